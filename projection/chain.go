package projection

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/causet/projection-worker/retry"
)

// applyFunc makes one attempt to apply ev to projection h. The innermost
// one calls the handler; the steps around it are middleware, in the manner
// of Watermill's router middleware: each wraps the next and is tested on
// its own, without Kafka.
type applyFunc func(ctx context.Context, h Handler, ev *Event) (Outcome, error)

// middleware wraps an applyFunc.
type middleware func(applyFunc) applyFunc

// chain returns apply wrapped in mws, the first outermost.
func chain(apply applyFunc, mws ...middleware) applyFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		apply = mws[i](apply)
	}
	return apply
}

// applyHandler is the innermost step: the handler's own Apply, its error
// wrapped with the event type and projection.
func applyHandler(db DB) applyFunc {
	return func(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
		out, err := h.Apply(ctx, db, ev)
		if err != nil {
			return out, fmt.Errorf("apply %s to %s: %w", ev.EventType, h.Name(), err)
		}
		return out, nil
	}
}

// attemptChain is one pair's attempt as the worker makes it: panics
// recovered, outcomes measured, and, under InfraPause, the database waited
// for.
func (pc *partition) attemptChain() applyFunc {
	mws := []middleware{recoverPanics, pc.w.cfg.Metrics.observeAttempt}
	if pc.w.cfg.OnInfraError == InfraPause {
		mws = append(mws, pc.waitForDatabase)
	}
	return chain(applyHandler(pc.w.db), mws...)
}

// PanicError is the error a handler's panic (in Apply or Plan) becomes. It
// is a projection error: retried, then dead-lettered with the stack of the
// panic.
type PanicError struct {
	Projection string
	Value      any
	// Stack is the Go stack of the panicking goroutine.
	Stack string
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("projection %s panicked: %v", e.Projection, e.Value)
}

// recoverPanics turns a panic of the next step into a *PanicError.
func recoverPanics(next applyFunc) applyFunc {
	return func(ctx context.Context, h Handler, ev *Event) (out Outcome, err error) {
		defer func() {
			if r := recover(); r != nil {
				out, err = Applied, &PanicError{Projection: h.Name(), Value: r, Stack: string(debug.Stack())}
			}
		}()
		return next(ctx, h, ev)
	}
}

// stackOf returns the Go stack a failure's dead letter carries: the stack
// of the panic for a *PanicError, else the stack of the goroutine that saw
// the error.
func stackOf(err error) string {
	var pe *PanicError
	if errors.As(err, &pe) {
		return pe.Stack
	}
	return string(debug.Stack())
}

// observeAttempt records an attempt's latency and outcome.
func (m *Metrics) observeAttempt(next applyFunc) applyFunc {
	return func(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
		attrs := pairAttrs(h.Name(), ev.TenantSchema)
		start := time.Now()
		out, err := next(ctx, h, ev)
		m.observeApply(ctx, attrs, time.Since(start))
		switch {
		case err == nil:
			m.applied(ctx, attrs, out)
		case ctx.Err() == nil:
			m.failed(ctx, attrs, retry.Classify(err))
		}
		return out, err
	}
}
