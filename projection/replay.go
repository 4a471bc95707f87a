package projection

import (
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
)

// replayInfo is what the replayer's headers say about a republished record
// (SPEC §7).
type replayInfo struct {
	projection    string    // apply only to this projection when non-empty
	count         int       // causet.replay.count
	firstFailedAt time.Time // causet.replay.first-failed-at, zero if absent
}

func readReplayInfo(rec *kgo.Record) replayInfo {
	var ri replayInfo
	for _, h := range rec.Headers {
		switch h.Key {
		case dlq.HeaderReplayProjection:
			// Cut as the dead letter's other labels from the wire are
			// (security trial: a 600 KB name, copied into the dead
			// letter's header, projectionName and error, made a dead
			// letter no DLQ topic of 1 MB takes, and stuck its
			// partition). A projection's name is 63 bytes at most, so a
			// cut one names none.
			ri.projection = dlq.CapLabel(string(h.Value))
		case dlq.HeaderReplayCountOut:
			ri.count, _ = dlq.ParseReplayCount(h.Value) // unreadable: a first failure
		case dlq.HeaderReplayFirstFailedAt:
			ri.firstFailedAt = time.Time{}
			if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil && ms > 0 {
				ri.firstFailedAt = time.UnixMilli(ms)
			}
		}
	}
	return ri
}
