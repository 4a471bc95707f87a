package projection

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/dlq"
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
}

// pair is one (record, projection) pair of a batch.
type pair struct {
	d    *decoded
	h    Handler
	stmt Statement
}

// processBatch applies recs (consecutive records of one partition) to every
// projection that handles them: planned statements in one transaction per
// batch, the other handlers one by one. Failing pairs are isolated, retried
// and dead-lettered on their own; the rest are applied once. It returns a
// non-nil error only when ctx is done before every pair was applied or
// dead-lettered; then no record of the batch may be marked for commit.
func (w *Worker) processBatch(ctx context.Context, pc *partition, recs []*kgo.Record) error {
	batch := make([]decoded, len(recs))
	for i, rec := range recs {
		d := &batch[i]
		d.idx = i
		d.rec = rec
		d.replay = readReplayInfo(rec)
		d.ev, d.err = w.cfg.TenantSchemas.DecodeEvent(rec.Value)
		if w.cfg.Tracer != nil {
			_, span := w.cfg.Tracer.WithProcessSpan(rec)
			defer span.End()
			if i == 0 {
				ctx = trace.ContextWithSpan(ctx, span)
			}
		}
	}

	var planned, single []pair
	var failures []pairFailure
	for i := range batch {
		d := &batch[i]
		if d.err != nil {
			// No projection saw it: dead-lettered in record order below,
			// after the rest of the batch is applied.
			failures = append(failures, pairFailure{d: d, err: d.err, firstAt: time.Now()})
			continue
		}
		matched := 0
		for _, h := range w.handlers {
			if d.replay.projection != "" && h.Name() != d.replay.projection || !h.Handles(d.ev.EventType) {
				continue
			}
			matched++
			p, ok := h.(Planner)
			if !ok || w.begin == nil {
				single = append(single, pair{d: d, h: h})
				continue
			}
			st, stack, err := plan(p, h.Name(), d.ev)
			if err != nil {
				w.cfg.Metrics.failed(ctx, pairAttrs(h.Name(), d.ev.TenantSchema), retry.Classify(err))
				failures = append(failures, pairFailure{d: d, h: h, err: err, stack: stack, firstAt: time.Now()})
				continue
			}
			planned = append(planned, pair{d: d, h: h, stmt: st})
		}
		if d.replay.projection != "" && matched == 0 {
			failures = append(failures, pairFailure{d: d, firstAt: time.Now(),
				err: fmt.Errorf("replayed to projection %q, which this worker does not have or which does not handle event type %q", d.replay.projection, d.ev.EventType)})
		}
	}

	rest := planned
	if w.cfg.CopyMinRows > 0 {
		var groups []*copyGroup
		if groups, rest = copyGroups(planned, w.cfg.CopyMinRows); len(groups) > 0 {
			if err := w.execCopy(ctx, groups); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// The statements find the failing pairs (or wait for the
				// database) and apply the rest.
				w.log.Debug("copy failed; applying the batch as statements", "partition", pc.partition, "error", err)
				rest = planned
			}
		}
	}
	f, err := w.applyPlanned(ctx, pc, rest)
	if err != nil {
		return err
	}
	failures = append(failures, f...)
	for _, p := range single {
		if stack, err := w.attempt(ctx, pc, p.h, p.d.ev); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures = append(failures, pairFailure{d: p.d, h: p.h, err: err, stack: stack, firstAt: time.Now()})
		}
	}
	return w.finishFailures(ctx, pc, recs, failures)
}

// plan calls p.Plan, turning a panic into a *PanicError (a projection
// error, like a panic in Apply). It returns the Go stack where Plan failed
// or panicked with the error.
func plan(p Planner, projection string, ev *Event) (st Statement, stack string, err error) {
	defer func() {
		if r := recover(); r != nil {
			st, stack, err = Statement{}, string(debug.Stack()), &PanicError{Projection: projection, Value: r}
		}
	}()
	st, err = p.Plan(ev)
	if err != nil {
		stack = string(debug.Stack())
	}
	return st, stack, err
}

