package logfold

import (
	"testing"
	"time"
)

// TestLineDue: a line that repeats is written when its text changes,
// and once every Every otherwise, with the repeats since.
func TestLineDue(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	var l Line
	steps := []struct {
		text  string
		at    time.Duration
		wantN int
		want  bool
	}{
		{"a", 0, 0, true},
		{"a", 5 * time.Second, 0, false},
		{"a", 10 * time.Second, 0, false},
		{"a", Every, 2, true},
		{"a", Every + time.Second, 0, false},
		{"b", Every + 2*time.Second, 0, true}, // a new text: at once, the old one's repeats not its own
		{"b", 3 * Every, 0, true},
	}
	for i, s := range steps {
		n, ok := l.Due(s.text, t0.Add(s.at))
		if n != s.wantN || ok != s.want {
			t.Errorf("step %d (%q at %s): due = %d, %t; want %d, %t", i, s.text, s.at, n, ok, s.wantN, s.want)
		}
	}
}
