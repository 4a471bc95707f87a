package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/pgtest"
)

// The peer benchmark's Kafka Connect settings (BenchmarkPeerKafkaConnect's doc
// says why these).
const (
	peerConnectTasks = 2    // tasks.max: one per core of the 2-core machine
	peerConnectBatch = 2000 // batch.size of the sink and consumer.max.poll.records
	// peerConnectHeap is connect-standalone.sh's default heap (KAFKA_HEAP_OPTS).
	peerConnectHeap = "-Xms256M -Xmx2G"
)

// BenchmarkPeerKafkaConnect is `make bench-peer` (issue 11 item 4): the same
// rows into the same PostgreSQL tables, once by the projection-worker binary and
// once by Apache Kafka Connect 4.4 standalone with Debezium's JDBC sink
// connector, on a real Apache Kafka broker, alternated; then with 1 % of the
// events poisoned. It runs only when BENCH_PEER_BROKERS names the broker
// (make bench-peer starts one of its own on 127.0.0.1:39092) and needs Java 17+
// and the jars of scripts/kafka-connect-fetch.sh (BENCH_PEER_CONNECT_DIR,
// default <repo>/.kafka-connect).
//
// The dataset is make bench's (BENCH_EVENTS events, default 200000; 8
// partitions keyed by user). The worker reads the projection events and its
// definitions (testdata/projections.yaml) turn each into one row per
// (event, projection) pair. A sink connector writes one flat record into one
// table, so the benchmark renders the same rows itself, as JSON with an inline
// schema (JsonConverter), one topic per table with the same partitioning and
// order; Connect's RegexRouter maps a topic to its table. The sink upserts by
// primary key (insert.mode=upsert, primary.key.mode=record_value), with
// peerConnectTasks tasks, batch.size and max.poll.records peerConnectBatch and
// use.reduction.buffer=true (one row per key per batch), into tables that
// `projection-worker migrate` created (schema.evolution=none), so both write
// the same columns, _causet_seq included.
//
// Poison: in the worker's topic a poisoned ARTIST_FOLLOWED has games 0, so the
// artist_followers score derive divides by zero and that pair is dead-lettered
// (user_follows still applies the event). For Connect the row of that pair
// cannot be computed either: its record carries the score as the text "NaN",
// which the bigint column rejects (SQLSTATE 42804). Connect runs the poisoned
// topics twice: errors.tolerance=none (the default) and errors.tolerance=all
// with a dead-letter queue topic.
//
// Each run has its own consumer group and freshly migrated tables. Its time
// runs from starting the process until its consumer group's committed offsets
// cover every record (the worker is sent SIGTERM, on which it commits, once its
// /metrics count every pair; Connect commits every second,
// offset.flush.interval.ms=1000); "from the first row" starts when the first
// row is visible in the tables. Peak RSS is VmHWM of the process (the JVM's
// or the worker's). Each final table is compared with the expected state (the
// dataset's rows applied by plain upserts in partition order, without the
// poisoned pairs) by its row count and two order-independent sums of a hash of
// each row's text. Connect writes into a database of its own (see database);
// it finds its plugins by their ServiceLoader manifests
// (plugin.discovery=service_load).
//
// BENCH_PEER_ROUNDS (default 2) is the number of clean runs of each;
// BENCH_WORKER_FLAGS (space-separated) adds flags to `projection-worker run`, as
// in make bench.
func BenchmarkPeerKafkaConnect(b *testing.B) {
	brokers := os.Getenv("BENCH_PEER_BROKERS")
	if brokers == "" {
		b.Skip("BENCH_PEER_BROKERS is not set: the peer benchmark needs a real Apache Kafka broker (make bench-peer starts one)")
	}
	p := newPeerEnv(b, brokers)
	rounds := 2
	if s := os.Getenv("BENCH_PEER_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			b.Fatalf("BENCH_PEER_ROUNDS=%q: want an integer >= 1", s)
		}
	}
	n := benchEvents(b)
	b.ResetTimer()

	var runs []peerRun
	clean := p.newPeerData("clean", newDataset(n, noPoison))
	for r := range rounds {
		// Alternate who goes first, so that neither always runs on a warmer
		// page cache or a quieter machine.
		if r%2 == 0 {
			runs = append(runs, p.runWorker(clean, r), p.runConnect(clean, r, false))
		} else {
			runs = append(runs, p.runConnect(clean, r, false), p.runWorker(clean, r))
		}
	}
	poison := p.newPeerData("poison", newDataset(n, derivePoison))
	runs = append(runs, p.runWorker(poison, 0), p.runConnect(poison, 0, false), p.runConnect(poison, 1, true))
	b.StopTimer()

	p.report(n, runs)
}

