package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
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
	b.StopTimer()
	fmt.Printf("large records: %d × %d MiB over %d partitions after %d events: peak RSS %.0f MiB; the same %d events alone: %.0f MiB (+%.0f MiB)\n",
		large, mibs, numPartitions, small, mib(w.peakRSS), small, mib(wBase.peakRSS), mib(w.peakRSS)-mib(wBase.peakRSS))
	b.ReportMetric(mib(w.peakRSS), "peak_MiB")
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
