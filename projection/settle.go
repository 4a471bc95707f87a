package projection

// What becomes of a pair that failed: settle (a batch's failures) and
// finishRetries (a round of retries, made aside: startRetries) either put
// it in the partition's retry set (retryset.go) to wait for its next
// attempt, or dead-letter it: at once (an invalid record, a permanent
// error, an open breaker, breaker.go) or once its retries run out. Dead letters are written without holding the
// partition (writeDeadLetters); a dead letter that cannot be written holds
// its record, visibly (deadLetter).

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/logfold"
	"github.com/causet/projection-worker/retry"
)

// settle registers the batch's records with the watermark, then settles
// each failed pair on its own: a failure that needs no retry (an invalid
// record, a permanent error) and a pair whose fingerprint's breaker is open
// are dead-lettered at once, together in one round trip; a pair that
// failed with a retriable error waits in the retry set while later records
// go on (retryset.go). It returns an error only when ctx is done first.
func (pc *partition) settle(ctx context.Context, batch []decoded, failures []pairFailure) error {
	// Dead letters go out in record order.
	slices.SortStableFunc(failures, func(a, b pairFailure) int { return a.d.idx - b.d.idx })
	// What outlives the batch (open records, waiting pairs) must not hold
	// the batch's array nor the fetch buffers its records' bytes share.
	detached := make(map[int]*decoded)
	for i := range failures {
		d := detached[failures[i].d.idx]
		if d == nil {
			d = detach(failures[i].d)
			detached[d.idx] = d
		}
		failures[i].d = d
	}
	pending := make(map[int]map[string]time.Time)
	for i, f := range failures {
		if t, ok := pc.receivedFirstFailedAt(f.d.rec.Offset, f.projectionName()); ok {
			failures[i].firstAt = t
		}
		if pending[f.d.idx] == nil {
			pending[f.d.idx] = make(map[string]time.Time)
		}
		pending[f.d.idx][f.projectionName()] = failures[i].firstAt
	}
	pc.track(batch, pending, detached)
	var dead []dlq.DeadLetter
	for _, f := range failures {
		if !needsRetry(f) {
			dead = append(dead, pc.w.immediateDeadLetter(f))
			continue
		}
		p := &retryPair{d: f.d, h: f.h, err: f.err, stack: f.stack, firstAt: f.firstAt, span: f.span}
		if _, ok := pc.receivedFirstFailedAt(f.d.rec.Offset, f.projectionName()); ok {
			// It failed at a previous owner too: this attempt was a retry,
			// after the ones made there.
			p.retries = pc.receivedRetries(f.d.rec.Offset, f.projectionName()) + 1
		}
		if dl := pc.schedule(p); dl != nil {
			dead = append(dead, *dl)
		}
	}
	return pc.conclude(ctx, dead)
}

