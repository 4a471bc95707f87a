package projection_test

// Regression tests for the faults found by the fault review (issue 8): each
// is named after the behaviour it guards.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// committedAt returns the group's committed offset of partition p (−1 none).
func (r *rig) committedAt(p int32) int64 {
	r.t.Helper()
	adm := kadm.NewClient(r.broker.Client(r.t))
	offs, err := adm.FetchOffsets(context.Background(), r.group)
	if err != nil {
		return -1
	}
	if o, ok := offs.Lookup(r.topic, p); ok && o.Err == nil {
		return o.At
	}
	return -1
}

// waitFor polls cond every 20 ms until it holds or testTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", testTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWorkerRevokeDuringRetryDeadLettersNothingTwice: a batch holds a pair
// that is retried and, after it, a permanent failure. When the partition is
// revoked while the pair waits to be retried, the next owner processes both
// again; the permanent failure must not have been dead-lettered already by
// the first owner, or it gets two dead letters.
func TestWorkerRevokeDuringRetryDeadLettersNothingTwice(t *testing.T) {
	t.Parallel()
	for _, brokers := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d brokers", brokers), func(t *testing.T) {
			t.Parallel()
			testRevokeDuringRetry(t, brokers)
		})
	}
}

func testRevokeDuringRetry(t *testing.T, brokers int) {
	r := newRig(t, rigOptions{brokers: brokers})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	r.produce("user-1", []byte(r.event("ARTIST_RATED", "user-1", 1, `{"user_id":"user-1","artist_id":"a","stars":3}`)))
	r.produce("poison", []byte("not json"))
	r.produce("user-2", []byte(r.follow("user-2", "artist-1", 1)))
	first := r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 5}
	})
	waitFor(t, "the follow after the retried pair to be applied", func() bool { return r.count("artist_followers") == 1 })
	time.Sleep(300 * time.Millisecond) // the rating now waits its first minute
	if err := first.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
	if got := r.committed(); got > 0 {
		t.Errorf("committed offset after the first owner = %d, want none or 0 (the rating unfinished)", got)
	}
	r.start(nil)
	r.waitCommitted(testTimeout)
	perOffset := map[string]int{}
	for _, d := range r.deadLetters() {
		perOffset[d.headers[dlq.HeaderOriginalOffset]+"/"+d.msg.ProjectionName]++
	}
	want := map[string]int{"0/artist_ratings": 1, "1/": 1}
	if fmt.Sprint(perOffset) != fmt.Sprint(want) {
		t.Errorf("dead letters per offset/projection = %v, want %v", perOffset, want)
	}
}

// TestWorkerHandOffOfManyOpenRecordsDeadLettersNothingTwice: a partition
// stopped with more open records than the first hand-off format held (42
// of them in its 4000 bytes: second new-user trial, SIGTERM with 45
// retried records) still tells the next owner which records after them it
// finished: the poison after 300 retried records is dead-lettered once,
// not again by the next owner.
func TestWorkerHandOffOfManyOpenRecordsDeadLettersNothingTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	const retried, poison = 300, 20
	for i := range retried {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, `{"user_id":"`+user+`","artist_id":"a","stars":3}`)))
	}
	for i := range poison {
		r.produce(fmt.Sprintf("poison-%d", i), []byte("not json"))
	}
	firstLogs := &logCounter{msgs: map[string][]slog.Record{}}
	first := r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 5}
		c.Logger = slog.New(firstLogs)
	})
	waitFor(t, "the poison's dead letters", func() bool { return len(r.deadLetters()) == poison })
	if err := first.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
	if n, open := len(firstLogs.records("hand-off committed")), logSum(firstLogs, "hand-off committed", "open_records"); n != 1 || open != retried {
		t.Errorf("%d hand-off committed lines with open_records=%d in all, want one with %d", n, open, retried)
	}
	for msg := range firstLogs.msgs {
		if strings.HasPrefix(msg, "hand-off holds only") {
			t.Errorf("the hand-off of %d open records was cut: %s", retried, msg)
		}
	}
	// A record after the hand-off: its dead letter says the next owner went
	// past the records handed off.
	r.produce("marker", []byte("not json either"))
	r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 5}
	})
	waitFor(t, "the marker's dead letter", func() bool { return len(r.deadLetters()) >= poison+1 })
	time.Sleep(200 * time.Millisecond)
	perOffset := map[string]int{}
	for _, d := range r.deadLetters() {
		perOffset[d.headers[dlq.HeaderOriginalOffset]]++
	}
	for off, n := range perOffset {
		if n != 1 {
			t.Errorf("offset %s: %d dead letters, want 1", off, n)
		}
	}
	if len(perOffset) != poison+1 {
		t.Errorf("dead letters for %d offsets, want %d", len(perOffset), poison+1)
	}
}

