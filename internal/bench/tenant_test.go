package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
)

// BenchmarkUnmigratedTenant is `make bench`'s scenario for non-blocking
// retries: BENCH_TENANT_EVENTS events (default 1000000: the first poisoned
// pairs take their full retries, about 6 s with the default policy, before
// the breaker opens, so a much shorter stream measures that wait) of which
// 1% belong to a tenant schema that was never migrated, so each of their
// pairs fails with 42P01 (a projection error) under the default retry
// policy (200 ms, ×2, 10 s cap, 5 retries) and breaker (3 exhaustions per
// minute). It runs the clean dataset and the unmigrated one alternately,
// BENCH_ROUNDS times each (default 3), each run with its own topics, group
// and schema, and reports each throughput, their medians and the ratio of
// the medians (target ≥ 0.9).
//
// For every run it checks the rows (equal to the raw upserts of the same
// events, none of the unmigrated tenant) and that every poisoned pair has
// exactly one dead letter. After the last unmigrated run it migrates the
// tenant, runs `dlq-replayer retry --fingerprint F` for each fingerprint of
// the dead letters, runs the worker again and checks that the tenant's
// tables hold every row of its events.
func BenchmarkUnmigratedTenant(b *testing.B) {
	n := 1000000
	if s := os.Getenv("BENCH_TENANT_EVENTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < numPartitions {
			b.Fatalf("BENCH_TENANT_EVENTS=%q: want an integer >= %d", s, numPartitions)
		}
	}
	rounds := benchRounds(b)
	e := newEnv(b, true)
	replayer := filepath.Join(e.dir, "dlq-replayer")
	if out, err := exec.Command("go", "build", "-o", replayer, "github.com/causet/projection-worker/cmd/dlq-replayer").CombinedOutput(); err != nil {
		b.Fatalf("go build dlq-replayer: %v\n%s", err, out)
	}
	b.ResetTimer()

	data := map[string]*dataset{"clean": newDataset(n, noPoison), "tenant": newDataset(n, unmigratedPoison)}
	want := map[string][tables]int64{}
	for _, name := range []string{"clean", "tenant"} {
		var rows [tables]int64
		e.raw(e.newScenario("rows"+name, data[name]), &rows, numPartitions)
		want[name] = rows
	}
	eps := map[string][]float64{}
	var last *scenario
	for r := range rounds {
		for _, name := range []string{"clean", "tenant"} {
			s := e.newScenario(fmt.Sprintf("%s%d", name, r), data[name])
			e.produce(s)
			e.migrate(s.tenant)
			w := e.runWorker(s)
			if got := e.rowCounts(s.tenant); got != want[name] {
				b.Fatalf("%s: the worker left rows %v, want %v", s.name, got, want[name])
			}
			e.checkDeadLetteredOnce(s)
			eps[name] = append(eps[name], float64(n)/w.committedAt.Seconds())
			if name == "tenant" {
				if last != nil {
					e.dropSchema(last.tenant)
				}
				last = s
			} else {
				e.dropSchema(s.tenant)
			}
		}
	}
	e.replayAfterMigrate(last, replayer)

	b.StopTimer()
	clean, tenant := median(eps["clean"]), median(eps["tenant"])
	e.logf("N=%d events, %d rounds, alternated: clean then 1%% of the events for an unmigrated tenant", n, rounds)
	fmt.Printf("clean worker events/s (runs): %s; median %.0f\n", formatRates(eps["clean"]), clean)
	fmt.Printf("unmigrated-tenant 1%% worker events/s (runs): %s; median %.0f\n", formatRates(eps["tenant"]), tenant)
	fmt.Printf("unmigrated/clean (medians): %.3f (target >= 0.9)\n", tenant/clean)
	b.ReportMetric(tenant/clean, "unmigrated/clean")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func formatRates(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += strconv.FormatFloat(x, 'f', 0, 64)
	}
	return out
}

// deadLetterRecords reads every record of topic.
func (e *env) deadLetterRecords(topic string) []*kgo.Record {
	e.b.Helper()
	total := e.records(topic)
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		e.b.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			e.b.Fatalf("read %d of %d records of %s: %v", len(out), total, topic, ctx.Err())
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// checkDeadLetteredOnce checks that s's dead-letter topic holds exactly one
// dead letter per poisoned pair, each for an event of the unmigrated tenant
// (42P01).
func (e *env) checkDeadLetteredOnce(s *scenario) {
	e.b.Helper()
	e.checkDeadLetters(s, deadLetterWant{tenant: s.absent, sqlstate: "42P01"})
}

// replayAfterMigrate migrates s's unmigrated tenant, replays its dead letters
// by fingerprint with dlq-replayer, runs the worker again over the replayed
// records and checks the tenant's rows.
func (e *env) replayAfterMigrate(s *scenario, replayer string) {
	b := e.b
	b.Helper()
	e.migrate(s.absent)
	fps := map[string]bool{}
	for _, r := range e.deadLetterRecords(s.dlq) {
		fps[header(r, dlq.HeaderFingerprint)] = true
	}
	before := e.records(s.topic)
	for fp := range fps {
		cmd := exec.Command(replayer, "retry", "--brokers", e.brokers, "--dlq-topic", s.dlq, "--topic", s.topic,
			"--ledger-topic", s.ledger, "--fingerprint", fp, "--log-level", "warn")
		cmd.Env = workerEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("dlq-replayer retry --fingerprint %s: %v\n%s", fp, err, out)
		}
		e.logf("%s: dlq-replayer retry --fingerprint %s: %s", s.name, fp, lastLine(out))
	}
	replayed := int(e.records(s.topic) - before)
	if replayed != s.data.poisoned {
		b.Fatalf("%s: %d records replayed, want %d", s.name, replayed, s.data.poisoned)
	}
	// The worker runs again in the same group: it has committed the
	// original events, so it reads the replayed ones, one pair each.
	again := &scenario{name: s.name + "-replay", tenant: s.tenant, absent: s.absent, topic: s.topic, dlq: s.dlq, ledger: s.ledger, group: s.group,
		data: &dataset{events: make([]event, int(before)+replayed), pairs: replayed}}
	e.runWorker(again)
	if got, want := e.rowCounts(s.absent), absentRows(s.data); got != want {
		b.Fatalf("%s: after migrate and replay the tenant holds rows %v, want %v", s.name, got, want)
	}
	if got := e.records(s.dlq); got != int64(s.data.poisoned) {
		b.Fatalf("%s: %d dead letters after the replay, want still %d", s.name, got, s.data.poisoned)
	}
	e.logf("%s: migrate + dlq-replayer retry by %d fingerprint(s) applied all %d dead-lettered pairs", s.name, len(fps), replayed)
}

// absentRows returns the rows the unmigrated tenant's events make: one per
// distinct primary key in each table.
func absentRows(d *dataset) [tables]int64 {
	type key struct{ artist, user int32 }
	var follows, ratings = map[key]bool{}, map[key]bool{}
	for i := range d.events {
		ev := &d.events[i]
		if !ev.absent {
			continue
		}
		if ev.typ == followed {
			follows[key{ev.artist, ev.user}] = true
		} else {
			ratings[key{ev.artist, ev.user}] = true
		}
	}
	return [tables]int64{int64(len(follows)), int64(len(follows)), int64(len(ratings))}
}

func lastLine(out []byte) string {
	s := strings.TrimRight(string(out), "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