// schedule settles a pair whose attempt failed with a retriable error: it
// waits in the retry set for its next attempt, unless the retries ran out
// or the breaker of its fingerprint is open (at its first failure, or since
// it began to wait; not for the breaker's probe), in which case its dead
// letter is returned for the caller to write.
func (pc *partition) schedule(p *retryPair) *dlq.DeadLetter {
	w := pc.w
	first := p.backoff == nil
	if first { // the first failure here: ask the breaker
		dl := w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, p.retries, p.firstAt, p.span)
		p.fp = dl.Fingerprint()
		probe, err := w.breaker.admit(p.fp)
		if err != nil {
			dl.ShortCircuit = p.fp
			return &dl
		}
		p.probe = probe
		// A pair handed off with retries made goes on with their schedule.
		p.backoff = w.cfg.Retry.NewBackOffAfter(p.retries)
		if !probe && w.cfg.Retry.MaxRetries > 0 {
			var lead bool
			p.slot, lead = w.breaker.lead(p.fp, time.Now().Add(w.slotHold))
			p.follow = !lead
		}
	} else if dl := pc.shortCircuit(p); dl != nil {
		return dl
	}
	var wait time.Duration
	if !p.follow {
		wait = p.backoff.NextBackOff()
	}
	if p.retries >= w.cfg.Retry.MaxRetries || wait == backoff.Stop {
		w.breaker.unlead(p.fp, p.slot)
		p.slot = 0
		if opened, n := w.breaker.exhausted(p.fp, p.probe); opened {
			w.breakerOpened(p, n)
		}
		dl := w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, p.retries, p.firstAt, p.span)
		return &dl
	}
	if p.follow { // until a slot frees (dueOnBreakers asks), a success or the breaker opens
		wait = max(time.Until(w.breaker.holdUntil(p.fp)), maxRetryEarly)
	}
	ev := p.d.ev
	attrs := []any{"topic", p.d.rec.Topic, "partition", p.d.rec.Partition, "offset", p.d.rec.Offset,
		"projection", p.h.Name(), "tenant_schema", ev.TenantSchema}
	if p.follow { // no retry is scheduled: it waits for the slots at most until they expire
		attrs = append(attrs, "waits_for_retry_slot", true, "wait_at_most", wait, "error", p.err)
	} else {
		attrs = append(attrs, "retry", p.retries+1, "wait", wait, "error", p.err)
	}
	// The line's trace_id and span_id are the pair's; its first failure is
	// at WARN, repeats aggregated; a pair that waits for a retry slot is
	// not retried yet: a DEBUG line of its own, out of the aggregate.
	ctx := spanContext(context.Background(), p.span)
	switch {
	case p.follow:
		w.log.DebugContext(ctx, "projection failed, waiting for a retry slot", attrs...)
	case first:
		w.failures.write(ctx, slog.LevelWarn, "projection failed, retrying", p.fp, attrs...)
	default:
		w.log.DebugContext(ctx, "projection failed, retrying", attrs...)
	}
	from := time.Now()
	if !p.attemptedAt.IsZero() && p.attemptedAt.Before(from) {
		from = p.attemptedAt
	}
	p.due, p.wait = from.Add(wait), wait
	pc.retries.add(p)
	return nil
}

// shortCircuit returns the dead letter of a waiting pair whose
// fingerprint's breaker opened while it waited (another pair's exhaustion),
// nil when the pair goes on: the breaker is closed, or the pair is its
// probe. The dead letter keeps the pair's last error and retry count.
func (pc *partition) shortCircuit(p *retryPair) *dlq.DeadLetter {
	if p.probe || !pc.w.breaker.isOpen(p.fp) {
		return nil
	}
	dl := pc.w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, p.retries, p.firstAt, p.span)
	dl.ShortCircuit = p.fp
	return &dl
}

// retryRound is a round of retries: the pairs that were due, whose
// attempts run in a goroutine of their own (startRetries). The partition's
// goroutine waits for them up to retryRoundWait (turnRetries), then goes
// on with its next batches, so that a round waiting for a lock or for a
// database that stopped answering holds none of the partition's later
// records (non-blocking retries); finishRetries settles the round on the
// partition's goroutine.
type retryRound struct {
	dead       []dlq.DeadLetter // short-circuited by an open breaker
	attempting []*retryPair     // taken from the retry set, attempted
	res        []attemptResult  // by attempting's index, once done is closed
	done       chan struct{}    // closed when the attempts are made
	at         time.Time        // when they were, set before done is closed
	stopWatch  func()           // ends its watchSlow
}

