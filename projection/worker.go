package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/semaphore"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/logfold"
)

// DeadLetterWriter publishes dead letters; *dlq.Writer implements it.
//
// Write returns nil only once Kafka has acknowledged the dead letter. It
// returns an error when ctx is done, or when it cannot write the dead
// letter for now (the topic keeps refusing it, it is too large, or Kafka
// does not acknowledge it within the writer's time limit,
// dlq.ErrAttemptTimeout); the worker then keeps the source offset
// uncommitted, reports the partition stuck in Ready, and calls Write again.
//
// WriteBatch writes several dead letters in one round trip, without
// retrying, and returns one error per dead letter (nil: acknowledged); the
// worker writes those that failed again with Write.
//
// A writer that also has a method Topic() string (*dlq.Writer does) names
// its topic: when a write fails, the worker asks the brokers whether that
// topic exists, and its error line says so when it does not.
type DeadLetterWriter interface {
	Write(ctx context.Context, dl dlq.DeadLetter) error
	WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error
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
	acquire  Acquirer // nil: each retry on its own (retrypipe.go)
	reset    Resetter // nil: connections are not closed on a read-only answer (dbwait.go)
	dead     DeadLetterWriter
	handlers []Handler
	breaker  *breaker
	// left is set when the worker left its group by itself at shutdown
	// (leaveDirect): the client's revoke that may follow commits nothing.
	left atomic.Bool
	// slotHold is how long a retry slot taken now is held at most: the
	// retry policy's Longest plus slotSlack, worked out once by NewWorker.
	slotHold time.Duration
	failures *failureLog
	tr       *tracing      // nil: no spans
	catalog  *tableCatalog // the tables' columns as PostgreSQL has them (copyGroupsChecked)
	// unhandledTypes holds the event types no projection handles that
	// were logged at INFO (noteUnhandled): at most maxUnhandledTypes, and
	// one more key, "", once that is said.
	unhandledMu    sync.Mutex
	unhandledTypes map[string]bool

	queued atomic.Int64 // record bytes queued in all partitions
	// retrying is the record bytes that every partition's pairs waiting
	// for a retry hold (retrySet.total; Config.MaxRetryingBytes).
	retrying atomic.Int64
	// processing is the budget of record bytes being processed, all
	// partitions together (Config.MaxQueuedBytes): processing memory is a
	// multiple of the bytes processed, so one partition's huge records do
	// not add up with another's.
	processing *semaphore.Weighted
	drained    chan struct{} // cap 1: a partition took records from its queue
	// assignedAt (cap 1) is signalled when partitions are assigned, so
	// that refreshHighWatermarks reads their end offsets then.
	assignedAt chan struct{}

	mu         sync.Mutex
	partitions map[int32]*partition
	joined     bool
	pollErr    error // the last error a poll returned while not joined
	// missingTopics are the events and dead-letter topics the brokers
	// said do not exist, at refreshHighWatermarks' last answer.
	missingTopics []string
	// recreatedTopics are those of them whose topic ID changed since
	// the worker first listed them: deleted and created again.
	recreatedTopics []string
	// shuttingDown is set when shutdown starts: Ready says so.
	shuttingDown bool
	// topicIDs are the topics' IDs when the worker first listed them.
	topicIDs map[string]kadm.TopicID
	wg       sync.WaitGroup // partition goroutines
}

// NewWorker returns a worker that consumes cfg.Topic in cfg.Group with a
// franz-go client built from opts (seed brokers, TLS, SASL, hooks, ...) plus
// fetch limits that opts may override (kgo.FetchMaxBytes
// DefaultFetchMaxBytes, kgo.FetchMaxPartitionBytes
// DefaultFetchMaxPartitionBytes) and the worker's own group options:
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
		topicIDs:   map[string]kadm.TopicID{},
		drained:    make(chan struct{}, 1),
		assignedAt: make(chan struct{}, 1),
	}
	if b, ok := db.(Beginner); ok {
		w.begin = b
	}
	if a, ok := db.(Acquirer); ok {
		w.acquire = a
	}
	if r, ok := db.(Resetter); ok {
		w.reset = r
	}
	w.catalog = newTableCatalog(db, w.log)
	w.failures = newFailureLog(w.log, cfg.FailureLogInterval)
	w.tr = newTracing(cfg)
	w.processing = semaphore.NewWeighted(int64(cfg.MaxQueuedBytes))
	w.breaker = newBreaker(cfg.Breaker, func(fp string, open bool, n int, why string) {
		if open { // said by the pair that opened it (settle: breakerOpened)
			cfg.Metrics.addBreakersOpen(context.Background(), 1)
			w.wakePartitions() // their waiting pairs of fp go now
			return
		}
		cfg.Metrics.addBreakersOpen(context.Background(), -1)
		// The incident's total: at INFO each such dead letter is only
		// counted here (new-user trial: only the opening line showed).
		w.log.Info("breaker closed: "+why, "fingerprint", fp, "dead_lettered_while_open", n)
	})
	w.breaker.onRelease = w.wakePartitions // their pairs waiting for a retry slot go now
	w.slotHold = cfg.Retry.Longest() + slotSlack
	// Bounded fetch buffers (SPEC: memory must not grow with the backlog);
	// opts may override them.
	all := []kgo.Opt{kgo.FetchMaxBytes(DefaultFetchMaxBytes), kgo.FetchMaxPartitionBytes(DefaultFetchMaxPartitionBytes)}
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

