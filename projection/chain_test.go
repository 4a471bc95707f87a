package projection

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cenkalti/backoff/v4"
)

// stubHandler is a Handler whose Apply runs fn.
type stubHandler struct {
	fn func() (Outcome, error)
}

func (stubHandler) Name() string        { return "stub" }
func (stubHandler) Handles(string) bool { return true }
func (h stubHandler) Apply(context.Context, DB, *Event) (Outcome, error) {
	return h.fn()
}

func TestChainOrderFirstIsOutermost(t *testing.T) {
	var order []string
	mw := func(name string) middleware {
		return func(next applyFunc) applyFunc {
			return func(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
				order = append(order, name+" in")
				out, err := next(ctx, h, ev)
				order = append(order, name+" out")
				return out, err
			}
		}
	}
	apply := chain(func(context.Context, Handler, *Event) (Outcome, error) {
		order = append(order, "apply")
		return Applied, nil
	}, mw("a"), mw("b"))
	if _, err := apply(context.Background(), stubHandler{}, &Event{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "a in,b in,apply,b out,a out" {
		t.Errorf("order = %s", got)
	}
}

func TestRecoverPanicsTurnsAPanicIntoAProjectionError(t *testing.T) {
	apply := chain(applyHandler(nil), recoverPanics)
	_, err := apply(context.Background(), stubHandler{fn: func() (Outcome, error) { panic("boom") }}, &Event{EventType: "X"})
	var pe *PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want *PanicError", err)
	}
	if pe.Projection != "stub" || pe.Value != "boom" || !strings.Contains(pe.Stack, "chain_test.go") {
		t.Errorf("PanicError = %q %v, stack has the panicking frame: %v", pe.Projection, pe.Value, strings.Contains(pe.Stack, "chain_test.go"))
	}
	if stackOf(err).String() != pe.Stack {
		t.Error("stackOf does not return the panic's stack")
	}
	if strings.Contains(pe.Stack, "runtime.gopanic") || strings.Contains(pe.Stack, "goroutine ") {
		t.Errorf("panic stack keeps the runtime's frames:\n%s", pe.Stack)
	}
}

// TestStackKeepsTheFramesThatExplainAFailure: a dead letter's stack names
// the functions that saw the failure, with file and line, without the Go
// runtime's or the backoff library's frames, and is capped.
func TestStackKeepsTheFramesThatExplainAFailure(t *testing.T) {
	var st callStack
	_ = backoff.Retry(func() error { st = stackOf(errors.New("x")); return nil }, &backoff.StopBackOff{})
	got := st.String()
	for _, want := range []string{"projection.TestStackKeepsTheFramesThatExplainAFailure", "chain_test.go:"} {
		if !strings.Contains(got, want) {
			t.Errorf("stack lacks %q:\n%s", want, got)
		}
	}
	for _, noise := range []string{"runtime.", "cenkalti/backoff", "goroutine "} {
		if strings.Contains(got, noise) {
			t.Errorf("stack keeps %q:\n%s", noise, got)
		}
	}
	var deep func(n int) callStack
	deep = func(n int) callStack {
		if n == 0 {
			return stackOf(errors.New("deep"))
		}
		return deep(n - 1)
	}
	lines := strings.Split(strings.TrimSpace(deep(100).String()), "\n")
	if len(lines) != 2*maxStackFrames+1 || !strings.HasSuffix(lines[len(lines)-1], "more frames left out") {
		t.Errorf("a deep stack formats as %d lines ending %q, want %d frames and a \"more frames left out\" line", len(lines), lines[len(lines)-1], maxStackFrames)
	}
}

func TestApplyHandlerNamesEventTypeAndProjection(t *testing.T) {
	apply := applyHandler(nil)
	base := errors.New("nope")
	_, err := apply(context.Background(), stubHandler{fn: func() (Outcome, error) { return Applied, base }}, &Event{EventType: "ARTIST_FOLLOWED"})
	if !errors.Is(err, base) || err.Error() != "apply ARTIST_FOLLOWED to stub: nope" {
		t.Errorf("err = %v", err)
	}
}

func TestObserveAttemptPassesResultsThrough(t *testing.T) {
	m := &Metrics{} // records nothing
	apply := chain(applyHandler(nil), m.observeAttempt)
	out, err := apply(context.Background(), stubHandler{fn: func() (Outcome, error) { return Stale, nil }}, &Event{})
	if out != Stale || err != nil {
		t.Errorf("= %v, %v; want Stale, nil", out, err)
	}
}

// stackAt returns callers(2) of a goroutine n calls deeper than its caller.
func stackAt(n int) []uintptr {
	if n == 0 {
		return callers(2)
	}
	return stackAt(n - 1)
}

// TestFormatFramesCachesByProgramCounters: the cached text of a stack is
// the text formatting gives it; two stacks of other program counters get
// their own texts; the cache never holds more than maxStackTexts.
func TestFormatFramesCachesByProgramCounters(t *testing.T) {
	a, b := stackAt(3), stackAt(5)
	if formatFrames(a) != formatFramesUncached(a) || formatFrames(a) != formatFramesUncached(a) {
		t.Errorf("cached text differs from the formatted one:\n%s\nwant\n%s", formatFrames(a), formatFramesUncached(a))
	}
	if formatFrames(b) != formatFramesUncached(b) || formatFrames(a) == formatFrames(b) {
		t.Errorf("stacks of other depths share a text:\n%s", formatFrames(b))
	}
	if !strings.Contains(formatFrames(a), "projection.stackAt\n") {
		t.Errorf("text %q does not name stackAt", formatFrames(a))
	}
	for i := range 2*maxStackTexts + 1 {
		// Program counters that are not in the stack: each one a new key.
		formatFrames([]uintptr{a[0], uintptr(i)})
		stackTexts.Lock()
		n := len(stackTexts.m)
		stackTexts.Unlock()
		if n > maxStackTexts {
			t.Fatalf("%d stack texts cached, want at most %d", n, maxStackTexts)
		}
	}
	if formatFrames(a) != formatFramesUncached(a) {
		t.Error("text changed after the cache was emptied")
	}
}

// BenchmarkFormatFrames formats a failure's stack of about 20 frames:
// cached (every dead letter of one code path after the first), and not.
func BenchmarkFormatFrames(b *testing.B) {
	pcs := stackAt(15)
	for _, bb := range []struct {
		name   string
		format func([]uintptr) string
	}{{"cached", formatFrames}, {"uncached", formatFramesUncached}} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bb.format(pcs)
			}
		})
	}
}