// peerEnv is what the runs of BenchmarkPeerKafkaConnect share.
type peerEnv struct {
	b          *testing.B
	ctx        context.Context
	brokers    string
	adm        *kadm.Client
	dbURL      string
	pg         *pgconn.Config
	pool       *pgxpool.Pool
	bin        string // projection-worker binary
	defs       string // absolute path of the definitions file
	java       string
	connectDir string // lib/ and plugins/ of scripts/kafka-connect-fetch.sh
	log4j      string // Connect's log4j2.properties
	dir        string
	id         string
}

func newPeerEnv(b *testing.B, brokers string) *peerEnv {
	p := &peerEnv{b: b, ctx: context.Background(), brokers: brokers, dir: b.TempDir(), id: randomID()}
	p.dbURL = pgtest.URL(b)
	var err error
	if p.pg, err = pgconn.ParseConfig(p.dbURL); err != nil {
		b.Fatalf("DATABASE_URL: %v", err)
	}
	if p.defs, err = filepath.Abs(projectionsFile); err != nil {
		b.Fatal(err)
	}
	if p.log4j, err = filepath.Abs("../../scripts/kafka-connect/log4j2.properties"); err != nil {
		b.Fatal(err)
	}
	p.connectDir = os.Getenv("BENCH_PEER_CONNECT_DIR")
	if p.connectDir == "" {
		p.connectDir, _ = filepath.Abs("../../.kafka-connect")
	}
	for _, sub := range []string{"lib", "plugins/debezium-connector-jdbc"} {
		if _, err := os.Stat(filepath.Join(p.connectDir, sub)); err != nil {
			b.Fatalf("BENCH_PEER_CONNECT_DIR=%s has no %s: run scripts/kafka-connect-fetch.sh first (%v)", p.connectDir, sub, err)
		}
	}
	p.java = "java"
	if h := os.Getenv("JAVA_HOME"); h != "" {
		p.java = filepath.Join(h, "bin", "java")
	}
	p.bin = filepath.Join(p.dir, "projection-worker")
	if out, err := exec.Command("go", "build", "-o", p.bin, "github.com/causet/projection-worker/cmd/projection-worker").CombinedOutput(); err != nil {
		b.Fatalf("go build projection-worker: %v\n%s", err, out)
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(kcl.Close)
	p.adm = kadm.NewClient(kcl)
	p.pool = p.newPool(p.dbURL)
	return p
}

func (p *peerEnv) logf(format string, args ...any) { fmt.Printf("bench-peer: "+format+"\n", args...) }

// migrate migrates a fresh tenant schema in the database of dbURL (dropping
// an earlier one of the same name through pool); it is dropped when the
// benchmark ends.
func (p *peerEnv) migrate(dbURL string, pool *pgxpool.Pool, schema string) string {
	p.b.Helper()
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			p.b.Errorf("drop schema %s: %v", schema, err)
		}
	}
	drop()
	cmd := exec.Command(p.bin, "migrate", "--database-url", dbURL, "--projections", p.defs,
		"--log-level", "warn", "--tenant-schema", schema)
	cmd.Env = workerEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		p.b.Fatalf("projection-worker migrate %s: %v\n%s", schema, err, out)
	}
	p.b.Cleanup(drop)
	return schema
}

