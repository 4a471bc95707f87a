package projection

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

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
	// Stack is the stack of the panicking goroutine, one frame per two
	// lines ("pkg.Func\n\tfile.go:42"), the Go runtime's and the backoff
	// library's frames left out, at most 24 frames.
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
				out, err = Applied, &PanicError{Projection: h.Name(), Value: r, Stack: formatFrames(callers(2))}
			}
		}()
		return next(ctx, h, ev)
	}
}

// callStack is the Go stack a failure's dead letter carries: the program
// counters, captured cheaply (runtime.Callers) when the failure is seen,
// and formatted only when a dead letter is built; or, for a panic, the
// panicking goroutine's stack already formatted.
type callStack struct {
	pcs  []uintptr
	text string
}

// maxStackFrames bounds the frames a dead letter's stack keeps.
const maxStackFrames = 24

// stackOf returns the stack a failure's dead letter carries: the stack of
// the panic for a *PanicError, else the stack of the goroutine that saw
// the error (its caller's frames).
func stackOf(err error) callStack {
	var pe *PanicError
	if errors.As(err, &pe) {
		return callStack{text: pe.Stack}
	}
	return callStack{pcs: callers(3)}
}

// callers returns the program counters of the calling goroutine's stack,
// skip frames up (runtime.Callers' rule), at most 2×maxStackFrames.
func callers(skip int) []uintptr {
	pcs := make([]uintptr, 2*maxStackFrames)
	return pcs[:runtime.Callers(skip, pcs)]
}

// String formats s one frame per two lines, as runtime/debug.Stack does
// ("pkg.Func\n\tfile.go:42"), keeping only the frames that explain a
// failure: the Go runtime's and the retry library's frames are left out,
// and at most maxStackFrames are kept ("... more frames left out").
func (s callStack) String() string {
	if s.pcs == nil {
		return s.text
	}
	return formatFrames(s.pcs)
}

// stackTexts caches formatFrames's text by program counters: the dead
// letters of one code path (every row a table refuses) carry one stack,
// which costs about 4.4 µs and 5 KB to format (BenchmarkFormatFrames). The
// same program counters always give the same text. At most maxStackTexts
// entries; a full cache is emptied.
var stackTexts struct {
	sync.Mutex
	m map[string]string
}

// maxStackTexts bounds stackTexts: far more code paths than fail at once.
const maxStackTexts = 256

func formatFrames(pcs []uintptr) string {
	if len(pcs) == 0 {
		return ""
	}
	// The program counters' bytes, as a key that is not kept.
	key := unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(pcs))), len(pcs)*int(unsafe.Sizeof(pcs[0])))
	stackTexts.Lock()
	text, ok := stackTexts.m[key]
	stackTexts.Unlock()
	if ok {
		return text
	}
	text = formatFramesUncached(pcs)
	stackTexts.Lock()
	if stackTexts.m == nil || len(stackTexts.m) >= maxStackTexts {
		stackTexts.m = make(map[string]string, maxStackTexts)
	}
	stackTexts.m[strings.Clone(key)] = text
	stackTexts.Unlock()
	return text
}

func formatFramesUncached(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	kept := 0
	for {
		f, more := frames.Next()
		if f.Function != "" && !noiseFrame(f.Function) {
			if kept == maxStackFrames {
				b.WriteString("... more frames left out\n")
				break
			}
			fmt.Fprintf(&b, "%s\n\t%s:%d\n", f.Function, f.File, f.Line)
			kept++
		}
		if !more {
			break
		}
	}
	return b.String()
}

// noiseFrame reports whether a frame of function fn says nothing about a
// failure: the Go runtime's and the backoff library's.
func noiseFrame(fn string) bool {
	return strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "github.com/cenkalti/backoff/")
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
