package projection

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/retry"
)

// Planner is implemented by handlers whose work for an event is one SQL
// statement (such as *TableProjection). When the worker's database can begin
// transactions, their statements are applied in batches: one transaction of
// pipelined statements per batch of records. Plan's errors are failures of
// the pair like Apply's.
type Planner interface {
	Plan(ev *Event) (Statement, error)
}

// Beginner is what batched apply needs of the database besides DB:
// *pgxpool.Pool satisfies it. Without it, every pair is applied on its own.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// decoded is one record of a batch after decoding.
type decoded struct {
	idx    int // index in the batch
	rec    *kgo.Record
	ev     *Event // nil when the value is invalid
	err    error  // decoding error
	replay replayInfo
	span   trace.Span // the record's span (tracing.go), nil without tracing
	taken  time.Time  // when the record was taken, with tracing: its span's start
}

// pairFailure is one (event, projection) pair whose first attempt failed.
type pairFailure struct {
	d       *decoded
	h       Handler // nil: the record reached no projection (immediateDeadLetter)
	err     error
	stack   callStack
	firstAt time.Time
	span    trace.Span // the pair's span; the record's for a record that reached no projection
}

// pair is one (record, projection) pair of a batch.
type pair struct {
	d    *decoded
	h    Handler
	stmt Statement
	span trace.Span // nil without tracing
}

// processBatch applies recs (consecutive records of one partition) to every
// projection that handles them: planned statements in one transaction per
// batch (the fast path: COPY and pipelined statements), the other handlers
// one by one, each pair once. It then settles each failing pair on its own
// (settle) and advances the watermark. It returns a non-nil error only when
// ctx is done first.
func (pc *partition) processBatch(ctx context.Context, recs []*kgo.Record) (err error) {
	w := pc.w
	batch := make([]decoded, len(recs))
	if w.tr != nil {
		defer func() {
			if err != nil { // revoked or stopped mid-batch: the records are left to the next owner
				for i := range batch {
					endRecord(batch[i].span, outcomeReleased, "")
				}
			}
		}()
	}
	var slab jsonstrict.NodeSlab // the records' trees' nodes
	var single []pair
	// Sized as the last batch's, with a quarter more for a batch of other
	// event types.
	planned := make([]pair, 0, len(recs)*max(pc.pairsPerRecord, 16)*5/64+8)
	defer func() {
		if len(recs) > 0 {
			pc.pairsPerRecord = len(planned) * 16 / len(recs)
		}
	}()
	var failures []pairFailure
	for i, rec := range recs {
		// Each record is planned right after it is decoded, while its
		// value and tree are still in the processor's cache.
		d := &batch[i]
		d.idx = i
		d.rec = rec
		d.replay = readReplayInfo(rec)
		d.ev, d.err = w.cfg.TenantSchemas.decodeRecord(rec.Value, &slab, &pc.kept)
		d.span = w.tr.startRecord(d, pc.spanAttrs)
		only, skip := pc.handedOff(d)
		if skip {
			endRecord(d.span, outcomeHandedOff, "")
			continue // finished by the previous owner
		}
		if d.err != nil {
			// No projection saw it: dead-lettered with the batch's failures,
			// after the rest of the batch is applied.
			failedAttempt(d.span, d.err)
			failures = append(failures, pairFailure{d: d, err: d.err, firstAt: time.Now(), span: d.span})
			continue
		}
		matched := 0
		for _, h := range w.handlers {
			if d.replay.projection != "" && h.Name() != d.replay.projection || !h.Handles(d.ev.EventType) {
				continue
			}
			matched++
			if only != nil && !only[h.Name()] {
				continue // applied or dead-lettered by the previous owner
			}
			span := w.tr.planSpan(d, h.Name())
			p, ok := h.(Planner)
			if !ok || w.begin == nil {
				single = append(single, pair{d: d, h: h, span: span})
				continue
			}
			if d.ev.seqArg == nil {
				d.ev.prepareArgs() // before its first Plan; shared with no other goroutine yet
			}
			st, err := plan(p, h.Name(), d.ev)
			if err != nil {
				w.cfg.Metrics.failed(ctx, pairAttrs(h.Name(), d.ev.TenantSchema), retry.Classify(err))
				span = w.tr.pairFailed(span, d, h.Name(), err)
				failures = append(failures, pairFailure{d: d, h: h, err: err, stack: stackOf(err), firstAt: time.Now(), span: span})
				continue
			}
			planned = append(planned, pair{d: d, h: h, stmt: st, span: span})
		}
		if d.replay.projection == "" && matched == 0 {
			// Not for this worker's projections (another consumer's, or a
			// misspelt type): nothing to write; counted, and at DEBUG.
			w.cfg.Metrics.unhandled(ctx)
			w.noteUnhandled(d)
		}
		if d.replay.projection != "" && matched == 0 {
			err := fmt.Errorf("replayed to projection %q, which this worker does not have or which does not handle event type %q", d.replay.projection, d.ev.EventType)
			failedAttempt(d.span, err)
			failures = append(failures, pairFailure{d: d, firstAt: time.Now(), err: err, span: d.span})
		}
	}

	rest := planned
	var ride *retryRound // the due retries that rode the batch (applySuspects)
	defer func() {
		if err != nil && ride != nil { // ctx is done: back to the set, for release
			_ = pc.finishRetries(ctx, ride)
		}
	}()
	if w.cfg.CopyMinRows > 0 {
		var groups []*copyGroup
		var suspects []pair
		groups, rest, suspects = pc.formCopyGroups(ctx, planned)
		var refused []pairFailure
		var err error
		if rest, suspects, refused, err = pc.applyCopyGroups(ctx, groups, rest, suspects, planned); err != nil {
			return err
		}
		failures = append(failures, refused...)
		pc.noteWrites(groups, suspects)
		var left []pair
		left, refused, ride = pc.applySuspects(ctx, suspects)
		rest = append(rest, left...)
		failures = append(failures, refused...)
	} else {
		pc.noteWrites(nil, nil) // nothing rides without COPY groups
	}
	f, err := pc.applyPlanned(ctx, rest)
	if err != nil {
		return err
	}
	failures = append(failures, f...)
	for _, p := range single {
		out, err := pc.attempt(spanContext(ctx, p.span), p.h, p.d.ev)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			span := w.tr.pairFailed(p.span, p.d, p.h.Name(), err)
			failures = append(failures, pairFailure{d: p.d, h: p.h, err: err, stack: stackOf(err), firstAt: time.Now(), span: span})
			continue
		}
		endPair(p.span, spanOutcome(out), 0)
	}
	// After every commit of the batch, before any of its offsets
	// advances (sweep.go).
	if err := pc.sweepApplied(ctx, sweptOf(planned, failures)); err != nil {
		return err
	}
	if err := pc.settle(ctx, batch, failures); err != nil {
		return err
	}
	r := ride
	ride = nil
	return pc.finishRetries(ctx, r)
}