// database creates database name and returns its URL and a pool on it; both
// go when the benchmark ends. Kafka Connect writes into a database of its
// own: the Debezium JDBC sink looks a table up by name in the JDBC metadata,
// across schemas, and the shared test database holds thousands of tables of
// the same names.
func (p *peerEnv) database(name string) (string, *pgxpool.Pool) {
	b := p.b
	b.Helper()
	u, err := url.Parse(p.dbURL)
	if err != nil || u.Scheme == "" {
		b.Fatalf("DATABASE_URL: the peer benchmark needs a postgres:// URL (%v)", err)
	}
	u.Path = "/" + name
	if _, err := p.pool.Exec(p.ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		b.Fatalf("create database %s: %v", name, err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := p.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			b.Errorf("drop database %s: %v", name, err)
		}
	})
	return u.String(), p.newPool(u.String()) // closed before the database is dropped
}

// newPool returns a pool on dbURL whose sessions render timestamps in UTC (the
// digests compare rows as text); it is closed when the benchmark ends.
func (p *peerEnv) newPool(dbURL string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		p.b.Fatalf("DATABASE_URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pool, err := pgxpool.NewWithConfig(p.ctx, cfg)
	if err != nil {
		p.b.Fatal(err)
	}
	p.b.Cleanup(pool.Close)
	if err := pool.Ping(p.ctx); err != nil {
		p.b.Fatalf("ping PostgreSQL: %v", err)
	}
	return pool
}

func (p *peerEnv) createTopics(topics ...string) {
	p.b.Helper()
	resp, err := p.adm.CreateTopics(p.ctx, numPartitions, 1, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		p.b.Fatalf("create topics %v: %v", topics, err)
	}
}

// topicRecords returns the records in topics (end offsets summed); with
// mayBeMissing, a topic that does not exist counts 0.
func (p *peerEnv) topicRecords(mayBeMissing bool, topics ...string) int64 {
	p.b.Helper()
	ends, err := p.adm.ListEndOffsets(p.ctx, topics...)
	if err != nil {
		p.b.Fatalf("end offsets of %v: %v", topics, err)
	}
	var n int64
	for _, parts := range ends {
		for _, o := range parts {
			switch {
			case o.Err == nil:
				n += o.Offset
			case !mayBeMissing || !errors.Is(o.Err, kerr.UnknownTopicOrPartition):
				p.b.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
			}
		}
	}
	return n
}

// committed returns the sum of group's committed offsets (−1: none yet).
func (p *peerEnv) committed(group string) int64 {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	offs, err := p.adm.FetchOffsets(ctx, group)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			sum += o.At
		}
	})
	return sum
}

// peerData is one dataset produced twice: as projection events for the
// worker and as flat per-table records for Connect; and its expected state.
type peerData struct {
	name     string
	data     *dataset
	tenant   string              // the worker's tenant schema (named in its events)
	events   string              // the worker's topic
	tables   [tables]string      // Connect's topics, one per table (tableNames order)
	records  int64               // records in the Connect topics
	expected string              // schema holding the expected state
	want     [tables]tableDigest // of the expected state
}

