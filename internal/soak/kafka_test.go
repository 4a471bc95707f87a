package soak

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/schemas"
)

// The real-broker soak (make soak-kafka, issue 8): three `projection-worker
// run` processes, built from this tree, in one consumer group on an Apache
// Kafka broker of its own (scripts/kafka-up.sh with KAFKA_DIR .kafka-soak on
// 127.0.0.1:29092, never make kafka-up's), killed with SIGKILL or SIGTERM and
// restarted on a seeded schedule, the broker stopped and started once. The
// stream, the model and the checks are the in-process soak's (stream.go,
// model.go, deadletter.go); here the commits are sampled with kadm instead of
// seen by a kfake hook, and "acknowledged dead letter" means read back from
// the dead-letter topic.

// kafkaSoakSettings are the real-broker soak's parameters, from the
// environment.
type kafkaSoakSettings struct {
	duration time.Duration // SOAK_DURATION: faults and production (default 5m)
	// SOAK_DRAIN bounds draining after the last fault (default 3m): a
	// SIGKILLed worker holds its partitions, and any rebalance, until its
	// session times out (45 s, franz-go's default: run has no flag for it),
	// then the backlog is worked off.
	drain time.Duration
	seed  uint64 // SOAK_SEED
	rate  int    // SOAK_RATE: events per second (default 60)
	race  bool   // SOAK_RACE: build the worker with -race (default 1)
	// SOAK_CAUSES: poison causes, as for make soak (default all that the
	// definitions file can provoke: not the Go projection's panic).
	causes []string
	logDir string // SOAK_LOG_DIR (default $TMPDIR): holds the run's folder of logs
	// The soak's broker: SOAK_KAFKA_DIR (default <repo>/.kafka-soak),
	// SOAK_KAFKA_PORT (29092), SOAK_KAFKA_CONTROLLER_PORT (29093).
	kafkaDir, kafkaPort, controllerPort string
	grace                               time.Duration // the workers' --shutdown-grace
}

func kafkaSoakLoad(t *testing.T) kafkaSoakSettings {
	s := kafkaSoakSettings{duration: 5 * time.Minute, drain: 3 * time.Minute, rate: 60, race: true,
		kafkaPort: "29092", controllerPort: "29093", grace: 10 * time.Second}
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	for k, dst := range map[string]*time.Duration{"SOAK_DURATION": &s.duration, "SOAK_DRAIN": &s.drain} {
		if v := env(k); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				t.Fatalf("%s: want a positive duration, got %q", k, v)
			}
			*dst = d
		}
	}
	s.seed = rand.Uint64() >> 12
	if v := env("SOAK_SEED"); v != "" {
		var err error
		if s.seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SOAK_SEED: %v", err)
		}
	}
	if v := env("SOAK_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			t.Fatalf("SOAK_RATE: want an integer >= 10, got %q", v)
		}
		s.rate = n
	}
	s.race = env("SOAK_RACE") != "0"
	s.causes = parseList(t, "SOAK_CAUSES", env("SOAK_CAUSES"), slices.DeleteFunc(slices.Clone(PoisonCauses), func(c string) bool { return c == "panic" }))
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	s.kafkaDir = filepath.Join(repo, ".kafka-soak")
	for k, dst := range map[string]*string{"SOAK_KAFKA_DIR": &s.kafkaDir, "SOAK_KAFKA_PORT": &s.kafkaPort, "SOAK_KAFKA_CONTROLLER_PORT": &s.controllerPort} {
		if v := env(k); v != "" {
			*dst = v
		}
	}
	s.logDir = env("SOAK_LOG_DIR")
	if s.logDir == "" {
		s.logDir = os.TempDir()
	}
	return s
}

// TestSoakKafka is make soak-kafka. It runs only with SOAK_KAFKA=1: it
// starts its own broker and takes minutes (not part of make test or make
// test-kafka).
func TestSoakKafka(t *testing.T) {
	if os.Getenv("SOAK_KAFKA") != "1" {
		t.Skip("the real-broker soak runs with SOAK_KAFKA=1 (make soak-kafka)")
	}
	s := kafkaSoakLoad(t)
	k := newKafkaSoak(t, s)
	rep := k.run()
	rep.Print(os.Stdout, 8)
	k.printExits(os.Stdout)
	fmt.Printf("soak-kafka seed %d: %s (logs: %s)\n", s.seed, map[bool]string{true: "FAIL", false: "PASS"}[rep.Failed()], k.s.logDir)
	if rep.Failed() {
		t.Fatalf("soak-kafka seed %d failed: %d violations, %d stalls; reproduce with SOAK_SEED=%d SOAK_DURATION=%s make soak-kafka (the schedule is seeded, its timing is the machine's)",
			s.seed, len(rep.Violations), len(rep.Stalls), s.seed, s.duration)
	}
}