// Joined reports whether the worker is a member of its consumer group (it
// has been assigned partitions, possibly none, and not lost them).
func (w *Worker) Joined() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.joined
}

// Client returns the worker's franz-go client (for admin calls and tests).
func (w *Worker) Client() *kgo.Client { return w.cl }

// Ready returns nil when the worker has joined its consumer group, no
// partition is paused waiting for the database and no partition is stuck on
// a dead letter it cannot write, else an error saying why. Before the group
// is joined, the error wraps the last error a poll returned (franz-go's
// group or connection error, such as kerr.SaslAuthenticationFailed), if any.
func (w *Worker) Ready() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.shuttingDown {
		// Operator trial: ready through a 20 s shutdown.
		return errors.New("shutting down: finishing the partitions' batches, committing and leaving the group")
	}
	var missing error
	if len(w.missingTopics) > 0 {
		missing = missingTopicsError(w.missingTopics)
	}
	if len(w.recreatedTopics) > 0 {
		missing = errors.Join(missing, recreatedTopicsError(w.recreatedTopics))
	}
	if !w.joined {
		if w.pollErr != nil {
			return errors.Join(missing, fmt.Errorf("consumer group not joined: %w", w.pollErr))
		}
		// Operator trial: up to 90 s of this, unexplained, while the group
		// waited for a killed member.
		return errors.Join(missing, errors.New("consumer group not joined (yet: a join waits for every member of the group, a crashed one until its session times out, --session-timeout)"))
	}
	var paused []int32
	var cause error // the database's last answer to the lowest paused partition
	var stuck []error
	for p, pc := range w.partitions {
		if err := pc.waitingForDB(); err != nil {
			paused = append(paused, p)
			if len(paused) == 1 || p < slices.Min(paused[:len(paused)-1]) {
				cause = err
			}
		}
		if err := pc.stuckOn(); err != nil {
			stuck = append(stuck, fmt.Errorf("partition %d stuck: dead letter cannot be written: %w", p, err))
		}
	}
	if len(paused) > 0 {
		slices.Sort(paused)
		stuck = append(stuck, fmt.Errorf("partitions %v paused: %s: %w", paused, waitWords(cause).cause, cause))
	}
	return errors.Join(append([]error{missing}, stuck...)...)
}

// recreatedTopicsError is Ready's reason for topics deleted and created
// again while the worker runs.
func recreatedTopicsError(topics []string) error {
	return fmt.Errorf("topics deleted and created again while the worker runs: %s (its Kafka client keeps the deleted topic's ID and neither reads nor writes the new one: restart the worker)",
		strings.Join(topics, ", "))
}

// missingTopicsError is Ready's reason for topics the brokers say do not
// exist.
func missingTopicsError(topics []string) error {
	return fmt.Errorf("topics do not exist: %s (deleted while the worker runs? create them again with `projection-worker topics` and their --partitions, then restart the worker)",
		strings.Join(topics, ", "))
}

// highWatermarkEvery is how often refreshHighWatermarks asks the broker
// for the end offsets of the assigned partitions (nanoseconds; tests
// shorten it): 15 s.
var highWatermarkEvery atomic.Int64

func init() { highWatermarkEvery.Store(int64(15 * time.Second)) }