// finishFailures retries and dead-letters the failed pairs of a batch, in
// record order, so that a revoke or shutdown at any point leaves nothing
// dead-lettered twice and commits what is finished:
//
//   - the dead letters of failures that need no retry (invalid records,
//     permanent errors) are written together, in one round trip, but only
//     up to the next record that has a pair to retry: a record after it may
//     be processed again by the next owner, and must not have a dead letter
//     already;
//   - before a record's pairs are retried, the records before it are
//     marked for commit;
//   - a record's dead letters, retried or not, are written only once all of
//     its failing pairs are resolved, so a record interrupted half way has
//     none;
//   - before waiting on a dead letter the topic refuses, the records before
//     it are marked for commit (deadLetterAll).
//
// It returns a non-nil error only when ctx is done first.
func (w *Worker) finishFailures(ctx context.Context, pc *partition, recs []*kgo.Record, failures []pairFailure) error {
	slices.SortStableFunc(failures, func(a, b pairFailure) int { return a.d.idx - b.d.idx })
	var pending []indexedDeadLetter
	for len(failures) > 0 {
		n := 1
		for n < len(failures) && failures[n].d.idx == failures[0].d.idx {
			n++
		}
		group := failures[:n]
		failures = failures[n:]
		idx := group[0].d.idx
		for i, f := range group {
			if t, ok := pc.receivedFirstFailedAt(f.d.rec.Offset, f.projectionName()); ok {
				group[i].firstAt = t
			}
		}
		if !slices.ContainsFunc(group, needsRetry) {
			for _, f := range group {
				pending = append(pending, indexedDeadLetter{idx, w.immediateDeadLetter(f)})
			}
			continue
		}
		if err := w.deadLetterAll(ctx, pc, recs, pending); err != nil {
			return err
		}
		pending = nil
		if idx > 0 {
			w.cl.MarkCommitRecords(recs[idx-1])
		}
		firstAt := make(map[string]time.Time, len(group))
		for _, f := range group {
			firstAt[f.projectionName()] = f.firstAt
		}
		pc.retrying(recs[idx], firstAt)
		for _, f := range group {
			if !needsRetry(f) {
				pending = append(pending, indexedDeadLetter{idx, w.immediateDeadLetter(f)})
				continue
			}
			dl, err := w.retryPair(ctx, pc, f)
			if err != nil {
				return err
			}
			if dl != nil {
				pending = append(pending, indexedDeadLetter{idx, *dl})
			}
		}
		pc.retrying(nil, nil)
	}
	return w.deadLetterAll(ctx, pc, recs, pending)
}

// projectionName is the name of the projection the pair failed in: "" for
// a record that reached none.
func (f pairFailure) projectionName() string {
	if f.h == nil {
		return f.d.replay.projection
	}
	return f.h.Name()
}

// needsRetry reports whether a failed pair is retried before it may be
// dead-lettered: it reached a projection and its error is not permanent.
func needsRetry(f pairFailure) bool { return f.h != nil && !retry.IsPermanent(f.err) }

// indexedDeadLetter is a dead letter with the index, in its batch, of the
// record it is for.
type indexedDeadLetter struct {
	idx int
	dl  dlq.DeadLetter
}

// batchWriter is implemented by dead-letter writers that can write several
// dead letters in one round trip (*dlq.Writer).
type batchWriter interface {
	WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error
}