// kafkaSoak is one run of the real-broker soak.
type kafkaSoak struct {
	t       *testing.T
	s       kafkaSoakSettings
	rng     *rand.Rand // the fault schedule's
	log     *slog.Logger
	runID   string
	brokers string
	bin     string // the projection-worker binary
	defs    string // the definitions file
	dbURL   string // the soak's own database
	dbName  string
	db      Database
	topic   string
	dlqT    string
	ledger  string
	group   string
	model   *Model
	checker *CommitChecker
	dlq     kafkaSoakDLQ
	adm     *kadm.Client // of the soak's broker, for its checks
	http    *http.Client

	migrated atomic.Bool

	findings

	mu         sync.Mutex
	slots      [3]*workerProc
	incarn     [3]int
	killed     map[string]bool      // worker ids that got SIGKILL
	unclean    map[string]time.Time // worker ids whose SIGTERM exit failed, and when
	exits      []string             // SIGTERM exits that were not clean, and unexpected exits
	faults     map[string]int
	faultEnds  []kafkaSoakEvent
	faultStart []time.Time
	readyLog   []kafkaSoakEvent
	lastCommit map[int32]int64
	started    int
	nkilled    int
}

// kafkaSoakEvent is a time and what happened then (a fault's end, or a
// readiness sample: "ready" or why not).
type kafkaSoakEvent struct {
	at   time.Time
	what string
}

// workerProc is one `projection-worker run` process.
type workerProc struct {
	slot     int
	id       string // --worker-id, and the causet.dlq.worker header
	addr     string // --http-addr
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	state    *os.ProcessState
	signaled atomic.Bool // the soak sent it a signal
}

func newKafkaSoak(t *testing.T, s kafkaSoakSettings) *kafkaSoak {
	runID := fmt.Sprintf("%d-%06x", s.seed, rand.Uint32()&0xffffff)
	// A folder per run: the checks read every worker log in it.
	s.logDir = filepath.Join(s.logDir, "soak-kafka-"+runID)
	if err := os.MkdirAll(s.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(s.logDir, "soak.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	k := &kafkaSoak{
		t: t, s: s,
		rng:        rand.New(rand.NewPCG(s.seed, 4)),
		log:        slog.New(slog.NewJSONHandler(logf, nil)),
		runID:      runID,
		brokers:    "127.0.0.1:" + s.kafkaPort,
		topic:      "soakkafka." + runID + ".events",
		dlqT:       "soakkafka." + runID + ".dlq",
		ledger:     "soakkafka." + runID + ".ledger",
		group:      "soakkafka-" + runID,
		defs:       "testdata/projections.yaml",
		model:      NewModel(),
		killed:     map[string]bool{},
		unclean:    map[string]time.Time{},
		faults:     map[string]int{},
		lastCommit: map[int32]int64{},
		http:       &http.Client{Timeout: 2 * time.Second},
	}
	k.findings.log, k.findings.prefix = k.log, "soak-kafka"
	k.dlq.acked = map[PairID]bool{}
	k.dlq.next = map[int32]int64{}
	// Whatever happens, no process of this run outlives it.
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, p := range k.slots {
			if p != nil {
				_ = p.cmd.Process.Kill()
			}
		}
	})
	return k
}

