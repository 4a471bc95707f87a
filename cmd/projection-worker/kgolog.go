package main

import "github.com/twmb/franz-go/pkg/kgo"

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
