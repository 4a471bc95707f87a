package projection

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestOnLostSaysNothingOfNoPartitions: franz-go calls onLost when a group
// session ends, also one that was never given a partition (the brokers
// down while it joined). Only a loss of partitions is a WARN (operator
// trial: "partitions lost" with "partitions":[] every few seconds of a
// broker outage).
func TestOnLostSaysNothingOfNoPartitions(t *testing.T) {
	var buf bytes.Buffer
	w := &Worker{log: slog.New(slog.NewTextHandler(&buf, nil)), cfg: Config{Topic: "events", ShutdownGrace: time.Second},
		partitions: map[int32]*partition{}, joined: true}
	for _, lost := range []map[string][]int32{nil, {}, {"events": {}}, {"other": {1}}} {
		w.onLost(context.Background(), nil, lost)
	}
	if buf.Len() != 0 || w.Joined() {
		t.Errorf("onLost of no partition of the topic: log %q, joined %t; want nothing logged, not joined", buf.String(), w.Joined())
	}
	w.onLost(context.Background(), nil, map[string][]int32{"events": {2, 5}})
	if got := buf.String(); !strings.Contains(got, `msg="partitions lost"`) || !strings.Contains(got, "partitions=\"[2 5]\"") {
		t.Errorf("onLost of partitions 2 and 5 logged %q, want a WARN partitions lost naming them", got)
	}
}

// TestRepeatedLine: a line that repeats is written when its text changes,
// and once a repeatedLineEvery otherwise, with the repeats since.
func TestRepeatedLine(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	var l repeatedLine
	steps := []struct {
		text  string
		at    time.Duration
		wantN int
		want  bool
	}{
		{"a", 0, 0, true},
		{"a", 5 * time.Second, 0, false},
		{"a", 10 * time.Second, 0, false},
		{"a", repeatedLineEvery, 2, true},
		{"a", repeatedLineEvery + time.Second, 0, false},
		{"b", repeatedLineEvery + 2*time.Second, 0, true}, // a new text: at once, the old one's repeats not its own
		{"b", 3 * repeatedLineEvery, 0, true},
	}
	for i, s := range steps {
		n, ok := l.due(s.text, t0.Add(s.at))
		if n != s.wantN || ok != s.want {
			t.Errorf("step %d (%q at %s): due = %d, %t; want %d, %t", i, s.text, s.at, n, ok, s.wantN, s.want)
		}
	}
}