// refreshHighWatermarks asks the broker, at start, when partitions are
// assigned and every highWatermarkEvery, for the end offsets of the events
// and dead-letter topics, until ctx ends. It
// raises the high watermark of each assigned partition that has taken
// records to its end offset, and keeps the topics the brokers say do not
// exist for Ready, logging each change (operator trial: with both topics
// deleted, the worker said it was ready). Fetches bring the high
// watermark too, but a partition whose fetching is paused (waiting for the
// database, or its queue full behind a batch that waits on a lock) fetches
// nothing, so without this its consumer lag would stand still while
// records pile up behind it, and a lag alert would not fire (SRE trial).
// An error is logged at debug level and tried again at the next tick.
func (w *Worker) refreshHighWatermarks(ctx context.Context) {
	adm := kadm.NewClient(w.cl)
	topics := []string{w.cfg.Topic}
	if named, ok := w.dead.(interface{ Topic() string }); ok && named.Topic() != "" && named.Topic() != w.cfg.Topic {
		topics = append(topics, named.Topic())
	}
	check := func() {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		details, err := adm.ListTopics(lctx, topics...)
		var ends kadm.ListedOffsets
		if err == nil {
			ends, err = adm.ListEndOffsets(lctx, w.cfg.Topic)
		}
		if err != nil {
			w.log.Debug("end offsets for the consumer lag", "topic", w.cfg.Topic, "error", err)
			return
		}
		var missing, recreated []string
		for _, t := range topics {
			td, ok := details[t]
			switch {
			case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
				missing = append(missing, t)
			case td.Err != nil || td.ID == (kadm.TopicID{}):
			case w.topicID(t) == (kadm.TopicID{}):
				w.mu.Lock()
				w.topicIDs[t] = td.ID
				w.mu.Unlock()
			case w.topicID(t) != td.ID:
				// franz-go keeps the ID it first saw: it neither reads
				// nor writes the topic of that name until restarted
				// (operator trial: ready, and nothing consumed).
				recreated = append(recreated, t)
			}
		}
		w.mu.Lock()
		was, wasRecreated := w.missingTopics, w.recreatedTopics
		w.missingTopics, w.recreatedTopics = missing, recreated
		held := make(map[int32]*partition, len(w.partitions))
		for p, pc := range w.partitions {
			held[p] = pc
		}
		w.mu.Unlock()
		switch {
		case len(missing) > 0 && !slices.Equal(missing, was):
			w.log.Error("topics do not exist: not ready until they are created again", "topics", missing,
				"error", missingTopicsError(missing))
		case len(missing) == 0 && len(was) > 0:
			w.log.Info("topics exist again", "topics", was)
		}
		if len(recreated) > 0 && !slices.Equal(recreated, wasRecreated) {
			w.log.Error("topics deleted and created again: restart the worker", "topics", recreated,
				"error", recreatedTopicsError(recreated))
		}
		var unread []*partition // assigned, no record taken yet
		ends.Each(func(o kadm.ListedOffset) {
			if o.Topic != w.cfg.Topic {
				return
			}
			if pc := held[o.Partition]; pc != nil && o.Err == nil {
				pc.mu.Lock()
				pc.highWatermark = max(pc.highWatermark, o.Offset)
				if pc.next < 0 {
					unread = append(unread, pc)
				}
				pc.mu.Unlock()
			}
		})
		w.setLagFrom(lctx, adm, unread)
	}
	// At once, so that the IDs are the ones the client started with
	// (operator trial: a topic deleted and created again within 15 s of
	// the start was taken for the one the worker had read); and when
	// partitions are assigned, so that each has its lag series from then,
	// not from the next tick (operator trial: none for the first 15 s,
	// since the first check ran before the group assigned any).
	check()
	everyOr(ctx, time.Duration(highWatermarkEvery.Load()), w.assignedAt, check)
}

// setLagFrom sets where the consumer lag of partitions that have taken no
// record yet counts from: the group's committed offset, or the log start
// offset (the client's reset: the start) without one. Their lag is then
// served too (metrics trial: with small fetch caps and a partition waiting
// for the database, partitions never fetched had no lag series, and the
// lag alert saw a quarter of the backlog).
func (w *Worker) setLagFrom(ctx context.Context, adm *kadm.Client, unread []*partition) {
	if len(unread) == 0 {
		return
	}
	committed := w.cl.CommittedOffsets()[w.cfg.Topic]
	var starts kadm.ListedOffsets
	for _, pc := range unread {
		from := int64(-1)
		if c, ok := committed[pc.partition]; ok && c.Offset >= 0 {
			from = c.Offset
		} else {
			if starts == nil {
				var err error
				if starts, err = adm.ListStartOffsets(ctx, w.cfg.Topic); err != nil {
					w.log.Debug("start offsets for the consumer lag", "topic", w.cfg.Topic, "error", err)
					starts = kadm.ListedOffsets{}
				}
			}
			if o, ok := starts.Lookup(w.cfg.Topic, pc.partition); ok && o.Err == nil {
				from = o.Offset
			}
		}
		pc.mu.Lock()
		pc.lagFrom = from
		pc.mu.Unlock()
	}
}