func (k *kafkaSoak) run() *Report {
	t := k.t
	fmt.Printf("soak-kafka: seed %d, %s of faults at %d events/s, causes %s, run %s, logs %s\n", k.s.seed, k.s.duration, k.s.rate, strings.Join(k.s.causes, ","), k.runID, k.s.logDir)
	if err := k.script("kafka-up.sh"); err != nil {
		t.Fatal(err)
	}
	admCl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	k.adm = kadm.NewClient(admCl)
	k.build()
	k.setupDB()
	defer k.db.Pool.Close()
	if err := k.worker("topics", "--brokers", k.brokers, "--topic", k.topic, "--dlq-topic", k.dlqT, "--ledger-topic", k.ledger, "--partitions", "12"); err != nil {
		t.Fatal(err)
	}
	if err := k.worker("migrate", "--database-url", k.dbURL, "--projections", k.defs, "--tenant-schema", TenantMain, "--tenant-schema", TenantNoColumn); err != nil {
		t.Fatal(err)
	}
	if _, err := k.db.Pool.Exec(context.Background(), "ALTER TABLE "+pgx.Identifier{TenantNoColumn, "followers"}.Sanitize()+" DROP COLUMN tier"); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{TenantMain, TenantNoColumn} {
		if _, err := k.db.Pool.Exec(context.Background(), RatingsCheckSQL(tenant)); err != nil {
			t.Fatal(err)
		}
	}
	k.checker = &CommitChecker{Model: k.model, DB: k.db, Acked: k.dlq.isAcked, Wait: 2 * time.Second}

	readCtx, stopReading := context.WithCancel(context.Background())
	defer stopReading()
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { defer readers.Done(); k.readDLQ(readCtx) }()

	start := time.Now()
	for slot := range k.slots {
		k.startWorker(slot)
	}
	ctx, stop := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); k.produce(ctx) }()
	go func() { defer bg.Done(); k.schedule(ctx) }()
	// Readiness and commits are sampled through the drain too.
	monCtx, stopMonitor := context.WithCancel(context.Background())
	var monitors sync.WaitGroup
	monitors.Add(2)
	go func() { defer monitors.Done(); k.monitor(monCtx) }()
	go func() { defer monitors.Done(); k.sampleCommits(monCtx) }()
	time.Sleep(k.s.duration)
	stop()
	bg.Wait()
	faultPhase := time.Since(start)
	lastFault := time.Now()
	k.log.Info("soak-kafka: faults over, draining")
	k.drain(lastFault)
	drained := time.Since(lastFault)
	stopMonitor()
	monitors.Wait()

	for slot := range k.slots {
		k.mu.Lock()
		p := k.slots[slot]
		k.slots[slot] = nil
		k.mu.Unlock()
		if p != nil {
			k.stopWorker(p, syscall.SIGTERM)
		}
	}
	// Invariant 2 at the end, on the offsets the last owners committed.
	k.checkCommits(context.Background())
	k.scanLogs()
	dls := k.dlq.caughtUp(k, 60*time.Second)
	stopReading()
	readers.Wait()
	st, err := k.db.Dump(context.Background(), []string{TenantMain, TenantLate, TenantNoColumn, NotATenant})
	if err != nil {
		t.Fatalf("dump tables: %v", err)
	}
	validator, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	killed := map[string]bool{}
	k.mu.Lock()
	for id := range k.killed {
		killed[id] = true
	}
	k.mu.Unlock()
	k.explain()
	fin := CheckFinal(k.model, st, dls, k.committed(), func(w string) bool { return killed[w] }, func(dl DeadLetter, src []byte) error {
		return CheckDeadLetter(validator, dl, src)
	})

	events, pairs := k.model.Counts()
	k.mu.Lock()
	defer k.mu.Unlock()
	rep := &Report{
		Seed: k.s.seed, Duration: faultPhase, Drain: drained, Events: events, Pairs: pairs, Faults: k.faults,
		CommitsChecked: k.checker.Commits, CommitViolations: k.checker.Bad, CommitsLate: k.checker.Late,
		Stalls: k.stalls, InstancesStarted: k.started, Killed: k.nkilled, Violations: slices.Clone(k.vs),
	}
	k.dlq.mu.Lock()
	rep.Violations = append(rep.Violations, k.dlq.bad...)
	k.dlq.mu.Unlock()
	excuseLost(&fin, dls, killed, k.losses())
	rep.AddFinal(fin)
	rep.LongestRecovery, rep.LongestRecoveryAfter = kafkaSoakRecovery(k.faultStart, k.faultEnds, k.readyLog)
	if rep.Failed() {
		fmt.Printf("soak-kafka: database %s kept for inspection (DROP DATABASE %s WITH (FORCE))\n", k.dbName, k.dbName)
	} else {
		if err := DropDatabase(context.Background(), pgtest.URL(t), k.dbName); err != nil {
			t.Errorf("drop database: %v", err)
		}
		k.deleteTopics()
	}
	return rep
}

// committed returns the group's committed offset of each partition.
func (k *kafkaSoak) committed() map[int32]int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Committed(ctx, k.adm, k.topic, k.group)
	if err != nil {
		k.t.Fatal(err)
	}
	return c
}

// deleteTopics deletes the run's topics, so that the soak's broker does not
// keep every run's records.
func (k *kafkaSoak) deleteTopics() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := k.adm.DeleteTopics(ctx, k.topic, k.dlqT, k.ledger); err != nil {
		k.t.Errorf("delete topics: %v", err)
	}
}

// printExits lists the worker exits that were not clean.
func (k *kafkaSoak) printExits(w io.Writer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.exits {
		fmt.Fprintf(w, "  exit: %s\n", e)
	}
}

func (k *kafkaSoak) fault(kind string) {
	k.mu.Lock()
	k.faults[kind]++
	k.faultStart = append(k.faultStart, time.Now())
	k.mu.Unlock()
	k.log.Info("soak-kafka: fault", "kind", kind)
}

func (k *kafkaSoak) faultOver(kind string) {
	k.mu.Lock()
	k.faultEnds = append(k.faultEnds, kafkaSoakEvent{time.Now(), kind})
	k.mu.Unlock()
	k.log.Info("soak-kafka: fault over", "kind", kind)
}

// script runs scripts/<name> on the soak's broker.
func (k *kafkaSoak) script(name string) error {
	start := time.Now()
	cmd := exec.Command("bash", "../../scripts/"+name)
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+k.s.kafkaDir, "KAFKA_PORT="+k.s.kafkaPort,
		"KAFKA_CONTROLLER_PORT="+k.s.controllerPort, "KAFKA_START_TIMEOUT=180")
	out, err := cmd.CombinedOutput()
	k.log.Info("soak-kafka: "+name, "output", string(out), "took", time.Since(start).String())
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return nil
}