// applyCopyGroups applies groups with COPY in one transaction (execCopy)
// and returns the pairs left for statements: rest, plus the pairs of the
// ranges that isolating a failed group left to statements; suspects, plus
// the upserts that a group's check took out (copyGroup.checkedOut); and
// the pairs whose rows PostgreSQL refused, as failures. An error that is
// not one group's (begin, commit) or an infrastructure error sends every
// planned pair to statements (nothing was committed; suspects are among
// them), which wait for the database or find the failing pairs. It
// returns a non-nil error only when ctx is done.
func (pc *partition) applyCopyGroups(ctx context.Context, groups []*copyGroup, rest, suspects, planned []pair) ([]pair, []pair, []pairFailure, error) {
	if len(groups) == 0 {
		return rest, suspects, nil, nil
	}
	left, failures, err := pc.execCopy(ctx, groups)
	switch {
	case err == nil:
		for _, g := range groups {
			suspects = append(suspects, g.checkedOut...)
		}
		return append(rest, left...), suspects, failures, nil
	case ctx.Err() != nil:
		return nil, nil, nil, ctx.Err()
	}
	pc.w.log.Debug("copy failed; applying the batch as statements", "partition", pc.partition, "error", err)
	return planned, nil, nil, nil
}

// maxUnhandledTypes bounds the event types noteUnhandled logs at INFO.
const maxUnhandledTypes = 100

