package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/otlptest"
	"github.com/causet/projection-worker/projection"
)

// Targets of BenchmarkWorkerThroughput (issue 11): ratios of medians
// measured side by side in one run, and the worker's CPU per event.
const (
	targetWorkerVsRaw  = 0.8  // clean worker / best raw method
	targetPoison       = 0.9  // each poison kind at 1% / clean
	targetTraceSampled = 0.95 // OTLP sampled at 1% / tracing off
	targetTraceAll     = 0.8  // OTLP sampled at 100% / tracing off
	targetCPUPerEvent  = 10.0 // µs of worker CPU (user + system) per event
)

// scenarioWords are the words of BENCH_SCENARIOS, each selecting rows of
// BenchmarkWorkerThroughput's table.
var scenarioWords = []string{"raw", "clean", "derive", "22003", "23502", "23514", "23514fn", "unmigrated", "trace"}

// benchScenarios returns the words of BENCH_SCENARIOS (comma or space
// separated; unset or empty: every word; "all" in the list: every word of
// scenarioWords, e.g. "all,other"), failing b on a word it does not know.
func benchScenarios(b *testing.B) map[string]bool {
	v := strings.TrimSpace(os.Getenv("BENCH_SCENARIOS"))
	out := map[string]bool{}
	if v == "" {
		v = "all"
	}
	for _, w := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		if w == "all" {
			for _, w := range scenarioWords {
				out[w] = true
			}
			continue
		}
		if w == "other" {
			if os.Getenv("BENCH_OTHER_BIN") == "" {
				b.Fatalf("BENCH_SCENARIOS=%q: scenario other runs BENCH_OTHER_BIN, which is not set", v)
			}
			out[w] = true
			continue
		}
		if !slices.Contains(scenarioWords, w) {
			b.Fatalf("BENCH_SCENARIOS=%q: unknown scenario %q (want a list of %s, or all)", v, w, strings.Join(scenarioWords, ", "))
		}
		out[w] = true
	}
	return out
}

// benchRounds returns BENCH_ROUNDS, default 3.
func benchRounds(b *testing.B) int {
	n := envInt(b, "BENCH_ROUNDS")
	if n == 0 {
		return 3
	}
	if n < 1 {
		b.Fatalf("BENCH_ROUNDS=%d: want an integer >= 1", n)
	}
	return n
}

// workload is a dataset produced once to its own topic, for its own tenant
// schema, which every worker run over it recreates.
type workload struct {
	kind   poisonKind
	data   *dataset
	topic  string
	tenant string
	absent string       // the tenant of unmigratedPoison events, never migrated
	want   []tableState // the tables the raw COPY of its successful pairs leaves
}

// deadLetterWant is what every dead letter of a run must say.
type deadLetterWant struct {
	tenant     string // causet.dlq.tenant-schema
	projection string // causet.dlq.projection; "" any
	sqlstate   string // causet.dlq.sqlstate; "" not a PostgreSQL error
}

// measured is one run of one scenario.
type measured struct {
	eps float64 // events per second: over the whole run (a worker's from its start)
	// fromFirst is the events per second once the first pair was applied
	// (workerResult.fromFirstRow, applyResult.fromFirstRow).
	fromFirst float64
	cpu       float64 // µs of worker CPU per event; 0 for raw methods
	pgCPU     float64 // µs of PostgreSQL's CPU per event; 0 when not measured
	// allCPU is µs per event of all the CPU the run took: the client's
	// (the raw method's goroutines, in this process; or the worker's),
	// this process's (the kfake broker serving the worker's fetches, the
	// polling of /metrics) and PostgreSQL's; 0 when PostgreSQL's is not
	// measured. With cores (allCPU × events/s) near the machine's, the
	// run was CPU-bound and the ratio of two runs' rates is about the
	// inverse ratio of their allCPU.
	allCPU  float64
	cores   float64 // allCPU × eps: the cores the run kept busy on average
	rss     float64 // MiB, the worker's peak; 0 for raw methods
	dropped int64   // spans dropped (queue full); tracing runs
	spans   int     // spans the OTLP receiver got; tracing runs
	sampled int64   // spans sampled (the SDK's count) when every pair was applied
	method  string  // raw-best: the method that was best in this round
}

