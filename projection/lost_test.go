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
