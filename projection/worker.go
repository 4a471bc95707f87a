package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/retry"
)

// InfraMode says what the worker does when the database is unavailable.
type InfraMode string

const (
	// InfraPause (the default) pauses the affected partitions, reports
	// not-ready and retries without limit until the database answers; no
	// event is dead-lettered during an outage.
	InfraPause InfraMode = "pause"
	// InfraDeadLetter treats infrastructure errors like projection errors:
	// retried up to the maximum, then dead-lettered.
	InfraDeadLetter InfraMode = "dlq"
)

// Defaults for Config.
const (
	DefaultGroup           = "causet-projection-worker"
	DefaultMaxPollRecords  = 10000
	DefaultMaxQueuedBytes  = 8 << 20
	DefaultMaxBatchRecords = 500
	DefaultShutdownGrace   = 25 * time.Second
)

// Config configures a Worker. Zero values take the documented defaults; call
// Validate (NewWorker does) to fill them in and check the rest.
type Config struct {
	// Topic is the events topic. Default "causet.projection-events.v1".
	Topic string
	// Group is the consumer group. Default "causet-projection-worker".
	Group string
	// Retry is the policy for failing (event, projection) pairs. Default
	// retry.DefaultPolicy(): 200 ms, ×2, 10 s cap, jitter, 5 retries.
	Retry retry.Policy
	// OnInfraError is InfraPause (default) or InfraDeadLetter.
	OnInfraError InfraMode
	// InfraRetry paces the waits while the database is unavailable under
	// InfraPause; its MaxRetries is ignored (no limit). Default 500 ms, ×2,
	// 30 s cap, jitter 0.5.
	InfraRetry retry.Policy
	// MaxPollRecords bounds the records taken from the client per poll.
	// Default 10000.
	MaxPollRecords int
	// MaxBatchRecords bounds the records of one partition applied in one
	// transaction. Default 500; 1 applies records one at a time.
	MaxBatchRecords int
	// CopyMinRows is the smallest group of upserts of one table in one
	// tenant schema, within a batch, that is applied with COPY into a
	// temporary table and one INSERT ... ON CONFLICT instead of one
	// statement per pair; below it the extra round trips cost more than they
	// save. When a COPY fails, its batch is applied as statements, which
	// isolate the failing pairs. Default 32; -1 never uses COPY.
	CopyMinRows int
	// MaxQueuedBytes bounds the record bytes (key, value, headers) polled
	// but not yet processed, all partitions together, so that memory does
	// not grow with the backlog: above it the worker stops polling (the
	// client then holds at most one fetch) until the queues drain. A single
	// partition holding three quarters of it, such as one waiting for the
	// database, has its fetching paused instead, so that it does not stall
	// the others; pausing drops what the client had fetched for it, which is
	// fetched again on resume. Default 8 MiB.
	MaxQueuedBytes int
	// CommitInterval is how often marked offsets are committed while
	// running (they are also committed on revoke and at shutdown). Default
	// 5 s (franz-go's default).
	CommitInterval time.Duration
	// ShutdownGrace bounds the time Run takes after its context is done to
	// commit finished offsets and leave the group. Default 25 s.
	ShutdownGrace time.Duration
	// Logger receives the worker's logs. Default: discarded.
	Logger *slog.Logger
	// Metrics records counters and histograms; default: none recorded.
	Metrics *Metrics
	// Tracer, when set, starts a process span per record, continuing the W3C
	// trace context found in the record's headers (franz-go kotel).
	Tracer *kotel.Tracer
	// TenantSchemas narrows the tenant schemas the worker accepts
	// (NewTenantSchemas, --tenant-schema-pattern). Default nil: every name
	// ValidTenantSchema accepts (SPEC §3's pattern, PostgreSQL's own
	// schemas and public excepted). An event for another tenant schema is
	// dead-lettered at once as permanent, naming tenantSchema.
	TenantSchemas *TenantSchemas
}