// benchScenario is one row of BenchmarkWorkerThroughput's table.
type benchScenario struct {
	name   string
	word   string  // the BENCH_SCENARIOS word that selects it
	ref    string  // the scenario its ratio is against; "" none
	target float64 // the ratio's target (at least); 0 none
	// Raw methods.
	mode       applyMode
	goroutines int
	// Worker runs.
	work       *workload
	dl         func(w *workload) deadLetterWant
	sampler    string // "" tracing off; else OTEL_TRACES_SAMPLER=sampler
	samplerArg string // OTEL_TRACES_SAMPLER_ARG; "" unset
	bin        string // the worker binary; "" the one built from this tree
	runs       []measured
}

func (s *benchScenario) worker() bool { return s.work != nil }

// benchConstraints runs the benchmark's own migration in schema, after
// projection.Migrate, in every schema it writes (raw and worker alike): it
// makes the tables stricter than the definitions say, so that PostgreSQL
// refuses values Plan cannot know to be wrong: artist_followers.score
// becomes integer (the definition says bigint; a score beyond 2^31−1 is
// 22003 numeric_value_out_of_range), artist_ratings.review NOT NULL (the
// definition leaves it nullable; a missing review is 23502
// not_null_violation), artist_ratings.stars gets CHECK (stars BETWEEN 1
// AND 5) (0 stars is 23514 check_violation) and artist_ratings.review
// CHECK (char_length(review) <= 500) (a longer review is 23514 too, from a
// constraint the worker does not evaluate in Go). The clean events
// satisfy all four. The error names the statement that failed.
func benchConstraints(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	for _, sql := range []string{
		"ALTER TABLE " + pgx.Identifier{schema, "artist_followers"}.Sanitize() + " ALTER COLUMN score TYPE integer",
		"ALTER TABLE " + pgx.Identifier{schema, "artist_ratings"}.Sanitize() + " ALTER COLUMN review SET NOT NULL",
		"ALTER TABLE " + pgx.Identifier{schema, "artist_ratings"}.Sanitize() + " ADD CONSTRAINT stars_range CHECK (stars BETWEEN 1 AND 5)",
		"ALTER TABLE " + pgx.Identifier{schema, "artist_ratings"}.Sanitize() + " ADD CONSTRAINT review_length CHECK (char_length(review) <= 500)",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// throughput is the state of one BenchmarkWorkerThroughput.
type throughput struct {
	*env
	n         int
	defs      *projection.Definitions
	tps       []*projection.TableProjection
	shapes    []*copyShape
	rawSchema string          // the raw methods' tenant schema
	clean     [][]plannedPair // the clean workload planned in rawSchema
}

// resetSchema drops schema and creates it again: projection.Migrate, then
// benchConstraints.
func (t *throughput) resetSchema(schema string) {
	t.b.Helper()
	t.dropSchema(schema)
	if err := projection.Migrate(t.ctx, t.pool, t.defs, schema); err != nil {
		t.b.Fatalf("migrate %s: %v", schema, err)
	}
	if err := benchConstraints(t.ctx, t.pool, schema); err != nil {
		t.b.Fatal(err)
	}
	t.quiesce()
}

// quiesce lets PostgreSQL finish what the previous run left before the
// next one is timed: a CHECKPOINT, so that its dirty buffers are written
// now rather than during the next run, then no autovacuum worker running
// (it waits up to 30 s). Without it the first worker run after the raw
// methods (which write 4 × the workload's rows) paid for them: clean ran
// at 0.6–0.7 × the scenarios after it in a loaded run. Then this process
// collects its own garbage (runtime.GC, which sweeps too), so that what
// the dataset, the expected state and the last run left is not collected
// during the next run on the same cores: "this process" took 0.2 to 1.1
// µs/event of runs that added nothing to its work (its CPU profile: the
// collector sweeping and marking what planPairs had allocated).
func (t *throughput) quiesce() {
	t.b.Helper()
	defer runtime.GC()
	if _, err := t.pool.Exec(t.ctx, "CHECKPOINT"); err != nil {
		t.logf("CHECKPOINT before the run: %v (going on)", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var n int
		err := t.pool.QueryRow(t.ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").Scan(&n)
		if err != nil {
			t.b.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.logf("%d autovacuum worker(s) still running after 30 s; timing the run anyway", n)
			return
		}
	}
}

// checkTables fails the benchmark when got (the tables run left) differ
// from want.
func (t *throughput) checkTables(run string, got, want []tableState) {
	t.b.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.b.Fatalf("%s left %s %+v, want %+v (the raw COPY of the same events)", run, want[i].table, got[i], want[i])
		}
	}
}

// applyRaw applies planned (d's successful pairs in the raw schema) with
// mode from g goroutines into a fresh raw schema and returns the result
// and the tables it left.
func (t *throughput) applyRaw(d *dataset, planned [][]plannedPair, mode applyMode, g int) (applyResult, []tableState) {
	t.b.Helper()
	t.resetSchema(t.rawSchema)
	pg0, self0 := t.pg.used(), selfCPU()
	r, err := runApply(t.ctx, t.dbURL, d, planned, g, mode, t.shapes)
	r.clientCPU = selfCPU() - self0
	if pg0 > 0 {
		r.pgCPU = t.pg.used() - pg0
	}
	if err != nil {
		t.b.Fatalf("raw %s, %d goroutine(s): %v", mode, g, err)
	}
	if r.pairs != d.statements() {
		t.b.Fatalf("raw %s, %d goroutine(s): applied %d pairs, want %d", mode, g, r.pairs, d.statements())
	}
	return r, t.tableStates(t.rawSchema, t.shapes)
}

// newWorkload generates the dataset of kind, produces it to a topic of its
// own and computes the tables its successful pairs leave (raw COPY, 8
// goroutines, untimed).
func (t *throughput) newWorkload(kind poisonKind, name string) *workload {
	t.b.Helper()
	w := &workload{kind: kind, data: newDataset(t.n, kind)}
	s := t.newScenario(name, w.data)
	w.topic, w.tenant, w.absent = s.topic, s.tenant, s.absent
	t.produce(s)
	planned := planPairs(t.b, w.data, t.tps, t.rawSchema)
	_, w.want = t.applyRaw(w.data, planned, modeCopy, numPartitions)
	if kind == noPoison {
		t.clean = planned
	}
	return w
}

// perEvent returns d in µs per event of the run.
func (t *throughput) perEvent(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(t.n)
}

// setAll sets allCPU, client (µs/event) plus PostgreSQL's, and cores;
// neither when PostgreSQL's CPU was not measured.
func (m *measured) setAll(client float64) {
	if m.pgCPU > 0 {
		m.allCPU = client + m.pgCPU
		m.cores = m.allCPU * m.eps / 1e6
	}
}

// runRawMethod measures one raw method on the clean workload.
func (t *throughput) runRawMethod(s *benchScenario, clean *workload, round int) measured {
	t.b.Helper()
	r, state := t.applyRaw(clean.data, t.clean, s.mode, s.goroutines)
	t.checkTables(fmt.Sprintf("%s (round %d)", s.name, round), state, clean.want)
	eps := float64(t.n) / r.elapsed.Seconds()
	m := measured{eps: eps, fromFirst: r.fromFirstRow(t.n), pgCPU: t.perEvent(r.pgCPU)}
	m.setAll(t.perEvent(r.clientCPU))
	t.logf("round %d: %s: %d pairs in %d transactions, %s: %.0f events/s; PostgreSQL %.1f µs/event, all %.1f µs/event (%.2f cores; load %s)",
		round, s.name, r.pairs, r.txs, r.elapsed.Round(time.Millisecond), eps, m.pgCPU, m.allCPU, m.cores, loadAvg())
	return m
}

// runWorkerScenario runs the worker binary once over s's workload, in its
// tenant schema recreated, with a new group, dead-letter and ledger topic,
// and checks what the benchmark asserts: every record fetched once, the
// tables equal to the raw COPY's, one dead letter per poisoned pair, each
// saying what the poison is.
func (t *throughput) runWorkerScenario(s *benchScenario, round int) measured {
	b := t.b
	b.Helper()
	w := s.work
	t.resetSchema(w.tenant)
	run := fmt.Sprintf("%s-r%d", s.name, round)
	sc := &scenario{name: run, bin: s.bin, data: w.data, tenant: w.tenant, absent: w.absent, topic: w.topic,
		dlq:    "bench.dlq." + run + "." + t.id,
		ledger: "bench.ledger." + run + "." + t.id,
		group:  "bench.group." + run + "." + t.id,
	}
	var rcv *otlptest.Receiver
	if s.sampler != "" {
		rcv = otlptest.NewReceiver(false)
		defer rcv.Close()
		sc.env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.Endpoint(), "OTEL_TRACES_SAMPLER=" + s.sampler}
		if s.samplerArg != "" {
			sc.env = append(sc.env, "OTEL_TRACES_SAMPLER_ARG="+s.samplerArg)
		}
	}
	res := t.runWorker(sc)
	switch {
	case res.fetched == 0:
		b.Fatalf("%s: the worker's /metrics has no messaging_kafka_fetch_records: whether each record was fetched once cannot be told", run)
	case res.fetched != int64(t.n):
		b.Fatalf("%s: the worker fetched %d records, want each of the %d once", run, res.fetched, t.n)
	}
	t.checkTables(run, t.tableStates(w.tenant, t.shapes), w.want)
	t.checkDeadLetters(sc, s.dl(w))
	m := measured{
		eps:       float64(t.n) / res.committedAt.Seconds(),
		fromFirst: res.fromFirstRow(t.n, int64(w.data.pairs)),
		cpu:       t.perEvent(res.cpu),
		pgCPU:     t.perEvent(res.pgCPU),
		rss:       mib(res.peakRSS),
	}
	m.setAll(m.cpu + t.perEvent(res.selfCPU))
	t.logf("%s: all CPU %.1f µs/event (worker %.1f, this process %.1f, PostgreSQL %.1f): %.2f cores",
		run, m.allCPU, m.cpu, t.perEvent(res.selfCPU), m.pgCPU, m.cores)
	if rcv != nil {
		if !res.spans.served {
			b.Fatalf("%s: the worker's /metrics has no otel_sdk_processor_span_queue_capacity: its dropped spans cannot be counted", run)
		}
		m.dropped, m.sampled, m.spans = res.spans.dropped, res.spans.sampled, rcv.SpanCount()
		t.logf("%s: %d spans sampled when every pair was applied, %d received by the end, %d dropped (queue full)", run, m.sampled, m.spans, m.dropped)
	}
	t.deleteTopics(sc.dlq, sc.ledger)
	return m
}

// checkDeadLetters fails the benchmark unless s's dead-letter topic holds
// exactly one dead letter per poisoned pair, each saying want.
func (e *env) checkDeadLetters(s *scenario, want deadLetterWant) {
	b := e.b
	b.Helper()
	dls := e.deadLetterRecords(s.dlq)
	seen := map[string]bool{}
	short := 0
	for _, r := range dls {
		id := header(r, dlq.HeaderOriginalPartition) + "@" + header(r, dlq.HeaderOriginalOffset) + "/" + header(r, dlq.HeaderProjection)
		if seen[id] {
			b.Fatalf("%s: two dead letters for pair %s", s.name, id)
		}
		seen[id] = true
		got := deadLetterWant{tenant: header(r, dlq.HeaderTenantSchema), projection: header(r, dlq.HeaderProjection), sqlstate: header(r, dlq.HeaderSQLState)}
		if want.projection == "" {
			got.projection = ""
		}
		if got != want {
			b.Fatalf("%s: dead letter %s says %+v, want %+v (error class %s: %s)", s.name, id, got, want,
				header(r, dlq.HeaderErrorClass), strings.TrimSpace(string(r.Value[:min(len(r.Value), 300)])))
		}
		if header(r, dlq.HeaderShortCircuit) != "" {
			short++
		}
	}
	if len(dls) != s.data.poisoned {
		b.Fatalf("%s: %d dead letters, want %d (one per poisoned pair)", s.name, len(dls), s.data.poisoned)
	}
	if len(dls) > 0 {
		e.logf("%s: %d dead letters, one per poisoned pair, SQLSTATE %q (%d short-circuited by a breaker)", s.name, len(dls), want.sqlstate, short)
	}
}

// deleteTopics deletes a run's topics once checked (kfake keeps every
// record in this process).
func (t *throughput) deleteTopics(topics ...string) {
	if _, err := t.adm.DeleteTopics(t.ctx, topics...); err != nil {
		t.b.Errorf("delete topics %v: %v", topics, err)
	}
}

// BenchmarkWorkerThroughput is `make bench`: the worker binary against the
// raw ceiling of the same rows, poisoned runs and traced runs against
// clean ones, alternated in BENCH_ROUNDS rounds (default 3), each round
// running every selected scenario once in the table's order. The figures
// are medians over the rounds with their spread (min–max); a ratio is the
// ratio of the medians, with the range of its per-round ratios.
//
// Each workload is BENCH_EVENTS events (default 200000; 8 partitions, keys
// over 100000 entities, 60% ARTIST_FOLLOWED with two projections, 40%
// ARTIST_RATED with one), produced once to an in-process kfake broker. Every
// schema written gets projection.Migrate and then benchConstraints.
// Scenarios, by their BENCH_SCENARIOS word (comma-separated; unset: all):
//
//   - raw: the raw ceiling, no Kafka, decoding or CEL: the clean workload's
//     pairs planned by TableProjection.Plan before the clock starts (the
//     worker's rows, sequence-number guard and tombstone check), applied
//     copyBatchEvents (the worker's --max-batch-records default, 1000)
//     events per transaction from 8 and from 1 goroutines (one
//     connection each) as pipelined statements and as COPY into a
//     temporary table plus one INSERT ... ON CONFLICT per table
//     (BenchmarkApplyBatchVsCopy's two ways); raw-best is the best of the
//     four in each round.
//   - clean: the projection-worker binary over the clean workload (its own
//     COPY path), against raw-best (target 0.8).
//   - derive, 22003, 23502, 23514, 23514fn, unmigrated: 1% of the events
//     poisoned (one pair each; both pairs for unmigrated), against clean
//     (target 0.9): a score derive dividing by zero (permanent, refused at
//     plan time); a score beyond integer (22003), a missing review (23502)
//     and 0 stars (23514, a CHECK comparison), which Plan passes and
//     PostgreSQL refuses because of benchConstraints, and which the worker
//     leaves to statements from the table's catalog; a review of 520
//     characters (23514fn: a CHECK with a function, which the worker does
//     not evaluate), which PostgreSQL refuses inside its COPY group (23502
//     and 23514 are projection errors: retried, then dead-lettered or
//     short-circuited by the breaker); events for a tenant schema never migrated (42P01, a
//     projection error: retried, then dead-lettered; the breaker opens
//     after the first pairs exhaust their ~6 s of retries, so a short run
//     shows that wait).
//   - trace: OTLP on, exported to an in-process receiver
//     (internal/otlptest), sampled at 1% (parentbased_traceidratio 0.01)
//     and at 100% (parentbased_always_on), against clean, which runs with
//     tracing off (targets 0.95 and 0.8; no span dropped).
//
// A worker's rate is N over the time from starting the process until the
// group has committed all N offsets (SIGTERM once its /metrics count every
// pair done); a raw method's is N over the time to apply the same rows,
// its clock started once its connections are open and its temporary
// tables made. So the table also gives each run's rate from its first row
// (for a worker, the pairs applied after /metrics first counted some, over
// the time until it counted all: its start-up of 0.2–0.5 s left out; for
// a raw method, the pairs applied after its first commit over the time
// since), with the ratios and targets from it beside the whole run's.
// CPU is the worker's user + system time until every pair was applied, per
// event; peak RSS is its VmHWM. The benchmark fails when a worker fetched a
// record more than once (or not at all), left tables different from the
// raw COPY of the same successful pairs, or wrote other than one dead
// letter per poisoned pair with the expected tenant, projection and
// SQLSTATE. It prints one table and one line `BENCH_JSON {...}` with the
// same figures and every run's rate.
//
// BENCH_WORKER_FLAGS (space-separated) adds flags to `projection-worker
// run`, e.g. BENCH_WORKER_FLAGS='--copy-min-rows -1'; BENCH_LOG_DIR=dir
// keeps each worker run's log there (with BENCH_WORKER_FLAGS='--log-level
// debug' it shows each COPY group that PostgreSQL refused);
// BENCH_WORKER_CPUPROFILE=prefix runs each worker with --pprof and keeps its
// CPU profiles, 5 s each, as prefix.<scenario>.<n>.pprof (merged, a
// candidate for cmd/projection-worker/default.pgo: README, Performance),
// and what it allocated until every pair was applied as
// prefix.<scenario>.allocs.pprof;
//
// BENCH_SCENARIOS=other with BENCH_OTHER_BIN=path adds the row clean-other:
// the clean workload run by that projection-worker binary (another
// commit's, built with go build), alternated with clean in every round and
// its ratio against it: an A/B of two versions of the worker in one run;
// and for each poison kind selected, the row poison-<kind>-other, that
// workload run by the other binary, against poison-<kind>.
func BenchmarkWorkerThroughput(b *testing.B) {
	words := benchScenarios(b)
	rounds := benchRounds(b)
	e := newEnv(b, true)
	defs, tps := e.projections(b)
	t := &throughput{env: e, n: benchEvents(b), defs: defs, tps: tps, shapes: newCopyShapes(defs)}
	t.rawSchema = t.schema("raw")
	anyWorker := false
	for _, w := range append(scenarioWords[1:], "other") {
		anyWorker = anyWorker || words[w]
	}
	words["clean"] = anyWorker // every worker scenario's reference
	loadStart := loadAvg()
	b.ResetTimer()

	onTenant := func(proj, sqlstate string) func(*workload) deadLetterWant {
		return func(w *workload) deadLetterWant {
			return deadLetterWant{tenant: w.tenant, projection: proj, sqlstate: sqlstate}
		}
	}
	works := map[poisonKind]*workload{}
	work := func(kind poisonKind, name, word string) *workload {
		if !words[word] {
			return nil
		}
		if works[kind] == nil {
			works[kind] = t.newWorkload(kind, name)
		}
		return works[kind]
	}
	clean := work(noPoison, "clean", "clean")
	if clean == nil && words["raw"] {
		clean = t.newWorkload(noPoison, "clean")
		works[noPoison] = clean
	}
	all := []*benchScenario{
		{name: "raw-pipelined-8", word: "raw", mode: modeBatch, goroutines: numPartitions},
		{name: "raw-pipelined-1", word: "raw", mode: modeBatch, goroutines: 1},
		{name: "raw-copy-8", word: "raw", mode: modeCopy, goroutines: numPartitions},
		{name: "raw-copy-1", word: "raw", mode: modeCopy, goroutines: 1},
		{name: "raw-best", word: "raw"},
		{name: "clean", word: "clean", ref: "raw-best", target: targetWorkerVsRaw, work: clean, dl: onTenant("", "")},
		{name: "poison-derive", word: "derive", ref: "clean", target: targetPoison,
			work: work(derivePoison, "derive", "derive"), dl: onTenant("artist_followers", "")},
		{name: "poison-22003", word: "22003", ref: "clean", target: targetPoison,
			work: work(rangePoison, "range", "22003"), dl: onTenant("artist_followers", "22003")},
		{name: "poison-23502", word: "23502", ref: "clean", target: targetPoison,
			work: work(nullPoison, "notnull", "23502"), dl: onTenant("artist_ratings", "23502")},
		{name: "poison-23514", word: "23514", ref: "clean", target: targetPoison,
			work: work(checkPoison, "check", "23514"), dl: onTenant("artist_ratings", "23514")},
		{name: "poison-23514-fn", word: "23514fn", ref: "clean", target: targetPoison,
			work: work(checkFnPoison, "checkfn", "23514fn"), dl: onTenant("artist_ratings", "23514")},
		{name: "poison-unmigrated", word: "unmigrated", ref: "clean", target: targetPoison,
			work: work(unmigratedPoison, "nomig", "unmigrated"),
			dl:   func(w *workload) deadLetterWant { return deadLetterWant{tenant: w.absent, sqlstate: "42P01"} }},
		{name: "trace-1pct", word: "trace", ref: "clean", target: targetTraceSampled, work: clean, dl: onTenant("", ""),
			sampler: "parentbased_traceidratio", samplerArg: "0.01"},
		{name: "trace-100pct", word: "trace", ref: "clean", target: targetTraceAll, work: clean, dl: onTenant("", ""),
			sampler: "parentbased_always_on"},
		{name: "clean-other", word: "other", ref: "clean", work: clean, dl: onTenant("", ""), bin: os.Getenv("BENCH_OTHER_BIN")},
	}
	if words["other"] { // each poison kind selected, run by the other binary too
		for _, s := range all {
			if strings.HasPrefix(s.name, "poison-") && words[s.word] {
				all = append(all, &benchScenario{name: s.name + "-other", word: "other", ref: s.name,
					work: s.work, dl: s.dl, bin: os.Getenv("BENCH_OTHER_BIN")})
			}
		}
	}
	var scens []*benchScenario
	for _, s := range all {
		if words[s.word] {
			scens = append(scens, s)
		}
	}

	var raws, workers []*benchScenario
	for _, s := range scens {
		if s.worker() {
			workers = append(workers, s)
		} else {
			raws = append(raws, s)
		}
	}
	for r := 1; r <= rounds; r++ {
		// The raw methods, then the worker scenarios, rotated by one each
		// round, so that no scenario always runs right after another.
		k := (r - 1) % max(len(workers), 1)
		order := slices.Concat(raws, workers[k:], workers[:k])
		names := make([]string, len(order))
		for i, s := range order {
			names[i] = s.name
		}
		e.logf("round %d of %d: load average %s; order %s", r, rounds, loadAvg(), strings.Join(names, ", "))
		for _, s := range order {
			switch {
			case s.worker():
				s.runs = append(s.runs, t.runWorkerScenario(s, r))
			case s.name == "raw-best":
				best := measured{} // the best of each figure
				for _, o := range scens {
					if o.worker() || o == s {
						continue
					}
					m := o.runs[len(o.runs)-1]
					if m.eps > best.eps {
						best.eps, best.method = m.eps, o.name
					}
					best.fromFirst = max(best.fromFirst, m.fromFirst)
				}
				s.runs = append(s.runs, best)
			default:
				s.runs = append(s.runs, t.runRawMethod(s, clean, r))
			}
		}
	}
	b.StopTimer()
	t.report(scens, rounds, loadStart)
}

// scenarioFigures are one row of the table, and one element of BENCH_JSON's
// scenarios.
type scenarioFigures struct {
	Name   string    `json:"name"`
	Runs   []float64 `json:"events_per_s"`
	Median float64   `json:"median_events_per_s"`
	Min    float64   `json:"min_events_per_s"`
	Max    float64   `json:"max_events_per_s"`
	// FromFirst: events/s once the first pair was applied (measured.fromFirst).
	FromFirst       []float64 `json:"events_per_s_from_first_row"`
	MedianFromFirst float64   `json:"median_events_per_s_from_first_row"`
	Reference       string    `json:"reference,omitempty"`
	Ratio           float64   `json:"ratio,omitempty"`     // median / the reference's median
	RatioMin        float64   `json:"ratio_min,omitempty"` // of the per-round ratios
	RatioMax        float64   `json:"ratio_max,omitempty"`
	// RatioFromFirst, its min and max: the same from the first row.
	RatioFromFirst    float64  `json:"ratio_from_first_row,omitempty"`
	RatioFromFirstMin float64  `json:"ratio_from_first_row_min,omitempty"`
	RatioFromFirstMax float64  `json:"ratio_from_first_row_max,omitempty"`
	Target            float64  `json:"ratio_target,omitempty"`
	CPU               float64  `json:"cpu_us_per_event,omitempty"`          // median
	PGCPU             float64  `json:"postgres_cpu_us_per_event,omitempty"` // median
	AllCPU            float64  `json:"all_cpu_us_per_event,omitempty"`      // median (measured.allCPU)
	Cores             float64  `json:"cores_busy,omitempty"`                // median (measured.cores)
	RSS               float64  `json:"peak_rss_mib,omitempty"`              // max over the runs
	Best              []string `json:"best_method,omitempty"`               // raw-best: the winner of each round
	Sampled           []int64  `json:"spans_sampled,omitempty"`             // the SDK's count when every pair was applied
	Spans             []int    `json:"spans_received,omitempty"`
	Dropped           *int64   `json:"spans_dropped,omitempty"` // sum over the runs
}

// report prints the table and the BENCH_JSON line and reports the main
// figures as benchmark metrics.
func (t *throughput) report(scens []*benchScenario, rounds int, loadStart string) {
	byName := map[string]*benchScenario{}
	for _, s := range scens {
		byName[s.name] = s
	}
	var figs []scenarioFigures
	for _, s := range scens {
		f := scenarioFigures{Name: s.name, Reference: s.ref, Target: s.target}
		var cpus, pgCPUs, allCPUs, cores []float64
		for _, m := range s.runs {
			f.Runs = append(f.Runs, m.eps)
			f.FromFirst = append(f.FromFirst, m.fromFirst)
			f.RSS = max(f.RSS, m.rss)
			if m.cpu > 0 {
				cpus = append(cpus, m.cpu)
			}
			if m.pgCPU > 0 {
				pgCPUs = append(pgCPUs, m.pgCPU)
			}
			if m.allCPU > 0 {
				allCPUs, cores = append(allCPUs, m.allCPU), append(cores, m.cores)
			}
			if m.method != "" {
				f.Best = append(f.Best, m.method)
			}
			if s.sampler != "" {
				f.Spans = append(f.Spans, m.spans)
				f.Sampled = append(f.Sampled, m.sampled)
				d := m.dropped
				if f.Dropped != nil {
					d += *f.Dropped
				}
				f.Dropped = &d
			}
		}
		f.Median, f.Min, f.Max = median(f.Runs), slices.Min(f.Runs), slices.Max(f.Runs)
		f.MedianFromFirst = median(f.FromFirst)
		if len(cpus) > 0 {
			f.CPU = median(cpus)
		}
		if len(pgCPUs) > 0 {
			f.PGCPU = median(pgCPUs)
		}
		if len(allCPUs) > 0 {
			f.AllCPU, f.Cores = median(allCPUs), median(cores)
		}
		if ref := byName[s.ref]; ref != nil {
			f.Ratio, f.RatioMin, f.RatioMax = ratios(s.runs, ref.runs, func(m measured) float64 { return m.eps })
			f.RatioFromFirst, f.RatioFromFirstMin, f.RatioFromFirstMax = ratios(s.runs, ref.runs, func(m measured) float64 { return m.fromFirst })
		} else {
			f.Reference, f.Target = "", 0
		}
		figs = append(figs, f)
	}

	loadEnd := loadAvg()
	fmt.Printf("\nN=%d events per run, %d rounds alternated (each round: the raw rows below in order, then the worker rows, rotated by one each round, each run after a CHECKPOINT); load average %s at start, %s at end (%d cores)\n",
		t.n, rounds, loadStart, loadEnd, runtime.NumCPU())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tevents/s median\tmin–max\tratio (per-round range)\tfrom first row: events/s\tratio (range)\tvs\ttarget (whole run; from first row)\tCPU µs/event\tPostgreSQL CPU µs/event\tall CPU µs/event (cores)\tpeak RSS MiB\t")
	for _, f := range figs {
		ratio, ratioFirst, target, cpu, pgCPU, all, rss := "–", "–", "–", "–", "–", "–", "–"
		if f.Reference != "" {
			ratio = fmt.Sprintf("%.3f (%.2f–%.2f)", f.Ratio, f.RatioMin, f.RatioMax)
			ratioFirst = fmt.Sprintf("%.3f (%.2f–%.2f)", f.RatioFromFirst, f.RatioFromFirstMin, f.RatioFromFirstMax)
		}
		if f.Target > 0 {
			target = fmt.Sprintf("≥ %.2f %s; %s", f.Target, passMark(f.Ratio >= f.Target), passMark(f.RatioFromFirst >= f.Target))
		}
		if f.CPU > 0 {
			cpu = fmt.Sprintf("%.1f %s", f.CPU, passMark(f.CPU <= targetCPUPerEvent))
		}
		if f.PGCPU > 0 {
			pgCPU = fmt.Sprintf("%.1f", f.PGCPU)
		}
		if f.AllCPU > 0 {
			all = fmt.Sprintf("%.1f (%.2f)", f.AllCPU, f.Cores)
		}
		if f.RSS > 0 {
			rss = fmt.Sprintf("%.0f", f.RSS)
		}
		vs := f.Reference
		if vs == "" {
			vs = "–"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f–%.0f\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", f.Name, f.Median, f.Min, f.Max, ratio, f.MedianFromFirst, ratioFirst, vs, target, cpu, pgCPU, all, rss)
	}
	_ = tw.Flush()
	for _, f := range figs {
		if len(f.Best) > 0 {
			fmt.Printf("raw-best per round: %s\n", strings.Join(f.Best, ", "))
		}
		if f.Dropped != nil {
			fmt.Printf("%s: spans sampled per run %v, received %v; dropped (queue full) %d, target 0 %s\n",
				f.Name, f.Sampled, f.Spans, *f.Dropped, passMark(*f.Dropped == 0))
		}
	}
	out, err := json.Marshal(struct {
		Benchmark  string            `json:"benchmark"`
		Events     int               `json:"events"`
		Partitions int               `json:"partitions"`
		Rounds     int               `json:"rounds"`
		WorkerArgs string            `json:"worker_flags,omitempty"`
		LoadStart  string            `json:"load_average_start"`
		LoadEnd    string            `json:"load_average_end"`
		Targets    map[string]any    `json:"targets"`
		Scenarios  []scenarioFigures `json:"scenarios"`
	}{"WorkerThroughput", t.n, numPartitions, rounds, os.Getenv("BENCH_WORKER_FLAGS"), loadStart, loadEnd,
		map[string]any{"worker_vs_raw": targetWorkerVsRaw, "poison_vs_clean": targetPoison, "trace_sampled_vs_off": targetTraceSampled,
			"trace_all_vs_off": targetTraceAll, "cpu_us_per_event_max": targetCPUPerEvent, "spans_dropped": 0},
		figs})
	if err != nil {
		t.b.Fatal(err)
	}
	fmt.Printf("BENCH_JSON %s\n", out)
	for _, f := range figs {
		t.b.ReportMetric(f.Median, f.Name+"_events/s")
		if f.Reference != "" {
			t.b.ReportMetric(f.Ratio, f.Name+"/"+f.Reference)
			t.b.ReportMetric(f.RatioFromFirst, f.Name+"/"+f.Reference+"_from_first_row")
		}
	}
}

// ratios returns the median of runs' figure (of) over the median of ref's,
// and the least and greatest of the per-round ratios (runs[i] against
// ref[i], run in the same round).
func ratios(runs, ref []measured, of func(measured) float64) (ratio, lo, hi float64) {
	var xs, refs, rs []float64
	for i, m := range runs {
		xs, refs = append(xs, of(m)), append(refs, of(ref[i]))
		rs = append(rs, of(m)/of(ref[i]))
	}
	return median(xs) / median(refs), slices.Min(rs), slices.Max(rs)
}

func passMark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