// TestWorkerHandOffKeepsRetryStateWhenTheBatchGoesPastIt: the next owner
// keeps the handed-off pairs' first failure and retries also when its first
// batch holds records after the hand-off (a record produced after the stop
// here; a hand-off cut to what fits in the offset metadata has them too).
// It once dropped the hand-off at the first record past it, before that
// batch's failures were settled (ops trial: 2400 dead letters dated at the
// restart, each with the second owner's full --max-retries).
func TestWorkerHandOffKeepsRetryStateWhenTheBatchGoesPastIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	const retried = 5
	for i := range retried {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, `{"user_id":"`+user+`","artist_id":"a","stars":3}`)))
	}
	firstLogs := &logCounter{msgs: map[string][]slog.Record{}}
	first := r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: 100 * time.Millisecond, Multiplier: 1, MaxInterval: 100 * time.Millisecond, MaxRetries: 1000}
		c.Logger = slog.New(firstLogs)
	})
	// Each pair has made 3 retries once its 4th is scheduled.
	waitFor(t, "3 retries of each pair at the first owner", func() bool {
		scheduled := map[int64]int64{} // offset → highest retry scheduled
		for _, rec := range firstLogs.records("projection failed, retrying") {
			var off, n int64
			rec.Attrs(func(a slog.Attr) bool {
				switch a.Key {
				case "offset":
					off = a.Value.Int64()
				case "retry":
					n = a.Value.Int64()
				}
				return true
			})
			scheduled[off] = max(scheduled[off], n)
		}
		for off := range int64(retried) {
			if scheduled[off] < 4 {
				return false
			}
		}
		return true
	})
	if err := first.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
	stopped := time.Now()
	if open := logSum(firstLogs, "hand-off committed", "open_records"); open != retried {
		t.Fatalf("hand-off committed with open_records=%d, want %d", open, retried)
	}
	r.produce("marker", []byte(r.follow("marker", "artist-1", 1))) // after the hand-off's last record
	// Fewer retries than the pairs made at the first owner: each is
	// dead-lettered at its first attempt here, with the retries it made.
	r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 2}
	})
	waitFor(t, "the retried pairs' dead letters", func() bool { return len(r.deadLetters()) >= retried })
	for _, d := range r.deadLetters() {
		if first := time.UnixMilli(d.msg.FirstFailedAt); !first.Before(stopped) || d.msg.RetryCount < 3 {
			t.Errorf("dead letter of offset %s: firstFailedAt %s, retryCount %d; want the first owner's first failure (before %s) and its retries (3 or more)",
				d.headers[dlq.HeaderOriginalOffset], first.Format(time.RFC3339Nano), d.msg.RetryCount, stopped.Format(time.RFC3339Nano))
		}
	}
}