// noteUnhandled logs the valid record d that no projection handles: at
// INFO for the first record of each event type (at most
// maxUnhandledTypes types, then a line saying the rest go to DEBUG), at
// DEBUG after that. A type misspelt in the definitions' events shows so
// without --log-level debug (new-user trial: real events went unapplied
// with nothing said).
func (w *Worker) noteUnhandled(d *decoded) {
	// Cut like other wire values a line repeats: a type of 100 000
	// characters made a 100 KB INFO line, and each of the 100 types kept
	// would hold its whole text (new-user trial).
	t := shortenValue(d.ev.EventType)
	if d.span != nil && d.span.IsRecording() {
		d.span.SetAttributes(AttrOutcome.String(outcomeUnhandled)) // in place of startRecord's applied
	}
	ctx := spanContext(context.Background(), d.span) // the log lines' trace_id and span_id
	w.unhandledMu.Lock()
	if w.unhandledTypes == nil {
		w.unhandledTypes = map[string]bool{}
	}
	seen, full := w.unhandledTypes[t], len(w.unhandledTypes) >= maxUnhandledTypes
	switch {
	case !seen && !full:
		w.unhandledTypes[t] = true
	case !seen && !w.unhandledTypes[""]:
		w.unhandledTypes[""] = true // said once
		w.log.Info("more event types that no projection handles: logged at debug only", "types_logged", maxUnhandledTypes)
	}
	w.unhandledMu.Unlock()
	if !seen && !full {
		w.log.InfoContext(ctx, "no projection handles the event type: its records are committed without a write (first of this type; the rest at debug)",
			"event_type", t, "topic", d.rec.Topic, "partition", d.rec.Partition, "offset", d.rec.Offset)
		return
	}
	w.log.DebugContext(ctx, "no projection handles the event type", "topic", d.rec.Topic, "partition", d.rec.Partition,
		"offset", d.rec.Offset, "event_type", t)
}

// rowError reports whether err is PostgreSQL refusing a row rather than
// the statement (so that splitting a COPY group isolates it): SQLSTATE
// classes 21 (cardinality: two rows of one key), 22 (data exception) and
// 23 (integrity constraint), P0001 (raised by a trigger) and 54000 (a
// value over PostgreSQL's limits: a key too long for its index).
func rowError(err error) bool {
	switch code := retry.SQLState(err); {
	case len(code) != 5:
		return false
	case code[:2] == "21", code[:2] == "22", code[:2] == "23", code == "P0001", code == "54000":
		return true
	}
	return false
}

// plan calls p.Plan, turning a panic into a *PanicError (a projection
// error, like a panic in Apply).
func plan(p Planner, projection string, ev *Event) (st Statement, err error) {
	defer func() {
		if r := recover(); r != nil {
			st, err = Statement{}, &PanicError{Projection: projection, Value: r, Stack: formatFrames(callers(2))}
		}
	}()
	return p.Plan(ev)
}

// projectionName is the projection of a failed pair as its dead letter
// names it: "" for a record that reached no projection, the projection a
// replay named when this worker does not have it.
func (f pairFailure) projectionName() string {
	switch {
	case f.h != nil:
		return f.h.Name()
	case f.d.ev == nil:
		return ""
	default:
		return f.d.replay.projection
	}
}