// deadLetterAll writes dls (in record order): in one round trip when the
// writer supports it, then one by one, with the stuck handling of
// deadLetter, those that were not written. Before writing one by one, it
// marks the record before that dead letter's record for commit: every
// earlier record is finished, and the partition commits them even while the
// dead-letter topic keeps refusing this one.
func (w *Worker) deadLetterAll(ctx context.Context, pc *partition, recs []*kgo.Record, dls []indexedDeadLetter) error {
	var errs []error
	if bw, ok := w.dead.(batchWriter); ok && len(dls) > 1 {
		plain := make([]dlq.DeadLetter, len(dls))
		for i, x := range dls {
			plain[i] = x.dl
		}
		wctx, done := pc.writeContext(ctx)
		errs = bw.WriteBatch(wctx, plain)
		done()
	}
	for i, x := range dls {
		if errs != nil && errs[i] == nil {
			w.deadLettered(ctx, x.dl)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errs != nil {
			w.log.Warn("dead-letter write failed, retrying",
				"topic", x.dl.Source.Topic, "partition", x.dl.Source.Partition, "offset", x.dl.Source.Offset,
				"projection", x.dl.Projection, "tenant_schema", x.dl.TenantSchema, "error", errs[i])
		}
		if x.idx > 0 {
			w.cl.MarkCommitRecords(recs[x.idx-1])
		}
		if err := w.deadLetter(ctx, pc, x.dl); err != nil {
			return err
		}
	}
	return nil
}

// immediateDeadLetter is the dead letter of a failure that needs no retry:
// a record that reached no projection, or a permanent error of a pair.
func (w *Worker) immediateDeadLetter(f pairFailure) dlq.DeadLetter {
	if f.h != nil {
		return w.newDeadLetter(f.d, f.h.Name(), retry.Permanent, f.err, f.stack, 0, f.firstAt)
	}
	if f.d.ev == nil {
		dl := dlq.DeadLetter{
			Source: f.d.rec, Class: retry.Permanent, Err: f.err,
			FirstFailedAt: firstFailedAt(f.d.replay, f.firstAt), ReplayCount: f.d.replay.count,
		}
		var ve *ValidationError
		if errors.As(f.err, &ve) {
			dl.TenantSchema, dl.ForkID, dl.EventType = ve.TenantSchema, ve.ForkID, ve.EventType
		}
		return dl
	}
	// A replay to a projection this worker does not have: a projection
	// error, not retried (no retry can add a projection).
	return w.newDeadLetter(f.d, f.d.replay.projection, retry.Projection, f.err, "", 0, f.firstAt)
}

// applyPlanned applies the planned pairs in transactions of pipelined
// statements. When a statement fails, the statements before it are applied
// again in a transaction of their own, the failing pair is returned as a
// failure, and the statements after it continue as the next batch: every
// good statement runs at most twice and commits once. Infrastructure errors
// wait for the database (InfraPause) or send the batch's pairs one by one
// to the retry path (InfraDeadLetter).
func (w *Worker) applyPlanned(ctx context.Context, pc *partition, planned []pair) ([]pairFailure, error) {
	var failures []pairFailure
	todo := [][]pair{planned} // a stack of segments, next on top
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
			err = w.cfg.InfraRetry.UntilAvailable(ctx, exec, func(err error, n int, wait time.Duration) {
				pc.setDBWait(true)
				w.log.Warn("database unavailable, waiting", "partition", pc.partition, "attempt", n, "wait", wait, "error", err)
			})
			pc.setDBWait(false)
		} else {
			err = exec(ctx)
		}
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case failedAt < 0 || retry.IsInfrastructure(err):
			// Not one statement's fault (commit failed, or the database went
			// away under InfraDeadLetter): each pair takes the retry path.
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

// batchFailure records the failure of pair p in a batch.
func (w *Worker) batchFailure(ctx context.Context, p pair, err error) pairFailure {
	class := retry.Classify(err)
	w.cfg.Metrics.failed(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema), class)
	return pairFailure{
		d: p.d, h: p.h, firstAt: time.Now(), stack: string(debug.Stack()),
		err: fmt.Errorf("apply %s to %s: %w", p.d.ev.EventType, p.h.Name(), err),
	}
}

// execBatch applies seg in one transaction. It returns the index of the
// statement that failed with the error, or −1 with an error that is not one
// statement's (begin, commit, connection), or −1 and nil on success.
func (w *Worker) execBatch(ctx context.Context, seg []pair) (int, error) {
	start := time.Now()
	tx, err := w.begin.Begin(ctx)
	if err != nil {
		return -1, err
	}
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
	w.cfg.Metrics.observeBatch(ctx, len(seg), time.Since(start))
	for i, p := range seg {
		w.cfg.Metrics.applied(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema), outcomes[i])
	}
	return -1, nil
}
