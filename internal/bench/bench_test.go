package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
)

// TestMain closes the PostgreSQL server pgtest may start for the benchmarks.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	defaultEvents   = 200000
	projectionsFile = "testdata/projections.yaml"
	tables          = 3
)

var tableNames = [tables]string{"artist_followers", "user_follows", "artist_ratings"}

// benchEvents returns N: BENCH_EVENTS, default 200000.
func benchEvents(b *testing.B) int {
	s := os.Getenv("BENCH_EVENTS")
	if s == "" {
		return defaultEvents
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < numPartitions {
		b.Fatalf("BENCH_EVENTS=%q: want an integer >= %d", s, numPartitions)
	}
	return n
}

// env is what the runs of one benchmark share: a kfake broker, the database
// and the worker binary.
type env struct {
	b       *testing.B
	ctx     context.Context
	brokers string // BENCH_BROKERS (a real broker), else an in-process kfake cluster's
	kcl     *kgo.Client
	adm     *kadm.Client
	dbURL   string
	pool    *pgxpool.Pool // admin: schemas, counts
	pg      postgresCPU   // PostgreSQL's CPU, when it runs on this host
	bin     string        // projection-worker binary; "" when not built
	defs    string        // absolute path of the definitions file
	dir     string
	id      string // random suffix of this benchmark's names
}

func newEnv(b *testing.B, withBinary bool) *env {
	b.Helper()
	e := &env{b: b, ctx: context.Background(), dir: b.TempDir(), id: randomID()}
	e.dbURL = pgtest.URL(b) // skips, or fails with CI=true, without PostgreSQL
	var err error
	if e.defs, err = filepath.Abs(projectionsFile); err != nil {
		b.Fatal(err)
	}
	if withBinary {
		e.bin = filepath.Join(e.dir, "projection-worker")
		build := exec.Command("go", "build", "-o", e.bin, "github.com/causet/projection-worker/cmd/projection-worker")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("go build projection-worker: %v\n%s", err, out)
		}
	}
	if e.brokers = os.Getenv("BENCH_BROKERS"); e.brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			b.Fatalf("kfake: %v", err)
		}
		b.Cleanup(cluster.Close)
		e.brokers = cluster.ListenAddrs()[0]
	}
	if e.kcl, err = kgo.NewClient(kgo.SeedBrokers(strings.Split(e.brokers, ",")...)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.kcl.Close)
	e.adm = kadm.NewClient(e.kcl)
	if e.pool, err = pgxpool.New(e.ctx, e.dbURL); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.pool.Close)
	if err := e.pool.Ping(e.ctx); err != nil {
		b.Fatalf("ping PostgreSQL: %v", err)
	}
	e.pg = newPostgresCPU(e.ctx, e.pool)
	return e
}

func randomID() string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// schema returns a fresh tenant schema name and drops the schema when the
// benchmark ends (it may be dropped earlier with dropSchema).
func (e *env) schema(role string) string {
	s := "bench_" + role + "_" + e.id
	e.b.Cleanup(func() { e.dropSchema(s) })
	return s
}

func (e *env) dropSchema(s string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
		e.b.Errorf("drop schema %s: %v", s, err)
	}
}

// migrate runs `projection-worker migrate` for schemas.
func (e *env) migrate(schemas ...string) {
	e.b.Helper()
	args := []string{"migrate", "--database-url", e.dbURL, "--projections", e.defs, "--log-level", "warn"}
	for _, s := range schemas {
		args = append(args, "--tenant-schema", s)
	}
	cmd := exec.Command(e.bin, args...)
	cmd.Env = workerEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		e.b.Fatalf("projection-worker migrate: %v\n%s", err, out)
	}
}

// createTopic creates topic with 8 partitions, deleted when the benchmark
// ends (on a real broker, BENCH_BROKERS, it would stay on its disk).
func (e *env) createTopic(topic string) {
	e.b.Helper()
	resp, err := e.adm.CreateTopic(e.ctx, numPartitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		e.b.Fatalf("create topic %s: %v", topic, err)
	}
	e.b.Cleanup(func() {
		if _, err := e.adm.DeleteTopics(context.Background(), topic); err != nil {
			e.b.Logf("delete topic %s: %v", topic, err)
		}
	})
}

