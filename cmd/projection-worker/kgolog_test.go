package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// TestQuietKgoLogsInfoAtDebug: quietKgo moves kgo's INFO lines to DEBUG,
// and leaves warnings and errors as they are, at every slog level.
func TestQuietKgoLogsInfoAtDebug(t *testing.T) {
	tests := []struct {
		level     slog.Level
		wantLevel kgo.LogLevel // what kgo is told to log
		want      []string     // lines logged, in order
	}{
		{level: slog.LevelDebug, wantLevel: kgo.LogLevelDebug, want: []string{"level=DEBUG msg=joined", "level=WARN msg=slow", "level=ERROR msg=failed"}},
		{level: slog.LevelInfo, wantLevel: kgo.LogLevelWarn, want: []string{"level=WARN msg=slow", "level=ERROR msg=failed"}},
		{level: slog.LevelError, wantLevel: kgo.LogLevelError, want: []string{"level=ERROR msg=failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.level.String(), func(t *testing.T) {
			var buf bytes.Buffer
			h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}})
			q := quietKgo{kslog.New(slog.New(h))}
			if got := q.Level(); got != tt.wantLevel {
				t.Errorf("Level() = %v, want %v", got, tt.wantLevel)
			}
			for _, l := range []struct {
				level kgo.LogLevel
				msg   string
			}{{kgo.LogLevelInfo, "joined"}, {kgo.LogLevelWarn, "slow"}, {kgo.LogLevelError, "failed"}} {
				if q.Level() >= l.level {
					q.Log(l.level, l.msg)
				}
			}
			if got, want := strings.TrimSpace(buf.String()), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("logged:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestFoldingKgoWritesARepeatedWarningOnceAMinute: kgo's warnings and
// errors that repeat, per message and broker, are written when their text
// changes, else once a minute with repeats (operator trial: 114 WARN
// `unable to open connection to broker` a minute while the brokers were
// down); INFO lines all go through.
func TestFoldingKgoWritesARepeatedWarningOnceAMinute(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	f := newFoldingKgo(kslog.New(slog.New(h)))
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	refused := []any{"broker", "seed_0", "err", "dial tcp 127.0.0.1:9092: connect: connection refused"}
	for range 100 { // every 0.5 s for 50 s
		f.Log(kgo.LogLevelWarn, "unable to open connection to broker", refused...)
		f.Log(kgo.LogLevelWarn, "unable to open connection to broker", "broker", "1", "err", "dial tcp 127.0.0.2:9092: i/o timeout")
		f.Log(kgo.LogLevelInfo, "metadata update", "broker", "seed_0")
		now = now.Add(500 * time.Millisecond)
	}
	f.Log(kgo.LogLevelError, "group manage loop errored", "err", "EOF")
	f.Log(kgo.LogLevelError, "group manage loop errored", "err", "unable to dial") // changed: at once
	now = now.Add(10 * time.Second)                                                // a minute after the first
	f.Log(kgo.LogLevelWarn, "unable to open connection to broker", refused...)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	count := func(s string) int {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, s) {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		text string
		want int
	}{
		{"broker=seed_0 err=\"dial tcp 127.0.0.1:9092", 2},
		{"broker=1 err=\"dial tcp 127.0.0.2:9092", 1},
		{"msg=\"metadata update\"", 100},
		{"msg=\"group manage loop errored\"", 2},
		{"repeats=99", 1},
	} {
		if got := count(c.text); got != c.want {
			t.Errorf("%d lines with %s, want %d:\n%s", got, c.text, c.want, strings.Join(lines[len(lines)-5:], "\n"))
		}
	}
}

// TestOpenTelemetryErrorsAreFolded: OpenTelemetry's errors that repeat
// (an export to a collector that cannot be reached, every 5 s) are
// written when their text changes, else once a minute with repeats
// (tracing trial: two ERROR lines every 5 s).
func TestOpenTelemetryErrorsAreFolded(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	h := foldedErrorHandler(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	refused := errors.New("failed to upload traces: dial tcp 127.0.0.1:4318: connect: connection refused")
	for range 24 { // every 5 s for 2 minutes
		h.Handle(refused)
		now = now.Add(5 * time.Second)
	}
	h.Handle(errors.New("failed to upload metrics: 404 Not Found"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "repeats=11") || !strings.Contains(lines[2], "404") {
		t.Errorf("logged:\n%s\nwant the refusal at once and a minute later with repeats=11, then the new error", buf.String())
	}
}