// applyPlanned applies the planned pairs in transactions of pipelined
// statements, in lock order (sortForLocks). When a statement fails, the statements before it are applied
// again in a transaction of their own, the failing pair is returned as a
// failure, and the statements after it continue as the next batch: every
// good statement runs at most twice and commits once. When the COMMIT is
// refused (a deferred constraint or trigger), each pair is applied again in
// a transaction of its own (applyTogether), so that only the pair whose row
// it refuses fails. Infrastructure errors
// wait for the database (InfraPause) or send the batch's pairs one by one
// to the retry path (InfraDeadLetter).
func (pc *partition) applyPlanned(ctx context.Context, planned []pair) ([]pairFailure, error) {
	w := pc.w
	var failures []pairFailure
	todo := [][]pair{sortForLocks(planned)} // a stack of segments, next on top
	for len(todo) > 0 {
		seg := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if len(seg) == 0 {
			continue
		}
		var failedAt int
		exec := func(ctx context.Context) error {
			var err error
			failedAt, err = w.execBatch(ctx, seg)
			return err
		}
		var err error
		if w.cfg.OnInfraError == InfraPause {
			err = pc.untilAvailable(ctx, exec)
		} else {
			err = exec(ctx)
		}
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case failedAt < 0 && !retry.IsInfrastructure(err) && w.acquire != nil:
			// The COMMIT (or BEGIN) was refused, not by one statement: a
			// deferred constraint or trigger refused some pair's row, which
			// one is unknown. Each pair again in a transaction of its own,
			// in one round trip, where only that pair's COMMIT fails.
			left, refused := pc.applyTogether(ctx, seg)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			failures = append(failures, refused...)
			for _, p := range left {
				failures = append(failures, w.batchFailure(ctx, p, err))
			}
			continue
		case failedAt < 0 || retry.IsInfrastructure(err):
			// Not one statement's fault (the database went away under
			// InfraDeadLetter, or no round trip apart): each pair takes the
			// retry path.
			for _, p := range seg {
				failures = append(failures, w.batchFailure(ctx, p, err))
			}
			continue
		}
		var pre pgx.ErrPreprocessingBatch
		if errors.As(err, &pre) {
			// A statement failed to prepare (e.g. 42703 undefined column): it
			// is not the statement at failedAt but every pair with that SQL.
			var rest []pair
			for _, p := range seg {
				if p.stmt.SQL == pre.SQL() {
					failures = append(failures, w.batchFailure(ctx, p, pre.Unwrap()))
				} else {
					rest = append(rest, p)
				}
			}
			if len(rest) < len(seg) {
				todo = append(todo, rest)
				continue
			}
		}
		failures = append(failures, w.batchFailure(ctx, seg[failedAt], err))
		todo = append(todo, seg[failedAt+1:], seg[:failedAt])
	}
	return failures, nil
}

// applySuspects applies the upserts the table is expected to refuse
// (copyGroupsChecked's suspects) in one round trip, each in a transaction
// of its own (execTogether): a refused one costs neither a round trip of
// its own nor the statements after it. The due retries of the tables the
// batch writes (noteWrites) ride along (rideRetries): the returned round,
// nil when none, is answered and is settled with finishRetries. It returns the pairs left
// for the statement path (no answer, or an infrastructure error: that path
// waits for the database) and the refused ones as failures.
func (pc *partition) applySuspects(ctx context.Context, suspects []pair) ([]pair, []pairFailure, *retryRound) {
	if pc.w.acquire == nil || len(suspects) == 0 {
		return suspects, nil, nil
	}
	ride := pc.rideRetries()
	var at plannedAttempts
	all := suspects
	if ride != nil {
		at = pc.planAttempts(ctx, ride.attempting, ride.res)
		all = append(suspects[:len(suspects):len(suspects)], at.planned...)
	}
	answers := pc.w.execTogether(ctx, "apply statements", all, len(suspects))
	if ride != nil {
		rode := answers[len(suspects):]
		for k, r := range rode {
			if r.made && retry.SQLState(r.err) == lockNotAvailable {
				rode[k] = attemptResult{aside: true}
			}
		}
		at.answered(ctx, rode)
		at.sweep(ctx, pc)
		ride.answered()
	}
	left, failures := pc.settleTogether(ctx, suspects, answers[:len(suspects)])
	pc.w.log.Debug("suspect upserts applied in one round trip", "partition", pc.partition,
		"upserts", len(suspects), "refused", len(failures), "left", len(left), "retries", len(at.planned))
	return left, failures, ride
}

// applyTogether applies pairs in one round trip, each in a transaction of
// its own (execTogether), and returns the pairs without an answer (the
// caller's path decides) and those PostgreSQL refused, as failures.
func (pc *partition) applyTogether(ctx context.Context, pairs []pair) ([]pair, []pairFailure) {
	return pc.settleTogether(ctx, pairs, pc.w.execTogether(ctx, "apply statements", pairs, len(pairs)))
}

// settleTogether reads execTogether's answers to pairs (same indexes): it
// returns the pairs without an answer and those refused, as failures, and
// ends the spans of the applied ones.
func (pc *partition) settleTogether(ctx context.Context, pairs []pair, answers []attemptResult) ([]pair, []pairFailure) {
	var left []pair
	var failures []pairFailure
	for i, r := range answers {
		p := pairs[i]
		switch {
		case !r.made:
			left = append(left, p)
		case r.err != nil:
			failures = append(failures, pc.w.batchFailure(ctx, p, r.err))
		default:
			endPair(p.span, spanOutcome(r.out), 0)
		}
	}
	return left, failures
}

