// Package logdur gives the commands' slog handlers one rendering of
// durations: a time.Duration attribute "wait" is logged as "wait_ms", its
// milliseconds as a number with microsecond precision (212.345), in JSON and
// text alike. slog's own rendering is integer nanoseconds in JSON and Go's
// "212.345ms" in text, which a log query cannot compare or sum.
package logdur

import (
	"log/slog"
	"math"
)

// Suffix is appended to the key of a duration attribute.
const Suffix = "_ms"

// ReplaceAttr is a slog.HandlerOptions.ReplaceAttr that logs a
// time.Duration attribute (at any group depth) as key+Suffix, a float64 of
// milliseconds rounded to the microsecond; other attributes are returned
// unchanged.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	d := a.Value.Duration()
	return slog.Float64(a.Key+Suffix, math.Round(float64(d.Microseconds()))/1000)
}

// Options returns handler options of level with ReplaceAttr.
func Options(level slog.Leveler) *slog.HandlerOptions {
	return &slog.HandlerOptions{Level: level, ReplaceAttr: ReplaceAttr}
}