// Validate fills in defaults and returns an error naming the first invalid
// field.
func (c *Config) Validate() error {
	if c.Topic == "" {
		c.Topic = dlq.DefaultEventsTopic
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Retry == (retry.Policy{}) {
		c.Retry = retry.DefaultPolicy()
	}
	if err := c.Retry.Validate(); err != nil {
		return err
	}
	if c.InfraRetry == (retry.Policy{}) {
		c.InfraRetry = retry.Policy{Initial: 500 * time.Millisecond, Multiplier: 2, MaxInterval: 30 * time.Second, Jitter: 0.5}
	}
	if err := c.InfraRetry.Validate(); err != nil {
		return fmt.Errorf("infra retry: %w", err)
	}
	switch c.OnInfraError {
	case "":
		c.OnInfraError = InfraPause
	case InfraPause, InfraDeadLetter:
	default:
		return fmt.Errorf("on-infra-error must be %q or %q, got %q", InfraPause, InfraDeadLetter, c.OnInfraError)
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = DefaultMaxPollRecords
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.CopyMinRows == 0 {
		c.CopyMinRows = 32
	}
	if c.MaxQueuedBytes == 0 {
		c.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if c.MaxPollRecords < 0 || c.MaxQueuedBytes < 0 || c.MaxBatchRecords < 0 {
		return errors.New("max poll, queued and batch records must be > 0")
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = 5 * time.Second
	}
	if c.CommitInterval < 0 {
		return fmt.Errorf("commit interval must be > 0, got %s", c.CommitInterval)
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown grace must be > 0, got %s", c.ShutdownGrace)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = &Metrics{}
	}
	return nil
}

// DeadLetterWriter publishes a dead letter and returns nil only once Kafka
// has acknowledged it. It returns an error when ctx is done, or when it
// cannot write the dead letter for now (the topic keeps refusing it, it is
// too large, or Kafka does not acknowledge it within the writer's time
// limit, dlq.ErrAttemptTimeout); the worker then keeps the source offset uncommitted,
// reports the partition stuck in Ready, and calls Write again.
// *dlq.Writer implements it.
type DeadLetterWriter interface {
	Write(ctx context.Context, dl dlq.DeadLetter) error
}

// Worker is the consumer-group worker: it applies each record of the events
// topic to every projection that handles its type, retries failures and
// dead-letters what cannot be applied, and commits a record's offset only
// after all of its (event, projection) pairs are applied or dead-lettered.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	cl       *kgo.Client
	db       DB
	begin    Beginner // nil: no batches
	dead     DeadLetterWriter
	handlers []Handler

	queued  atomic.Int64  // record bytes queued in all partitions
	drained chan struct{} // cap 1: a partition took records from its queue

	mu         sync.Mutex
	partitions map[int32]*partition
	joined     bool
	wg         sync.WaitGroup // partition goroutines
}

// NewWorker returns a worker that consumes cfg.Topic in cfg.Group with a
// franz-go client built from opts (seed brokers, TLS, SASL, hooks, ...) plus
// fetch limits that opts may override (FetchMaxBytes 16 MiB,
// FetchMaxPartitionBytes 1 MiB) and the worker's own group options:
// cooperative-sticky balancing,
// BlockRebalanceOnPoll, AutoCommitMarks and its assignment callbacks. Do not
// pass consumer-group or consume-topic options in opts.
//
// handlers must have unique names. db is where handlers apply events (a
// *pgxpool.Pool). dead receives the dead letters. It returns an error for an
// invalid cfg, duplicate handler names or a client that cannot be built.
func NewWorker(cfg Config, handlers []Handler, db DB, dead DeadLetterWriter, opts ...kgo.Opt) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || dead == nil {
		return nil, errors.New("projection worker needs a database and a dead-letter writer")
	}
	seen := make(map[string]bool, len(handlers))
	for _, h := range handlers {
		if seen[h.Name()] {
			return nil, fmt.Errorf("duplicate projection name %q", h.Name())
		}
		seen[h.Name()] = true
	}
	w := &Worker{
		cfg:        cfg,
		log:        cfg.Logger,
		db:         db,
		dead:       dead,
		handlers:   handlers,
		partitions: make(map[int32]*partition),
		drained:    make(chan struct{}, 1),
	}
	if b, ok := db.(Beginner); ok {
		w.begin = b
	}
	// Bounded fetch buffers (SPEC: memory must not grow with the backlog);
	// opts may override them.
	all := []kgo.Opt{kgo.FetchMaxBytes(16 << 20), kgo.FetchMaxPartitionBytes(1 << 20)}
	all = append(all, opts...)
	all = append(all,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(cfg.CommitInterval),
		kgo.OnPartitionsAssigned(w.onAssigned),
		kgo.OnPartitionsRevoked(w.onRevoked),
		kgo.OnPartitionsLost(w.onLost),
		kgo.FetchMaxWait(time.Second),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	w.cl = cl
	if err := cfg.Metrics.observeWorker(w); err != nil {
		cl.Close()
		return nil, fmt.Errorf("consumer lag gauge: %w", err)
	}
	return w, nil
}

// Client returns the worker's franz-go client (for admin calls and tests).
func (w *Worker) Client() *kgo.Client { return w.cl }

// Ready returns nil when the worker has joined its consumer group, no
// partition is paused waiting for the database and no partition is stuck on
// a dead letter it cannot write, else an error saying why.
func (w *Worker) Ready() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.joined {
		return errors.New("consumer group not joined")
	}
	var paused []int32
	var stuck []error
	for p, pc := range w.partitions {
		if pc.waitingForDB() {
			paused = append(paused, p)
		}
		if err := pc.stuckOn(); err != nil {
			stuck = append(stuck, fmt.Errorf("partition %d stuck: dead letter cannot be written: %w", p, err))
		}
	}
	if len(paused) > 0 {
		stuck = append(stuck, fmt.Errorf("partitions %v paused: database unavailable", paused))
	}
	return errors.Join(stuck...)
}

// Run polls and processes records until ctx is done, then shuts down within
// the shutdown grace: it cancels in-flight retries and backoff waits, waits
// for the partition goroutines, commits the offsets of finished records and
// leaves the group. The whole shutdown is bounded by the grace: the
// partition goroutines get the grace less a reserve (a quarter of it, at
// most 5 s) for the final commit and leaving the group; a goroutine that
// has not returned by then (a projection that ignores its context) is
// named in the error and not waited for. It returns nil after a clean
// shutdown, and an error when a partition did not stop, the final commit
// fails or the grace runs out. Run may be called once; it closes the
// client.
func (w *Worker) Run(ctx context.Context) error {
	for {
		if !w.waitForRoom(ctx) {
			break
		}
		fetches := w.cl.PollRecords(ctx, w.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			w.log.Error("fetch failed", "topic", topic, "partition", p, "error", err)
		})
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			w.partition(fp.Partition).push(fp.Records, fp.HighWatermark)
		})
		w.cl.AllowRebalance()
	}
	return w.shutdown()
}