// topicID returns the ID topic had when the worker first listed it (zero
// until then).
func (w *Worker) topicID(topic string) kadm.TopicID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.topicIDs[topic]
}

// errTopicRecreated is returned by a commit of offsets of the events
// topic once it was deleted and created again: they are the deleted
// topic's, and committed to the new one (by name) they would skip its
// records.
var errTopicRecreated = errors.New("not committed: the events topic was deleted and created again, and the offsets are the deleted topic's (restart the worker)")

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	everyOr(ctx, d, nil, f)
}

// everyOr calls f every d, and whenever kick receives (nil: never), until
// ctx ends.
func everyOr(ctx context.Context, d time.Duration, kick <-chan struct{}, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		f()
	}
}

// closeQuietBreakers closes, every quarter of the breaker window (at
// least every second), the breakers whose fingerprint saw no failure for a
// window, until ctx ends.
func (w *Worker) closeQuietBreakers(ctx context.Context) {
	every(ctx, max(w.cfg.Breaker.Window/4, time.Second), w.breaker.closeQuiet)
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
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	for _, f := range []func(context.Context){w.failures.run, w.closeQuietBreakers, w.refreshHighWatermarks} {
		background.Go(func() { f(fctx) })
	}
	defer func() { stop(); background.Wait() }() // after shutdown: the last repeats are written
	var notJoined logfold.Line
	fetchFailed := map[int32]*logfold.Line{} // by partition (-1: the client's)
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
			w.mu.Lock()
			joined := w.joined
			if !joined {
				w.pollErr = err
			}
			w.mu.Unlock()
			if !joined {
				// franz-go returns the join's error at each poll while it
				// retries (every few seconds while a broker is down):
				// written when it changes, else once a minute.
				if n, ok := notJoined.Due(err.Error(), time.Now()); ok {
					attrs := append([]any{"group", w.cfg.Group}, fetchErrorAttrs(topic, p, err)...)
					if n > 0 {
						attrs = append(attrs, "repeats", n)
					}
					w.log.Error("consumer group not joined", attrs...)
				}
				return
			}
			// Per partition, written when its error changes, else once a
			// minute: a lasting error comes back at every poll
			// (operator trial: UNKNOWN_TOPIC_ID of a topic deleted and
			// created again, 12 000 lines a second).
			l := fetchFailed[p]
			if l == nil {
				l = &logfold.Line{}
				fetchFailed[p] = l
			}
			if n, ok := l.Due(topic+": "+err.Error(), time.Now()); ok {
				attrs := fetchErrorAttrs(topic, p, err)
				if n > 0 {
					attrs = append(attrs, "repeats", n)
				}
				w.log.Error("fetch failed", attrs...)
			}
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
	w.shuttingDown = true
	all := make([]*partition, 0, len(w.partitions))
	for p, pc := range w.partitions {
		all = append(all, pc)
		delete(w.partitions, p)
	}
	w.mu.Unlock()
	// Said when it starts: a shutdown that runs out of grace was silent
	// until its end (new-user trial: nothing for 25 s after a SIGTERM
	// during a group join).
	w.log.Info("shutting down: finishing the partitions' batches, committing and leaving the group", "partitions", len(all), "grace", w.cfg.ShutdownGrace)
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
	inJoin, err := w.commitAtShutdown(grace)
	if err != nil {
		errs = append(errs, fmt.Errorf("commit offsets at shutdown: %w", err))
	} else {
		w.commitHandoffs(grace, all, stuck)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		w.cl.CloseAllowingRebalance()
	}()
	if !w.closeWithin(grace, closed, inJoin) {
		errs = append(errs, fmt.Errorf("leave group: shutdown grace of %s exceeded", w.cfg.ShutdownGrace))
	}
	if len(stuck) == 0 {
		w.wg.Wait()
	}
	return errors.Join(errs...)
}