// rowCounts returns the rows of each projection table in schema.
func (e *env) rowCounts(schema string) [tables]int64 {
	e.b.Helper()
	var n [tables]int64
	for i, t := range tableNames {
		if err := e.pool.QueryRow(e.ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, t}.Sanitize()).Scan(&n[i]); err != nil {
			e.b.Fatalf("count %s.%s: %v", schema, t, err)
		}
	}
	return n
}

// committed returns the sum of the group's committed offsets on topic.
func (e *env) committed(group, topic string) (int64, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	offs, err := e.adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil && o.At > 0 {
			sum += o.At
		}
	})
	return sum, nil
}

// records returns the number of records in topic (end offsets summed; the
// topic is not transactional and never truncated here).
func (e *env) records(topic string) int64 {
	e.b.Helper()
	ends, err := e.adm.ListEndOffsets(e.ctx, topic)
	if err != nil {
		e.b.Fatalf("end offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			e.b.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		n += o.Offset
	})
	return n
}

// workerEnv is the environment of the subprocess: ours without OTLP
// exporters (the worker would export to them).
func workerEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}

// scenario is one worker run: its own topics, group and tenant schema.
type scenario struct {
	name   string // "clean" or "poison"
	data   *dataset
	tenant string
	absent string // the tenant of unmigratedPoison events, never migrated
	topic  string
	dlq    string
	ledger string
	group  string
	env    []string // added to the worker's environment (OTEL_* of a tracing run)
	bin    string   // the worker binary; "" env.bin
}

func (e *env) newScenario(name string, data *dataset) *scenario {
	s := &scenario{
		name:   name,
		data:   data,
		tenant: e.schema(name),
		absent: e.schema(name + "_nomig"),
		topic:  "bench.events." + name + "." + e.id,
		dlq:    "bench.dlq." + name + "." + e.id,
		ledger: "bench.ledger." + name + "." + e.id,
		group:  "bench.group." + name + "." + e.id,
	}
	e.createTopic(s.topic)
	e.b.Cleanup(func() { // made by the worker, when it runs s itself
		_, _ = e.adm.DeleteTopics(context.Background(), s.dlq, s.ledger)
	})
	return s
}

// produce writes the scenario's events to its topic.
func (e *env) produce(s *scenario) {
	e.b.Helper()
	start := time.Now()
	if err := produce(e.ctx, []kgo.Opt{kgo.SeedBrokers(strings.Split(e.brokers, ",")...)}, s.topic, s.tenant, s.absent, s.data); err != nil {
		e.b.Fatalf("produce: %v", err)
	}
	if got := e.records(s.topic); got != int64(len(s.data.events)) {
		e.b.Fatalf("produced %d events, topic holds %d", len(s.data.events), got)
	}
	el := time.Since(start)
	e.logf("%s: produced %d events (%d poisoned, %d pairs) in %s (%.0f events/s)",
		s.name, len(s.data.events), s.data.poisoned, s.data.pairs, el.Round(time.Millisecond), float64(len(s.data.events))/el.Seconds())
}

// logf prints a progress line to stdout at once (b.Logf would hold it until
// the benchmark ends and print it after the figures, which must come last).
func (e *env) logf(format string, args ...any) {
	fmt.Printf("bench: "+format+"\n", args...)
}

// raw measures the raw ceiling for s's rows with the given goroutine counts,
// each in a fresh schema dropped afterwards, and returns the results in
// order. Each run's row counts are stored in *want when it is zero, else
// checked against it.
func (e *env) raw(s *scenario, want *[tables]int64, goroutines ...int) []rawResult {
	e.b.Helper()
	var out []rawResult
	for _, g := range goroutines {
		schema := e.schema(fmt.Sprintf("raw%d_%s", g, s.name))
		e.migrate(schema)
		r, err := runRaw(e.ctx, e.dbURL, s.data, g, g, plainUpserts(s.data, schema))
		if err != nil {
			e.b.Fatal(err)
		}
		if r.statements != s.data.statements() {
			e.b.Fatalf("raw applied %d upserts, want %d", r.statements, s.data.statements())
		}
		counts := e.rowCounts(schema)
		e.dropSchema(schema)
		if *want == ([tables]int64{}) {
			*want = counts
		} else if counts != *want {
			e.b.Fatalf("raw with %d goroutines left rows %v, another raw run %v", g, counts, *want)
		}
		n := len(s.data.events)
		e.logf("%s: raw, %d goroutine(s): %d upserts for %d events in %s: %.0f upserts/s = %.0f events/s (rows %v)",
			s.name, g, r.statements, n, r.elapsed.Round(time.Millisecond),
			float64(r.statements)/r.elapsed.Seconds(), float64(n)/r.elapsed.Seconds(), counts)
		out = append(out, r)
	}
	return out
}

