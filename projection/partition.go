package projection

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/twmb/franz-go/pkg/kgo"
)

// partition is the state of one assigned partition. Its goroutine (run)
// takes queued records in offset order, applies them in batches, keeps the
// pairs that failed with a retriable error in its retry set (retryset.go)
// while later records go on, and marks for commit the watermark: the lowest
// record that still has an unfinished pair. It exits when ctx is cancelled.
type partition struct {
	w         *Worker
	partition int32
	ctx       context.Context
	cancel    context.CancelFunc
	wake      chan struct{}        // cap 1: records were queued
	done      chan struct{}        // closed when run returns
	attempt   applyFunc            // one attempt of one pair (chain.go)
	spanAttrs []attribute.KeyValue // its record spans' common attributes (tracing.go)

	mu          sync.Mutex
	queue       []*kgo.Record
	queuedBytes int
	fetchPaused bool // fetching paused for backpressure or a database wait
	// dbWait is the database's last answer while the partition waits for
	// it (InfraPause); nil when not waiting.
	dbWait        error
	stuck         error // a dead letter that cannot be written, nil when none
	next          int64 // the watermark: offset of the next record to finish; −1 unknown
	highWatermark int64
	// lagFrom is where the consumer lag counts from while next is
	// unknown (no record taken yet): the group's committed offset, or
	// without one the log start offset (refreshHighWatermarks); −1
	// unknown.
	lagFrom       int64
	retryingPairs int      // retries.waiting(), for Ready and metrics
	received      *handoff // left by the previous owner (handoff.go)

	// Owned by the goroutine; read by others only after done is closed.
	open     []*recordState // records with unfinished pairs, in offset order
	lastDone *kgo.Record    // the last record taken
	retries  retrySet
	round    *retryRound // the round of retries in flight, nil when none
	// rode holds the tables the last batch wrote with COPY or suspect
	// upserts, which due retries may ride (noteWrites).
	rode    []projectionTable
	seen    breakerSeen      // the breaker's counts when retries were last swept
	writing *deadLetterWrite // the dead-letter write in flight, nil when none
	// kept holds the event types and tenant schemas of the partition's
	// records, one copy each (decodeRecord).
	kept keptStrings
	// refusedGroups marks the COPY groups to isolate at once (execCopy).
	refusedGroups refusedMarks
	// pairsPerRecord is planned pairs per record of the last batch, in
	// 1/16: the next batch's planned slice is sized from it, not grown.
	pairsPerRecord int
	// retriedAtRelease holds, once the partition is released, the retries
	// its waiting pairs had made, for the hand-off (newHandoff).
	retriedAtRelease map[pairKey]int
}

