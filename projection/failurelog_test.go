package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// logLines decodes buf's JSON log lines.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := json.NewDecoder(buf)
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestFailureLogAggregatesRepeatsPerFingerprint: 1000 dead letters of one
// fingerprint and 1 of another within an interval write the first of each
// in full and, when the interval ends, one line with the other 999; the
// next interval starts in full again.
func TestFailureLogAggregatesRepeatsPerFingerprint(t *testing.T) {
	var buf bytes.Buffer
	l := newFailureLog(slog.New(slog.NewJSONHandler(&buf, nil)), time.Minute)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	l.now = clock.now
	ctx := context.Background()
	for i := range 1000 {
		l.write(ctx, slog.LevelWarn, "dead-lettered", "fp-a", "partition", 3, "offset", i, "projection", "p")
	}
	l.write(ctx, slog.LevelWarn, "dead-lettered", "fp-b", "partition", 1, "offset", 7)
	l.write(ctx, slog.LevelWarn, "projection failed, retrying", "fp-a", "partition", 3, "offset", 5)
	l.flush(ctx, false) // the interval has not ended
	lines := logLines(t, &buf)
	if len(lines) != 3 {
		t.Fatalf("%d lines within the interval, want 3 (the first of each message and fingerprint): %v", len(lines), lines)
	}
	if lines[0]["fingerprint"] != "fp-a" || lines[0]["offset"] != 0.0 || lines[0]["projection"] != "p" {
		t.Errorf("first line = %v, want fp-a's first in full", lines[0])
	}
	clock.add(time.Minute)
	l.flush(ctx, false)
	lines = logLines(t, &buf)
	if len(lines) != 1 || lines[0]["msg"] != "dead-lettered (repeated)" || lines[0]["count"] != 999.0 ||
		lines[0]["fingerprint"] != "fp-a" || lines[0]["last_offset"] != 999.0 || lines[0]["level"] != "WARN" {
		t.Fatalf("after the interval: %v, want one line with fp-a's 999 repeats", lines)
	}
	l.write(ctx, slog.LevelWarn, "dead-lettered", "fp-a", "offset", 1000)
	l.write(ctx, slog.LevelWarn, "dead-lettered", "fp-a", "offset", 1001)
	l.flush(ctx, true) // shutdown
	lines = logLines(t, &buf)
	if len(lines) != 2 || lines[0]["offset"] != 1000.0 || lines[1]["count"] != 1.0 {
		t.Errorf("next interval and shutdown: %v, want offset 1000 in full, then 1 repeat", lines)
	}
}

// TestFailureLogWritesNothingBelowItsLevel: a logger at ERROR counts
// nothing, so nothing is written later either.
func TestFailureLogWritesNothingBelowItsLevel(t *testing.T) {
	var buf bytes.Buffer
	l := newFailureLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})), time.Minute)
	for range 3 {
		l.write(context.Background(), slog.LevelWarn, "dead-lettered", "fp", "offset", 1)
	}
	l.flush(context.Background(), true)
	if buf.Len() != 0 {
		t.Errorf("wrote %q at level ERROR", buf.String())
	}
}

// spanContextHandler records the span context of each log record's ctx
// (as cmd/projection-worker's handler adds trace_id and span_id).
type spanContextHandler struct {
	slog.Handler
	spans *[]trace.SpanContext
}

func (h spanContextHandler) Handle(ctx context.Context, r slog.Record) error {
	*h.spans = append(*h.spans, trace.SpanContextFromContext(ctx))
	return h.Handler.Handle(ctx, r)
}

// TestFailureLogRepeatsCarryTheLastRepeatsTrace: a "(repeated)" line says
// the last repeat's partition and offset, and carries that record's span
// context, not the one of the record being logged when the interval ended
// (tracing trial: the line carried the next record's trace id).
func TestFailureLogRepeatsCarryTheLastRepeatsTrace(t *testing.T) {
	var buf bytes.Buffer
	var spans []trace.SpanContext
	l := newFailureLog(slog.New(spanContextHandler{slog.NewJSONHandler(&buf, nil), &spans}), time.Minute)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	l.now = clock.now
	recordCtx := func(b byte) (context.Context, trace.SpanContext) {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{b}, SpanID: trace.SpanID{b}, TraceFlags: trace.FlagsSampled})
		return trace.ContextWithSpanContext(context.Background(), sc), sc
	}
	ctx1, sc1 := recordCtx(1)
	ctx2, sc2 := recordCtx(2)
	ctx3, sc3 := recordCtx(3)
	l.write(ctx1, slog.LevelWarn, "dead-lettered", "fp", "partition", 0, "offset", 1)
	l.write(ctx2, slog.LevelWarn, "dead-lettered", "fp", "partition", 0, "offset", 2, "error", "the second's")
	clock.add(time.Minute)
	l.write(ctx3, slog.LevelWarn, "dead-lettered", "fp", "partition", 0, "offset", 3)
	lines := logLines(t, &buf)
	if len(lines) != 3 || lines[1]["msg"] != "dead-lettered (repeated)" || lines[1]["last_offset"] != 2.0 || lines[1]["last_error"] != "the second's" {
		t.Fatalf("lines %v, want offset 1 in full, offset 2 (and its error) as a repeat, offset 3 in full", lines)
	}
	for i, want := range []trace.SpanContext{sc1, sc2, sc3} {
		if !spans[i].Equal(want) {
			t.Errorf("line %d (%v) carries trace %s, want %s", i, lines[i]["msg"], spans[i].TraceID(), want.TraceID())
		}
	}
}

// recordChan is a slog.Handler that sends each record's message.
type recordChan chan string

func (h recordChan) Enabled(context.Context, slog.Level) bool { return true }
func (h recordChan) Handle(_ context.Context, r slog.Record) error {
	h <- r.Message
	return nil
}
func (h recordChan) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordChan) WithGroup(string) slog.Handler      { return h }

// TestFailureLogWritesRepeatsSoonAfterTheirInterval: a fingerprint whose
// first line came half an interval after run started gets its repeats
// written about one interval after that line, not at the next whole
// interval of run's (new-user trial: up to two intervals).
func TestFailureLogWritesRepeatsSoonAfterTheirInterval(t *testing.T) {
	const interval = 2 * time.Second
	lines := make(recordChan, 8)
	l := newFailureLog(slog.New(lines), interval)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(interval / 2)
	first := time.Now()
	l.write(ctx, slog.LevelWarn, "dead-lettered", "fp", "offset", 1)
	l.write(ctx, slog.LevelWarn, "dead-lettered", "fp", "offset", 2)
	if msg := <-lines; msg != "dead-lettered" {
		t.Fatalf("first line %q", msg)
	}
	select {
	case msg := <-lines:
		// Flushed once an interval, the repeats came 1.5 intervals after
		// the first line; a tenth of an interval's ticks bring it to 1.1.
		if took := time.Since(first); msg != "dead-lettered (repeated)" || took > interval*13/10 {
			t.Errorf("%q %s after the first line, want the repeated line within 1.3 intervals (%s)", msg, took, interval*13/10)
		}
	case <-time.After(3 * interval):
		t.Fatal("no repeated line within 3 intervals")
	}
}