// TestWorkerSaysWhenABatchWaitsOnALock: a table locked by another session
// holds the batch (the worker sets no lock_timeout); a WARN line says the
// partition's batch is taking long, naming the partition and the fix, and
// the batch is applied once the lock is released (ops trial: no line at
// all for 75 s). Not parallel: it shortens the watch for every worker.
func TestWorkerSaysWhenABatchWaitsOnALock(t *testing.T) {
	defer projection.SetSlowWork(300 * time.Millisecond)()
	r := newRig(t, rigOptions{})
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	ctx := context.Background()
	tx := lockFollowers(t, r)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	const slow = "a partition's batch is taking long"
	waitFor(t, "the slow batch's WARN line", func() bool { return len(logs.withPrefix(slow)) > 0 })
	for _, rec := range logs.withPrefix(slow) {
		if !strings.Contains(rec.Message, "lock_timeout") || rec.Level != slog.LevelWarn {
			t.Errorf("slow batch line %q at %s, want a WARN naming lock_timeout", rec.Message, rec.Level)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted(testTimeout)
	if n := r.count("artist_followers"); n != 1 {
		t.Errorf("rows = %d, want 1", n)
	}
}

// TestWorkerStuckOnDeadLetterCommitsTheRecordsBeforeIt: while a dead letter
// cannot be written, the records before it are finished and their offsets
// are committed; only the record itself and what follows wait.
func TestWorkerStuckOnDeadLetterCommitsTheRecordsBeforeIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.produce("good-1", []byte(r.follow("good-1", "artist-1", 1)))
	r.produce("good-2", []byte(r.follow("good-2", "artist-1", 1)))
	r.produce("poison", []byte("not json"))
	r.produce("good-3", []byte(r.follow("good-3", "artist-1", 1)))
	w, refusing := r.startRefusing()

	waitFor(t, "the partition to be reported stuck", func() bool { return strings.Contains(fmt.Sprint(w.Ready()), "stuck") })
	waitFor(t, "offset 2 (the records before the dead letter) to be committed", func() bool { return r.committed() == 2 })
	time.Sleep(300 * time.Millisecond) // a wrong commit past the record would happen now
	if got := r.committed(); got != 2 {
		t.Errorf("committed offset = %d, want 2 while offset 2's dead letter is not written", got)
	}
	refusing.n.Store(0)
	r.waitCommitted(testTimeout)
}

// planPanicky is a planned projection whose Plan (and Apply) panic.
type planPanicky struct{}

func (planPanicky) Name() string          { return "plan_panicky" }
func (planPanicky) Handles(t string) bool { return t == "ARTIST_FOLLOWED" }
func (planPanicky) Apply(context.Context, projection.DB, *projection.Event) (projection.Outcome, error) {
	panic("apply boom")
}
func (planPanicky) Plan(*projection.Event) (projection.Statement, error) { panic("plan boom") }

// TestWorkerPlanPanicIsDeadLetteredNotFatal: a panic in a Planner's Plan is
// a projection error like a panic in Apply; it once killed the process.
func TestWorkerPlanPanicIsDeadLetteredNotFatal(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil, append([]projection.Handler{planPanicky{}}, r.handlers...)...)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	d := dls[0]
	if d.msg.ProjectionName != "plan_panicky" || d.headers[dlq.HeaderErrorClass] != "projection" || !strings.Contains(d.msg.Error, "boom") || !strings.Contains(d.msg.StackTrace, "planPanicky") {
		t.Errorf("dead letter = %+v %v", d.msg, d.headers)
	}
	if n := r.count("artist_followers"); n != 1 {
		t.Errorf("artist_followers rows = %d, want 1", n)
	}
}

// blocking is a Go projection that blocks every BLOCK event until its
// context ends (block true), or applies it at once (block false).
type blocking struct {
	block bool
	mu    sync.Mutex
	seen  map[string]bool // entity ids applied or blocked on
}

func (b *blocking) Name() string          { return "blocking" }
func (b *blocking) Handles(t string) bool { return t == "BLOCK" }
func (b *blocking) Apply(ctx context.Context, _ projection.DB, ev *projection.Event) (projection.Outcome, error) {
	b.mu.Lock()
	if b.seen == nil {
		b.seen = map[string]bool{}
	}
	b.seen[ev.EntityID] = true
	b.mu.Unlock()
	if !b.block {
		return projection.Applied, nil
	}
	<-ctx.Done()
	return projection.Applied, ctx.Err()
}

func (b *blocking) saw(entity string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[entity]
}

