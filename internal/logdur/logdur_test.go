package logdur

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestDurationsAreMilliseconds: a duration attribute is logged as key_ms,
// a number of milliseconds, in JSON and text, in groups too; nothing else
// changes.
func TestDurationsAreMilliseconds(t *testing.T) {
	tests := []struct {
		name string
		h    func(*bytes.Buffer) slog.Handler
		want []string
	}{
		{"json", func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, Options(slog.LevelInfo)) },
			[]string{`"wait_ms":1500`, `"g":{"took_ms":0.25}`, `"attempt":2`, `"timeout":"1s"`}},
		{"text", func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, Options(slog.LevelInfo)) },
			[]string{`wait_ms=1500 `, `g.took_ms=0.25 `, `attempt=2 `, `timeout=1s`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			slog.New(tt.h(&b)).Info("retrying", "wait", 1500*time.Millisecond, slog.Group("g", "took", 250*time.Microsecond),
				"attempt", 2, "timeout", "1s")
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("log %s lacks %s", b.String(), w)
				}
			}
		})
	}
}