// workerResult is one run of the worker subprocess.
type workerResult struct {
	committedAt    time.Duration // start → every offset committed (after SIGTERM once every pair is applied)
	firstAppliedAt time.Duration // start → first pair counted in /metrics (0: not seen)
	firstDone      int64         // the pairs /metrics counted then (read every pollEvery: often more than one)
	allAppliedAt   time.Duration // start → every pair counted in /metrics (0: not seen)
	peakRSS        int64         // bytes: VmHWM, else the largest VmRSS sampled
	stopTook       time.Duration // SIGTERM → exit
	fetched        int64         // records read from fetch responses (refetches included), 0: unknown
	batches        int64         // batch transactions, committed and rolled back (causet.projection.batch.size's count)
	batchPairs     int64         // the pairs of those transactions (its sum)
	cpu            time.Duration // user + system CPU of the worker until every pair was applied
	pgCPU          time.Duration // PostgreSQL's CPU over the same time (0: not measured)
	selfCPU        time.Duration // this process's over the same time: the kfake broker, the polling
	spans          spanStats     // the SDK's span counts when every pair was applied (OTLP on)
}

// fromFirstRow is the worker's rate once it applied its first pair, in
// events/s: the pairs applied after /metrics first counted some, over the
// time until it counted every one (of pairs, for n events); 0 when not
// seen. Unlike n over committedAt it leaves out the worker's start
// (process, connections, consumer group join, first fetch), as the raw
// methods' clock starts once their connections are open.
func (r workerResult) fromFirstRow(n int, pairs int64) float64 {
	if r.firstAppliedAt == 0 || r.allAppliedAt <= r.firstAppliedAt || pairs <= r.firstDone {
		return 0
	}
	return float64(n) * float64(pairs-r.firstDone) / float64(pairs) / (r.allAppliedAt - r.firstAppliedAt).Seconds()
}