// waitForRoom blocks while the queued record bytes are at MaxQueuedBytes
// or above. It returns false when ctx is done first.
func (w *Worker) waitForRoom(ctx context.Context) bool {
	for w.queued.Load() >= int64(w.cfg.MaxQueuedBytes) {
		select {
		case <-ctx.Done():
			return false
		case <-w.drained:
		}
	}
	return ctx.Err() == nil
}

// dequeued accounts for n record bytes leaving a partition's queue.
func (w *Worker) dequeued(n int) {
	w.queued.Add(-int64(n))
	select {
	case w.drained <- struct{}{}:
	default:
	}
}

func (w *Worker) shutdown() error {
	grace, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownGrace)
	defer cancel()
	w.mu.Lock()
	all := make([]*partition, 0, len(w.partitions))
	for p, pc := range w.partitions {
		all = append(all, pc)
		delete(w.partitions, p)
	}
	w.mu.Unlock()
	var errs []error
	// The partitions get the grace less a reserve for the final commit and
	// leaving the group, so that the whole shutdown fits in the grace.
	reserve := min(w.cfg.ShutdownGrace/4, 5*time.Second)
	stopCtx, stopCancel := context.WithTimeout(grace, w.cfg.ShutdownGrace-reserve)
	stuck := stopPartitions(stopCtx, all)
	stopCancel()
	for _, p := range stuck {
		errs = append(errs, fmt.Errorf("partition %d did not stop within the shutdown grace of %s (a projection that ignores its context?); its unfinished records are processed again by the next owner", p, w.cfg.ShutdownGrace))
	}
	if err := w.cl.CommitMarkedOffsets(grace); err != nil {
		errs = append(errs, fmt.Errorf("commit offsets at shutdown: %w", err))
	} else {
		w.commitHandoffs(grace, all)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		w.cl.CloseAllowingRebalance()
	}()
	select {
	case <-closed:
	case <-grace.Done():
		errs = append(errs, fmt.Errorf("leave group: shutdown grace of %s exceeded", w.cfg.ShutdownGrace))
	}
	if len(stuck) == 0 {
		w.wg.Wait()
	}
	return errors.Join(errs...)
}