// batchFailure records the failure of pair p in a batch; a PostgreSQL
// error about one column of a table projection's row names it
// (*ColumnError).
func (w *Worker) batchFailure(ctx context.Context, p pair, err error) pairFailure {
	err = w.statementError(ctx, p.h, p.d.ev, p.stmt.Args, err)
	w.cfg.Metrics.failed(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema), retry.Classify(err))
	span := w.tr.pairFailed(p.span, p.d, p.h.Name(), err)
	return pairFailure{d: p.d, h: p.h, firstAt: time.Now(), stack: callStack{pcs: callers(2)}, err: err, span: span}
}

// execBatch applies seg in one transaction. It returns the index of the
// statement that failed with the error, or −1 with an error that is not one
// statement's (begin, commit, connection), or −1 and nil on success.
func (w *Worker) execBatch(ctx context.Context, seg []pair) (failed int, err error) {
	start := time.Now()
	ctx, done := w.batchTx(ctx, start, "apply batch", len(seg), slices.Values(seg))
	began := false
	defer func() { done(err, len(seg), began) }()
	tx, err := w.begin.Begin(ctx)
	if err != nil {
		return -1, err
	}
	began = true
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	b := &pgx.Batch{}
	for _, p := range seg {
		b.Queue(p.stmt.SQL, p.stmt.Args...)
	}
	br := tx.SendBatch(ctx, b)
	outcomes := make([]Outcome, len(seg))
	for i, p := range seg {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return i, err
		}
		outcomes[i] = p.stmt.Outcome(tag)
	}
	if err := br.Close(); err != nil {
		return -1, err
	}
	if err := tx.Commit(ctx); err != nil {
		return -1, err
	}
	took := time.Since(start)
	w.cfg.Metrics.observeBatch(ctx, len(seg), took, true)
	for i, p := range seg {
		attrs := pairAttrs(p.h.Name(), p.d.ev.TenantSchema)
		w.cfg.Metrics.applied(ctx, attrs, outcomes[i])
		w.cfg.Metrics.observeApply(ctx, attrs, took) // a pair of a batch takes the batch's transaction
		endPair(p.span, spanOutcome(outcomes[i]), 0)
	}
	return -1, nil
}

// batchTx starts the span of a batch transaction of n pairs begun at
// start (tracing.go's startBatch); the returned func ends it with the
// transaction's error and, for a committed one, the pairs it applied (of
// the n: a COPY transaction leaves refused rows and upserts for
// statements), and records a rolled-back transaction in the batch metrics
// when it began (a committed one is recorded with its outcomes by the
// caller; an attempt whose BEGIN failed, the database down, is no
// transaction: metrics trial, 67 rolled back in an outage where none
// began).
func (w *Worker) batchTx(ctx context.Context, start time.Time, name string, n int, pairs iter.Seq[pair]) (context.Context, func(err error, applied int, began bool)) {
	ctx, span := w.tr.startBatch(ctx, name, n, pairs)
	return ctx, func(err error, applied int, began bool) {
		if err == nil {
			batchApplied(span, n, applied)
		}
		endBatch(span, err)
		if err != nil && began {
			w.cfg.Metrics.observeBatch(ctx, n, time.Since(start), false)
		}
	}
}

// spanOutcome is out as a span's causet.outcome.
func spanOutcome(out Outcome) string {
	if out == Stale {
		return outcomeStale
	}
	return outcomeApplied
}

// detach returns a copy of d that shares no memory with its batch nor with
// the fetch its record came from: a record waiting for a retry otherwise
// keeps its whole batch of decoded events and fetched bytes alive.
func detach(d *decoded) *decoded {
	c := *d
	r := *d.rec
	r.Key, r.Value = bytes.Clone(d.rec.Key), bytes.Clone(d.rec.Value)
	r.Headers = make([]kgo.RecordHeader, len(d.rec.Headers))
	for i, h := range d.rec.Headers {
		r.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	c.rec = &r
	if d.ev != nil {
		c.ev = d.ev.detachedTo(r.Value)
	}
	return &c
}