func (p *peerEnv) newPeerData(name string, d *dataset) *peerData {
	b := p.b
	b.Helper()
	pd := &peerData{
		name:     name,
		data:     d,
		tenant:   "peer_w_" + name + "_" + p.id,
		events:   "peer-" + p.id + "-" + name + "-events",
		expected: "peer_x_" + name + "_" + p.id,
	}
	for i, t := range tableNames {
		pd.tables[i] = "peer-" + p.id + "-" + name + "-" + t
	}
	p.migrate(p.dbURL, p.pool, pd.expected)
	p.createTopics(append([]string{pd.events}, pd.tables[:]...)...)
	start := time.Now()
	if err := produce(p.ctx, []kgo.Opt{kgo.SeedBrokers(p.brokers)}, pd.events, pd.tenant, pd.tenant, d); err != nil {
		b.Fatalf("produce events: %v", err)
	}
	if err := produceRows(p.ctx, []kgo.Opt{kgo.SeedBrokers(p.brokers)}, pd.tables, d); err != nil {
		b.Fatalf("produce rows: %v", err)
	}
	pd.records = p.topicRecords(false, pd.tables[:]...)
	if got := p.topicRecords(false, pd.events); got != int64(len(d.events)) || pd.records != int64(d.pairs) {
		b.Fatalf("%s: topics hold %d events and %d rows, want %d and %d", name, got, pd.records, len(d.events), d.pairs)
	}
	p.logf("%s: produced %d events and their %d rows (%d poisoned) in %s", name, len(d.events), d.pairs, d.poisoned, time.Since(start).Round(time.Millisecond))
	r, err := runRaw(p.ctx, p.dbURL, d, numPartitions, numPartitions, plainUpserts(d, pd.expected))
	if err != nil {
		b.Fatalf("expected state: %v", err)
	}
	if r.statements != d.statements() {
		b.Fatalf("expected state: %d upserts, want %d", r.statements, d.statements())
	}
	pd.want = p.digest(p.pool, pd.expected)
	p.logf("%s: expected state %s rows (plain upserts in %s)", name, rowsOf(pd.want), r.elapsed.Round(time.Millisecond))
	return pd
}

// tableDigest identifies the contents of a table: its rows and two sums of a
// hash of each row's text, which do not depend on the order of the rows.
type tableDigest struct{ rows, h1, h2 int64 }

// digest returns the digests of schema's projection tables.
func (p *peerEnv) digest(pool *pgxpool.Pool, schema string) [tables]tableDigest {
	p.b.Helper()
	var d [tables]tableDigest
	for i, t := range tableNames {
		q := "SELECT count(*), coalesce(sum(hashtext(r::text)), 0)::bigint, coalesce(sum(hashtext(r::text || '|')), 0)::bigint FROM " +
			pgx.Identifier{schema, t}.Sanitize() + " r"
		if err := pool.QueryRow(p.ctx, q).Scan(&d[i].rows, &d[i].h1, &d[i].h2); err != nil {
			p.b.Fatalf("digest of %s.%s: %v", schema, t, err)
		}
	}
	return d
}

// rowsOf returns the row counts of digests, as "[a b c]".
func rowsOf(d [tables]tableDigest) string {
	return fmt.Sprintf("[%d %d %d]", d[0].rows, d[1].rows, d[2].rows)
}

// anyRow reports whether any table of schema has a row.
func (p *peerEnv) anyRow(pool *pgxpool.Pool, schema string) bool {
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, t := range tableNames {
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("EXISTS (SELECT 1 FROM " + pgx.Identifier{schema, t}.Sanitize() + ")")
	}
	var ok bool
	_ = pool.QueryRow(p.ctx, q.String()).Scan(&ok)
	return ok
}

// peerRun is the outcome of one run of the worker or of Connect.
type peerRun struct {
	System   string  `json:"system"`  // "worker" or "connect"
	Dataset  string  `json:"dataset"` // "clean" or "poison"
	Setting  string  `json:"setting,omitempty"`
	Seconds  float64 `json:"seconds"`               // start → committed offsets cover every record; 0: never
	FirstRow float64 `json:"first_row_seconds"`     // start → first row visible; 0: never
	EPS      float64 `json:"events_per_s"`          // N / Seconds
	EPSFirst float64 `json:"events_per_s_first"`    // N / (Seconds − FirstRow)
	PeakRSS  float64 `json:"peak_rss_mib"`          // VmHWM
	Dead     int64   `json:"dead_letters"`          // records in its dead-letter topic
	Equal    bool    `json:"tables_equal_expected"` // every table's rows are the expected state's
	Rows     int64   `json:"rows"`                  // rows in its tables
	Want     int64   `json:"rows_expected"`
	Poison   string  `json:"poison,omitempty"`      // what happened to the poisoned records
	Failed   string  `json:"task_failed,omitempty"` // Connect: the first failed task's error
}