// build compiles the worker binary of this tree (with -race unless
// SOAK_RACE=0).
func (k *kafkaSoak) build() {
	k.bin = filepath.Join(k.t.TempDir(), "projection-worker")
	args := []string{"build", "-o", k.bin}
	if k.s.race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/projection-worker")...)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		k.t.Fatalf("go build: %v\n%s", err, out)
	}
}

// worker runs a one-shot projection-worker command.
func (k *kafkaSoak) worker(args ...string) error {
	out, err := exec.Command(k.bin, args...).CombinedOutput()
	k.log.Info("soak-kafka: projection-worker "+args[0], "output", string(out))
	if err != nil {
		return fmt.Errorf("projection-worker %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// setupDB creates the run's own database, so that its tenant schemas are
// fresh and shared with no other test.
func (k *kafkaSoak) setupDB() {
	k.dbName = "soakkafka_" + strings.ReplaceAll(k.runID, "-", "_")
	var err error
	if k.dbURL, k.db, err = CreateDatabase(context.Background(), pgtest.URL(k.t), k.dbName); err != nil {
		k.t.Fatal(err)
	}
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startWorker starts a new process in slot: its worker id names the slot and
// the incarnation (w2.3), so that dead letters tell which process wrote them.
func (k *kafkaSoak) startWorker(slot int) {
	addr, err := freeAddr()
	if err != nil {
		k.t.Errorf("free port: %v", err)
		return
	}
	k.mu.Lock()
	k.incarn[slot]++
	id := fmt.Sprintf("w%d.%d", slot+1, k.incarn[slot])
	k.mu.Unlock()
	p := &workerProc{slot: slot, id: id, addr: addr, logPath: filepath.Join(k.s.logDir, id+".log"), done: make(chan struct{})}
	logf, err := os.Create(p.logPath)
	if err != nil {
		k.t.Errorf("worker log: %v", err)
		return
	}
	p.cmd = exec.Command(k.bin, "run",
		"--brokers", k.brokers, "--database-url", k.dbURL, "--projections", k.defs,
		"--topic", k.topic, "--dlq-topic", k.dlqT, "--ledger-topic", k.ledger, "--group", k.group,
		"--http-addr", addr, "--worker-id", id,
		// The documented retry shape with short waits, as the in-process
		// soak's workers: a poison pair costs about half a second.
		"--max-retries", "5", "--retry-initial", "20ms", "--retry-max-interval", "200ms",
		"--shutdown-grace", k.s.grace.String(), "--log-format", "json")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		k.t.Errorf("start %s: %v", id, err)
		return
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		p.state = p.cmd.ProcessState
		close(p.done)
		if !p.signaled.Load() {
			why := lastError(p.logPath)
			// Started while the broker is down, a worker exits at once (a pod
			// is restarted): not a fault of the worker.
			atStart := !logHas(p.logPath, `"msg":"projection worker started"`) && strings.Contains(why, "unable to dial")
			k.mu.Lock()
			if k.slots[slot] == p {
				k.slots[slot] = nil
			}
			k.exits = append(k.exits, fmt.Sprintf("%s exited by itself: %s; %s", id, p.state, why))
			if atStart {
				k.faults["exit at start, broker down"]++
			}
			k.mu.Unlock()
			if !atStart {
				k.violate(Violation{4, "worker exited by itself", fmt.Sprintf("%s: %s (log %s)", id, p.state, p.logPath)})
			}
		}
	}()
	k.mu.Lock()
	k.slots[slot] = p
	k.started++
	k.mu.Unlock()
	k.log.Info("soak-kafka: worker started", "worker", id, "pid", p.cmd.Process.Pid, "http", addr)
}

// stopWorker signals p and waits for it to exit. After SIGTERM the worker
// must exit within its shutdown grace (plus 10 s for the process); else it
// is a stall and it gets SIGKILL.
func (k *kafkaSoak) stopWorker(p *workerProc, sig syscall.Signal) {
	p.signaled.Store(true)
	if sig == syscall.SIGKILL {
		k.mu.Lock()
		k.killed[p.id] = true
		k.nkilled++
		k.mu.Unlock()
	}
	start := time.Now()
	_ = p.cmd.Process.Signal(sig)
	bound := k.s.grace + 10*time.Second
	select {
	case <-p.done:
	case <-time.After(bound):
		k.stall("%s did not exit within %s of %s (shutdown grace %s)", p.id, bound, sig, k.s.grace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	k.log.Info("soak-kafka: worker stopped", "worker", p.id, "signal", sig.String(), "state", p.state.String(), "took", time.Since(start).String())
	if sig == syscall.SIGTERM && !p.state.Success() {
		why := lastError(p.logPath)
		k.mu.Lock()
		k.faults["sigterm exit≠0"]++
		if strings.Contains(why, "commit offsets at shutdown") {
			// Its finished records since the last commit are processed
			// again by their next owners, as after a SIGKILL.
			k.unclean[p.id] = time.Now()
		}
		k.exits = append(k.exits, fmt.Sprintf("%s after SIGTERM: %s in %s; %s", p.id, p.state, time.Since(start).Round(100*time.Millisecond), why))
		k.mu.Unlock()
	}
}

// lastError returns what a worker's log says last about an error: the
// lines the process printed after its JSON log (the error it exited with),
// else its last error-level log line.
func lastError(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	last := "no error logged"
	var tail []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !strings.HasPrefix(line, "{"):
			tail = append(tail, line)
		case strings.Contains(line, `"level":"ERROR"`):
			last, tail = line, nil
		default:
			tail = nil
		}
	}
	if len(tail) > 0 {
		last = strings.Join(tail, " / ")
	}
	if len(last) > 400 {
		last = last[:400] + "..."
	}
	return last
}

// logHas reports whether the log at path holds s.
func logHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

// scanLogs reports the data races and panics the workers' logs show.
func (k *kafkaSoak) scanLogs() {
	paths, _ := filepath.Glob(filepath.Join(k.s.logDir, "w*.log"))
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if n := strings.Count(string(b), "WARNING: DATA RACE"); n > 0 {
			k.violate(Violation{4, "data race", fmt.Sprintf("%d in %s", n, path)})
		}
		if strings.Contains(string(b), "\npanic: ") || strings.HasPrefix(string(b), "panic: ") {
			k.violate(Violation{4, "worker panicked", path})
		}
	}
}

// produce writes the stream at s.rate events per second until ctx is done
// (riding out the broker's restart), adds each record to the model once the
// broker has acknowledged it, and migrates the late tenant half-way.
// AlwaysRetryEOF: kgo takes an EOF right after a request for a
// misconfiguration (TLS, SASL) and fails the record; here the broker's
// restart causes it, on a loaded machine.
func (k *kafkaSoak) produce(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers), kgo.DefaultProduceTopic(k.topic), kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(5*time.Minute), kgo.RecordRetries(1<<20), kgo.UnknownTopicRetries(-1), kgo.AlwaysRetryEOF())
	if err != nil {
		k.t.Error(err)
		return
	}
	defer cl.Close()
	// The worker binary has the definitions file's projections only: the
	// stream's Go projection (rating_audit) and its poison are left out.
	gen := NewGenerator(k.s.seed, 3000, 25, k.s.causes, func(tenant string) bool { return tenant != TenantLate || k.migrated.Load() })
	half := time.Now().Add(k.s.duration / 2)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	per := max(1, k.s.rate/10)
	var failed atomic.Int64
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if !k.migrated.Load() && time.Now().After(half) {
			if err := k.worker("migrate", "--database-url", k.dbURL, "--projections", k.defs, "--tenant-schema", TenantLate); err != nil {
				k.t.Error(err)
			} else if _, err := k.db.Pool.Exec(ctx, RatingsCheckSQL(TenantLate)); err != nil {
				k.t.Error(err)
			}
			k.migrated.Store(true)
			k.log.Info("soak-kafka: late tenant migrated")
		}
		for range per {
			r := gen.Next()
			r.Pairs = slices.DeleteFunc(r.Pairs, func(p Pair) bool { return p.Projection == AuditProjection })
			cl.Produce(context.Background(), &kgo.Record{Key: r.Key, Value: r.Value}, func(kr *kgo.Record, err error) {
				if err != nil {
					if failed.Add(1) == 1 {
						k.t.Errorf("produce: %v (the model no longer knows what was produced)", err)
					}
					return
				}
				r.Partition, r.Offset = kr.Partition, kr.Offset
				k.model.Add(r)
			})
		}
	}
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		k.t.Errorf("produce: flush: %v", err)
	}
}