// TestWorkerPausedPartitionResumesAfterReassignment: a partition whose
// fetching is paused (backpressure behind a slow pair) that is revoked and
// later assigned back must be fetched again; the client keeps a pause
// across rebalances, and the new partition state starts unpaused.
func TestWorkerPausedPartitionResumesAfterReassignment(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 2})
	manual := r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceTo := func(p int32, key, value string) {
		t.Helper()
		if err := manual.ProduceSync(context.Background(), &kgo.Record{Partition: p, Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	small := func(c *projection.Config) { c.MaxQueuedBytes = 100 } // any record pauses its partition
	slow := &blocking{block: true}
	a := r.start(small, append([]projection.Handler{slow}, r.handlers...)...)
	for p := range int32(2) {
		produceTo(p, fmt.Sprintf("block-%d", p), r.event("BLOCK", fmt.Sprintf("block-%d", p), 1, "{}"))
	}
	waitFor(t, "both partitions to block", func() bool { return slow.saw("block-0") && slow.saw("block-1") })

	fast := &blocking{}
	b := r.start(small, append([]projection.Handler{fast}, r.handlers...)...)
	waitFor(t, "the second member to take a partition", func() bool { return fast.saw("block-0") || fast.saw("block-1") })
	moved := int32(0)
	if fast.saw("block-1") {
		moved = 1
	}
	waitFor(t, "the moved partition's block record to be committed", func() bool { return r.committedAt(moved) == 1 })
	if err := b.stop(t); err != nil { // the moved partition goes back to the first member
		t.Fatalf("second worker Run = %v", err)
	}
	for i := range 3 {
		user := fmt.Sprintf("user-%d", i)
		produceTo(moved, user, r.follow(user, "artist-1", 1))
	}
	waitFor(t, fmt.Sprintf("partition %d to be consumed again by the first member", moved), func() bool { return r.committedAt(moved) == 4 })
	if err := a.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
}

// stubborn is a Go projection that ignores its context: it blocks until the
// test ends.
type stubborn struct{ release chan struct{} }

func (stubborn) Name() string          { return "stubborn" }
func (stubborn) Handles(t string) bool { return t == "BLOCK" }
func (s stubborn) Apply(context.Context, projection.DB, *projection.Event) (projection.Outcome, error) {
	<-s.release
	return projection.Applied, nil
}

// TestWorkerShutdownIsBoundedByTheGrace: Run returns within the shutdown
// grace even when a handler ignores its context, with an error that says
// what did not stop.
func TestWorkerShutdownIsBoundedByTheGrace(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	s := stubborn{release: make(chan struct{})}
	t.Cleanup(func() { close(s.release) })
	rn := r.start(func(c *projection.Config) { c.ShutdownGrace = time.Second }, append([]projection.Handler{s}, r.handlers...)...)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	r.produce("block", []byte(r.event("BLOCK", "block", 1, "{}")))
	time.Sleep(300 * time.Millisecond) // the handler now blocks
	start := time.Now()
	rn.cancel()
	select {
	case <-rn.done:
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15 s of a 1 s shutdown grace")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %s with a 1 s grace", took)
	}
	if rn.err == nil || !strings.Contains(rn.err.Error(), "partition 0") {
		t.Errorf("Run = %v, want an error naming partition 0, which did not stop", rn.err)
	}
	if got := r.committed(); got != 1 {
		t.Errorf("committed offset = %d, want 1", got)
	}
}

// TestWorkerStopDuringDatabaseOutageDoesNotClaimRecovery: a partition
// stopped while it waits for the database must not log that the database
// is available again.
func TestWorkerStopDuringDatabaseOutageDoesNotClaimRecovery(t *testing.T) {
	t.Parallel()
	db := pgtest.StartOwn(t)
	r := newRig(t, rigOptions{db: db})
	var logs safeBuffer
	rn := r.start(func(c *projection.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if err := db.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Restart(context.Background()) })
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	waitFor(t, "the partition to pause", func() bool { return strings.Contains(fmt.Sprint(rn.w.Ready()), "paused") })
	if err := rn.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if out := logs.String(); strings.Contains(out, "available again") {
		t.Errorf("log claims the database recovered while it is down:\n%s", out)
	}
}

// safeBuffer is a bytes.Buffer safe for concurrent writes.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWorkerNextOwnerKeepsFirstFailedAt: a pair whose retries are cut by a
// revoke or shutdown is dead-lettered by the next owner with the time it
// first failed at the previous owner, not at the next one.
func TestWorkerNextOwnerKeepsFirstFailedAt(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	before := time.Now().UnixMilli()
	r.produce("user-1", []byte(r.event("ARTIST_RATED", "user-1", 1, `{"user_id":"user-1","artist_id":"a","stars":3}`)))
	first := r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 5}
	})
	time.Sleep(time.Second) // the rating fails once and waits its first minute
	if err := first.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
	secondStart := time.Now().UnixMilli()
	r.start(nil)
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	if got := dls[0].msg.FirstFailedAt; got < before || got >= secondStart {
		t.Errorf("firstFailedAt = %d, want the first owner's failure in [%d, %d)", got, before, secondStart)
	}
}