// recordState is a record that has pairs neither applied nor acknowledged as
// dead letters.
type recordState struct {
	d *decoded
	// pending maps each unfinished pair's projection ("" for the record
	// itself) to when it first failed.
	pending map[string]time.Time
	bytes   int // recordBytes of the record
	// deadLettered is why the record's span ends with status Error: the
	// first of its dead letters; "" when none.
	deadLettered string
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
	pc.highWatermark = max(pc.highWatermark, hwm) // refreshHighWatermarks may have seen further
	full := pc.queuedBytes >= pc.w.cfg.MaxQueuedBytes*3/4
	pc.mu.Unlock()
	if full {
		pc.pauseFetch(pauseQueueFull)
	}
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

// Why a partition's fetching is paused (pauseFetch).
const (
	pauseQueueFull    = "queue full"
	pauseRetrySetFull = "retry set full"
	pauseDBWait       = "database wait"
)

// pauseFetch stops fetching the partition until maybeResume. The client
// drops what it has buffered for the partition (franz-go's
// PauseFetchPartitions), so those records are fetched again on resume: a
// DEBUG line names the reason and the bytes queued then.
func (pc *partition) pauseFetch(reason string) {
	pc.mu.Lock()
	already := pc.fetchPaused
	pc.fetchPaused = true
	queued := pc.queuedBytes
	pc.mu.Unlock()
	if !already {
		pc.w.cl.PauseFetchPartitions(map[string][]int32{pc.w.cfg.Topic: {pc.partition}})
		pc.w.log.Debug("fetch paused: "+reason, "topic", pc.w.cfg.Topic, "partition", pc.partition, "queued_bytes", queued)
	}
}

// maybeResume resumes fetching once the queue holds at most a quarter of
// MaxQueuedBytes, the retry set has room and the database is not being
// waited for.
func (pc *partition) maybeResume() {
	room := pc.retries.hasRoom(pc.w.cfg)
	pc.mu.Lock()
	resume := pc.fetchPaused && pc.dbWait == nil && room && pc.queuedBytes <= pc.w.cfg.MaxQueuedBytes/4
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

// waitingForDB returns the database's last answer while the partition
// waits for the database (InfraPause), else nil.
func (pc *partition) waitingForDB() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.dbWait
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

// run is the partition's goroutine. Each round it retries the pairs that
// are due, then applies new records while the retry set has room, then
// waits for records, the next due retry or the end.
func (pc *partition) run() {
	defer close(pc.done)
	defer pc.release()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// Before release, the pairs of the round in flight go back to the set.
	defer func() { _ = pc.finishRetries(pc.ctx, pc.round) }()
	for {
		if err := pc.settleDeadLetters(pc.ctx, false); err != nil {
			return
		}
		if pc.turnRetries(true, nil) != nil {
			return
		}
		for pc.retries.hasRoom(pc.w.cfg) {
			recs, more := pc.take(pc.w.cfg.MaxBatchRecords)
			if len(recs) == 0 {
				break
			}
			for len(recs) > 0 {
				n := inOrder(recs)
				pc.rewound(recs[0])
				stop := pc.watchSlow("batch")
				err := pc.processWithinBudget(recs[:n])
				stop()
				if err != nil {
					return // ctx is done: the unfinished records go to the next owner
				}
				recs = recs[n:]
				// Settle a round answered meanwhile and start the next of
				// the pairs due: a partition whose queue never runs dry
				// (a backlog, under load) retries on schedule too, not
				// only the pairs that ride a batch of their table. It
				// leaves the pairs that may ride the next batch
				// (notLeftToRide).
				if pc.turnRetries(true, pc.notLeftToRide) != nil {
					return
				}
			}
			pc.maybeResume()
			if !more {
				break
			}
		}
		if pc.retries.hasRoom(pc.w.cfg) {
			pc.maybeResume()
		} else {
			pc.pauseFetch(pauseRetrySetFull) // backpressure until retries drain
		}
		timer.Reset(pc.retries.nextDue(time.Hour))
		select {
		case <-pc.ctx.Done():
			return
		case <-pc.wake:
		case <-timer.C:
		case <-pc.writingDone():
		case <-pc.round.doneChan():
		}
	}
}

// slowWork is how long a batch (or a round of retries) of a partition may
// take before watchSlow says so: 30 s (nanoseconds; tests shorten it).
var slowWork atomic.Int64

func init() { slowWork.Store(int64(30 * time.Second)) }

// watchSlow returns a func that ends the watch of a partition's batch or
// round of retries (what): when it is still running after slowWork, and
// the partition is not waiting for the database (which says so itself), a
// WARN line says so, then one every slowWork while it lasts (ops trial: a
// table locked by another session stalled the partition with no line at
// all). Nothing stops such a statement unless lock_timeout or
// statement_timeout is set for the worker's sessions (README).
func (pc *partition) watchSlow(what string) (stop func()) {
	start := time.Now()
	var t *time.Timer
	var mu sync.Mutex
	stopped := false
	warn := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if pc.waitingForDB() == nil {
			pc.w.log.Warn("a partition's "+what+" is taking long: a statement waits for a lock another session holds, or runs long; set lock_timeout and statement_timeout for the worker's sessions to have such statements fail, be retried and, for good, dead-lettered (README, Failure handling)",
				"topic", pc.w.cfg.Topic, "partition", pc.partition, "elapsed", time.Since(start))
		}
		t.Reset(time.Duration(slowWork.Load()))
	}
	t = time.AfterFunc(time.Duration(slowWork.Load()), warn)
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// largeBatchFloor is the smallest batch, in record bytes, that takes from
// the processing budget, however small Config.MaxQueuedBytes is.
const largeBatchFloor = 64 << 10

// processWithinBudget processes recs (processBatch). A batch of more than
// an eighth of Config.MaxQueuedBytes (and more than 64 KiB) first waits
// until the worker's
// processing budget (MaxQueuedBytes) has room for its bytes; a batch
// larger than the whole budget takes all of it, so it runs alone among
// the large ones. Smaller batches never wait: a partition blocked on a
// slow pair holds no budget the others need. It returns an error only when
// the partition's ctx is done first.
func (pc *partition) processWithinBudget(recs []*kgo.Record) error {
	n := 0
	for _, r := range recs {
		n += recordBytes(r)
	}
	if budget := pc.w.cfg.MaxQueuedBytes; n > max(budget/8, largeBatchFloor) {
		n = min(n, budget)
		if err := pc.w.processing.Acquire(pc.ctx, int64(n)); err != nil {
			return err
		}
		defer pc.w.processing.Release(int64(n))
	}
	return pc.processBatch(pc.ctx, recs)
}

// release undoes what the partition holds in the worker's accounting: its
// queued bytes, its paused and stuck gauges, a breaker probe it ran.
func (pc *partition) release() {
	// A dead-letter write in flight goes on for up to half the shutdown
	// grace (writeContext): what it wrote is finished, and so committed or
	// handed off, rather than written again by the next owner.
	_ = pc.settleDeadLetters(pc.ctx, true)
	pc.mu.Lock()
	pc.w.dequeued(pc.queuedBytes)
	pc.queue, pc.queuedBytes = nil, 0
	pc.mu.Unlock()
	if pc.waitingForDB() != nil {
		pc.w.cfg.Metrics.addPaused(context.Background(), -1)
	}
	if pc.stuckOn() != nil {
		pc.w.cfg.Metrics.addStuck(context.Background(), -1)
	}
	pc.endSpans(pc.open, pc.retries.pairs)
	pc.retriedAtRelease = pc.retries.counts()
	pc.retries.cancel(pc.w.breaker)
	pc.setRetrying(0)
}

// endSpans ends the spans of open records and waiting pairs that the
// partition drops unfinished (revoked, or rewound): outcome released.
func (pc *partition) endSpans(open []*recordState, waiting []*retryPair) {
	if pc.w.tr == nil {
		return
	}
	for _, p := range waiting {
		endPair(p.span, outcomeReleased, p.retries)
	}
	for _, rs := range open {
		endRecord(rs.d.span, outcomeReleased, "")
	}
}

// track registers the records of a batch once its fast path is done:
// failed holds, by batch index, the projections of each record's
// unfinished pairs and when they first failed, detached their records'
// copies (detach). Records without one are finished.
func (pc *partition) track(batch []decoded, failed map[int]map[string]time.Time, detached map[int]*decoded) {
	for i := range batch {
		if pending := failed[i]; len(pending) > 0 {
			pc.open = append(pc.open, &recordState{d: detached[i], pending: pending, bytes: recordBytes(batch[i].rec)})
		} else {
			endRecord(batch[i].span, outcomeApplied, "")
		}
	}
	if len(batch) > 0 {
		pc.lastDone = batch[len(batch)-1].rec
	}
}

// stateOf returns the open state of the record at offset, nil if finished.
func (pc *partition) stateOf(offset int64) *recordState {
	for _, rs := range pc.open {
		if rs.d.rec.Offset == offset {
			return rs
		}
	}
	return nil
}

// finish records that the pair (offset, projection) is applied or its dead
// letter acknowledged.
func (pc *partition) finish(offset int64, projection string) {
	if rs := pc.stateOf(offset); rs != nil {
		delete(rs.pending, projection)
		if len(rs.pending) == 0 {
			endRecord(rs.d.span, outcomeApplied, rs.deadLettered)
		}
	}
}

// advance drops the finished records from the front of the open list and
// marks the watermark for commit: the first open record, or the record
// after the last one taken.
func (pc *partition) advance() {
	i := 0
	for i < len(pc.open) && len(pc.open[i].pending) == 0 {
		i++
	}
	pc.open = pc.open[i:]
	var at kgo.EpochOffset
	switch {
	case len(pc.open) > 0:
		r := pc.open[0].d.rec
		at = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
	case pc.lastDone != nil:
		at = kgo.EpochOffset{Epoch: pc.lastDone.LeaderEpoch, Offset: pc.lastDone.Offset + 1}
	default:
		return
	}
	pc.w.cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{pc.w.cfg.Topic: {pc.partition: at}})
	pc.mu.Lock()
	pc.next = at.Offset
	pc.mu.Unlock()
}

func (pc *partition) setRetrying(n int) {
	pc.mu.Lock()
	d := n - pc.retryingPairs
	pc.retryingPairs = n
	pc.mu.Unlock()
	if d != 0 {
		pc.w.cfg.Metrics.addRetrying(context.Background(), int64(d))
	}
}

// inOrder returns how many records at the head of recs have increasing
// offsets.
func inOrder(recs []*kgo.Record) int {
	for i := 1; i < len(recs); i++ {
		if recs[i].Offset <= recs[i-1].Offset {
			return i
		}
	}
	return len(recs)
}

// rewound handles records the client delivers again: first, at or below
// the last record taken, happens when the client rewinds its fetch position
// within an assignment (a broker reported lost records after a leader
// change, or the offset was out of range). What was taken from there on is
// processed again, so its open records and waiting pairs are dropped (the
// records before first stay); re-applied records are stale no-ops, and
// their dead letters can be written twice. A WARN line says so, with the
// partition and both offsets.
func (pc *partition) rewound(first *kgo.Record) {
	if pc.lastDone == nil || first.Offset > pc.lastDone.Offset {
		return
	}
	pc.w.log.Warn("records delivered again: the client rewound this partition; they are processed again (stale no-ops, and their dead letters may be written twice)",
		"topic", pc.w.cfg.Topic, "partition", pc.partition, "offset", first.Offset, "last_offset", pc.lastDone.Offset)
	keep := pc.open[:0]
	for _, rs := range pc.open {
		if rs.d.rec.Offset < first.Offset {
			keep = append(keep, rs)
		} else {
			pc.endSpans([]*recordState{rs}, nil)
		}
	}
	clear(pc.open[len(keep):])
	pc.open = keep
	pc.retries.dropFrom(first.Offset, pc.w.breaker)
	pc.setRetrying(pc.retries.waiting())
	pc.lastDone = nil
	if len(pc.open) > 0 {
		pc.lastDone = pc.open[len(pc.open)-1].d.rec
	}
}