// wakePartitions wakes every partition's goroutine.
func (w *Worker) wakePartitions() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, pc := range w.partitions {
		select {
		case pc.wake <- struct{}{}:
		default:
		}
	}
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
		lagFrom:   -1,
	}
	pc.retries.total = &w.retrying
	pc.attempt = pc.attemptChain()
	pc.spanAttrs = w.tr.partitionAttrs(p)
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
	w.pollErr = nil
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
		select {
		case w.assignedAt <- struct{}{}:
		default: // a check is due already
		}
	}
}

// onRevoked stops the revoked partitions' goroutines (cancelling retries and
// backoff waits at once) and commits what they finished.
func (w *Worker) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	stopped, stuck := w.stop(revoked[w.cfg.Topic])
	if w.left.Load() {
		return // committed at shutdown; the member is no longer the group's
	}
	if err := w.commitMarked(ctx, cl); err != nil {
		w.log.Error("commit offsets on revoke failed", "topic", w.cfg.Topic, "error", err)
	} else {
		w.commitHandoffs(ctx, stopped, stuck)
	}
	if len(revoked[w.cfg.Topic]) > 0 {
		w.log.Info("partitions revoked", "topic", w.cfg.Topic, "partitions", revoked[w.cfg.Topic])
	}
}

// commitAttempts is how many times commitMarked tries a commit.
const commitAttempts = 5