// runWorker runs `projection-worker run` for s until its /metrics count
// every (event, projection) pair as applied, stale or dead-lettered, then
// stops it with SIGTERM, waits until the group has committed every event
// (the worker commits at shutdown) and checks that it exits with status 0.
// Without /metrics it waits for the periodic commit (5 s) instead.
func (e *env) runWorker(s *scenario) workerResult {
	b := e.b
	b.Helper()
	httpAddr := freeAddr(b)
	logDir := e.dir
	if d := os.Getenv("BENCH_LOG_DIR"); d != "" { // keep the worker's logs
		logDir = d
	}
	logPath := filepath.Join(logDir, "worker-"+s.name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	bin := e.bin
	if s.bin != "" {
		bin = s.bin
	}
	cmd := exec.Command(bin, "run",
		"--brokers", e.brokers,
		"--database-url", e.dbURL,
		"--projections", e.defs,
		"--topic", s.topic,
		"--dlq-topic", s.dlq,
		"--ledger-topic", s.ledger,
		"--partitions", strconv.Itoa(numPartitions),
		"--group", s.group,
		"--http-addr", httpAddr,
		"--worker-id", "bench",
		"--log-level", "warn",
	)
	cmd.Args = append(cmd.Args, strings.Fields(os.Getenv("BENCH_WORKER_FLAGS"))...)
	profPrefix := os.Getenv("BENCH_WORKER_CPUPROFILE")
	if profPrefix != "" {
		cmd.Args = append(cmd.Args, "--pprof")
	}
	cmd.Env = append(append(workerEnv(), s.env...), strings.Fields(os.Getenv("BENCH_WORKER_ENV"))...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	tail := func() string { return logTail(logPath, 30) }

	pg0, self0 := e.pg.used(), selfCPU()
	proc := startProcess(b, cmd, "projection-worker")
	defer proc.stop(0) // on failure: never leave the worker behind
	if profPrefix != "" {
		defer profileWorker(b, httpAddr, profPrefix+"."+s.name)()
	}
	start, exited, running := proc.start, proc.exited, true

	n := int64(len(s.data.events))
	pairs := int64(s.data.pairs)
	timeout := 5*time.Minute + time.Duration(n)*time.Millisecond
	var res workerResult
	var last int64
	lastProgress := time.Now()
	hc := &http.Client{Timeout: 2 * time.Second}
	sample := func() {
		if hwm := peakRSS(cmd.Process.Pid); hwm > res.peakRSS {
			res.peakRSS = hwm
		}
	}

	// Until every pair is applied (the worker's own counters) or, without
	// them, until the periodic commit (every 5 s) covers every event.
	// /metrics is read every pollEvery, and more often as the count nears
	// every pair (pollNext), so that the end is seen within a few ms, not
	// up to 100 ms late, without reading it (a page and the DLQ depth's
	// offsets) a hundred times a second all along.
	poll := time.NewTimer(pollEvery)
	defer poll.Stop()
	// BENCH_TIMELINE=1: the pairs done, each second (as BenchmarkWorkerInProcess).
	timeline, nextMark := os.Getenv("BENCH_TIMELINE") != "", time.Second
	for res.allAppliedAt == 0 && res.committedAt == 0 {
		select {
		case err := <-exited:
			running = false
			b.Fatalf("projection-worker exited before committing every event (%d of %d): %v\n%s", last, n, err, tail())
		case <-poll.C:
		}
		sample()
		next := pollEvery
		if done, ok := pairsDone(hc, httpAddr); ok {
			now := time.Since(start)
			if timeline && now >= nextMark {
				e.logf("%s: t=%.1fs: %d pairs done", s.name, now.Seconds(), done)
				nextMark = now.Truncate(time.Second) + time.Second
			}
			if done > 0 && res.firstAppliedAt == 0 {
				res.firstAppliedAt, res.firstDone = now, done
			}
			if done >= pairs {
				res.allAppliedAt = now
			}
			next = pollNext(done, pairs, now-res.firstAppliedAt)
		}
		got, err := e.committed(s.group, s.topic)
		if err != nil {
			poll.Reset(next)
			continue // the group may not exist yet
		}
		if got == n {
			res.committedAt = time.Since(start)
		}
		if got != last {
			last, lastProgress = got, time.Now()
		}
		if time.Since(start) > timeout || time.Since(lastProgress) > 3*time.Minute {
			b.Fatalf("projection-worker committed %d of %d events in %s (last progress %s ago)\n%s",
				got, n, time.Since(start).Round(time.Second), time.Since(lastProgress).Round(time.Second), tail())
		}
		poll.Reset(next)
	}
	sample()
	res.fetched = fetchedRecords(hc, httpAddr)
	if m, ok := scrape(hc, httpAddr); ok {
		res.batches = int64(m["causet_projection_batch_size_count"])
		res.batchPairs = int64(m["causet_projection_batch_size_sum"])
	}
	res.cpu = cpuTime(cmd.Process.Pid)
	res.selfCPU = selfCPU() - self0
	if pg0 > 0 {
		res.pgCPU = e.pg.used() - pg0
	}
	res.spans = scrapeSpans(hc, httpAddr)
	if profPrefix != "" { // and what it allocated, from its start
		saveProfile(b, httpAddr, "allocs", profPrefix+"."+s.name+".allocs.pprof")
	}

	// SIGTERM: the worker commits what it has applied and leaves the group;
	// the clock stops when the group's committed offsets cover every event,
	// not at the next periodic commit.
	stopAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatalf("SIGTERM projection-worker: %v", err)
	}
	deadline := time.After(60 * time.Second)
	for running || res.committedAt == 0 {
		if res.committedAt == 0 {
			if got, err := e.committed(s.group, s.topic); err == nil {
				if got == n {
					res.committedAt = time.Since(start)
				}
				last = got
			}
		}
		if !running {
			if res.committedAt == 0 {
				b.Fatalf("projection-worker exited 0 after SIGTERM with %d of %d events committed\n%s", last, n, tail())
			}
			break
		}
		select {
		case err := <-exited:
			running = false
			res.stopTook = time.Since(stopAt)
			if err != nil {
				b.Fatalf("projection-worker after SIGTERM: %v (want exit status 0)\n%s", err, tail())
			}
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			b.Fatalf("projection-worker did not exit within 60s of SIGTERM\n%s", tail())
		}
	}
	steady := "n/a"
	if eps := res.fromFirstRow(int(n), pairs); eps > 0 {
		steady = fmt.Sprintf("%.0f events/s", eps)
	}
	e.logf("%s: worker committed %d events in %s (first pair applied at %s, all pairs applied at %s; steady %s); peak RSS %.1f MiB; "+
		"CPU %s (%.1f µs/event; PostgreSQL %.1f µs/event); fetched %d records (%.2f× the events); %d batch transactions of %.0f pairs on average; exited 0 %s after SIGTERM",
		s.name, n, res.committedAt.Round(time.Millisecond), res.firstAppliedAt.Round(time.Millisecond), res.allAppliedAt.Round(time.Millisecond),
		steady, mib(res.peakRSS),
		res.cpu.Round(10*time.Millisecond), float64(res.cpu.Microseconds())/float64(n), float64(res.pgCPU.Microseconds())/float64(n),
		res.fetched, float64(res.fetched)/float64(n), res.batches, float64(res.batchPairs)/max(1, float64(res.batches)), res.stopTook.Round(time.Millisecond))
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > 0 && s.data.poisoned == 0 {
		e.logf("%s: worker log (warn and above):\n%s", s.name, tail())
	}
	return res
}

// pollEvery is how often runWorker reads a worker's /metrics while the
// end is not near.
const pollEvery = 100 * time.Millisecond

// pollNext returns when to read /metrics again after done of pairs were
// applied in the time since the first: half the time the rest should
// take at that rate, between 5 ms and pollEvery.
func pollNext(done, pairs int64, took time.Duration) time.Duration {
	if done <= 0 || took <= 0 || done >= pairs {
		return pollEvery
	}
	rest := time.Duration(float64(took) * float64(pairs-done) / float64(done) / 2)
	return min(max(rest, 5*time.Millisecond), pollEvery)
}

// freeAddr returns a 127.0.0.1 address with a port that was free just now.
func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// peakRSS returns the peak resident set size of pid in bytes (VmHWM of
// /proc/<pid>/status, or VmRSS without it), 0 when unreadable.
func peakRSS(pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	var hwm, rss int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmHWM":
			hwm = kb * 1024
		case "VmRSS":
			rss = kb * 1024
		}
	}
	return max(hwm, rss)
}