// partition returns the goroutine state of partition p, starting it if it
// is not running. Called from the poll loop and the assignment callback.
func (w *Worker) partition(p int32) *partition {
	w.mu.Lock()
	defer w.mu.Unlock()
	if pc, ok := w.partitions[p]; ok {
		return pc
	}
	ctx, cancel := context.WithCancel(context.Background())
	pc := &partition{
		w:         w,
		partition: p,
		ctx:       ctx,
		cancel:    cancel,
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		next:      -1,
		lastTaken: -1,
	}
	w.partitions[p] = pc
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		pc.run()
	}()
	return pc
}

func (w *Worker) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	w.mu.Lock()
	w.joined = true
	w.mu.Unlock()
	// The client keeps a partition's fetch pause across rebalances, while
	// the partition's new state starts unpaused: a partition paused by its
	// previous state (backpressure, a database wait), revoked and assigned
	// back would never be fetched again.
	if ps := assigned[w.cfg.Topic]; len(ps) > 0 {
		cl.ResumeFetchPartitions(map[string][]int32{w.cfg.Topic: ps})
	}
	var states []*partition
	for _, p := range assigned[w.cfg.Topic] {
		states = append(states, w.partition(p))
	}
	if len(states) > 0 {
		// No record of these partitions is polled before this returns.
		w.receiveHandoffs(ctx, cl, states)
	}
	if len(assigned[w.cfg.Topic]) > 0 {
		w.log.Info("partitions assigned", "topic", w.cfg.Topic, "partitions", assigned[w.cfg.Topic])
	}
}

// onRevoked stops the revoked partitions' goroutines (cancelling retries and
// backoff waits at once) and commits what they finished.
func (w *Worker) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	stopped := w.stop(revoked[w.cfg.Topic])
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		w.log.Error("commit offsets on revoke failed", "topic", w.cfg.Topic, "error", err)
	} else {
		w.commitHandoffs(ctx, stopped)
	}
	if len(revoked[w.cfg.Topic]) > 0 {
		w.log.Info("partitions revoked", "topic", w.cfg.Topic, "partitions", revoked[w.cfg.Topic])
	}
}

// onLost stops the lost partitions without committing: another member may
// already own them.
func (w *Worker) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	w.mu.Lock()
	w.joined = false
	w.mu.Unlock()
	w.stop(lost[w.cfg.Topic])
	w.log.Warn("partitions lost", "topic", w.cfg.Topic, "partitions", lost[w.cfg.Topic])
}