// watch samples a running process every 100 ms until done reports true or
// failed returns a reason, and fills r's times and peak RSS. It returns the
// reason of a failure ("" when done) and whether it received the process's
// exit (status 0, with done true); it fails b when the process exits before
// done or stalls for 3 minutes.
func (p *peerEnv) watch(r *peerRun, pid int, exited <-chan error, pool *pgxpool.Pool, schema string, start time.Time,
	progress func() int64, done func() bool, failed func() string, tail func() string) (why string, exited0 bool) {
	b := p.b
	var rss int64
	last, lastAt := int64(-2), time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	defer func() { r.PeakRSS = mib(rss) }()
	for i := 0; ; i++ {
		select {
		case err := <-exited:
			// The worker exits on the SIGTERM that done sends once every
			// pair is applied; it must have committed every record by then.
			if err == nil && done() {
				r.Seconds = time.Since(start).Seconds()
				return "", true
			}
			b.Fatalf("%s %s exited before it was done: %v\n%s", r.System, r.Dataset, err, tail())
		case <-tick.C:
		}
		rss = max(rss, peakRSS(pid))
		if r.FirstRow == 0 && p.anyRow(pool, schema) {
			r.FirstRow = time.Since(start).Seconds()
		}
		if done() {
			r.Seconds = time.Since(start).Seconds()
			rss = max(rss, peakRSS(pid))
			return "", false
		}
		if i%10 == 0 { // once a second: REST calls and offset fetches
			if why := failed(); why != "" {
				rss = max(rss, peakRSS(pid))
				return why, false
			}
			if got := progress(); got != last {
				last, lastAt = got, time.Now()
			} else if time.Since(lastAt) > 3*time.Minute {
				b.Fatalf("%s %s: no progress for 3 minutes (at %d)\n%s", r.System, r.Dataset, got, tail())
			}
		}
	}
}