// schedule is the seeded fault schedule: every 4–12 s a random worker gets
// SIGKILL or SIGTERM and is started again 0–3 s after it exited; once, at
// 30–70 % of the run, the broker is stopped and started (kafka-down.sh,
// kafka-up.sh: same data). A worker that exited by itself is started again.
// It returns with the broker up and every slot running.
func (k *kafkaSoak) schedule(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	brokerAt := time.Now().Add(time.Duration((0.3 + 0.4*k.rng.Float64()) * float64(k.s.duration)))
	next := time.Now().Add(time.Duration(4000+k.rng.IntN(8000)) * time.Millisecond)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			k.restartEmptySlots()
			return
		case <-tick.C:
		}
		now := time.Now()
		if !brokerAt.IsZero() && now.After(brokerAt) {
			brokerAt = time.Time{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				k.fault("broker-restart")
				if err := k.script("kafka-down.sh"); err != nil {
					k.t.Error(err)
				}
				time.Sleep(2 * time.Second)
				if err := k.script("kafka-up.sh"); err != nil {
					k.t.Error(err)
				}
				k.faultOver("broker-restart")
			}()
		}
		k.restartEmptySlots()
		if now.Before(next) {
			continue
		}
		slot := k.rng.IntN(len(k.slots))
		sig, kind := syscall.SIGTERM, "sigterm"
		if k.rng.IntN(2) == 0 {
			sig, kind = syscall.SIGKILL, "sigkill"
		}
		pause := time.Duration(k.rng.IntN(3000)) * time.Millisecond
		gap := time.Duration(4000+k.rng.IntN(8000)) * time.Millisecond
		k.mu.Lock()
		p := k.slots[slot]
		k.slots[slot] = nil
		k.mu.Unlock()
		if p != nil {
			k.fault(kind)
			k.stopWorker(p, sig)
			time.Sleep(pause)
			k.startWorker(slot)
			k.faultOver(kind)
		}
		// The next fault counts from this one's end: a SIGTERM may take the
		// whole shutdown grace.
		next = time.Now().Add(gap)
	}
}