// cpuTime returns the user + system CPU time pid has used (fields 14 and
// 15 of /proc/<pid>/stat, in clock ticks of 1/100 s), 0 when unreadable.
func cpuTime(pid int) time.Duration { return ticks(procStat(pid), 14, 15) }

// selfCPU returns this process's user + system CPU time so far (cpuTime).
func selfCPU() time.Duration { return cpuTime(os.Getpid()) }

// scrape reads the worker's /metrics and returns the sum over all series of
// each metric name (labels dropped).
func scrape(hc *http.Client, addr string) (map[string]float64, bool) {
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sums[name] += v
		}
	}
	return sums, sc.Err() == nil
}

// pairsDone scrapes the worker's /metrics and returns the pairs applied,
// stale or dead-lettered so far.
func pairsDone(hc *http.Client, addr string) (int64, bool) {
	m, ok := scrape(hc, addr)
	if !ok {
		return 0, false
	}
	sum := m["causet_projection_applied_total"] + m["causet_projection_stale_total"] + m["causet_projection_dead_lettered_total"]
	return int64(math.Round(sum)), true
}

// spanStats are the OpenTelemetry SDK's own counts of the worker's spans,
// from its /metrics (served with OTLP on; the worker turns the SDK's
// observability on).
type spanStats struct {
	// served: /metrics has the batch span processor's
	// otel_sdk_processor_span_queue_capacity, so its drops are counted.
	served bool
	// dropped: otel_sdk_processor_span_processed_total with
	// error_type="queue_full", counted when a span finds the queue full (the
	// series without error_type only appears once spans are exported).
	dropped int64
	// sampled: otel_sdk_span_started_total with
	// otel_span_sampling_result="RECORD_AND_SAMPLE", the spans to export.
	sampled int64
}