// TestWorkerShutdownLetsADeadLetterWriteInFlightFinish: a worker stopped
// while Kafka has not yet answered a dead-letter write lets the write
// finish (within half the shutdown grace) and commits its record, instead
// of cutting it: a write cut after its request was sent can be stored all
// the same, and the next owner then writes the dead letter a second time.
// When Kafka answers only after half the grace, the write is cut, the
// record stays uncommitted and the worker says so at WARN, naming the pair
// (the line that explains a dead letter found twice).
func TestWorkerShutdownLetsADeadLetterWriteInFlightFinish(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		answerAfter   time.Duration // Kafka's delay on the dead-letter topic
		grace         time.Duration
		wantCommitted int64
	}{
		{"answered within half the grace", time.Second, 10 * time.Second, 1},
		{"answered after half the grace", 4 * time.Second, 2 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{fake: true})
			var slow atomic.Bool
			slow.Store(true)
			sent := make(chan struct{}, 1)
			topics, err := kadm.NewClient(r.broker.Client(t)).ListTopics(context.Background(), r.dlqTopic)
			if err != nil {
				t.Fatal(err)
			}
			dlqID := topics[r.dlqTopic].ID
			r.broker.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				r.broker.Fake.KeepControl()
				pr := req.(*kmsg.ProduceRequest)
				if len(pr.Topics) == 0 || pr.Topics[0].Topic != r.dlqTopic && pr.Topics[0].TopicID != dlqID || !slow.Load() {
					return nil, nil, false
				}
				select {
				case sent <- struct{}{}:
				default:
				}
				r.broker.Fake.SleepControl(func() { time.Sleep(tc.answerAfter) })
				return nil, nil, false
			})
			var log safeBuffer
			prod := r.broker.Client(t, kgo.ProducerLinger(0), kgo.AllowIdempotentProduceCancellation())
			writer, err := dlq.NewWriter(prod, dlq.WriterConfig{RecordConfig: dlq.RecordConfig{Topic: r.dlqTopic, Worker: "test-worker", Generation: "test/v42"}})
			if err != nil {
				t.Fatal(err)
			}
			w, err := projection.NewWorker(projection.Config{
				Topic: r.topic, Group: r.group, Retry: fastRetry, CommitInterval: time.Hour, ShutdownGrace: tc.grace,
				Logger: slog.New(slog.NewJSONHandler(&log, nil)),
			}, r.handlers, r.pool, writer, r.broker.Opts()...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			first := &running{w: w, cancel: cancel, done: make(chan struct{})}
			go func() {
				defer close(first.done)
				first.err = w.Run(ctx)
			}()
			r.produce("poison", []byte("not json"))
			select {
			case <-sent:
			case <-time.After(testTimeout):
				t.Fatal("the dead letter was never sent")
			}
			if err := first.stop(t); err != nil { // while Kafka has not answered
				t.Fatalf("first worker Run = %v", err)
			}
			if got := r.committed(); got != tc.wantCommitted {
				t.Errorf("committed offset after the first worker = %d, want %d", got, tc.wantCommitted)
			}
			released := strings.Contains(log.String(), `"msg":"dead letter not acknowledged when the partition was released`) &&
				strings.Contains(log.String(), `"partition":0,"offset":0,"projection":""`)
			if released != (tc.wantCommitted == 0) {
				t.Errorf("log says the dead letter of 0@0 was left unacknowledged: %v, want %v; log:\n%s", released, tc.wantCommitted == 0, log.String())
			}
			slow.Store(false)
			r.start(nil)
			r.produce("good", []byte(r.follow("good", "artist-1", 1)))
			r.waitCommitted(testTimeout)
			if dls := r.deadLetters(); len(dls) < 1 || len(dls) > 2-int(tc.wantCommitted) {
				t.Errorf("dead letters = %d, want 1 (or 2 when the cut write was stored)", len(dls))
			}
		})
	}
}

// concurrent is a Go projection that applies LARGE events slowly and
// counts how many it applies at once.
type concurrent struct {
	mu        sync.Mutex
	now, most int
	applied   int
}

func (c *concurrent) Name() string          { return "concurrent" }
func (c *concurrent) Handles(t string) bool { return t == "LARGE" }
func (c *concurrent) Apply(ctx context.Context, _ projection.DB, _ *projection.Event) (projection.Outcome, error) {
	c.mu.Lock()
	c.now++
	c.most = max(c.most, c.now)
	c.mu.Unlock()
	time.Sleep(200 * time.Millisecond)
	c.mu.Lock()
	c.now--
	c.applied++
	c.mu.Unlock()
	return projection.Applied, nil
}

func (c *concurrent) counts() (most, applied int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.most, c.applied
}