// stop stops the goroutines of partitions ps, waiting for them at most the
// shutdown grace: a rebalance must not hang on a projection that ignores
// its context. A goroutine still running after that only ever marks
// records it finished, which stays correct. It returns the stopped
// partitions' states.
func (w *Worker) stop(ps []int32) []*partition {
	w.mu.Lock()
	var stopping []*partition
	for _, p := range ps {
		if pc, ok := w.partitions[p]; ok {
			stopping = append(stopping, pc)
			delete(w.partitions, p)
		}
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownGrace)
	defer cancel()
	if stuck := stopPartitions(ctx, stopping); len(stuck) > 0 {
		w.log.Error("partitions did not stop within the shutdown grace; going on without them (a projection that ignores its context?)",
			"topic", w.cfg.Topic, "partitions", stuck, "grace", w.cfg.ShutdownGrace)
	}
	return stopping
}

// stopPartitions cancels ps and waits until their goroutines have returned
// or ctx is done. It returns the partitions whose goroutines had not
// returned by then.
func stopPartitions(ctx context.Context, ps []*partition) []int32 {
	for _, pc := range ps {
		pc.cancel()
	}
	var stuck []int32
	for _, pc := range ps {
		select {
		case <-pc.done:
		case <-ctx.Done():
			select {
			case <-pc.done:
			default:
				stuck = append(stuck, pc.partition)
			}
		}
	}
	return stuck
}

// partition is the state of one assigned partition. Its goroutine (run)
// processes queued records in offset order and exits when ctx is cancelled.
type partition struct {
	w         *Worker
	partition int32
	ctx       context.Context
	cancel    context.CancelFunc
	wake      chan struct{} // cap 1: records were queued
	done      chan struct{} // closed when run returns

	mu            sync.Mutex
	queue         []*kgo.Record
	queuedBytes   int
	fetchPaused   bool  // fetching paused for backpressure or a database wait
	dbWait        bool  // waiting for the database (InfraPause)
	stuck         error // a dead letter that cannot be written, nil when none
	next          int64 // offset of the next record to finish; −1 unknown
	highWatermark int64
	lastTaken     int64    // offset of the last record taken; −1 none (goroutine only)
	inRetry       *handoff // the record whose failing pairs are being retried
	received      *handoff // left by the previous owner (handoff.go)
}

func (pc *partition) push(recs []*kgo.Record, hwm int64) {
	pc.mu.Lock()
	if pc.next < 0 {
		pc.next = recs[0].Offset
	}
	pc.queue = append(pc.queue, recs...)
	n := 0
	for _, r := range recs {
		n += recordBytes(r)
	}
	pc.queuedBytes += n
	pc.w.queued.Add(int64(n))
	pc.highWatermark = hwm
	full := pc.queuedBytes >= pc.w.cfg.MaxQueuedBytes*3/4
	pc.mu.Unlock()
	if full {
		pc.pauseFetch()
	}
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

func (pc *partition) pauseFetch() {
	pc.mu.Lock()
	already := pc.fetchPaused
	pc.fetchPaused = true
	pc.mu.Unlock()
	if !already {
		pc.w.cl.PauseFetchPartitions(map[string][]int32{pc.w.cfg.Topic: {pc.partition}})
	}
}

// maybeResume resumes fetching once the queue holds at most a quarter of
// MaxQueuedBytes and the database is not being waited for.
func (pc *partition) maybeResume() {
	pc.mu.Lock()
	resume := pc.fetchPaused && !pc.dbWait && pc.queuedBytes <= pc.w.cfg.MaxQueuedBytes/4
	if resume {
		pc.fetchPaused = false
	}
	pc.mu.Unlock()
	if resume {
		pc.w.cl.ResumeFetchPartitions(map[string][]int32{pc.w.cfg.Topic: {pc.partition}})
	}
}

// setStuck records (err != nil) or clears a dead letter that cannot be
// written; Ready reports it.
func (pc *partition) setStuck(err error) {
	pc.mu.Lock()
	was := pc.stuck != nil
	pc.stuck = err
	pc.mu.Unlock()
	switch {
	case err != nil && !was:
		pc.w.cfg.Metrics.addStuck(pc.ctx, 1)
	case err == nil && was:
		pc.w.cfg.Metrics.addStuck(pc.ctx, -1)
	}
}

func (pc *partition) stuckOn() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.stuck
}

