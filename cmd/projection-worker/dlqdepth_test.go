package main

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TestDLQDepthOnlyOfEveryPartition: causet_dlq_depth sums every
// partition's end minus start offset, and is not observed when a
// partition's offsets are missing or failed: a deleted topic (one entry,
// partition -1, UNKNOWN_TOPIC_OR_PARTITION) read as a depth of 0 (operator
// trial).
func TestDLQDepthOnlyOfEveryPartition(t *testing.T) {
	offsets := func(os ...kadm.ListedOffset) kadm.ListedOffsets {
		l := kadm.ListedOffsets{}
		for _, o := range os {
			if l[o.Topic] == nil {
				l[o.Topic] = map[int32]kadm.ListedOffset{}
			}
			l[o.Topic][o.Partition] = o
		}
		return l
	}
	at := func(p int32, off int64) kadm.ListedOffset {
		return kadm.ListedOffset{Topic: "dlq", Partition: p, Offset: off}
	}
	gone := kadm.ListedOffset{Topic: "dlq", Partition: -1, Err: kerr.UnknownTopicOrPartition}
	leaderless := kadm.ListedOffset{Topic: "dlq", Partition: 1, Err: kerr.LeaderNotAvailable}
	for _, tt := range []struct {
		name         string
		ends, starts kadm.ListedOffsets
		want         int64
		known        bool
	}{
		{"every partition", offsets(at(0, 10), at(1, 7)), offsets(at(0, 4), at(1, 0)), 13, true},
		{"empty", offsets(at(0, 3), at(1, 0)), offsets(at(0, 3), at(1, 0)), 0, true},
		{"topic deleted", offsets(gone), offsets(gone), 0, false},
		{"a partition's end failed", offsets(at(0, 10), leaderless), offsets(at(0, 4), at(1, 0)), 0, false},
		{"a partition's start failed", offsets(at(0, 10), at(1, 7)), offsets(at(0, 4), leaderless), 0, false},
		{"a start missing", offsets(at(0, 10), at(1, 7)), offsets(at(0, 4)), 0, false},
		{"nothing listed", offsets(), offsets(), 0, false},
	} {
		got, known := dlqDepth(tt.ends, tt.starts)
		if known != tt.known || known && got != tt.want {
			t.Errorf("%s: dlqDepth = %d, %t; want %d, %t", tt.name, got, known, tt.want, tt.known)
		}
	}
}