// restartEmptySlots starts a worker in every slot whose worker exited by
// itself.
func (k *kafkaSoak) restartEmptySlots() {
	for slot := range k.slots {
		k.mu.Lock()
		empty := k.slots[slot] == nil
		k.mu.Unlock()
		if empty {
			k.startWorker(slot)
		}
	}
}

func (k *kafkaSoak) live() []*workerProc {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ps []*workerProc
	for _, p := range k.slots {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// get GETs path of p's HTTP server; the body is read up to 1 MiB.
func (k *kafkaSoak) get(p *workerProc, path string) (int, string, error) {
	resp, err := k.http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// ready returns nil when every live worker's /readyz answers 200, else why
// not.
func (k *kafkaSoak) ready() error {
	var errs []string
	for _, p := range k.live() {
		code, body, err := k.get(p, "/readyz")
		switch {
		case err != nil:
			errs = append(errs, p.id+": "+err.Error())
		case code != http.StatusOK:
			errs = append(errs, fmt.Sprintf("%s: %d %s", p.id, code, strings.TrimSpace(body)))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// gauges returns the non-zero causet_projection_partitions_paused and
// _stuck gauges of the live workers' /metrics.
func (k *kafkaSoak) gauges() []string {
	var out []string
	for _, p := range k.live() {
		_, body, err := k.get(p, "/metrics")
		if err != nil {
			out = append(out, p.id+": /metrics: "+err.Error())
			continue
		}
		for _, line := range strings.Split(body, "\n") {
			if !strings.HasPrefix(line, "causet_projection_partitions_paused") && !strings.HasPrefix(line, "causet_projection_partitions_stuck") {
				continue
			}
			fields := strings.Fields(line)
			if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err != nil || v != 0 {
				out = append(out, p.id+": "+line)
			}
		}
	}
	return out
}

// every calls fn every d until ctx is done.
func every(ctx context.Context, d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fn()
	}
}

// monitor samples the live workers' readiness every second.
func (k *kafkaSoak) monitor(ctx context.Context) {
	every(ctx, time.Second, func() {
		what := "ready"
		if err := k.ready(); err != nil {
			what = err.Error()
		}
		k.mu.Lock()
		changed := len(k.readyLog) == 0 || k.readyLog[len(k.readyLog)-1].what != what
		k.readyLog = append(k.readyLog, kafkaSoakEvent{time.Now(), what})
		k.mu.Unlock()
		if changed {
			k.log.Info("soak-kafka: readiness", "ready", what)
		}
	})
}

// kafkaSoakRecovery is the longest time from the end of a fault to the
// first sample with every live worker ready, over the faults after which
// no other fault began before that sample: faults every few seconds
// chain (a SIGKILLed process holds every rebalance for its 45 s session),
// and a chain recovers once, from the end of its last fault. starts and
// ends are in time order.
func kafkaSoakRecovery(starts []time.Time, ends, samples []kafkaSoakEvent) (time.Duration, string) {
	var worst time.Duration
	var after string
	for _, fe := range ends {
		i := sort.Search(len(samples), func(i int) bool { return !samples[i].at.Before(fe.at) })
		for ; i < len(samples) && samples[i].what != "ready"; i++ {
		}
		if i == len(samples) {
			continue
		}
		ready := samples[i].at
		j := sort.Search(len(starts), func(j int) bool { return starts[j].After(fe.at) })
		if j < len(starts) && starts[j].Before(ready) {
			continue // another fault began before the recovery: it counts from that one's end
		}
		if d := ready.Sub(fe.at); d > worst {
			worst, after = d, fe.what
		}
	}
	return worst, after
}

// sampleCommits is invariant 2 while the soak runs: every 500 ms it reads
// the group's committed offsets and checks each new one.
func (k *kafkaSoak) sampleCommits(ctx context.Context) {
	every(ctx, 500*time.Millisecond, func() { k.checkCommits(ctx) })
}

// checkCommits reads the committed offsets, then the dead-letter topic's end
// offsets, waits until the dead-letter reader has read up to them (every
// dead letter acknowledged before the commit is then known), and checks
// each offset that moved against the database and the dead letters read.
func (k *kafkaSoak) checkCommits(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	committed, err := k.adm.FetchOffsets(qctx, k.group)
	if err != nil {
		k.log.Info("soak-kafka: committed offsets not read", "error", err.Error())
		return // the broker is restarting; next time
	}
	ends, err := k.adm.ListEndOffsets(qctx, k.dlqT)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		k.log.Info("soak-kafka: dead-letter end offsets not read", "error", err.Error())
		return
	}
	if !k.dlq.waitFor(qctx, ends) {
		k.log.Info("soak-kafka: dead letters not read up to the end offsets in time")
		return
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Topic != k.topic || o.Err != nil || o.At < 0 {
			return
		}
		k.mu.Lock()
		moved := o.At > k.lastCommit[o.Partition]
		if moved {
			k.lastCommit[o.Partition] = o.At
		}
		k.mu.Unlock()
		if moved {
			k.violate(k.checker.Check(ctx, "of group "+k.group, o.Partition, o.At)...)
		}
	})
}

// kafkaSoakDLQ is what the soak has read of the dead-letter topic.
type kafkaSoakDLQ struct {
	mu    sync.Mutex
	dls   []DeadLetter
	acked map[PairID]bool
	next  map[int32]int64 // next offset to read, by partition
	bad   []Violation
}

func (d *kafkaSoakDLQ) isAcked(id PairID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acked[id]
}

// waitFor waits until every partition is read up to ends; false when ctx
// ends first.
func (d *kafkaSoakDLQ) waitFor(ctx context.Context, ends kadm.ListedOffsets) bool {
	for {
		behind := false
		d.mu.Lock()
		ends.Each(func(e kadm.ListedOffset) {
			behind = behind || d.next[e.Partition] < e.Offset
		})
		d.mu.Unlock()
		if !behind {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// caughtUp returns every dead letter, once the reader has read the whole
// topic.
func (d *kafkaSoakDLQ) caughtUp(k *kafkaSoak, timeout time.Duration) []DeadLetter {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ends, err := k.adm.ListEndOffsets(ctx, k.dlqT)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		k.t.Fatalf("dead-letter end offsets: %v", err)
	}
	if !d.waitFor(ctx, ends) {
		k.t.Fatalf("dead-letter topic not read to its end within %s", timeout)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.dls)
}

// readDLQ reads the dead-letter topic from its start until ctx is done.
func (k *kafkaSoak) readDLQ(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers), kgo.ConsumeTopics(k.dlqT),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		k.t.Error(err)
		return
	}
	defer cl.Close()
	d := &k.dlq
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			dl, err := RecordDeadLetter(r)
			d.mu.Lock()
			defer d.mu.Unlock()
			d.next[r.Partition] = r.Offset + 1
			if err != nil {
				d.bad = append(d.bad, Violation{5, "unreadable dead letter", fmt.Sprintf("dlq %d@%d: %v", r.Partition, r.Offset, err)})
				return
			}
			d.dls = append(d.dls, dl)
			d.acked[dl.Pair] = true
		})
	}
}

