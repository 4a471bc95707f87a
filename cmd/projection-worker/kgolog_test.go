package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

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
