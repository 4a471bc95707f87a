package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/logfold"
)

// quietKgo is a kgo.Logger that logs kgo's INFO lines (metadata updates,
// each step of a group join, producer IDs) at DEBUG: `make run` uses it, so
// that its terminal shows the worker's own lines. Warnings and errors are
// unchanged.
type quietKgo struct{ kgo.Logger }

// Level returns the level kgo should log at: with the wrapped logger at
// INFO, kgo's INFO lines would be demoted below it, so only warnings are
// asked for.
func (q quietKgo) Level() kgo.LogLevel {
	if l := q.Logger.Level(); l != kgo.LogLevelInfo {
		return l
	}
	return kgo.LogLevelWarn
}

// Log logs an INFO line of kgo at DEBUG, and any other as it is.
func (q quietKgo) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelInfo {
		level = kgo.LogLevelDebug
	}
	q.Logger.Log(level, msg, keyvals...)
}

// foldingKgo is a kgo.Logger that writes a warning or error of kgo that
// repeats (the same message about the same broker) when its text changes,
// else once a minute with `repeats` (logfold): while the brokers were down
// a worker wrote about 114 WARN `unable to open connection to broker` and
// 16 ERROR `group manage loop errored` lines a minute (operator trial).
// INFO and DEBUG lines go through unchanged.
type foldingKgo struct {
	kgo.Logger
	now   func() time.Time
	mu    sync.Mutex
	lines map[string]*logfold.Line // by message and broker
}

// foldingLines bounds the lines foldingKgo remembers; past it, it forgets
// them all (a repeat is then written once more).
const foldingLines = 1024

func newFoldingKgo(l kgo.Logger) *foldingKgo {
	return &foldingKgo{Logger: l, now: time.Now, lines: map[string]*logfold.Line{}}
}

// Log writes the line, or counts it as a repeat.
func (f *foldingKgo) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level != kgo.LogLevelError && level != kgo.LogLevelWarn {
		f.Logger.Log(level, msg, keyvals...)
		return
	}
	key := msg
	for i := 0; i+1 < len(keyvals); i += 2 {
		if keyvals[i] == "broker" {
			key += "\x00" + fmt.Sprint(keyvals[i+1])
		}
	}
	text := fmt.Sprint(keyvals...)
	f.mu.Lock()
	l := f.lines[key]
	if l == nil {
		if len(f.lines) >= foldingLines {
			clear(f.lines)
		}
		l = &logfold.Line{}
		f.lines[key] = l
	}
	repeats, write := l.Due(text, f.now())
	f.mu.Unlock()
	if !write {
		return
	}
	if repeats > 0 {
		keyvals = append(keyvals, "repeats", repeats)
	}
	f.Logger.Log(level, msg, keyvals...)
}
