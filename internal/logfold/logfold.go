// Package logfold decides when a log line that repeats is written: when
// its text changes, or once Every after it was last written, with the
// count of the repeats left out since. The worker folds with it the lines
// an outage repeats every few seconds or faster (a broker down, a topic
// deleted: thousands of lines a second before).
package logfold

import "time"

// Every is how often a line that repeats unchanged is written.
const Every = time.Minute

// Line is one line's state; the zero Line is ready. It is not safe for
// concurrent use.
type Line struct {
	text    string
	written time.Time
	n       int // repeats since it was last written
}

// Due reports whether the line text, seen at now, is to be written, and
// how many times it was seen unchanged since it was last written (0 when
// its text changed: the repeats were of the old text).
func (l *Line) Due(text string, now time.Time) (repeats int, write bool) {
	if text == l.text && now.Sub(l.written) < Every {
		l.n++
		return 0, false
	}
	n := l.n
	if text != l.text {
		n = 0
	}
	l.text, l.written, l.n = text, now, 0
	return n, true
}