// runWorker runs `projection-worker run` on pd's events into a fresh tenant
// schema.
func (p *peerEnv) runWorker(pd *peerData, round int) peerRun {
	b := p.b
	b.Helper()
	r := peerRun{System: "worker", Dataset: pd.name}
	p.migrate(p.dbURL, p.pool, pd.tenant)
	runtime.GC() // this process's garbage collected now, not during the run (quiesce)
	suffix := fmt.Sprintf("%s-%d-%s", pd.name, round, p.id)
	group, dlq, ledger := "peer-worker-"+suffix, "peer-dlq-"+suffix, "peer-ledger-"+suffix
	httpAddr := freeAddr(b)
	logPath := filepath.Join(p.dir, "worker-"+suffix+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(p.bin, "run", "--brokers", p.brokers, "--database-url", p.dbURL,
		"--projections", p.defs, "--topic", pd.events, "--dlq-topic", dlq, "--ledger-topic", ledger,
		"--partitions", strconv.Itoa(numPartitions), "--group", group, "--http-addr", httpAddr,
		"--worker-id", "bench-peer", "--log-level", "warn")
	cmd.Args = append(cmd.Args, strings.Fields(os.Getenv("BENCH_WORKER_FLAGS"))...)
	cmd.Env = workerEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	tail := func() string { return logTail(logPath, 30) }
	hc := &http.Client{Timeout: 2 * time.Second}
	n := int64(len(pd.data.events))

	proc := startProcess(b, cmd, "projection-worker")
	defer proc.stop(0) // on failure: never leave the worker behind
	start, exited := proc.start, proc.exited
	signalled := false
	_, gone := p.watch(&r, cmd.Process.Pid, exited, p.pool, pd.tenant, start,
		func() int64 { return p.committed(group) },
		func() bool {
			if !signalled {
				if got, ok := pairsDone(hc, httpAddr); ok && got >= int64(pd.data.pairs) {
					// Every pair is applied or dead-lettered: SIGTERM makes
					// the worker commit now instead of at its next periodic
					// commit (5 s).
					_ = cmd.Process.Signal(syscall.SIGTERM)
					signalled = true
				}
			}
			return p.committed(group) == n
		},
		func() string { return "" }, tail)
	if !gone {
		select {
		case err := <-exited:
			if err != nil {
				b.Fatalf("projection-worker: %v (want exit status 0)\n%s", err, tail())
			}
		case <-time.After(60 * time.Second):
			b.Fatalf("projection-worker did not exit within 60s of SIGTERM\n%s", tail())
		}
	}
	r.Dead = p.topicRecords(false, dlq)
	if pd.data.poisoned > 0 {
		r.Poison = fmt.Sprintf("%d dead letters for %d poisoned pairs; the rest applied", r.Dead, pd.data.poisoned)
	}
	p.finish(&r, pd, p.pool, pd.tenant)
	return r
}

// finish fills r's rates and compares schema's tables with the expected
// state.
func (p *peerEnv) finish(r *peerRun, pd *peerData, pool *pgxpool.Pool, schema string) {
	n := float64(len(pd.data.events))
	if r.Seconds > 0 {
		r.EPS = n / r.Seconds
		if r.FirstRow > 0 && r.Seconds > r.FirstRow {
			r.EPSFirst = n / (r.Seconds - r.FirstRow)
		}
	}
	got := p.digest(pool, schema)
	r.Equal = got == pd.want
	for i := range got {
		r.Rows += got[i].rows
		r.Want += pd.want[i].rows
	}
	p.logf("%s %s %s: %.1f s (first row at %.1f s): %.0f events/s (%.0f from the first row); peak RSS %.0f MiB; "+
		"rows %s, expected %s, equal: %t; dead letters %d; %s %s",
		r.System, r.Dataset, r.Setting, r.Seconds, r.FirstRow, r.EPS, r.EPSFirst, r.PeakRSS,
		rowsOf(got), rowsOf(pd.want), r.Equal, r.Dead, r.Poison, r.Failed)
}

// connectStatus is the part of Connect's GET /connectors/{name}/status read
// here.
type connectStatus struct {
	Tasks []struct {
		ID    int    `json:"id"`
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
}

// runConnect runs Kafka Connect standalone with the Debezium JDBC sink on pd's
// per-table topics into a fresh schema; tolerate sets errors.tolerance=all with
// a dead-letter queue topic.
func (p *peerEnv) runConnect(pd *peerData, round int, tolerate bool) peerRun {
	b := p.b
	b.Helper()
	r := peerRun{System: "connect", Dataset: pd.name}
	suffix := fmt.Sprintf("%s-%d-%s", pd.name, round, p.id)
	name := "peer-" + suffix
	group := "connect-" + name // Connect's sink group: connect-<connector name>
	dbURL, pool := p.database(fmt.Sprintf("peer_c_%s_%d_%s", pd.name, round, p.id))
	schema := p.migrate(dbURL, pool, "peer")
	runtime.GC() // as runWorker
	dlq := "peer-connect-dlq-" + suffix
	dir := filepath.Join(p.dir, "connect-"+suffix)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	restAddr := freeAddr(b)
	worker := map[string]string{
		"bootstrap.servers":              p.brokers,
		"key.converter":                  "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "true",
		"offset.storage.file.filename":   filepath.Join(dir, "offsets"),
		"offset.flush.interval.ms":       "1000",
		"plugin.path":                    filepath.Join(p.connectDir, "plugins"),
		// The connectors' ServiceLoader manifests only: no reflective scan of
		// plugin.path and the classpath, which took 40 s of a start here.
		"plugin.discovery":          "service_load",
		"listeners":                 "http://" + restAddr,
		"consumer.max.poll.records": strconv.Itoa(peerConnectBatch),
	}
	jdbc := url.URL{Scheme: "postgresql", Host: fmt.Sprintf("%s:%d", p.pg.Host, p.pg.Port), Path: "/" + pool.Config().ConnConfig.Database,
		RawQuery: url.Values{"currentSchema": {schema}}.Encode()}
	connector := map[string]string{
		"name":                         name,
		"connector.class":              "io.debezium.connector.jdbc.JdbcSinkConnector",
		"tasks.max":                    strconv.Itoa(peerConnectTasks),
		"topics":                       strings.Join(pd.tables[:], ","),
		"connection.url":               "jdbc:" + jdbc.String(),
		"connection.username":          p.pg.User,
		"connection.password":          p.pg.Password,
		"insert.mode":                  "upsert",
		"primary.key.mode":             "record_value",
		"primary.key.fields":           "artist_id,user_id",
		"schema.evolution":             "none",
		"batch.size":                   strconv.Itoa(peerConnectBatch),
		"use.reduction.buffer":         "true",
		"transforms":                   "table",
		"transforms.table.type":        "org.apache.kafka.connect.transforms.RegexRouter",
		"transforms.table.regex":       ".*-(" + strings.Join(tableNames[:], "|") + ")",
		"transforms.table.replacement": "$1",
	}
	r.Setting = "errors.tolerance=none"
	if tolerate {
		r.Setting = "errors.tolerance=all, DLQ topic"
		connector["errors.tolerance"] = "all"
		connector["errors.log.enable"] = "true"
		connector["errors.deadletterqueue.topic.name"] = dlq
		connector["errors.deadletterqueue.topic.replication.factor"] = "1"
		connector["errors.deadletterqueue.context.headers.enable"] = "true"
	}
	workerProps, connectorProps := filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties")
	writeProperties(b, workerProps, worker)
	writeProperties(b, connectorProps, connector)
	args := append(strings.Fields(peerConnectHeap), "-XX:+UseG1GC", "-Djava.awt.headless=true",
		"-Duser.timezone=UTC", "-Dlog4j2.configurationFile="+p.log4j, "-Dkafka.logs.dir="+dir,
		"-cp", filepath.Join(p.connectDir, "lib", "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone", workerProps, connectorProps)
	cmd := exec.Command(p.java, args...)
	out, err := os.Create(filepath.Join(dir, "connect.out"))
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	logPath := filepath.Join(dir, "connect.log")
	tail := func() string { return logTail(logPath, 40) + "\n" + logTail(out.Name(), 10) }
	hc := &http.Client{Timeout: 2 * time.Second}

	proc := startProcess(b, cmd, "Kafka Connect")
	defer proc.stop(30 * time.Second) // SIGTERM, then SIGKILL after 30 s
	start, exited := proc.start, proc.exited
	var failedAt time.Time
	why, _ := p.watch(&r, cmd.Process.Pid, exited, pool, schema, start,
		func() int64 { return p.committed(group) },
		func() bool { return p.committed(group) == pd.records },
		func() string {
			st, ok := connectorStatus(hc, restAddr, name)
			if !ok {
				return ""
			}
			failed, trace := 0, ""
			for _, t := range st.Tasks {
				if t.State == "FAILED" {
					failed++
					if trace == "" {
						trace = t.Trace
					}
				}
			}
			if failed == 0 || failed < len(st.Tasks) {
				return ""
			}
			// Every task failed; give the database a few seconds to show
			// what they had committed.
			if failedAt.IsZero() {
				failedAt = time.Now()
			}
			if time.Since(failedAt) < 3*time.Second {
				return ""
			}
			return fmt.Sprintf("%d of %d tasks FAILED: %s", failed, len(st.Tasks), firstCause(trace))
		}, tail)
	r.Failed = why
	r.Dead = p.topicRecords(true, dlq)
	switch {
	case pd.data.poisoned == 0:
	case why != "":
		r.Poison = fmt.Sprintf("every task failed; offsets committed for %d of %d records", max(p.committed(group), 0), pd.records)
	default:
		r.Poison = fmt.Sprintf("%d records in its DLQ topic for %d poisoned records", r.Dead, pd.data.poisoned)
	}
	p.finish(&r, pd, pool, schema)
	return r
}

// connectorStatus reads Connect's REST status of connector name.
func connectorStatus(hc *http.Client, addr, name string) (connectStatus, bool) {
	var st connectStatus
	resp, err := hc.Get("http://" + addr + "/connectors/" + url.PathEscape(name) + "/status")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, false
	}
	return st, json.NewDecoder(resp.Body).Decode(&st) == nil
}

// firstCause returns the innermost "Caused by:" line of a Java stack trace, or
// its first line.
func firstCause(trace string) string {
	line, _, _ := strings.Cut(trace, "\n")
	for _, l := range strings.Split(trace, "\n") {
		if c, ok := strings.CutPrefix(strings.TrimSpace(l), "Caused by: "); ok {
			line = c
		}
	}
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}

// writeProperties writes a Java properties file of kv (sorted keys; values
// escaped as java.util.Properties reads them).
func writeProperties(b *testing.B, path string, kv map[string]string) {
	b.Helper()
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	esc := strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	var s strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&s, "%s=%s\n", k, esc.Replace(kv[k]))
	}
	if err := os.WriteFile(path, []byte(s.String()), 0o600); err != nil {
		b.Fatal(err)
	}
}