// scrapeSpans reads the worker's spanStats from its /metrics.
func scrapeSpans(hc *http.Client, addr string) spanStats {
	var st spanStats
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "otel_sdk_processor_span_queue_capacity"):
			st.served = true
		case strings.HasPrefix(line, "otel_sdk_processor_span_processed_total") && strings.Contains(line, `error_type="queue_full"`):
			st.dropped += int64(v)
		case strings.HasPrefix(line, "otel_sdk_span_started_total") && strings.Contains(line, `otel_span_sampling_result="RECORD_AND_SAMPLE"`):
			st.sampled += int64(v)
		}
	}
	return st
}

// fetchedRecords returns the records the worker's client read from fetch
// responses (kotel's messaging.kafka.fetch_records.count), 0 when unknown.
func fetchedRecords(hc *http.Client, addr string) int64 {
	m, _ := scrape(hc, addr)
	for name, v := range m {
		if strings.HasPrefix(name, "messaging_kafka_fetch_records") {
			return int64(v)
		}
	}
	return 0
}

func logTail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, 64<<20))
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = append([]string{fmt.Sprintf("... (%d lines before)", len(all)-lines)}, all[len(all)-lines:]...)
	}
	return strings.Join(all, "\n")
}

// loadAvg returns the 1, 5 and 15 minute load averages of /proc/loadavg.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	return strings.Join(f[:min(3, len(f))], " ")
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// projections loads the benchmark's definitions file and its table
// projections, failing b on error.
func (e *env) projections(b *testing.B) (*projection.Definitions, []*projection.TableProjection) {
	b.Helper()
	defs, err := projection.LoadDefinitions(e.defs)
	if err != nil {
		b.Fatal(err)
	}
	tps, err := projection.NewTableProjections(defs)
	if err != nil {
		b.Fatal(err)
	}
	return defs, tps
}

// openConns returns a pool of at most n connections to url and n of its
// connections, acquired (so opened) before any clock starts; the caller
// releases them and closes the pool.
func openConns(ctx context.Context, url string, n int) (*pgxpool.Pool, []*pgxpool.Conn, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(n)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			for _, c := range conns[:i] {
				c.Release()
			}
			pool.Close()
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
	}
	return pool, conns, nil
}

// process is a subprocess a benchmark runs (the worker, Kafka Connect).
type process struct {
	cmd    *exec.Cmd
	start  time.Time
	exited chan error    // receives cmd.Wait's result, once
	done   chan struct{} // closed once the process has exited
}

// startProcess starts cmd (what names it in the failure).
func startProcess(b *testing.B, cmd *exec.Cmd, what string) *process {
	p := &process{cmd: cmd, exited: make(chan error, 1), done: make(chan struct{})}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", what, err)
	}
	go func() {
		err := cmd.Wait()
		close(p.done)
		p.exited <- err
	}()
	return p
}

// stop ends the process unless it has exited: SIGTERM, then SIGKILL after
// grace (at once with 0); it returns once the process has exited.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(grace):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// profiled numbers the CPU profiles profileWorker writes, over the runs.
var profiled atomic.Int64

// profileWorker takes CPU profiles of the worker serving /debug/pprof on
// httpAddr (run with --pprof), 5 s each, one after another, into
// prefix.<n>.pprof, until the returned stop is called; a profile cut short
// by the worker's exit is not kept. Merged (go tool pprof -proto
// prefix.*), they are a candidate PGO profile of the worker process.
// saveProfile writes the worker's pprof profile name (/debug/pprof/<name>)
// to path; a failure is reported as the test's error.
func saveProfile(b *testing.B, httpAddr, name, path string) {
	resp, err := http.Get("http://" + httpAddr + "/debug/pprof/" + name)
	if err != nil {
		b.Error(err)
		return
	}
	defer resp.Body.Close()
	prof, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("/debug/pprof/%s: %s", name, resp.Status)
	}
	if err == nil {
		err = os.WriteFile(path, prof, 0o644)
	}
	if err != nil {
		b.Error(err)
	}
}

func profileWorker(b *testing.B, httpAddr, prefix string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/debug/pprof/profile?seconds=5", nil)
			if err != nil {
				b.Error(err)
				return
			}
			var prof []byte
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				prof, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != http.StatusOK { // not listening yet, or gone
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			path := fmt.Sprintf("%s.%d.pprof", prefix, profiled.Add(1))
			if err := os.WriteFile(path, prof, 0o644); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