func (pc *partition) waitingForDB() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.dbWait
}

func (pc *partition) setDBWait(waiting bool) {
	pc.mu.Lock()
	changed := pc.dbWait != waiting
	pc.dbWait = waiting
	pc.mu.Unlock()
	if !changed {
		return
	}
	switch {
	case waiting:
		pc.pauseFetch()
		pc.w.cfg.Metrics.addPaused(pc.ctx, 1)
		pc.w.log.Warn("database unavailable: partition paused", "topic", pc.w.cfg.Topic, "partition", pc.partition)
	case pc.ctx.Err() != nil:
		// Revoked or shutting down while waiting: the database may well
		// still be down.
		pc.w.cfg.Metrics.addPaused(context.Background(), -1)
		pc.w.log.Info("partition stopped while waiting for the database", "topic", pc.w.cfg.Topic, "partition", pc.partition)
	default:
		pc.w.cfg.Metrics.addPaused(pc.ctx, -1)
		pc.w.log.Info("database available again: partition resumed", "topic", pc.w.cfg.Topic, "partition", pc.partition)
		pc.maybeResume()
	}
}

// recordBytes is what a queued record holds in memory, roughly.
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// take removes up to n records from the head of the queue and reports
// whether more remain.
func (pc *partition) take(n int) ([]*kgo.Record, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if len(pc.queue) <= n {
		q := pc.queue
		pc.w.dequeued(pc.queuedBytes)
		pc.queue, pc.queuedBytes = nil, 0
		return q, false
	}
	q := make([]*kgo.Record, n)
	copy(q, pc.queue)
	pc.queue = append(pc.queue[:0:0], pc.queue[n:]...)
	taken := 0
	for _, r := range q {
		taken += recordBytes(r)
	}
	pc.queuedBytes -= taken
	pc.w.dequeued(taken)
	return q, true
}

func (pc *partition) run() {
	defer close(pc.done)
	defer func() { // records left unprocessed leave the accounting
		pc.mu.Lock()
		pc.w.dequeued(pc.queuedBytes)
		pc.queue, pc.queuedBytes = nil, 0
		pc.mu.Unlock()
	}()
	defer func() {
		if pc.waitingForDB() {
			pc.w.cfg.Metrics.addPaused(context.Background(), -1)
		}
		if pc.stuckOn() != nil {
			pc.w.cfg.Metrics.addStuck(context.Background(), -1)
		}
	}()
	for {
		select {
		case <-pc.ctx.Done():
			return
		case <-pc.wake:
		}
		for {
			recs, more := pc.take(pc.w.cfg.MaxBatchRecords)
			if len(recs) == 0 {
				break
			}
			pc.noticeRewind(recs)
			if err := pc.w.processBatch(pc.ctx, pc, recs); err != nil {
				if pc.ctx.Err() == nil {
					pc.w.log.Error("partition stopped on an unexpected error; it resumes at the next assignment",
						"topic", pc.w.cfg.Topic, "partition", pc.partition, "error", err)
				}
				return // leave the batch unmarked for the next owner
			}
			last := recs[len(recs)-1]
			pc.w.cl.MarkCommitRecords(last)
			pc.mu.Lock()
			pc.next = last.Offset + 1
			pc.mu.Unlock()
			pc.maybeResume()
			if !more {
				break
			}
		}
	}
}

// replayInfo is what the replayer's headers say about a republished record
// (SPEC §7).
type replayInfo struct {
	projection    string    // apply only to this projection when non-empty
	count         int       // causet.replay.count
	firstFailedAt time.Time // causet.replay.first-failed-at, zero if absent
}

func readReplayInfo(rec *kgo.Record) replayInfo {
	var ri replayInfo
	for _, h := range rec.Headers {
		switch h.Key {
		case dlq.HeaderReplayProjection:
			ri.projection = string(h.Value)
		case dlq.HeaderReplayCountOut:
			ri.count, _ = strconv.Atoi(string(h.Value))
		case dlq.HeaderReplayFirstFailedAt:
			if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				ri.firstFailedAt = time.UnixMilli(ms)
			}
		}
	}
	return ri
}