// TestWorkerProcessesLargeBatchesWithinTheBudget: records of 600 KiB on
// three partitions, with MaxQueuedBytes 1 MiB, are processed one at a time
// (each takes more than half the processing budget), so that processing
// memory does not add up across partitions; with a budget of 4 MiB they are
// processed side by side (so the check above can fail).
func TestWorkerProcessesLargeBatchesWithinTheBudget(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		budget   int
		parallel bool
	}{{1 << 20, false}, {4 << 20, true}} {
		r := newRig(t, rigOptions{partitions: 3})
		manual := r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		for p := range int32(3) {
			entity := fmt.Sprintf("large-%d", p)
			value := r.event("LARGE", entity, 1, fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", 600<<10)))
			if err := manual.ProduceSync(context.Background(), &kgo.Record{Partition: p, Key: []byte(entity), Value: []byte(value)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		c := &concurrent{}
		r.start(func(cfg *projection.Config) { cfg.MaxQueuedBytes = tt.budget }, append([]projection.Handler{c}, r.handlers...)...)
		waitFor(t, "the three large records to be applied", func() bool { _, n := c.counts(); return n == 3 })
		if most, _ := c.counts(); (most > 1) != tt.parallel {
			t.Errorf("budget %d: at most %d large records applied at once, want parallel=%v", tt.budget, most, tt.parallel)
		}
	}
}

// TestWorkerNextOwnerGoesOnCountingRetries: a pair whose retries are cut by
// a shutdown after 2 of its 4 is retried by the next owner only for what
// is left of its --max-retries (the hand-off carries the count; new-user
// trial: a restart gave it 4 more), and its dead letter says 4.
func TestWorkerNextOwnerGoesOnCountingRetries(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	r.produce("user-1", []byte(r.event("ARTIST_RATED", "user-1", 1, `{"user_id":"user-1","artist_id":"a","stars":3}`)))
	policy := func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: 200 * time.Millisecond, Multiplier: 5, MaxInterval: time.Second, MaxRetries: 4}
	}
	const retrying = "projection failed, retrying" // one line before each retry
	firstLogs := &logCounter{msgs: map[string][]slog.Record{}}
	first := r.start(func(c *projection.Config) {
		policy(c)
		c.Logger = slog.New(firstLogs)
	})
	deadline := time.Now().Add(testTimeout)
	for len(firstLogs.records(retrying)) < 3 { // failed 3 times: 2 retries made, the third waits 1 s
		if time.Now().After(deadline) {
			t.Fatal("the rating never failed three times")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.stop(t); err != nil {
		t.Fatalf("first worker Run = %v", err)
	}
	secondLogs := r.startLogged(policy)
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	if got := dls[0].msg.RetryCount; got != 4 {
		t.Errorf("retryCount = %d, want 4", got)
	}
	if got := len(firstLogs.records(retrying)) + len(secondLogs.records(retrying)); got != 4 {
		t.Errorf("%d retries scheduled across both owners, want 4 (--max-retries)", got)
	}
}

// TestWorkerCommitsAtShutdownThroughRetriableErrors: when the coordinator
// answers the shutdown's commit with REQUEST_TIMED_OUT, then
// NOT_COORDINATOR, the worker commits again, and the group's offset covers
// every record it applied: the next owner does not process them again (the
// fault soak, seed 1796212270894762707: a revoke's commit lost to one
// REQUEST_TIMED_OUT, seven dead letters written twice). The revoke path
// commits through the same function.
func TestWorkerCommitsAtShutdownThroughRetriableErrors(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{fake: true})
	rn := r.start(func(c *projection.Config) { c.CommitInterval = time.Hour })
	const n = 3
	for i := range n {
		r.produce(fmt.Sprintf("u%d", i), []byte(r.follow(fmt.Sprintf("u%d", i), "artist-1", 1)))
	}
	deadline := time.Now().Add(testTimeout)
	for r.count("artist_followers") < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := r.count("artist_followers"); got != n {
		t.Fatalf("%d rows applied, want %d", got, n)
	}
	// Rows are visible once their transaction commits; their offsets are
	// marked after the sweep that follows it (CI: stopped in between, the
	// batch was left to the next owner and 1 of 3 committed).
	waitFor(t, "the worker to mark every applied record", func() bool {
		return rn.w.Client().MarkedOffsets()[r.topic][0].Offset == n
	})
	var refused atomic.Int32
	r.broker.Fake.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cr := req.(*kmsg.OffsetCommitRequest)
		if cr.Group != r.group || refused.Load() >= 2 {
			return nil, nil, false
		}
		r.broker.Fake.KeepControl()
		code := []*kerr.Error{kerr.RequestTimedOut, kerr.NotCoordinator}[refused.Add(1)-1]
		return kafkatest.CommitError(cr, code.Code), nil, true
	})
	if err := rn.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil after the commit went through", err)
	}
	if got := refused.Load(); got != 2 {
		t.Fatalf("%d commits refused, want 2: the test no longer shows what it should", got)
	}
	if got := r.committed(); got != n {
		t.Errorf("committed offset = %d, want %d (every applied record)", got, n)
	}
}

