package soak

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/causet/projection-worker/dlq"
	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TestExcuseLostCountsOnlyCopiesWrittenBeforeTheirWriterLostThePartition
// checks the real-broker soak's rule for duplicate dead letters that are
// not violations: every copy but the newest written by a worker that was
// SIGKILLed or lost the partition before the next copy was written.
func TestExcuseLostCountsOnlyCopiesWrittenBeforeTheirWriterLostThePartition(t *testing.T) {
	id := PairID{3, 10, ""}
	dl := func(worker string, ms int64) DeadLetter {
		return DeadLetter{Pair: id, Worker: worker, Class: "permanent", Value: fmt.Appendf(nil, `{"failedAt":%d}`, ms)}
	}
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for _, tc := range []struct {
		name    string
		dls     []DeadLetter
		killed  map[string]bool
		losses  map[string][]kafkaSoakLoss
		excused bool
	}{
		{"lost after writing", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(1500), []int32{2, 3}}}}, true},
		{"failed final commit", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(1500), nil}}}, true},
		{"lost, then SIGKILLed", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000), dl("w3.1", 3000)}, map[string]bool{"w2.1": true},
			map[string][]kafkaSoakLoss{"w1.1": {{at(1500), []int32{3}}}}, true},
		{"lost before writing", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(500), []int32{3}}}}, false},
		{"lost another partition", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(1500), []int32{4}}}}, false},
		{"the newest writer's loss does not count", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w2.1": {{at(2500), nil}}}, false},
		{"first writer SIGKILLed", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, map[string]bool{"w1.1": true},
			nil, true},
		{"lost after the next copy", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(2500), nil}}}, false},
		{"one worker twice, lost in between", []DeadLetter{dl("w1.1", 1000), dl("w1.1", 2000), dl("w2.1", 3000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(1500), []int32{3}}, {at(2500), nil}}}, true},
		{"one worker twice, not lost in between", []DeadLetter{dl("w1.1", 1000), dl("w2.1", 2000), dl("w1.1", 3000)}, nil,
			map[string][]kafkaSoakLoss{"w1.1": {{at(3500), nil}}, "w2.1": {{at(2500), nil}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.dls) - 1
			v := Violation{3, "duplicate dead letter", fmt.Sprintf("%s dead-lettered %d times (permanent; workers ...)", id, n+1)}
			label := "permanent, across workers"
			fin := Final{Duplicates: map[string]int{label: n}, InFlightDuplicates: map[string]int{}, Violations: []Violation{v}}
			excuseLost(&fin, tc.dls, tc.killed, tc.losses)
			want := Final{Duplicates: map[string]int{label: n}, InFlightDuplicates: map[string]int{}, Violations: []Violation{v}}
			if tc.excused {
				want = Final{Duplicates: map[string]int{}, InFlightDuplicates: map[string]int{label + ", partition lost": n}, Violations: []Violation{}}
			}
			if d := cmp.Diff(want, fin, cmp.AllowUnexported(Violation{})); d != "" {
				t.Errorf("final (-want +got):\n%s", d)
			}
		})
	}
}

// TestLogLinesExcuseOnlyDeadLettersMaybeStored checks the log lines both
// soaks read as the reason a dead letter may be in the topic twice: a
// write attempt that timed out, and a partition released while a write
// was unacknowledged with its request maybe in flight (a context error) —
// not one the broker refused (never stored).
func TestLogLinesExcuseOnlyDeadLettersMaybeStored(t *testing.T) {
	refused := fmt.Errorf("dead letter for t[0]@3 not written to t.dlq: %w", kerr.InvalidRecord)
	for _, tc := range []struct {
		msg     string
		err     error
		excused bool
	}{
		{"dead-letter write failed, retrying", fmt.Errorf("x: %w", dlq.ErrAttemptTimeout), true},
		{"dead-letter write failed, retrying", refused, false},
		{"dead letter not acknowledged when the partition was released; the next owner writes it again (it may then appear twice)",
			fmt.Errorf("dead letter for t[0]@3 not written to t.dlq: %w", context.Canceled), true},
		{"dead letter not acknowledged when the partition was released; the next owner writes it again (it may then appear twice)", refused, false},
	} {
		m := NewModel()
		log := slog.New(rewindWatcher{slog.NewJSONHandler(io.Discard, nil), m})
		log.Warn(tc.msg, "partition", 0, "offset", 3, "projection", "p", "error", tc.err)
		if got := m.timedOut[PairID{0, 3, "p"}]; got != tc.excused {
			t.Errorf("in-process soak: %q with %v: excused %v, want %v", tc.msg[:20], tc.err, got, tc.excused)
		}
		if got := maybeStored(tc.err.Error()); got != tc.excused {
			t.Errorf("real-broker soak: %q with %v: maybeStored %v, want %v", tc.msg[:20], tc.err, got, tc.excused)
		}
	}
}