// pairFailure is one (event, projection) pair whose first attempt failed.
type pairFailure struct {
	d       *decoded
	h       Handler // nil: the record reached no projection (immediateDeadLetter)
	err     error
	stack   string
	firstAt time.Time
}

// retryPair retries a pair whose first attempt failed. It returns nil, nil
// when a retry succeeded; the dead letter to write when the error is
// permanent or the retries ran out (the caller writes it, so that the dead
// letters of one record are written together); and ctx's error, with no
// dead letter, when ctx is done first.
func (w *Worker) retryPair(ctx context.Context, pc *partition, f pairFailure) (*dlq.DeadLetter, error) {
	rec, ev := f.d.rec, f.d.ev
	m := w.cfg.Metrics
	attrs := pairAttrs(f.h.Name(), ev.TenantSchema)
	last, stack := f.err, f.stack
	retries := 0
	if !retry.IsPermanent(last) {
		first := true
		var err error
		retries, err = w.cfg.Retry.Do(ctx, func(ctx context.Context) error {
			if first {
				first = false
				return last
			}
			s, err := w.attempt(ctx, pc, f.h, ev)
			if err != nil {
				last, stack = err, s
			}
			return err
		}, func(err error, n int, wait time.Duration) {
			m.retried(ctx, attrs)
			w.log.Warn("projection failed, retrying",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"projection", f.h.Name(), "tenant_schema", ev.TenantSchema,
				"retry", n, "wait", wait, "error", err)
		})
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			return nil, nil
		}
		last = err
	}
	dl := w.newDeadLetter(f.d, f.h.Name(), retry.Classify(last), last, stack, retries, f.firstAt)
	return &dl, nil
}

func (w *Worker) newDeadLetter(d *decoded, projection string, class retry.Class, err error, stack string, retries int, firstAt time.Time) dlq.DeadLetter {
	ev := d.ev
	return dlq.DeadLetter{
		Source:        d.rec,
		Projection:    projection,
		TenantSchema:  ev.TenantSchema,
		ForkID:        ev.ForkID,
		EventType:     ev.EventType,
		Class:         class,
		Err:           err,
		Stack:         stack,
		Retries:       retries,
		FirstFailedAt: firstFailedAt(d.replay, firstAt),
		ReplayCount:   d.replay.count,
	}
}

func firstFailedAt(replay replayInfo, now time.Time) time.Time {
	if !replay.firstFailedAt.IsZero() {
		return replay.firstFailedAt
	}
	return now
}

// attempt applies ev to one projection once. Under InfraPause, it waits
// (without counting retries) while the database is unavailable. It returns
// the Go stack where the handler failed or panicked with the error.
func (w *Worker) attempt(ctx context.Context, pc *partition, h Handler, ev *Event) (string, error) {
	var stack string
	once := func(ctx context.Context) (err error) {
		stack, err = w.applyOnce(ctx, h, ev)
		return err
	}
	if w.cfg.OnInfraError != InfraPause {
		err := once(ctx)
		return stack, err
	}
	err := w.cfg.InfraRetry.UntilAvailable(ctx, once, func(err error, n int, wait time.Duration) {
		pc.setDBWait(true)
		w.log.Warn("database unavailable, waiting",
			"partition", pc.partition, "projection", h.Name(), "tenant_schema", ev.TenantSchema,
			"attempt", n, "wait", wait, "error", err)
	})
	pc.setDBWait(false)
	return stack, err
}