// drain waits, up to s.drain after the last fault, for every partition to
// be committed to its end, every live worker ready and no partition paused
// or stuck; what is not by then is a stall.
func (k *kafkaSoak) drain(since time.Time) {
	deadline := since.Add(k.s.drain)
	var behind, gauges []string
	var readyErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		behind, err = Uncommitted(ctx, k.adm, k.topic, k.group)
		cancel()
		if err != nil {
			behind = []string{err.Error()}
		}
		readyErr = k.ready()
		gauges = k.gauges()
		if n := int(time.Since(since) / time.Second); n%10 == 0 {
			k.log.Info("soak-kafka: draining", "behind", strings.Join(behind, "; "), "ready", fmt.Sprint(readyErr), "gauges", strings.Join(gauges, "; "))
		}
		if len(behind) == 0 && readyErr == nil && len(gauges) == 0 {
			k.log.Info("soak-kafka: drained", "after", time.Since(since).String())
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, b := range behind {
		k.stall("%s, %s after the last fault", b, k.s.drain)
	}
	if readyErr != nil {
		k.stall("not ready %s after the last fault: %v", k.s.drain, readyErr)
	}
	for _, g := range gauges {
		k.stall("%s after the last fault: %s", k.s.drain, g)
	}
}

// kafkaSoakLoss is when a worker stopped owning partitions without
// committing them: "partitions lost" in its log (its group session broke,
// as when the broker restarts), or a SIGTERM exit whose final commit failed
// within the grace (franz-go holds commits while the member is in a
// JoinGroup, which the broker holds until every member rejoins: a SIGKILLed
// one only leaves at its session timeout, 45 s by default).
type kafkaSoakLoss struct {
	at    time.Time
	parts []int32 // nil: all
}

// losses reads the partition losses of every worker from the logs and the
// failed SIGTERM exits. Call it with k.mu held.
func (k *kafkaSoak) losses() map[string][]kafkaSoakLoss {
	out := map[string][]kafkaSoakLoss{}
	for id, at := range k.unclean {
		out[id] = append(out[id], kafkaSoakLoss{at: at})
	}
	k.eachLogLine(func(worker string, line kafkaSoakLogLine) {
		if line.Msg == "partitions lost" && line.Partitions != nil {
			out[worker] = append(out[worker], kafkaSoakLoss{line.Time, line.Partitions})
		}
	})
	return out
}

// kafkaSoakLogLine holds the fields of a worker's JSON log line that the
// checks read.
type kafkaSoakLogLine struct {
	Time       time.Time `json:"time"`
	Msg        string    `json:"msg"`
	Partitions []int32   `json:"partitions"`
	Partition  *int32    `json:"partition"`
	Offset     int64     `json:"offset"`
	Projection string    `json:"projection"`
	Error      string    `json:"error"`
}

// eachLogLine calls fn with every JSON line of every worker log of the run.
func (k *kafkaSoak) eachLogLine(fn func(worker string, line kafkaSoakLogLine)) {
	paths, _ := filepath.Glob(filepath.Join(k.s.logDir, "w*.log"))
	for _, path := range paths {
		worker := strings.TrimSuffix(filepath.Base(path), ".log")
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line kafkaSoakLogLine
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				fn(worker, line)
			}
		}
		f.Close()
	}
}