// report prints the table and the JSON line of BenchmarkPeerKafkaConnect.
func (p *peerEnv) report(n int, runs []peerRun) {
	fmt.Printf("\nN=%d events; load average %s; %d cores\n\n", n, loadAvg(), runtime.NumCPU())
	fmt.Println("| run | events/s | from first row | peak RSS MiB | poison | final tables = expected |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, r := range runs {
		label := r.System + ", " + r.Dataset
		if r.Setting != "" && r.Dataset == "poison" {
			label += ", " + r.Setting
		}
		eps, first := "failed", "–"
		if r.Seconds > 0 {
			eps, first = fmt.Sprintf("%.0f", r.EPS), fmt.Sprintf("%.0f", r.EPSFirst)
		}
		poison := r.Poison
		if poison == "" {
			poison = "–"
		}
		eq := "yes"
		if !r.Equal {
			eq = fmt.Sprintf("no (%d rows, expected %d)", r.Rows, r.Want)
		}
		fmt.Printf("| %s | %s | %s | %.0f | %s | %s |\n", label, eps, first, r.PeakRSS, poison, eq)
	}
	var wEPS, cEPS, wRSS, cRSS []float64
	for _, r := range runs {
		if r.Dataset != "clean" {
			continue
		}
		if r.System == "worker" {
			wEPS, wRSS = append(wEPS, r.EPS), append(wRSS, r.PeakRSS)
		} else {
			cEPS, cRSS = append(cEPS, r.EPS), append(cRSS, r.PeakRSS)
		}
	}
	sum := struct {
		N          int       `json:"n"`
		WorkerEPS  float64   `json:"worker_events_per_s_median"`
		ConnectEPS float64   `json:"connect_events_per_s_median"`
		Speedup    float64   `json:"speedup"`
		WorkerRSS  float64   `json:"worker_peak_rss_mib_max"`
		ConnectRSS float64   `json:"connect_peak_rss_mib_max"`
		RSSRatio   float64   `json:"rss_ratio"`
		Runs       []peerRun `json:"runs"`
	}{N: n, WorkerEPS: median(wEPS), ConnectEPS: median(cEPS), WorkerRSS: slices.Max(wRSS), ConnectRSS: slices.Max(cRSS), Runs: runs}
	sum.Speedup = sum.WorkerEPS / sum.ConnectEPS
	sum.RSSRatio = sum.WorkerRSS / sum.ConnectRSS
	fmt.Printf("\nclean medians: worker %.0f events/s, Kafka Connect + Debezium JDBC %.0f events/s: %.2f× (target ≥ 2.5×); "+
		"peak RSS %.0f MiB against %.0f MiB: %.2f (target ≤ 0.33)\n", sum.WorkerEPS, sum.ConnectEPS, sum.Speedup, sum.WorkerRSS, sum.ConnectRSS, sum.RSSRatio)
	line, err := json.Marshal(sum)
	if err != nil {
		p.b.Fatal(err)
	}
	fmt.Printf("bench-peer-json: %s\n", line)
	p.b.ReportMetric(sum.WorkerEPS, "worker_events/s")
	p.b.ReportMetric(sum.ConnectEPS, "connect_events/s")
	p.b.ReportMetric(sum.Speedup, "speedup")
	p.b.ReportMetric(sum.RSSRatio, "rss_ratio")
}
