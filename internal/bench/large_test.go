package bench

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkLargeRecords is `make bench`'s memory scenario for records up
// to the fetch limit: BENCH_LARGE_RECORDS (default 6) records of
// BENCH_LARGE_MIB MiB each (default 10), spread over the partitions and
// produced together so that several partitions hold one at once — half of
// them valid events carrying a large payload field (decoded, applied),
// half not JSON (dead-lettered without their original: base64 would make
// them larger than the dead-letter topic takes) — after 20 000 ordinary
// events. It reports the worker's peak RSS next to that of the same
// 20 000 events alone, run before it, and checks that every record was
// committed and each non-JSON one dead-lettered once.
func BenchmarkLargeRecords(b *testing.B) {
	large, mibs := 6, 10
	if s := os.Getenv("BENCH_LARGE_RECORDS"); s != "" {
		large, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("BENCH_LARGE_MIB"); s != "" {
		mibs, _ = strconv.Atoi(s)
	}
	e := newEnv(b, true)
	b.ResetTimer()
	const small = 20000
	base := e.newScenario("largebase", newDataset(small, noPoison))
	e.produce(base)
	e.migrate(base.tenant)
	wBase := e.runWorker(base)

	s := e.newScenario("large", newDataset(small, noPoison))
	e.allowLargeRecords(s.topic, (mibs+2)<<20)
	e.produce(s)
	e.migrate(s.tenant)
	e.produceLarge(s, large, mibs<<20)
	w := e.runWorker(s)
	dls := e.deadLetterRecords(s.dlq)
	if want := large / 2; len(dls) != want {
		b.Fatalf("%d dead letters, want %d (one per non-JSON large record)", len(dls), want)
	}
	// Failing records (deployment trial): BENCH_FAILING_RECORDS (default
	// 4000) events of BENCH_FAILING_KB KB (default 50) for a tenant schema
	// never migrated, over the partitions: each pair is retried, held as a
	// copy while it waits, and dead-lettered when the breaker opens.
	failing, kbs := 4000, 50
	if v := os.Getenv("BENCH_FAILING_RECORDS"); v != "" {
		failing, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("BENCH_FAILING_KB"); v != "" {
		kbs, _ = strconv.Atoi(v)
	}
	f := e.newScenario("failing", &dataset{})
	e.produceFailing(f, failing, kbs<<10)
	wf := e.runWorker(f)
	if dls := e.deadLetterRecords(f.dlq); len(dls) != failing {
		b.Fatalf("%d dead letters, want %d (one per record for the tenant not migrated)", len(dls), failing)
	}
	b.StopTimer()
	fmt.Printf("large records: %d × %d MiB over %d partitions after %d events: peak RSS %.0f MiB; the same %d events alone: %.0f MiB (+%.0f MiB)\n",
		large, mibs, numPartitions, small, mib(w.peakRSS), small, mib(wBase.peakRSS), mib(w.peakRSS)-mib(wBase.peakRSS))
	fmt.Printf("failing records: %d × %d KB for a tenant not migrated over %d partitions (retried, then dead-lettered): peak RSS %.0f MiB\n",
		failing, kbs, numPartitions, mib(wf.peakRSS))
	b.ReportMetric(mib(w.peakRSS), "peak_MiB")
	b.ReportMetric(mib(wf.peakRSS), "failing_peak_MiB")
}

// produceFailing appends n ARTIST_RATED events of about size bytes for s's
// tenant schema that is never migrated (s.absent) to s's topic, over the
// partitions, and counts them in s.data as poisoned pairs.
func (e *env) produceFailing(s *scenario, n, size int) {
	e.b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.b.Fatal(err)
	}
	defer cl.Close()
	var failed atomic.Pointer[error]
	// Random letters, as the trial sent: text that compresses 100:1 would
	// measure the fetch caps instead (README, Operations, memory).
	rng := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	for i := range n {
		pad := make([]byte, max(size-300, 1))
		for j := range pad {
			pad[j] = byte('a' + rng.IntN(26))
		}
		user := fmt.Sprintf("failing-user-%d", i)
		v := fmt.Appendf(nil, `{"eventType":"ARTIST_RATED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"a","stars":3,"attachment":"%s"}}`,
			user, s.absent, user, pad)
		cl.Produce(e.ctx, &kgo.Record{Topic: s.topic, Partition: int32(i % numPartitions), Key: []byte(user), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
		s.data.pairs++
		s.data.poisoned++
		s.data.events = append(s.data.events, event{})
	}
	if err := cl.Flush(e.ctx); err != nil {
		e.b.Fatalf("produce failing records: %v", err)
	}
	if err := failed.Load(); err != nil {
		e.b.Fatalf("produce failing records: %v", *err)
	}
}

// allowLargeRecords sets topic's max.message.bytes to n.
func (e *env) allowLargeRecords(topic string, n int) {
	e.b.Helper()
	v := strconv.Itoa(n)
	resp, err := e.adm.AlterTopicConfigs(e.ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		e.b.Fatalf("max.message.bytes of %s: %v", topic, err)
	}
}

// produceLarge appends n records of size bytes to s's topic, over the
// partitions, and counts them in s.data: even ones valid events (a large
// payload field the projections ignore), odd ones not JSON (a dead letter
// each).
func (e *env) produceLarge(s *scenario, n, size int) {
	e.b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ProducerBatchMaxBytes(int32(size+(1<<20))),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		e.b.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range n {
		var v []byte
		if i%2 == 0 {
			user := fmt.Sprintf("large-user-%d", i)
			v = fmt.Appendf(nil, `{"eventType":"ARTIST_RATED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"a","stars":3,"attachment":"%s"}}`,
				user, s.tenant, user, bytes.Repeat([]byte("x"), size-300))
			s.data.pairs++
		} else {
			v = bytes.Repeat([]byte{0xfe}, size)
			s.data.pairs++
			s.data.poisoned++
		}
		recs = append(recs, &kgo.Record{Topic: s.topic, Partition: int32(i % numPartitions), Key: []byte(fmt.Sprintf("large-%d", i)), Value: v})
		s.data.events = append(s.data.events, event{})
	}
	if err := cl.ProduceSync(e.ctx, recs...).FirstErr(); err != nil {
		e.b.Fatalf("produce large records: %v", err)
	}
}