// explain tells the model what the workers' logs say made a dead letter
// legitimately twice, as the in-process soak's log hook does: records the
// client delivered again (a rewind), dead-letter writes whose attempt
// timed out (written after all, perhaps), and those a released partition
// left unacknowledged with their request maybe in flight.
func (k *kafkaSoak) explain() {
	k.eachLogLine(func(_ string, line kafkaSoakLogLine) {
		if line.Partition == nil {
			return
		}
		switch {
		case strings.HasPrefix(line.Msg, "records delivered again"):
			k.model.Rewound(*line.Partition, line.Offset)
		case strings.HasPrefix(line.Msg, "dead-letter write failed") && strings.Contains(line.Error, dlq.ErrAttemptTimeout.Error()),
			strings.HasPrefix(line.Msg, "dead letter not acknowledged") && maybeStored(line.Error):
			k.model.WriteTimedOut(PairID{*line.Partition, line.Offset, line.Projection})
		}
	})
}

// excuseLost moves from the invariant 3 violations to the in-flight count,
// labelled "partition lost", the duplicate dead letters of pairs whose
// every copy but the newest was written by a worker that was SIGKILLed or,
// before the next copy, lost the partition without committing (see
// kafkaSoakLoss): the next owner, perhaps the same worker given the
// partition back, had to process the record again. A worker that writes a
// dead letter again without losing its partition in between is never
// excused; pairs whose first copy's writer was SIGKILLed are CheckFinal's.
func excuseLost(fin *Final, dls []DeadLetter, killed map[string]bool, losses map[string][]kafkaSoakLoss) {
	byPair := map[PairID][]DeadLetter{}
	for _, dl := range dls {
		byPair[dl.Pair] = append(byPair[dl.Pair], dl)
	}
	flagged := map[string]bool{}
	for _, v := range fin.Violations {
		if v.Invariant == 3 {
			id, _, _ := strings.Cut(v.Detail, " ")
			flagged[id] = true
		}
	}
	excused := map[string]bool{}
	for id, copies := range byPair {
		if !flagged[id.String()] {
			continue // one copy, or explained by CheckFinal already
		}
		byTime := slices.Clone(copies)
		slices.SortStableFunc(byTime, func(a, b DeadLetter) int { return cmp.Compare(failedAt(a), failedAt(b)) })
		copies = byTime
		lost := true
		for i, dl := range byTime[:len(byTime)-1] {
			from, to := time.UnixMilli(failedAt(dl)), time.UnixMilli(failedAt(byTime[i+1]))
			lost = lost && (killed[dl.Worker] || slices.ContainsFunc(losses[dl.Worker], func(l kafkaSoakLoss) bool {
				return !l.at.Before(from) && !l.at.After(to) && (l.parts == nil || slices.Contains(l.parts, id.Partition))
			}))
		}
		if !lost {
			continue
		}
		excused[id.String()] = true
		how := "same worker"
		if slices.ContainsFunc(copies, func(dl DeadLetter) bool { return dl.Worker != copies[0].Worker }) {
			how = "across workers"
		}
		label := copies[0].Cause() + ", " + how
		if fin.Duplicates[label] -= len(copies) - 1; fin.Duplicates[label] <= 0 {
			delete(fin.Duplicates, label)
		}
		fin.InFlightDuplicates[label+", partition lost"] += len(copies) - 1
	}
	fin.Violations = slices.DeleteFunc(fin.Violations, func(v Violation) bool {
		id, _, _ := strings.Cut(v.Detail, " ")
		return v.Invariant == 3 && excused[id]
	})
}

// maybeStored reports whether a dead-letter write's logged error leaves it
// perhaps stored by the broker: an attempt that timed out, or one
// cancelled with its request in flight.
func maybeStored(errText string) bool {
	return strings.Contains(errText, dlq.ErrAttemptTimeout.Error()) ||
		strings.Contains(errText, context.Canceled.Error()) || strings.Contains(errText, context.DeadlineExceeded.Error())
}