// applyOnce calls the handler, turning a panic into an error, and records
// the outcome in the metrics.
func (w *Worker) applyOnce(ctx context.Context, h Handler, ev *Event) (stack string, err error) {
	m := w.cfg.Metrics
	attrs := pairAttrs(h.Name(), ev.TenantSchema)
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			stack = string(debug.Stack())
			err = &PanicError{Projection: h.Name(), Value: r}
		}
		if err != nil && ctx.Err() == nil {
			if stack == "" {
				stack = string(debug.Stack())
			}
			m.failed(ctx, attrs, retry.Classify(err))
		}
	}()
	out, err := h.Apply(ctx, w.db, ev)
	m.observeApply(ctx, attrs, time.Since(start))
	if err != nil {
		return "", fmt.Errorf("apply %s to %s: %w", ev.EventType, h.Name(), err)
	}
	m.applied(ctx, attrs, out)
	return "", nil
}

func (w *Worker) deadLetter(ctx context.Context, pc *partition, dl dlq.DeadLetter) error {
	// An error that is not ctx's means the writer could not write the dead
	// letter for now: the dead-letter topic keeps refusing it, or it is too
	// large for the topic. The record is never skipped: the partition
	// reports not-ready, logs an error and the write is tried again.
	b := w.cfg.InfraRetry.NewBackOff()
	for {
		wctx, done := pc.writeContext(ctx)
		err := w.dead.Write(wctx, dl)
		done()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.NextBackOff()
		pc.setStuck(err)
		hint := "the dead-letter topic refuses writes: check it exists and accepts this worker's records"
		switch {
		case errors.Is(err, dlq.ErrTooLarge):
			hint = "raise the dead-letter topic's max.message.bytes (or --dlq-max-bytes) and restart the worker: the limit is read at start"
		case errors.Is(err, dlq.ErrAttemptTimeout):
			hint = "Kafka does not acknowledge dead letters in time: check the dead-letter topic's partition leaders and brokers (--dlq-write-timeout)"
		}
		w.log.Error("dead letter not written; the partition waits and tries again",
			"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
			"projection", dl.Projection, "tenant_schema", dl.TenantSchema, "retry_in", wait, "fix", hint, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	pc.setStuck(nil)
	w.deadLettered(ctx, dl)
	return nil
}

// deadLettered records an acknowledged dead letter in the metrics and log.
func (w *Worker) deadLettered(ctx context.Context, dl dlq.DeadLetter) {
	w.cfg.Metrics.deadLettered(ctx, pairAttrs(dl.Projection, dl.TenantSchema), dl.Class)
	w.log.Warn("dead-lettered",
		"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
		"projection", dl.Projection, "tenant_schema", dl.TenantSchema,
		"error_class", dl.Class.String(), "retries", dl.Retries, "error", dl.Err)
}

// PanicError is the error a handler's panic becomes. It is a projection
// error: retried, then dead-lettered with the stack of the panic.
type PanicError struct {
	Projection string
	Value      any
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("projection %s panicked: %v", e.Projection, e.Value)
}

// noticeRewind says when the client delivers records again, at or below the
// last one taken: it rewinds a partition's fetch position within an
// assignment when a broker reports lost records after a leader change, or
// when the offset was out of range. The records are processed again (stale
// no-ops; their dead letters can be written twice); a WARN line names the
// partition and both offsets.
func (pc *partition) noticeRewind(recs []*kgo.Record) {
	last := pc.lastTaken
	for _, r := range recs {
		if last >= 0 && r.Offset <= last {
			pc.w.log.Warn("records delivered again: the client rewound this partition; they are processed again (stale no-ops, and their dead letters may be written twice)",
				"topic", pc.w.cfg.Topic, "partition", pc.partition, "offset", r.Offset, "last_offset", last)
		}
		last = r.Offset
	}
	pc.lastTaken = last
}

// writeContext returns the context of one dead-letter write: ctx, except
// that a revoke or shutdown (ctx done) lets a write in flight go on for up
// to half the shutdown grace. Cut at once, a write whose request was
// already sent may be stored all the same while its record stays
// unfinished, and the next owner writes the dead letter again; let finish,
// the record is finished and committed with the others. Call the returned
// function when the write returns.
func (pc *partition) writeContext(ctx context.Context) (context.Context, func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer *time.Timer
	var mu sync.Mutex
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(pc.w.cfg.ShutdownGrace/2, cancel)
	})
	return wctx, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