// TestWorkerConsumerLagGrowsWhileAPartitionIsHeld: while batches wait on a
// lock and the partitions' fetching is paused (their queues full), the
// records produced behind them still show in causet.projection.consumer.lag:
// the high watermark comes from the broker's end offsets, not only from
// fetches, which a paused partition does not make (SRE trial: the gauge
// stood still for 50 s while 20 000 records arrived, so the lag alert
// could not fire).
func TestWorkerConsumerLagGrowsWhileAPartitionIsHeld(t *testing.T) {
	defer projection.SetHighWatermarkEvery(100 * time.Millisecond)()
	r := newRig(t, rigOptions{partitions: 3})
	metrics, reader := testMetrics(t)
	ctx := context.Background()
	tx := lockFollowers(t, r)
	// A queue of 2 KiB: a partition's fetching pauses after a few records.
	r.start(func(c *projection.Config) { c.Metrics = metrics; c.MaxQueuedBytes = 2048 })
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			user := fmt.Sprintf("user-%d", i)
			r.produce(user, []byte(r.follow(user, "artist-1", 1)))
		}
	}
	lag := func() int64 {
		var sum int64
		for _, p := range lagPoints(t, reader) {
			sum += p.Value
		}
		return sum
	}
	produce(0, 30)
	waitFor(t, "every partition's fetching paused behind the lock", func() bool { return lag() > 0 })
	time.Sleep(300 * time.Millisecond) // fetches that were under way end
	produce(30, 300)
	waitFor(t, "the consumer lag to count all 300 records held", func() bool { return lag() == 300 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted(testTimeout)
	waitFor(t, "the consumer lag back to 0", func() bool { return lag() == 0 })
}

// lagPoints returns the series of causet.projection.consumer.lag that
// reader collects.
func lagPoints(t *testing.T, reader *sdkmetric.ManualReader) []metricdata.DataPoint[int64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.DataPoint[int64]
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if g, ok := md.Data.(metricdata.Gauge[int64]); ok && md.Name == "causet.projection.consumer.lag" {
				out = append(out, g.DataPoints...)
			}
		}
	}
	return out
}

// TestWorkerServesTheLagOfItsPartitionsOnceAssigned: every partition
// assigned has its consumer lag series soon after the assignment, also one
// with no record to fetch, not only at the next refresh of the end offsets
// (operator trial: no causet_projection_consumer_lag series for the first
// 15 s of every start, since the first refresh ran before the group
// assigned any partition).
func TestWorkerServesTheLagOfItsPartitionsOnceAssigned(t *testing.T) {
	defer projection.SetHighWatermarkEvery(time.Hour)()
	r := newRig(t, rigOptions{partitions: 3})
	metrics, reader := testMetrics(t)
	// Records in one partition: the others have nothing to fetch.
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.start(func(c *projection.Config) { c.Metrics = metrics })
	r.waitCommitted(testTimeout)
	waitFor(t, "a lag series of each of the 3 partitions, at 0", func() bool {
		ps := lagPoints(t, reader)
		return len(ps) == 3 && !slices.ContainsFunc(ps, func(p metricdata.DataPoint[int64]) bool { return p.Value != 0 })
	})
}

