package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/plugin/kslog"
	"go.uber.org/goleak"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/otlptest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
	"github.com/causet/projection-worker/schemas"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// FaultKinds is every fault the soak injects; SOAK_FAULTS picks some
// ("all", the default, or a comma list; "none" for a clean run).
var FaultKinds = []string{
	// instances
	"join", "leave", "kill",
	// Kafka, through kfake's control hooks
	"dlq-refuse-retriable", "dlq-refuse-fatal", "dlq-slow", "dlq-unanswered",
	"leader-move", "coordinator-move", "fetch-error", "commit-error",
	// PostgreSQL
	"pg-terminate", "proxy-cut", "proxy-blackhole", "proxy-slow",
	"statement-timeout", "lock-wait", "read-only",
}

// settings are the soak's parameters, from the environment.
type settings struct {
	duration  time.Duration // SOAK_DURATION: the fault phase
	drain     time.Duration // SOAK_DRAIN: bound on draining after the last fault
	seed      uint64        // SOAK_SEED
	faults    []string      // SOAK_FAULTS
	causes    []string      // SOAK_CAUSES: poison causes (default all but plan-panic)
	instances int           // SOAK_INSTANCES at start
	rate      int           // SOAK_RATE events per second
	logPath   string        // SOAK_LOG
	// sabotage, for the checker's self-test.
	dropDeadLetters bool  // the workers' dead-letter writer acknowledges without writing
	commitAhead     int64 // the broker stores every commit this far ahead
}

func loadSettings(t *testing.T) settings {
	s := settings{duration: 10 * time.Minute, drain: 120 * time.Second, instances: 3, rate: 60}
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	var err error
	if v := env("SOAK_DURATION"); v != "" {
		if s.duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
	}
	if v := env("SOAK_DRAIN"); v != "" {
		if s.drain, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SOAK_DRAIN: %v", err)
		}
	}
	s.seed = rand.Uint64() >> 12
	if v := env("SOAK_SEED"); v != "" {
		if s.seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SOAK_SEED: %v", err)
		}
	}
	for k, dst := range map[string]*int{"SOAK_INSTANCES": &s.instances, "SOAK_RATE": &s.rate} {
		if v := env(k); v != "" {
			if *dst, err = strconv.Atoi(v); err != nil || *dst < 1 {
				t.Fatalf("%s: want a positive integer, got %q", k, v)
			}
		}
	}
	s.faults = parseList(t, "SOAK_FAULTS", env("SOAK_FAULTS"), FaultKinds)
	// "all" is every cause but the opt-in ones; "all,plan-panic" adds one.
	causes := env("SOAK_CAUSES")
	if rest, ok := strings.CutPrefix(causes, "all,"); ok {
		s.causes = append(slices.Clone(PoisonCauses), parseList(t, "SOAK_CAUSES", rest, OptInCauses)...)
	} else {
		s.causes = parseList(t, "SOAK_CAUSES", causes, append(slices.Clone(PoisonCauses), OptInCauses...))
		if causes == "" || causes == "all" {
			s.causes = slices.Clone(PoisonCauses)
		}
	}
	s.logPath = env("SOAK_LOG")
	if s.logPath == "" {
		// The pid keeps concurrent runs of one seed apart.
		s.logPath = filepath.Join(os.TempDir(), fmt.Sprintf("soak-%d-%d.log", s.seed, os.Getpid()))
	}
	return s
}

// parseList reads "all", "none" or a comma list of known names.
func parseList(t *testing.T, name, v string, known []string) []string {
	switch v {
	case "", "all":
		return slices.Clone(known)
	case "none":
		return nil
	}
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(known, f) {
			t.Fatalf("%s: unknown %q; known: all, none, %s", name, f, strings.Join(known, ","))
		}
		out = append(out, f)
	}
	return out
}

// TestSoak is make soak: SOAK_DURATION of faults against several workers,
// then the invariants. It runs only when SOAK_DURATION is set.
func TestSoak(t *testing.T) {
	if os.Getenv("SOAK_DURATION") == "" {
		t.Skip("the fault soak runs with SOAK_DURATION set (make soak; make test runs a short one)")
	}
	s := loadSettings(t)
	rep := runSoak(t, s)
	rep.Print(os.Stdout, 8)
	fmt.Printf("soak seed %d: %s (log: %s)\n", s.seed, map[bool]string{true: "FAIL", false: "PASS"}[rep.Failed()], s.logPath)
	if rep.Failed() {
		t.Fatalf("soak seed %d failed: %d violations, %d stalls; reproduce with SOAK_SEED=%d SOAK_DURATION=%s SOAK_FAULTS=%s",
			s.seed, len(rep.Violations), len(rep.Stalls), s.seed, s.duration, strings.Join(s.faults, ","))
	}
}

