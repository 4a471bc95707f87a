package projection

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/retry"
)

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
				pc.w.log.Warn("dead-letter write failed, retrying",
					"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
					"projection", dl.Projection, "tenant_schema", dl.TenantSchema, "error", f.errs[i])
			}
			refused = append(refused, dl)
			continue
		}
		pc.w.deadLettered(ctx, dl)
		pc.finish(dl.Source.Offset, dl.Projection)
	}
	pc.advance()
	if len(refused) > 0 && ctx.Err() != nil {
		return ctx.Err() // no new write once revoked: the next owner writes them
	}
	for _, dl := range refused {
		if err := pc.deadLetter(ctx, dl); err != nil {
			return err
		}
		pc.w.deadLettered(ctx, dl)
		pc.finish(dl.Source.Offset, dl.Projection)
		pc.advance()
	}
	return nil
}

// deadLetter writes dl, waiting as long as it takes. An error that is not
// ctx's means the writer could not write the dead letter for now: the
// dead-letter topic keeps refusing it, or it is too large for the topic.
// The record is never skipped: the partition reports not-ready (stuck),
// logs an error with the fix, and the write is tried again. It returns an
// error only when ctx is done first.
func (pc *partition) deadLetter(ctx context.Context, dl dlq.DeadLetter) error {
	b := pc.w.cfg.InfraRetry.NewBackOff()
	for {
		wctx, done := pc.writeContext(ctx)
		err := pc.w.dead.Write(wctx, dl)
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
		pc.w.log.Error("dead letter not written; the partition waits and tries again",
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
	return nil
}

// deadLettered records an acknowledged dead letter in the metrics and log
// (WARN; DEBUG for a pair short-circuited by an open breaker).
func (w *Worker) deadLettered(ctx context.Context, dl dlq.DeadLetter) {
	w.cfg.Metrics.deadLettered(ctx, pairAttrs(dl.Projection, dl.TenantSchema), dl.Class)
	level := slog.LevelWarn
	if dl.ShortCircuit != "" {
		level = slog.LevelDebug // the breaker's ERROR line when it opened says it for all of them
	}
	w.log.Log(ctx, level, "dead-lettered",
		"topic", dl.Source.Topic, "partition", dl.Source.Partition, "offset", dl.Source.Offset,
		"projection", dl.Projection, "tenant_schema", dl.TenantSchema,
		"error_class", dl.Class.String(), "retries", dl.Retries, "short_circuit", dl.ShortCircuit, "error", dl.Err)
}

func (w *Worker) newDeadLetter(d *decoded, projection string, class retry.Class, err error, stack callStack, retries int, firstAt time.Time) dlq.DeadLetter {
	ev := d.ev
	return dlq.DeadLetter{
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
			dl.ValueShape = dlq.ValueNotStrictObject
			if ve.StrictObject {
				dl.ValueShape = dlq.ValueStrictObject
			}
		}
		return dl
	}
	// A replay to a projection this worker does not have: a projection
	// error, not retried (no retry can add a projection).
	return w.newDeadLetter(f.d, f.d.replay.projection, retry.Projection, f.err, callStack{}, 0, f.firstAt)
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