// lockFollowers locks r's artist_followers table in a transaction of its
// own, which the caller rolls back to release it (and the test's end does).
func lockFollowers(t *testing.T, r *rig) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestWorkerIsNotReadyWhileItsTopicsDoNotExist: the events and dead-letter
// topics deleted under a running worker. Its Ready names them within the
// refresh of the end offsets (operator trial: with both topics gone,
// /readyz said ready and causet_dlq_depth 0, and only franz-go's INFO
// lines said anything); created again, they have new topic IDs, which
// franz-go does not adopt, so Ready asks for a restart (second trial: it
// said ready, consumed nothing and logged 12 000 fetch errors a second).
func TestWorkerIsNotReadyWhileItsTopicsDoNotExist(t *testing.T) {
	defer projection.SetHighWatermarkEvery(100 * time.Millisecond)()
	r := newRig(t, rigOptions{partitions: 3})
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	rn := r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	ready := func(want string) {
		t.Helper()
		deadline := time.Now().Add(testTimeout)
		for {
			err := rn.w.Ready()
			if want == "" && err == nil || want != "" && err != nil && strings.Contains(err.Error(), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Ready() = %v, want %q", err, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ready("")
	ctx := context.Background()
	adm := kadm.NewClient(r.broker.Client(t))
	if _, err := adm.DeleteTopics(ctx, r.topic, r.dlqTopic); err != nil {
		t.Fatal(err)
	}
	ready("topics do not exist: " + r.topic + ", " + r.dlqTopic + " (deleted while the worker runs? create them again with `projection-worker topics` and their --partitions, then restart the worker)")
	for _, topic := range []string{r.topic, r.dlqTopic} {
		// A real broker may still be deleting it: asked again until it
		// takes the name.
		for deadline := time.Now().Add(testTimeout); ; time.Sleep(200 * time.Millisecond) {
			resp, err := adm.CreateTopic(ctx, 3, 1, map[string]*string{"retention.ms": kadm.StringPtr("-1")}, topic)
			if err == nil {
				err = resp.Err
			}
			if err == nil {
				break
			}
			if !errors.Is(err, kerr.TopicAlreadyExists) || time.Now().After(deadline) {
				t.Fatalf("create topic %s again: %v", topic, err)
			}
		}
	}
	ready("topics deleted and created again while the worker runs: " + r.topic + ", " + r.dlqTopic + " (its Kafka client keeps the deleted topic's ID and neither reads nor writes the new one: restart the worker)")
	if strings.Contains(rn.w.Ready().Error(), "topics do not exist") {
		t.Errorf("Ready() = %v, want the topics no longer said missing", rn.w.Ready())
	}
	// Each poll answers the old ID's fetch error again: said once per
	// partition and error, the repeats counted (2 000 000 lines before).
	// A new client: the rig's producer keeps the old ID too.
	prod := r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.ProducerLinger(0))
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("user-2"), Value: []byte(r.follow("user-2", "artist-1", 1))}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if n := len(logs.records("fetch failed")); n > 3*2 {
		t.Errorf("%d fetch failed lines in 10 s, want at most 2 per partition (the first of each error)", n)
	}
}

// TestWorkerSeesItsTopicCreatedAgainSoonAfterItStarts: the worker takes
// its topics' IDs as it starts, so a topic deleted and created again
// before its first 15 s check is seen (operator trial: deleted within
// 15 s of the start, the new topic was taken for the one the worker had
// read: ready, nothing consumed), and it commits none of the deleted
// topic's offsets, which by the topic's name would be the new one's and
// skip its records.
func TestWorkerSeesItsTopicCreatedAgainSoonAfterItStarts(t *testing.T) {
	defer projection.SetHighWatermarkEvery(3 * time.Second)()
	r := newRig(t, rigOptions{partitions: 2})
	rn := r.start(nil)
	for i := range 4 {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	waitFor(t, "the records to be applied", func() bool { return r.count("artist_followers") == 4 })
	ctx := context.Background()
	adm := kadm.NewClient(r.broker.Client(t))
	if _, err := adm.DeleteTopics(ctx, r.topic); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(testTimeout); ; time.Sleep(100 * time.Millisecond) {
		resp, err := adm.CreateTopic(ctx, 2, 1, nil, r.topic)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kerr.TopicAlreadyExists) || time.Now().After(deadline) {
			t.Fatalf("create topic %s again: %v", r.topic, err)
		}
	}
	waitFor(t, "Ready to say the topic was created again", func() bool {
		err := rn.w.Ready()
		return err != nil && strings.Contains(err.Error(), "topics deleted and created again while the worker runs: "+r.topic)
	})
	_ = rn.stop(t) // its commits refused: an error
	offsets, err := adm.FetchOffsets(ctx, r.group)
	if err != nil {
		t.Fatal(err)
	}
	offsets.Each(func(o kadm.OffsetResponse) {
		if o.Topic == r.topic && o.Err == nil && o.At > 0 {
			t.Errorf("partition %d of the new topic has offset %d committed, the deleted topic's: its first records would be skipped", o.Partition, o.At)
		}
	})
}