// commitMarked commits the marked offsets, and tries again after an error
// the coordinator may not give the next time (kerr's retriable ones, such
// as REQUEST_TIMED_OUT and NOT_COORDINATOR, and a broken connection): up
// to commitAttempts times, waiting 50 ms and then twice as long each time
// (at most 750 ms in all), within ctx. A revoke or shutdown whose commit
// is lost makes the next owner process the records again and dead-letter
// again the ones that failed (the fault soak, seed 1796212270894762707: a
// REQUEST_TIMED_OUT at a revoke, seven dead letters written twice). It
// returns the last attempt's error.
func (w *Worker) commitMarked(ctx context.Context, cl *kgo.Client) error {
	w.mu.Lock()
	recreated := slices.Contains(w.recreatedTopics, w.cfg.Topic)
	w.mu.Unlock()
	if recreated {
		return errTopicRecreated
	}
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := cl.CommitMarkedOffsets(ctx)
		if err == nil || attempt == commitAttempts || !retriableCommit(err) || ctx.Err() != nil {
			return err
		}
		w.log.Warn("commit offsets failed, retrying", "topic", w.cfg.Topic, "attempt", attempt, "wait", wait, "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// joinCommitWait is how long commitAtShutdown waits for the client's
// commit before it commits directly, and closeWithin for the client to
// leave the group before it leaves directly; leaveWait, how long
// closeWithin waits for the client to close after that.
const (
	joinCommitWait = 2 * time.Second
	leaveWait      = time.Second
)

// commitAtShutdown commits the marked offsets through the client
// (commitMarked) or, when the client has not committed within
// joinCommitWait, directly (commitDirect), and reports whether it did so.
// The client holds commits while its group join and sync are in flight,
// and a join waits for every member of the group, a crashed one until its
// session times out, longer than the shutdown grace (operator trial: a
// SIGTERM 3 s after another member was killed and a new one started ran
// out of grace, committed nothing, and its partitions were read again
// from the last commit, 86 s later). The broker takes a commit of the
// current generation until the join completes: what a member commits as
// its partitions are revoked.
func (w *Worker) commitAtShutdown(ctx context.Context) (direct bool, err error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.commitMarked(cctx, w.cl) }()
	select {
	case err := <-done:
		return false, err
	case <-time.After(joinCommitWait):
	}
	cancel()
	<-done
	marked := w.cl.MarkedOffsets()[w.cfg.Topic]
	committed := w.cl.CommittedOffsets()[w.cfg.Topic]
	var ps []kmsg.OffsetCommitRequestTopicPartition
	for p, o := range marked {
		if c, ok := committed[p]; ok && c.Offset >= o.Offset {
			continue
		}
		cp := kmsg.NewOffsetCommitRequestTopicPartition()
		cp.Partition, cp.Offset, cp.LeaderEpoch = p, o.Offset, o.Epoch
		ps = append(ps, cp)
	}
	w.log.Info("the client holds the commit back (a consumer group join in flight?): committing the offsets directly", "topic", w.cfg.Topic, "partitions", len(ps), "waited", joinCommitWait)
	if len(ps) == 0 {
		return true, nil
	}
	return true, w.commitDirect(ctx, ps)
}

// closeWithin waits for the client to close (closed), which it does once
// it has left the group, and reports whether it did, or the worker left
// the group by itself, before ctx is done. The client leaves once its
// join in flight is answered, which waits for every member, a crashed one
// until its session times out (operator trial: 86 s); so when the client
// has not closed within joinCommitWait (or inJoin: it held a commit back),
// the worker leaves with a request of its own (leaveDirect) and gives the
// client leaveWait more.
func (w *Worker) closeWithin(ctx context.Context, closed <-chan struct{}, inJoin bool) bool {
	if !inJoin {
		t := time.NewTimer(joinCommitWait)
		defer t.Stop()
		select {
		case <-closed:
			return true
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	if !w.leaveDirect(ctx) {
		select {
		case <-closed:
			return true
		case <-ctx.Done():
			return false
		}
	}
	t := time.NewTimer(leaveWait)
	defer t.Stop()
	select {
	case <-closed:
	case <-ctx.Done():
	case <-t.C:
	}
	return true
}

// leaveDirect sends the group a LeaveGroup of the worker's member, unless
// it is a static one (--group-instance-id, which keeps its partitions
// until its session times out), so that the group's join goes on without
// it at once, and reports whether the group took it.
func (w *Worker) leaveDirect(ctx context.Context) bool {
	if id, ok := w.cl.OptValue(kgo.InstanceID).(string); ok && id != "" {
		return false
	}
	memberID, _ := w.cl.GroupMetadata()
	if memberID == "" {
		return false
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group, req.MemberID = w.cfg.Group, memberID
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID, m.Reason = memberID, kmsg.StringPtr("shutting down while the group rebalances")
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, w.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, m := range resp.Members {
			err = cmp.Or(err, kerr.ErrorForCode(m.ErrorCode))
		}
	}
	if err != nil {
		w.log.Warn("could not leave the consumer group by itself; the group reassigns the worker's partitions once its session times out", "group", w.cfg.Group, "error", err)
		return false
	}
	w.left.Store(true)
	w.log.Info("left the consumer group by itself: the client's own leave waits for a group join in flight", "group", w.cfg.Group, "member_id", memberID)
	return true
}

// retriableCommit reports whether a commit that failed with err may
// succeed if sent again: a retriable Kafka error or a broken connection,
// not a fenced or stale member (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
// FENCED_INSTANCE_ID), whose partitions are no longer its own.
func retriableCommit(err error) bool {
	var ne net.Error
	return kerr.IsRetriable(err) || errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// onLost stops the lost partitions without committing: another member may
// already own them.
func (w *Worker) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	w.mu.Lock()
	w.joined = false
	w.mu.Unlock()
	w.stop(lost[w.cfg.Topic])
	if len(lost[w.cfg.Topic]) == 0 || w.left.Load() {
		// A session lost with nothing assigned (the brokers were down
		// while it joined): nothing stopped, nothing to say (operator
		// trial: a WARN with an empty list every few seconds). Nor after
		// the worker left the group by itself at shutdown (leaveDirect).
		return
	}
	w.log.Warn("partitions lost", "topic", w.cfg.Topic, "partitions", append([]int32{}, lost[w.cfg.Topic]...))
}

// fetchErrorAttrs are the log attributes of an error of a poll: the topic
// and partition only when the error is one partition's (franz-go gives a
// client's own error, such as failing to join the group, with topic "").
func fetchErrorAttrs(topic string, partition int32, err error) []any {
	if topic == "" {
		return []any{"error", err}
	}
	return []any{"topic", topic, "partition", partition, "error", err}
}

// stop stops the goroutines of partitions ps, waiting for them at most the
// shutdown grace: a rebalance must not hang on a projection that ignores
// its context. A goroutine still running after that only ever marks
// records it finished, which stays correct. It returns the stopped
// partitions' states and the partitions whose goroutines had not returned.
func (w *Worker) stop(ps []int32) (stopped []*partition, stuck []int32) {
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
	stuck = stopPartitions(ctx, stopping)
	if len(stuck) > 0 {
		w.log.Error("partitions did not stop within the shutdown grace; going on without them (a projection that ignores its context?)",
			"topic", w.cfg.Topic, "partitions", stuck, "grace", w.cfg.ShutdownGrace)
	}
	return stopping, stuck
}

// hasHandler reports whether the worker has a projection named name.
func (w *Worker) hasHandler(name string) bool {
	for _, h := range w.handlers {
		if h.Name() == name {
			return true
		}
	}
	return false
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