// finished reports whether r's attempts are made (false for nil).
func (r *retryRound) finished() bool {
	if r == nil {
		return false
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// doneChan is closed when r's attempts are made; nil (never ready in a
// select) for nil.
func (r *retryRound) doneChan() <-chan struct{} {
	if r == nil {
		return nil
	}
	return r.done
}

// startRetries takes the pairs that are due from the retry set and starts
// their next attempts (those of Planners together in one round trip:
// attemptTogether) in a goroutine of its own; it returns the round, nil
// when no pair is due. A due pair whose fingerprint's breaker opened while
// it waited is not attempted: the breaker already says how it would end
// (its dead letter is written by finishRetries). The pairs of the round
// still count against the retry set's bounds (retrySet.hasRoom) until it
// is finished. With only not nil, only the due pairs it reports true for
// are taken.
func (pc *partition) startRetries(ctx context.Context, only func(*retryPair) bool) *retryRound {
	r := pc.newRound(pc.retries.takeDue(time.Now(), only))
	if r == nil {
		return nil
	}
	r.stopWatch = pc.watchSlow("round of retries")
	if len(r.attempting) == 0 {
		r.answered()
		return r
	}
	// attemptTogether reads only the pairs and the worker's shared state.
	go func() {
		pc.attemptTogether(ctx, r.attempting, r.res)
		r.answered()
	}()
	return r
}

// newRound returns the round of retries of the due pairs, taken from the
// retry set (nil when there are none): the pairs whose breaker opened while
// they waited get their dead letters (dead), the others are to be
// attempted and count as in flight (retrySet.fly) until finishRetries.
func (pc *partition) newRound(due []*retryPair) *retryRound {
	if len(due) == 0 {
		return nil
	}
	r := &retryRound{attempting: make([]*retryPair, 0, len(due)), done: make(chan struct{}), stopWatch: func() {}}
	for _, p := range due {
		if dl := pc.shortCircuit(p); dl != nil {
			r.dead = append(r.dead, *dl)
			continue
		}
		r.attempting = append(r.attempting, p)
	}
	r.res = make([]attemptResult, len(r.attempting))
	pc.retries.fly(r.attempting, 1)
	return r
}

// answered marks r's attempts made, now.
func (r *retryRound) answered() {
	r.at = time.Now()
	close(r.done)
}

// rideRetries takes from the retry set the due pairs of the table
// projections and tenant schemas that the batch writes (its COPY groups
// and its suspect upserts: pc.rode, noteWrites), for their attempts to
// ride the batch's round trip of suspect upserts (applySuspects) rather
// than make a round of their own: a 1 % poison that a CHECK refuses
// inside COPY groups (23514) then costs PostgreSQL's statements, not
// rounds waiting for another connection of the pool while the partition
// waits for them. Only those
// tables: a table lock that makes their retries wait holds the batch's
// COPY anyway. A lock on a row (or an advisory lock a trigger takes) holds
// a rider at most rideLockTimeout; it then goes aside for a round of its
// own and never rides again (retryPair.noRide). Nothing rides while a
// round is in flight: that round may be waiting for the same lock. It
// returns nil when no pair rides.
func (pc *partition) rideRetries() *retryRound {
	if len(pc.retries.pairs) == 0 || pc.round != nil {
		return nil
	}
	pc.retries.dueOnBreakers(pc.w.breaker, &pc.seen, pc.w.slotHold)
	return pc.newRound(pc.retries.takeDue(time.Now(), pc.mayRide))
}

// noteWrites sets pc.rode to the tables of the batch's COPY groups and
// suspect upserts, which its due retries may ride (rideRetries) and which
// the round between batches leaves to the next batch (notLeftToRide).
func (pc *partition) noteWrites(groups []*copyGroup, suspects []pair) {
	pc.rode = pc.rode[:0]
	for _, g := range groups {
		if t := (projectionTable{g.p, g.schema}); !slices.Contains(pc.rode, t) {
			pc.rode = append(pc.rode, t)
		}
	}
	for _, p := range suspects {
		if t := (projectionTable{p.h, p.d.ev.TenantSchema}); !slices.Contains(pc.rode, t) {
			pc.rode = append(pc.rode, t)
		}
	}
}

// projectionTable is a projection's table in a tenant schema.
type projectionTable struct {
	h      Handler
	schema string
}

// mayRide reports whether p may ride a batch that writes the tables in
// pc.rode (rideRetries).
func (pc *partition) mayRide(p *retryPair) bool {
	return !p.noRide && slices.Contains(pc.rode, projectionTable{p.h, p.d.ev.TenantSchema})
}

// notLeftToRide reports whether the round that starts between batches
// (run) takes p, due. It leaves p in the retry set when p could ride the
// batch just applied (mayRide), so the next batch, which most likely
// writes its table too, may carry its attempt in its round trip of
// suspect upserts (a round of its own costs PostgreSQL another connection
// and the partition its wait), and p is late by less than its wait and
// retryRoundWait. The bound keeps a pair on time under a backlog of
// batches that write its table but have no suspect upserts to ride: at
// most its wait late, and at most 250 ms for a pair made due at once
// (released from waiting for a retry slot, its breaker opened), whose
// wait is a long one.
func (pc *partition) notLeftToRide(p *retryPair) bool {
	return !pc.mayRide(p) || time.Since(p.due) >= min(p.wait, retryRoundWait)
}

// retryRoundWait is how long a partition's goroutine waits for the round
// of retries it started before it goes on with its records while the round
// goes on aside. A round answered within it is settled at once, as when
// rounds held the partition: going on at once with every round measured
// slower (make bench, N=1 000 000, 1 % 23514, two runs of 4 alternated
// rounds: the build that held the partition 1.17× and 1.10× as fast, with
// less CPU per event in the worker and in PostgreSQL). A round that waits
// longer (for a lock another session holds, for a database that stopped
// answering) holds none of the partition's later records.
const retryRoundWait = 250 * time.Millisecond

// turnRetries settles pc.round once its attempts are made and then, with
// none in flight and start, starts the next round of the pairs due (made
// due at once first when their breaker opened; with only not nil, those it
// reports true for) and waits for it up to retryRoundWait, settling it
// when it is answered by then. It returns ctx's error when ctx is done
// first.
func (pc *partition) turnRetries(start bool, only func(*retryPair) bool) error {
	if pc.round.finished() {
		r := pc.round
		pc.round = nil
		if err := pc.finishRetries(pc.ctx, r); err != nil {
			return err
		}
	}
	if pc.round != nil || !start {
		return nil
	}
	pc.retries.dueOnBreakers(pc.w.breaker, &pc.seen, pc.w.slotHold)
	r := pc.startRetries(pc.ctx, only)
	if r == nil {
		return nil
	}
	t := time.NewTimer(retryRoundWait)
	defer t.Stop()
	select {
	case <-r.done:
		return pc.finishRetries(pc.ctx, r)
	case <-t.C:
	case <-pc.ctx.Done():
	}
	pc.round = r
	return nil
}

// finishRetries waits for round r's attempts (nil: none) and settles each
// pair on the partition's goroutine: applied, waiting again, or
// dead-lettered; a pair its attempt round trip left without an answer
// (no Planner, an infrastructure error) is attempted on its own here. It
// writes the round's dead letters and advances the watermark. A pair whose
// record the partition dropped while the round was in flight (its records
// were delivered again: rewound) is dropped too; the record's new
// delivery settles it. It returns ctx's error when ctx is done first; the
// pairs not settled go back to the retry set, for release to free their
// breaker probes and hand their retries off.
func (pc *partition) finishRetries(ctx context.Context, r *retryRound) error {
	if r == nil {
		return nil
	}
	<-r.done
	r.stopWatch()
	pc.retries.fly(r.attempting, -1)
	w := pc.w
	dead := r.dead
	for i, p := range r.attempting {
		if rs := pc.stateOf(p.d.rec.Offset); rs == nil || rs.d != p.d {
			w.breaker.left(p)
			pc.endSpans(nil, []*retryPair{p})
			continue
		}
		if r.res[i].aside { // due again at once, for a round aside; not an attempt
			p.noRide = true
			p.due = time.Now()
			pc.retries.add(p)
			continue
		}
		out, err := r.res[i].out, r.res[i].err
		if !r.res[i].made && ctx.Err() == nil {
			out, err = pc.attempt(spanContext(ctx, p.span), p.h, p.d.ev)
		}
		if ctx.Err() != nil {
			for _, rest := range r.attempting[i:] {
				pc.retries.add(rest) // for release to free their probes
			}
			return ctx.Err()
		}
		p.retries++
		p.attemptedAt = r.at
		if !r.res[i].made {
			p.attemptedAt = time.Time{} // attempted just now
		}
		retryEvent(p.span, p.retries, p.wait, p.attemptedAt)
		w.cfg.Metrics.retried(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema))
		if err == nil {
			w.breaker.succeeded(p.fp, p.probe)
			endPair(p.span, spanOutcome(out), p.retries)
			pc.finish(p.d.rec.Offset, p.h.Name())
			continue
		}
		failedAttempt(p.span, err)
		p.err, p.stack = err, stackOf(err)
		if retry.IsPermanent(err) {
			w.breaker.left(p)
			dl := w.newDeadLetter(p.d, p.h.Name(), retry.Permanent, err, p.stack, p.retries, p.firstAt, p.span)
			dead = append(dead, dl)
			continue
		}
		if dl := pc.schedule(p); dl != nil {
			dead = append(dead, *dl)
		}
	}
	return pc.conclude(ctx, dead)
}

// conclude ends a round of settling pairs: it updates the retrying gauge,
// writes the round's dead letters and advances the watermark. It returns
// an error only when ctx is done first.
func (pc *partition) conclude(ctx context.Context, dead []dlq.DeadLetter) error {
	pc.setRetrying(pc.retries.waiting())
	if err := pc.writeDeadLetters(ctx, dead); err != nil {
		return err
	}
	pc.advance()
	return nil
}

// needsRetry reports whether a failed pair is retried before it may be
// dead-lettered: it reached a projection and its error is not permanent.
func needsRetry(f pairFailure) bool { return f.h != nil && !retry.IsPermanent(f.err) }

// deadLetterWrite is a partition's dead-letter write in flight: one
// WriteBatch, made by its own goroutine while the partition goes on.
type deadLetterWrite struct {
	dls  []dlq.DeadLetter
	errs []error       // WriteBatch's, set when done is closed
	done chan struct{} // closed when WriteBatch has returned
}

// writeDeadLetters starts writing dls in one round trip and returns without
// waiting for Kafka: their pairs stay unfinished, so the watermark (and the
// committed offset) stays at or before them until the write is
// acknowledged (settleDeadLetters). At most one write is in flight per
// partition: a write still in flight is settled first. It returns an error
// only when ctx is done first.
func (pc *partition) writeDeadLetters(ctx context.Context, dls []dlq.DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	if err := pc.settleDeadLetters(ctx, true); err != nil {
		return err
	}
	f := &deadLetterWrite{dls: dls, done: make(chan struct{})}
	wctx, done := pc.writeContext(ctx)
	go func() {
		defer close(f.done)
		defer done()
		f.errs = pc.w.dead.WriteBatch(wctx, dls)
	}()
	pc.writing = f
	return nil
}

// writingDone returns a channel closed when the write in flight returns,
// nil (never ready) when there is none.
func (pc *partition) writingDone() <-chan struct{} {
	if pc.writing == nil {
		return nil
	}
	return pc.writing.done
}

// settleDeadLetters settles the dead-letter write in flight once it has
// returned (waiting for it when wait is set; it is bounded by
// writeContext): each acknowledged dead letter finishes its pair; each
// refused one is written again on its own (deadLetter), waiting as long as
// it takes; then the watermark advances. It returns an error only when ctx
// is done first, leaving the refused pairs unfinished.
func (pc *partition) settleDeadLetters(ctx context.Context, wait bool) error {
	f := pc.writing
	if f == nil {
		return nil
	}
	if !wait {
		select {
		case <-f.done:
		default:
			return nil
		}
	}
	<-f.done
	pc.writing = nil
	var refused []dlq.DeadLetter
	for i, dl := range f.dls {
		if f.errs[i] != nil {
			if ctx.Err() == nil {
				pc.w.log.WarnContext(logContext(dl), "dead-letter write failed, retrying",
					"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
					"projection", dl.Projection, "tenant_schema", dl.TenantSchema, "error", f.errs[i])
			} else {
				pc.unacknowledged(dl, f.errs[i])
			}
			refused = append(refused, dl)
			continue
		}
		pc.deadLetterDone(ctx, dl)
	}
	pc.advance()
	if len(refused) > 0 && ctx.Err() != nil {
		return ctx.Err() // no new write once revoked: the next owner writes them
	}
	for _, dl := range refused {
		if err := pc.deadLetter(ctx, dl); err != nil {
			return err
		}
		pc.deadLetterDone(ctx, dl)
		pc.advance()
	}
	return nil
}

// logContext is the context of dl's log lines: its pair's span (trace_id
// and span_id; tracing trial: a stuck dead letter could not be tied to its
// trace), none without tracing.
func logContext(dl dlq.DeadLetter) context.Context {
	if dl.Context != nil {
		return dl.Context
	}
	return context.Background()
}

// unacknowledged logs, at WARN, that the partition is released (revoke,
// SIGTERM) before Kafka acknowledged the dead letter dl, with the write's
// error: the pair stays unfinished and the next owner writes its dead
// letter again. When the write timed out or was cancelled with its request
// in flight (dlq.ErrAttemptTimeout, a context error), the broker may have
// stored it, and the dead letter can then appear twice: the line says why.
func (pc *partition) unacknowledged(dl dlq.DeadLetter, err error) {
	pc.w.log.WarnContext(logContext(dl), "dead letter not acknowledged when the partition was released; the next owner writes it again (it may then appear twice)",
		"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
		"projection", dl.Projection, "tenant_schema", dl.TenantSchema, "error", err)
}

// deadLetter writes dl, waiting as long as it takes. An error that is not
// ctx's means the writer could not write the dead letter for now: the
// dead-letter topic keeps refusing it, or it is too large for the topic.
// The record is never skipped: the partition reports not-ready (stuck),
// logs an error with the fix, and the write is tried again. It returns an
// error only when ctx is done first.
func (pc *partition) deadLetter(ctx context.Context, dl dlq.DeadLetter) error {
	b := pc.w.cfg.InfraRetry.NewBackOff()
	// Folded: once a minute while the cause is unchanged (pathological-
	// stream trial: a line every 6 s per stuck partition, without end).
	var line logfold.Line
	for {
		wctx, done := pc.writeContext(ctx)
		err := pc.w.dead.Write(wctx, dl)
		done()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			pc.unacknowledged(dl, err)
			return ctx.Err()
		}
		wait := b.NextBackOff()
		pc.setStuck(err)
		hint := "the dead-letter topic refuses writes: check it exists and accepts this worker's records"
		switch {
		case errors.Is(err, kerr.MessageTooLarge):
			// The broker's refusal: the topic takes less than when the
			// worker read its limit (pathological-stream trial: the
			// hint said only "refuses writes").
			hint = "the dead-letter topic's max.message.bytes is below this dead letter (lowered since the worker started? it reads the limit at start, and then leaves out of a dead letter what does not fit): raise it back, or restart the worker"
		case errors.Is(err, dlq.ErrTooLarge):
			hint = "raise the dead-letter topic's max.message.bytes (or --dlq-max-bytes) and restart the worker: the limit is read at start"
		case errors.Is(err, dlq.ErrInvalidDeadLetter):
			hint = "the worker built a dead letter that is not one (a bug: report this line); the partition waits, so nothing is lost"
		case errors.Is(err, dlq.ErrAttemptTimeout):
			hint = "Kafka does not acknowledge dead letters in time: check the dead-letter topic's partition leaders and brokers (--dlq-write-timeout)"
		}
		if topic, missing := pc.w.deadLetterTopicMissing(ctx); missing {
			// Said, whatever the writer's last error (new-user trial: the
			// topic deleted while the worker ran, the line blamed time).
			hint = "the dead-letter topic " + topic + " does not exist (deleted?): create it (projection-worker topics); the partition waits, so nothing is lost"
		}
		if repeats, due := line.Due(hint+"\x00"+dlq.MaskLiterals(err.Error()), time.Now()); due { // sizes and counts in the text vary
			args := []any{"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
				"projection", dl.Projection, "tenant_schema", dl.TenantSchema, "retry_in", wait, "fix", hint, "error", err}
			if repeats > 0 {
				args = append(args, "repeats", repeats)
			}
			pc.w.log.ErrorContext(logContext(dl), "dead letter not written; the partition waits and tries again", args...)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	pc.setStuck(nil)
	return nil
}

// deadLetterTopicMissing reports whether the dead-letter topic (the
// writer's, when it says: dlq.Writer.Topic) is known to the brokers not to
// exist, asked with a metadata request of at most 5 s; and its name.
func (w *Worker) deadLetterTopicMissing(ctx context.Context) (string, bool) {
	named, ok := w.dead.(interface{ Topic() string })
	if !ok || w.cl == nil {
		return "", false
	}
	topic := named.Topic()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(w.cl).ListTopics(ctx, topic)
	if err != nil {
		return topic, false
	}
	t, ok := topics[topic]
	return topic, !ok || errors.Is(t.Err, kerr.UnknownTopicOrPartition)
}

// deadLetterDone finishes the pair of dl, whose dead letter Kafka
// acknowledged: metrics and log (deadLettered), its span ended with status
// Error, its record's span marked as such.
func (pc *partition) deadLetterDone(ctx context.Context, dl dlq.DeadLetter) {
	pc.w.deadLettered(ctx, dl)
	if rs := pc.stateOf(dl.Source.Offset); rs != nil && dl.Context != nil {
		// Spans are compared by id: a span that is not sampled is a value
		// of an uncomparable type.
		if s := trace.SpanFromContext(dl.Context); s.SpanContext().SpanID() != rs.d.span.SpanContext().SpanID() {
			endDeadLettered(s, dl.Class, dl.Err, dl.Retries, dl.ShortCircuit)
		}
		if rs.deadLettered == "" {
			rs.deadLettered = "dead-lettered: " + dl.Err.Error()
		}
	}
	pc.finish(dl.Source.Offset, dl.Projection)
}

// deadLettered records an acknowledged dead letter in the metrics and log
// (WARN, repeats of one fingerprint aggregated by failureLog; DEBUG for a
// pair short-circuited by an open breaker).
func (w *Worker) deadLettered(ctx context.Context, dl dlq.DeadLetter) {
	label := dl.TenantSchema
	if w.cfg.TenantSchemas.Check(label) != nil {
		// A name the worker refuses as a tenant schema (pg_x, public, one
		// outside --tenant-schema-pattern): kept in the dead letter, not
		// given a label of its own (new-user trial: 130 events for
		// pg_x1...pg_x130 took the 100 labels of real tenants).
		label = ""
	}
	projection := dl.Projection
	if projection != "" && !w.hasHandler(projection) {
		// A replay to a projection this worker does not have names it
		// in a header any producer can write: one label for every such
		// name, as for tenants (operator trial: each made a series).
		projection = OtherProjections
	}
	w.cfg.Metrics.deadLettered(ctx, pairAttrs(projection, label), dl.Class)
	attrs := []any{"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
		"projection", dl.Projection, "tenant_schema", dl.TenantSchema,
		"error_class", dl.Class.String(), "retries", dl.Retries, "short_circuit", dl.ShortCircuit, "error", dl.Err}
	if dl.Context != nil {
		// The pair's span, in the record's own trace, for the log line's
		// trace_id and span_id.
		ctx = trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(dl.Context))
	}
	if dl.ShortCircuit != "" {
		// The breaker's ERROR line when it opened says it for all of them,
		// and its line when it closes counts them.
		w.breaker.shortCircuited(dl.ShortCircuit)
		w.log.DebugContext(ctx, "dead-lettered", attrs...)
		return
	}
	w.failures.write(ctx, slog.LevelWarn, "dead-lettered", dl.Fingerprint(), attrs...)
}

// breakerOpened logs, at ERROR, the breaker that pair p's exhaustion
// opened, with n exhaustions in the window: its fingerprint and what it
// stands for, p's projection, tenant schema, error class, SQLSTATE and
// error (operator trial: the line named only the fingerprint).
func (w *Worker) breakerOpened(p *retryPair, n int) {
	ctx := spanContext(context.Background(), p.span)
	w.log.ErrorContext(ctx, "breaker opened: pairs failing with this fingerprint are dead-lettered at once, one probe retried in full every interval; fix the cause, then dlq-replayer retry --fingerprint",
		"fingerprint", p.fp, "projection", p.h.Name(), "tenant_schema", p.d.ev.TenantSchema, "error_class", retry.Classify(p.err).String(),
		"sqlstate", retry.SQLState(p.err), "error", p.err, "exhausted", n, "window", w.cfg.Breaker.Window, "probe_interval", w.cfg.Breaker.ProbeInterval)
}

// newDeadLetter is the dead letter of a pair of d; span is the pair's span
// (nil without tracing), which its send span continues.
func (w *Worker) newDeadLetter(d *decoded, projection string, class retry.Class, err error, stack callStack, retries int, firstAt time.Time, span trace.Span) dlq.DeadLetter {
	ev := d.ev
	return dlq.DeadLetter{
		Context:       traceContext(span),
		Source:        d.rec,
		Projection:    projection,
		TenantSchema:  ev.TenantSchema,
		ForkID:        ev.ForkID,
		EventType:     ev.EventType,
		Class:         class,
		Err:           err,
		Stack:         stack.String(),
		Retries:       retries,
		FirstFailedAt: firstFailedAt(d.replay, firstAt),
		ReplayCount:   d.replay.count,
		ValueShape:    dlq.ValueStrictObject, // d.ev: DecodeEvent accepted it
	}
}

// firstFailedAt is the first failure of a pair: the original one for a
// replayed event (SPEC §6), else now.
func firstFailedAt(replay replayInfo, now time.Time) time.Time {
	if !replay.firstFailedAt.IsZero() {
		return replay.firstFailedAt
	}
	return now
}

// immediateDeadLetter is the dead letter of a failure that needs no retry:
// a record that reached no projection, or a permanent error of a pair.
func (w *Worker) immediateDeadLetter(f pairFailure) dlq.DeadLetter {
	if f.h != nil {
		return w.newDeadLetter(f.d, f.h.Name(), retry.Permanent, f.err, f.stack, 0, f.firstAt, f.span)
	}
	if f.d.ev == nil {
		dl := dlq.DeadLetter{
			Context: traceContext(f.span),
			Source:  f.d.rec, Class: retry.Permanent, Err: f.err,
			FirstFailedAt: firstFailedAt(f.d.replay, f.firstAt), ReplayCount: f.d.replay.count,
		}
		var ve *ValidationError
		if errors.As(f.err, &ve) {
			dl.TenantSchema, dl.ForkID, dl.EventType = ve.TenantSchema, ve.ForkID, ve.EventType
			dl.ValueShape = dlq.ValueNotStrictObject
			if ve.StrictObject {
				dl.ValueShape = dlq.ValueStrictObject
			}
		}
		return dl
	}
	// A replay to a projection this worker does not have: a projection
	// error, not retried (no retry can add a projection).
	return w.newDeadLetter(f.d, f.d.replay.projection, retry.Projection, f.err, callStack{}, 0, f.firstAt, f.span)
}

// writeContext returns the context of one dead-letter write: ctx, except
// that a revoke or shutdown (ctx done) lets a write in flight go on for up
// to half the shutdown grace. Cut at once, a write whose request was
// already sent may be stored all the same while its pair stays unfinished,
// and the next owner writes the dead letter again; let finish, the pair is
// finished and handed off as such. Call the returned function when the
// write returns.
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