// TestSoakCheckerFails proves the checks can fail: a dead-letter writer that
// acknowledges without writing must break invariants 1 and 2, and a broker
// that stores every commit ahead of what was sent must break invariant 2.
func TestSoakCheckerFails(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tc := range []struct {
		name string
		mod  func(*settings)
		want func(*Report) error
	}{
		{"dropped dead letters", func(s *settings) { s.dropDeadLetters = true }, func(r *Report) error {
			if r.CommitViolations == 0 || r.Lost == 0 {
				return fmt.Errorf("commit violations %d, lost %d: want both > 0", r.CommitViolations, r.Lost)
			}
			return nil
		}},
		{"commits ahead", func(s *settings) { s.commitAhead = 25 }, func(r *Report) error {
			if r.CommitViolations == 0 {
				return fmt.Errorf("commit violations %d: want > 0", r.CommitViolations)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := settings{duration: 10 * time.Second, drain: 20 * time.Second, seed: 1, instances: 2, rate: 80,
				causes: PoisonCauses, logPath: filepath.Join(t.TempDir(), "soak.log")}
			tc.mod(&s)
			rep := runSoak(t, s)
			rep.Print(os.Stdout, 3)
			if rep.CommitsChecked == 0 {
				t.Fatal("no commit checked")
			}
			if err := tc.want(rep); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// soak is one run.
type soak struct {
	t       *testing.T
	s       settings
	rng     *rand.Rand // the fault schedule's
	log     *slog.Logger
	cluster *kfake.Cluster
	hooks   *brokerHooks
	model   *Model
	checker *CommitChecker
	db      Database
	dbName  string
	workURL string // the soak database, host replaced per proxy
	pgAddr  string
	defs    *projection.Definitions
	tables  []*projection.TableProjection
	group   string
	topics  dlq.TopicConfig
	dlqMax  int

	findings

	mu        sync.Mutex
	live      []*instance
	next      int
	abrupt    map[string]bool
	faults    map[string]int
	faultEnds []faultEnd
	readyLog  []readySample
	started   int
	killed    int
	migrated  atomic.Bool
	spans     otlptest.SpanCounter // the instances' ended spans
}

type faultEnd struct {
	at   time.Time
	kind string
}

type readySample struct {
	at    time.Time
	ready bool
}

func runSoak(t *testing.T, s settings) *Report {
	leaks := goleak.IgnoreCurrent()
	fmt.Printf("soak: seed %d, faults %s for %s, log %s\n", s.seed, strings.Join(s.faults, ","), s.duration, s.logPath)
	logf, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	model := NewModel()
	k := &soak{
		t: t, s: s,
		rng:    rand.New(rand.NewPCG(s.seed, 2)),
		log:    slog.New(rewindWatcher{slog.NewJSONHandler(logf, &slog.HandlerOptions{Level: soakLogLevel()}), model}),
		model:  model,
		abrupt: map[string]bool{},
		faults: map[string]int{},
		group:  "soak-group",
		topics: dlq.TopicConfig{EventsTopic: "soak.events", DLQTopic: "soak.dlq", LedgerTopic: "soak.ledger", Partitions: 12, ReplicationFactor: 3},
	}
	k.findings.log, k.findings.prefix = k.log, "soak"
	k.setupDB()
	k.setupKafka()
	defer k.cluster.Close()

	start := time.Now()
	for range s.instances {
		k.startInstance()
	}
	ctx, stop := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(3)
	go func() { defer bg.Done(); k.produce(ctx) }()
	go func() { defer bg.Done(); k.schedule(ctx) }()
	go func() { defer bg.Done(); k.monitor(ctx) }()
	time.Sleep(s.duration)
	stop()
	bg.Wait()
	faultPhase := time.Since(start)
	lastFault := time.Now()
	k.log.Info("soak: faults over, draining")

	k.drain(lastFault)
	drained := time.Since(lastFault)
	k.mu.Lock()
	live := slices.Clone(k.live)
	k.live = nil
	k.mu.Unlock()
	for _, in := range live {
		k.stopInstance(in, false)
	}
	committed := k.committed()
	dls := k.readDeadLetters()
	st, err := k.db.Dump(context.Background(), []string{TenantMain, TenantLate, TenantNoColumn, NotATenant})
	if err != nil {
		t.Fatalf("dump tables: %v", err)
	}
	validator, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	abrupt := maps(k.abrupt)
	k.mu.Unlock()
	fin := CheckFinal(k.model, st, dls, committed, func(w string) bool { return abrupt[w] }, func(dl DeadLetter, src []byte) error {
		return CheckDeadLetter(validator, dl, src)
	})
	k.cluster.Close()
	k.db.Pool.Close()
	k.dropDB()
	if err := goleak.Find(leaks); err != nil {
		k.log.Error("soak: goroutines leaked", "goroutines", err.Error())
		k.stalls = append(k.stalls, "goroutines leaked (all of them in the log): "+firstLines(err.Error(), 30))
	}

	events, pairs := k.model.Counts()
	rep := &Report{
		Seed: s.seed, Duration: faultPhase, Drain: drained, Events: events, Pairs: pairs,
		Faults: k.faults, Lost: fin.Lost, Unprocessed: fin.Unprocessed,
		CommitsChecked: k.checker.Commits, CommitViolations: k.checker.Bad, CommitsLate: k.checker.Late,
		DeadLetters: fin.DeadLetters, DeadLettersByCause: fin.ByCause, GoodDeadLettered: fin.GoodDeadLettered, ExpectedGoodDeadLettered: fin.ExpectedGoodDeadLettered,
		Duplicates: fin.Duplicates, InFlightDuplicates: fin.InFlightDuplicates, RewoundDuplicates: fin.RewoundDuplicates, TimedOutDuplicates: fin.TimedOutDuplicates,
		Stalls: k.stalls, InstancesStarted: k.started, Killed: k.killed, SpansEnded: k.spans.Ended(),
	}
	rep.Refusals = k.hooks.refused
	rep.Violations = append(slices.Clone(k.vs), fin.Violations...)
	rep.LongestRecovery, rep.LongestRecoveryAfter = k.longestRecovery()
	return rep
}

func maps(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

// setupDB creates the soak's own database (so that making it read-only or
// slow touches nobody else's tests) with the tenants of the stream.
func (k *soak) setupDB() {
	t := k.t
	base := pgtest.URL(t)
	ctx := context.Background()
	k.dbName = fmt.Sprintf("soak_%d_%08x", k.s.seed%1000000, rand.Uint32())
	var err error
	if k.workURL, k.db, err = CreateDatabase(ctx, base, k.dbName); err != nil {
		t.Fatalf("create database: %v", err)
	}
	u, err := url.Parse(k.workURL)
	if err != nil {
		t.Fatal(err)
	}
	k.pgAddr = u.Host
	if k.defs, err = projection.LoadDefinitions("testdata/projections.yaml"); err != nil {
		t.Fatal(err)
	}
	if k.tables, err = projection.NewTableProjections(k.defs); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{TenantMain, TenantNoColumn} {
		k.migrate(tenant)
	}
	if _, err := k.db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{TenantNoColumn, "followers"}.Sanitize()+" DROP COLUMN tier"); err != nil {
		t.Fatal(err)
	}
	// A statement timeout, as production databases have.
	if _, err := k.db.Pool.Exec(ctx, "ALTER DATABASE "+ident(k.dbName)+" SET statement_timeout = "+quoteDuration(StatementTimeout)); err != nil {
		t.Fatal(err)
	}
}

func (k *soak) migrate(tenant string) {
	ctx := context.Background()
	if err := projection.Migrate(ctx, k.db.Pool, k.defs, tenant); err != nil {
		k.t.Errorf("migrate %s: %v", tenant, err)
		return
	}
	if _, err := k.db.Pool.Exec(ctx, AuditTableSQL(tenant)); err != nil {
		k.t.Errorf("audit table in %s: %v", tenant, err)
	}
	if _, err := k.db.Pool.Exec(ctx, RatingsCheckSQL(tenant)); err != nil {
		k.t.Errorf("ratings check in %s: %v", tenant, err)
	}
}

func (k *soak) dropDB() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := DropDatabase(ctx, pgtest.URL(k.t), k.dbName); err != nil {
		k.t.Errorf("drop database: %v", err)
	}
}

// setupKafka starts 3 kfake brokers with the events and dead-letter topics
// (12 partitions, leaders spread over the brokers, differently for the two)
// and the ledger topic, and installs the hooks.
func (k *soak) setupKafka() {
	t := k.t
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	k.cluster = c
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := dlq.EnsureTopics(ctx, adm, k.topics)
	if err != nil {
		t.Fatalf("topics: %v", err)
	}
	k.dlqMax = dlq.DefaultMaxBytes
	if rep.DLQMaxMessageBytes > 0 {
		k.dlqMax = rep.DLQMaxMessageBytes
	}
	for p := range k.topics.Partitions {
		if err := c.MoveTopicPartition(k.topics.EventsTopic, p, p%3); err != nil {
			t.Fatal(err)
		}
		if err := c.MoveTopicPartition(k.topics.DLQTopic, p, (p+1)%3); err != nil {
			t.Fatal(err)
		}
	}
	tds, err := adm.ListTopics(ctx, k.topics.EventsTopic, k.topics.DLQTopic)
	if err != nil {
		t.Fatal(err)
	}
	k.checker = &CommitChecker{Model: k.model, DB: k.db, Wait: 300 * time.Millisecond}
	k.hooks = &brokerHooks{
		c: c, group: k.group,
		events: k.topics.EventsTopic, eventsID: tds[k.topics.EventsTopic].ID,
		dlq: k.topics.DLQTopic, dlqID: tds[k.topics.DLQTopic].ID,
		checker: k.checker, onBad: k.violate, commitAhead: k.s.commitAhead,
		rng: rand.New(rand.NewPCG(k.s.seed, 3)),
	}
	k.checker.Acked = k.hooks.Acked
	k.hooks.install()
}

// instance is one worker, wired as cmd/projection-worker's serve does: its
// own pool (through its own proxy), dead-letter producer and writer, and
// projection.Worker.
type instance struct {
	name   string
	w      *projection.Worker
	pool   *pgxpool.Pool
	proxy  *Proxy
	prod   *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// soakRetry is the retry policy of the soak's workers: the documented shape
// (×2, jitter, 5 retries) with short waits, so that a poison pair costs
// about half a second rather than a minute.
var soakRetry = retry.Policy{Initial: 20 * time.Millisecond, Multiplier: 2, MaxInterval: 200 * time.Millisecond, Jitter: 0.5, MaxRetries: 5}

func (k *soak) startInstance() {
	t := k.t
	k.mu.Lock()
	k.next++
	n := k.next
	name := fmt.Sprintf("soak-w%d", n)
	k.started++
	k.mu.Unlock()
	log := k.log.With("instance", name)
	proxy, err := NewProxy(k.pgAddr)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(k.workURL)
	u.Host = proxy.Addr()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.ConnectTimeout = 5 * time.Second // as serve's poolConfig
	pcfg.ConnConfig.RuntimeParams["application_name"] = "soak-worker"
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(k.cluster.ListenAddrs()...),
		kgo.ClientID(name),
		kgo.WithLogger(kslog.New(log.With("component", "kgo"))),
		// A member that died abruptly is noticed in 25 s, not 45 s. Not
		// less: kfake, unlike Apache Kafka, expires a member whose
		// JoinGroup waits in a rebalance once its session timeout passes,
		// and restarts the rebalance deadline at every join, so a kill
		// during a rebalance (which then waits for the dead member's
		// session) dropped the live members that had rejoined; they went
		// on with their partitions, unaware, beside the new owner (seed
		// 1796342323001481726 with 10 s: 44 and 423 duplicate dead letters
		// from two such members; with 25 s none).
		kgo.SessionTimeout(25 * time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.RebalanceTimeout(10 * time.Second),
	}
	prod, err := kgo.NewClient(append(slices.Clone(kopts),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(int32(max(k.dlqMax+64*1024, 1<<20))),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	// The instances trace half the records and every pair of them (spans
	// counted, not kept): the spans' bookkeeping, sampled or not, goes
	// through every fault too.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.5))),
		sdktrace.WithSpanProcessor(&k.spans))
	writer, err := dlq.NewWriter(prod, dlq.WriterConfig{
		RecordConfig:   dlq.RecordConfig{Topic: k.topics.DLQTopic, Worker: name, Generation: "soak/" + k.defs.IRVersion, MaxBytes: k.dlqMax},
		Backoff:        soakRetry,
		Logger:         log,
		TracerProvider: tp,
		// Like the retries and the grace, scaled down: a dead-letter topic
		// that does not answer makes the partition stuck (visible) after 5
		// attempts of 2 s plus the backoff, well inside the 30 s after
		// which a partition that does not move while every instance is
		// ready counts as a silent stall. With the default 10 s attempts
		// that report comes after about a minute (README).
		AttemptTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var dead projection.DeadLetterWriter = writer
	if k.s.dropDeadLetters {
		dead = &dropping{w: writer}
	}
	handlers := make([]projection.Handler, 0, len(k.tables)+1)
	for _, tp := range k.tables {
		handlers = append(handlers, tp)
	}
	if slices.Contains(k.s.causes, "plan-panic") { // a projection applied in batches, whose Plan panics on its poison
		handlers = append(handlers, PlanningAudit{})
	} else {
		handlers = append(handlers, Audit{})
	}
	// Every other instance (the first one too) copies groups of 2 upserts
	// or more, so that at
	// the soak's few events a second its batches go through COPY (and a
	// refused row through the COPY isolation) as well as statements.
	copyMinRows := 0 // the default, 32
	if n%2 == 1 {
		copyMinRows = 2
	}
	w, err := projection.NewWorker(projection.Config{
		CopyMinRows:    copyMinRows,
		Topic:          k.topics.EventsTopic,
		Group:          k.group,
		Retry:          soakRetry,
		OnInfraError:   projection.InfraPause,
		CommitInterval: time.Second,
		ShutdownGrace:  10 * time.Second,
		Logger:         log,
		TracerProvider: tp,
		TraceEveryPair: true,
	}, handlers, pool, dead, kopts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{name: name, w: w, pool: pool, proxy: proxy, prod: prod, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		in.err = w.Run(ctx)
	}()
	k.mu.Lock()
	k.live = append(k.live, in)
	k.mu.Unlock()
	k.log.Info("soak: instance started", "instance", name)
}

// dropping is the self-test's broken dead-letter writer: every other dead
// letter is acknowledged without being written.
type dropping struct {
	w *dlq.Writer
	n atomic.Int64
}

func (d *dropping) Write(ctx context.Context, dl dlq.DeadLetter) error {
	if d.n.Add(1)%2 == 0 {
		return nil
	}
	return d.w.Write(ctx, dl)
}

// WriteBatch drops every second dead letter too, reporting it written.
func (d *dropping) WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error {
	errs := make([]error, len(dls))
	for i, dl := range dls {
		errs[i] = d.Write(ctx, dl)
	}
	return errs
}

// stopInstance stops in: gracefully (cancel, and Run commits and leaves the
// group within its grace), or abruptly: the broker refuses its commits,
// heartbeats and leave (fenced), its database connections are cut and its
// dead-letter producer closed, then its context is cut wherever it is.
func (k *soak) stopInstance(in *instance, abrupt bool) {
	if abrupt {
		member, _ := in.w.Client().GroupMetadata()
		k.hooks.fence(member)
		k.mu.Lock()
		k.abrupt[in.name] = true
		k.killed++
		k.mu.Unlock()
		in.proxy.Close()
		in.prod.Close()
	}
	in.cancel()
	stopped := time.Now()
	bound := 10*time.Second + 15*time.Second
	select {
	case <-in.done:
		if in.err != nil && !abrupt {
			k.log.Warn("soak: instance stopped with an error", "instance", in.name, "error", in.err)
		}
	case <-time.After(bound):
		select {
		case <-in.done:
			k.stall("instance %s (abrupt %v) returned from Run %s after its stop (shutdown grace 10s): %v",
				in.name, abrupt, time.Since(stopped).Round(time.Second), in.err)
		case <-time.After(90 * time.Second):
			k.stall("instance %s (abrupt %v) did not return from Run within %s of its stop (shutdown grace 10s)",
				in.name, abrupt, time.Since(stopped).Round(time.Second))
			return // leave it: the leak check reports its goroutines
		}
	}
	in.prod.Close()
	in.proxy.Close()
	in.pool.Close()
	k.log.Info("soak: instance stopped", "instance", in.name, "abrupt", abrupt, "error", fmt.Sprint(in.err))
}

// produce writes the stream at s.rate events per second until ctx is done;
// it migrates the late tenant half-way.
func (k *soak) produce(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...), kgo.DefaultProduceTopic(k.topics.EventsTopic), kgo.ProducerLinger(0))
	if err != nil {
		k.t.Error(err)
		return
	}
	defer cl.Close()
	gen := NewGenerator(k.s.seed, 3000, 25, k.s.causes, func(tenant string) bool { return tenant != TenantLate || k.migrated.Load() })
	half := time.Now().Add(k.s.duration / 2)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	per := max(1, k.s.rate/10)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !k.migrated.Load() && time.Now().After(half) {
			k.migrate(TenantLate)
			k.migrated.Store(true)
			k.log.Info("soak: late tenant migrated")
		}
		krs := make([]*kgo.Record, per)
		// ProduceSync's results come in completion order: map them back
		// by record.
		recs := make(map[*kgo.Record]*Record, per)
		for i := range krs {
			r := gen.Next()
			krs[i] = &kgo.Record{Key: r.Key, Value: r.Value}
			recs[krs[i]] = r
		}
		pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res := cl.ProduceSync(pctx, krs...)
		cancel()
		for _, r := range res {
			if r.Err != nil {
				k.t.Errorf("produce: %v", r.Err)
				return
			}
			m := recs[r.Record]
			m.Partition, m.Offset = r.Record.Partition, r.Record.Offset
			k.model.Add(m)
		}
	}
}

// silentAfter is how long a partition with records to process may go
// without its committed offset moving while every instance says it is
// ready: longer is a silent stall (invariant 4), whatever the faults.
const silentAfter = 30 * time.Second

// monitor samples readiness of the live instances every 250 ms, and every
// second the group's progress on each partition: a partition behind its
// end whose commit does not move for silentAfter while no instance reports
// anything (not ready) is stalled silently.
func (k *soak) monitor(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...))
	if err != nil {
		k.t.Error(err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	type progress struct {
		at      int64
		since   time.Time // committed offset last moved, or the partition was drained
		flagged bool
	}
	parts := map[int32]*progress{}
	var lastNotReady time.Time
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		ready := k.allReady() == nil
		if !ready {
			lastNotReady = now
		}
		k.mu.Lock()
		k.readyLog = append(k.readyLog, readySample{now, ready})
		k.mu.Unlock()
		if n%4 != 0 {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ends, err1 := adm.ListEndOffsets(qctx, k.topics.EventsTopic)
		committed, err2 := adm.FetchOffsets(qctx, k.group)
		cancel()
		if err1 != nil || err2 != nil {
			continue
		}
		ends.Each(func(e kadm.ListedOffset) {
			at := int64(0)
			if c, ok := committed.Lookup(e.Topic, e.Partition); ok {
				at = c.At
			}
			p := parts[e.Partition]
			if p == nil || p.at != at || at >= e.Offset {
				parts[e.Partition] = &progress{at: at, since: now}
				return
			}
			if !p.flagged && now.Sub(p.since) > silentAfter && lastNotReady.Before(p.since) {
				p.flagged = true
				k.violate(Violation{4, "silent stall", fmt.Sprintf("partition %d committed %d of %d, not moved for %s, every instance ready",
					e.Partition, at, e.Offset, now.Sub(p.since).Round(time.Second))})
			}
		})
	}
}

func (k *soak) allReady() error {
	k.mu.Lock()
	live := slices.Clone(k.live)
	k.mu.Unlock()
	var errs []string
	for _, in := range live {
		if err := in.w.Ready(); err != nil {
			errs = append(errs, in.name+": "+err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// longestRecovery is the longest time from the end of a fault to every
// live instance ready again.
func (k *soak) longestRecovery() (time.Duration, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var worst time.Duration
	var after string
	for _, fe := range k.faultEnds {
		for _, s := range k.readyLog {
			if s.at.Before(fe.at) || !s.ready {
				continue
			}
			if d := s.at.Sub(fe.at); d > worst {
				worst, after = d, fe.kind
			}
			break
		}
	}
	return worst, after
}

// schedule injects a random fault every 1–4 s until ctx is done, at most
// two lasting ones at a time, and heals them all before returning.
func (k *soak) schedule(ctx context.Context) {
	if len(k.s.faults) == 0 {
		<-ctx.Done()
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	lasting := make(chan struct{}, 2)
	for {
		wait := time.Duration(1000+k.rng.IntN(3000)) * time.Millisecond
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		kind := k.s.faults[k.rng.IntN(len(k.s.faults))]
		d := time.Duration(1000+k.rng.IntN(5000)) * time.Millisecond
		select {
		case lasting <- struct{}{}:
		default:
			continue // two faults running already
		}
		fn := k.fault(kind, d)
		if fn == nil {
			<-lasting
			continue
		}
		k.mu.Lock()
		k.faults[kind]++
		k.mu.Unlock()
		k.log.Info("soak: fault", "kind", kind, "for", d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-lasting }()
			fn()
			k.mu.Lock()
			k.faultEnds = append(k.faultEnds, faultEnd{time.Now(), kind})
			k.mu.Unlock()
			k.log.Info("soak: fault over", "kind", kind)
		}()
	}
}

// fault returns the function that injects kind for about d and heals it, or
// nil when kind does not apply now.
func (k *soak) fault(kind string, d time.Duration) func() {
	k.mu.Lock()
	n := len(k.live)
	k.mu.Unlock()
	ctx := context.Background()
	node := int32(k.rng.IntN(3))
	switch kind {
	case "join":
		if n >= 5 {
			return nil
		}
		return k.startInstance
	case "leave", "kill":
		if n <= 1 {
			return nil
		}
		k.mu.Lock()
		i := k.rng.IntN(len(k.live))
		in := k.live[i]
		k.live = slices.Delete(k.live, i, i+1)
		k.mu.Unlock()
		return func() {
			k.stopInstance(in, kind == "kill")
			if kind == "kill" {
				k.startInstance() // the replacement pod
			}
		}
	case "dlq-refuse-retriable", "dlq-refuse-fatal", "dlq-slow", "dlq-unanswered":
		f := produceFault{kind: strings.TrimPrefix(kind, "dlq-"), node: node, slow: time.Duration(200+k.rng.IntN(1500)) * time.Millisecond}
		if kind != "dlq-slow" && k.rng.IntN(3) == 0 {
			// Long enough to need reporting: a partition that cannot
			// write its dead letter must say so (not ready, stuck)
			// within silentAfter.
			d = silentAfter + 15*time.Second
			k.log.Info("soak: fault lengthened", "kind", kind, "for", d, "node", node)
		}
		return func() {
			k.hooks.setProduceFault(f)
			time.Sleep(d)
			k.hooks.setProduceFault(produceFault{})
		}
	case "leader-move":
		topic := k.topics.EventsTopic
		if k.rng.IntN(2) == 0 {
			topic = k.topics.DLQTopic
		}
		p := int32(k.rng.IntN(int(k.topics.Partitions)))
		return func() {
			if err := k.cluster.MoveTopicPartition(topic, p, node); err != nil {
				k.t.Errorf("move %s/%d: %v", topic, p, err)
			}
		}
	case "coordinator-move":
		return k.cluster.RehashCoordinators
	case "fetch-error":
		code := []*kerr.Error{kerr.NotLeaderForPartition, kerr.UnknownServerError, kerr.KafkaStorageError}[k.rng.IntN(3)]
		count := 1 + k.rng.IntN(20)
		return func() {
			h := k.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Nodes: []int32{node}, Err: code, Count: count})
			time.Sleep(d)
			h.Remove()
		}
	case "commit-error":
		return func() {
			k.hooks.setCommitFault(true)
			time.Sleep(d)
			k.hooks.setCommitFault(false)
		}
	case "pg-terminate":
		return func() { k.terminateWorkers(ctx) }
	case "proxy-cut":
		return func() {
			for _, p := range k.proxies() {
				p.Cut()
			}
		}
	case "proxy-blackhole":
		return func() {
			var ends []func()
			for _, p := range k.proxies() {
				ends = append(ends, p.BlackHole())
			}
			time.Sleep(d)
			for _, end := range ends {
				end()
			}
		}
	case "proxy-slow":
		delay := time.Duration(5+k.rng.IntN(40)) * time.Millisecond
		return func() {
			ps := k.proxies()
			for _, p := range ps {
				p.Slow(delay)
			}
			time.Sleep(d)
			for _, p := range ps {
				p.Slow(0)
			}
		}
	case "statement-timeout":
		// Every statement slower than 30 ms fails with 57014, a projection
		// error (retried, then dead-lettered: a statement that always
		// times out must not hold its partition), so good pairs caught by
		// a cut longer than their retries are dead-lettered by design.
		k.model.ExpectGoodDeadLetters("projection/57014")
		return func() { k.databaseSetting(ctx, "statement_timeout", "'30ms'", quoteDuration(StatementTimeout), d) }
	case "read-only":
		return func() { k.databaseSetting(ctx, "default_transaction_read_only", "on", "off", d) }
	case "lock-wait":
		table := []string{"followers", "user_follows", "ratings"}[k.rng.IntN(3)]
		return func() { k.lockTable(ctx, pgx.Identifier{TenantMain, table}.Sanitize(), d) }
	}
	return nil
}

func (k *soak) proxies() []*Proxy {
	k.mu.Lock()
	defer k.mu.Unlock()
	ps := make([]*Proxy, len(k.live))
	for i, in := range k.live {
		ps[i] = in.proxy
	}
	return ps
}

// terminateWorkers ends every backend of the workers (pg_terminate_backend).
func (k *soak) terminateWorkers(ctx context.Context) {
	_, err := k.db.Pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'soak-worker'", k.dbName)
	if err != nil {
		k.t.Errorf("terminate backends: %v", err)
	}
}

// quoteDuration is d as a PostgreSQL setting literal in milliseconds.
func quoteDuration(d time.Duration) string { return fmt.Sprintf("'%dms'", d.Milliseconds()) }

// databaseSetting sets a default of the soak database for d (new sessions;
// the workers' sessions are ended so that they reconnect under it), then
// sets it back to normal the same way.
func (k *soak) databaseSetting(ctx context.Context, name, value, normal string, d time.Duration) {
	db := ident(k.dbName)
	if err := k.alterDatabase(ctx, "ALTER DATABASE "+db+" SET "+name+" = "+value); err != nil {
		k.t.Errorf("set %s: %v", name, err)
		return
	}
	k.terminateWorkers(ctx)
	time.Sleep(d)
	if err := k.alterDatabase(ctx, "ALTER DATABASE "+db+" SET "+name+" = "+normal); err != nil {
		k.t.Errorf("reset %s: %v", name, err)
	}
	k.terminateWorkers(ctx)
}

// alterDatabase runs sql, an ALTER DATABASE ... SET, again (up to 5 times,
// 200 ms apart) while PostgreSQL answers "tuple concurrently updated"
// (XX000): another session changing a database setting at the same moment,
// as a second soak on the same server does (seen with two soaks at once).
func (k *soak) alterDatabase(ctx context.Context, sql string) error {
	var err error
	for range 5 {
		if _, err = k.db.Pool.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), "tuple concurrently updated") {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// lockTable holds a lock that blocks writers of table for d.
func (k *soak) lockTable(ctx context.Context, table string, d time.Duration) {
	tx, err := k.db.Pool.Begin(ctx)
	if err != nil {
		k.t.Errorf("lock: %v", err)
		return
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN SHARE ROW EXCLUSIVE MODE"); err != nil {
		k.t.Errorf("lock %s: %v", table, err)
		return
	}
	time.Sleep(d)
}

// drain waits, up to s.drain after the last fault, for every partition to
// be committed to its end and every live instance to be ready; what is not
// is a stall.
func (k *soak) drain(since time.Time) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := since.Add(k.s.drain)
	var behind []string
	var readyErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		behind, err = Uncommitted(ctx, adm, k.topics.EventsTopic, k.group)
		cancel()
		if err != nil {
			behind = []string{"offsets not read: " + err.Error()}
		}
		readyErr = k.allReady()
		if len(behind) == 0 && readyErr == nil {
			k.log.Info("soak: drained", "after", time.Since(since))
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	sort.Strings(behind)
	for _, b := range behind {
		k.stall("%s, %s after the last fault", b, k.s.drain)
	}
	if readyErr != nil {
		k.stall("not ready %s after the last fault: %v", k.s.drain, readyErr)
	}
}

// committed returns the group's committed offset of each events partition.
func (k *soak) committed() map[int32]int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, k.group)
	if err != nil {
		k.t.Fatalf("committed offsets: %v", err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == k.topics.EventsTopic && o.Err == nil {
			out[o.Partition] = o.At
		}
	})
	return out
}

// readDeadLetters reads the dead-letter topic from its start to its end.
func (k *soak) readDeadLetters() []DeadLetter {
	t := k.t
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, k.topics.DLQTopic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	parts := map[int32]kgo.Offset{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Offset > 0 {
			want[e.Partition] = e.Offset
			parts[e.Partition] = kgo.NewOffset().AtStart()
		}
	})
	var out []DeadLetter
	if len(want) == 0 {
		return out
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{k.topics.DLQTopic: parts}))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for len(want) > 0 {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read dead letters: %v (partitions left %v)", ctx.Err(), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			hs := make([][2]string, len(r.Headers))
			for i, h := range r.Headers {
				hs[i] = [2]string{h.Key, string(h.Value)}
			}
			dl, err := ParseDeadLetter(r.Key, r.Value, hs)
			if err != nil {
				k.violate(Violation{5, "unreadable dead letter", fmt.Sprintf("dlq %d@%d: %v", r.Partition, r.Offset, err)})
			} else {
				out = append(out, dl)
			}
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
		})
	}
	return out
}

// rewindWatcher passes log records on and tells the model about the lines
// that explain a dead letter written twice (README, Failure handling): the
// worker's "records delivered again" (a client that rewinds a partition
// within an assignment, as kgo does after a broker reported lost records
// when a leader moved, makes the worker process those records again) and
// the writer's "dead-letter write failed" with dlq.ErrAttemptTimeout (an
// attempt Kafka did not acknowledge in time may still have been stored),
// and the worker's "dead letter not acknowledged when the partition was
// released" with a timeout or a context error (its request may have been
// in flight: the next owner writes it again).
type rewindWatcher struct {
	slog.Handler
	m *Model
}

func (h rewindWatcher) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "dead-letter write failed") || strings.HasPrefix(r.Message, "dead letter not acknowledged") {
		id, timedOut := PairID{Partition: -1, Offset: -1}, false
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "partition":
				id.Partition = int32(a.Value.Int64())
			case "offset":
				id.Offset = a.Value.Int64()
			case "projection":
				id.Projection = a.Value.String()
			case "error":
				// Maybe stored: an attempt that timed out, or one cancelled
				// with its request in flight (the partition released).
				err := asError(a.Value)
				timedOut = errors.Is(err, dlq.ErrAttemptTimeout) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
			}
			return true
		})
		if timedOut && id.Partition >= 0 && id.Offset >= 0 {
			h.m.WriteTimedOut(id)
		}
	}
	if strings.HasPrefix(r.Message, "records delivered again") {
		var p, o int64 = -1, -1
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "partition":
				p = a.Value.Int64()
			case "offset":
				o = a.Value.Int64()
			}
			return true
		})
		if p >= 0 && o >= 0 {
			h.m.Rewound(int32(p), o)
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h rewindWatcher) WithAttrs(as []slog.Attr) slog.Handler {
	return rewindWatcher{h.Handler.WithAttrs(as), h.m}
}

func (h rewindWatcher) WithGroup(name string) slog.Handler {
	return rewindWatcher{h.Handler.WithGroup(name), h.m}
}

// asError returns the error a log attribute holds, nil if none.
func asError(v slog.Value) error {
	if v.Kind() != slog.KindAny {
		return nil
	}
	err, _ := v.Any().(error)
	return err
}

// soakLogLevel is the soak log's level: SOAK_LOG_LEVEL=debug logs every
// retry and every COPY group that failed (the log grows to hundreds of MB
// in a long run); default info.
func soakLogLevel() slog.Level {
	if strings.EqualFold(os.Getenv("SOAK_LOG_LEVEL"), "debug") {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
