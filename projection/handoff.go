package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A hand-off carries, from a partition's owner to the next one, when the
// failing pairs of the record it stopped at first failed, so that their
// dead letters keep the original firstFailedAt (SPEC §6) across a
// rebalance or a restart. It travels in the metadata of the partition's
// committed offset, the one place Kafka keeps per partition and group: the
// owner commits the metadata when it stops a partition in the middle of a
// record's retries (revoke or shutdown), and the next owner reads it when
// the partition is assigned. An owner that dies abruptly leaves none; the
// next owner then dates the first failure from its own.

// handoffPrefix starts the metadata of a hand-off; other metadata (kgo
// commits the member id) is ignored.
const handoffPrefix = "causet.handoff.v1:"

// handoff is the JSON after handoffPrefix.
type handoff struct {
	// Offset is the record the hand-off is for: the committed offset.
	Offset int64 `json:"offset"`
	// FirstFailedAt maps a projection name to the epoch ms of its pair's
	// first failure.
	FirstFailedAt map[string]int64 `json:"firstFailedAt"`
}

func (h handoff) metadata() string {
	b, _ := json.Marshal(h) // a map of strings to integers always encodes
	return handoffPrefix + string(b)
}

// parseHandoff returns the hand-off in a committed offset's metadata, and
// false when there is none for offset at.
func parseHandoff(metadata string, at int64) (handoff, bool) {
	rest, ok := strings.CutPrefix(metadata, handoffPrefix)
	if !ok {
		return handoff{}, false
	}
	var h handoff
	if err := json.Unmarshal([]byte(rest), &h); err != nil || h.Offset != at || len(h.FirstFailedAt) == 0 {
		return handoff{}, false
	}
	return h, true
}

// retrying records that the partition is retrying the failing pairs of rec,
// first failed at the given times (by projection); nil rec clears it.
func (pc *partition) retrying(rec *kgo.Record, firstAt map[string]time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if rec == nil {
		pc.inRetry = nil
		return
	}
	h := &handoff{Offset: rec.Offset, FirstFailedAt: make(map[string]int64, len(firstAt))}
	for name, t := range firstAt {
		h.FirstFailedAt[name] = t.UnixMilli()
	}
	pc.inRetry = h
}

// receivedFirstFailedAt returns when the pair (offset, projection) first
// failed at a previous owner, from the hand-off read at assignment.
func (pc *partition) receivedFirstFailedAt(offset int64, projection string) (time.Time, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.received == nil || pc.received.Offset != offset {
		return time.Time{}, false
	}
	ms, ok := pc.received.FirstFailedAt[projection]
	return time.UnixMilli(ms), ok
}

// commitHandoffs commits, for each stopped partition that was in the middle
// of a record's retries, that record's offset with the hand-off as
// metadata. Call it after the
// marked offsets are committed, while the member still owns the
// partitions. Failures are logged: a lost hand-off only dates a dead
// letter's first failure later.
func (w *Worker) commitHandoffs(ctx context.Context, stopped []*partition) {
	committed := w.cl.CommittedOffsets()[w.cfg.Topic]
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = w.cfg.Group
	req.MemberID, req.Generation = w.cl.GroupMetadata()
	if id, ok := w.cl.OptValue(kgo.InstanceID).(string); ok && id != "" {
		req.InstanceID = &id
	}
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic = w.cfg.Topic
	for _, pc := range stopped {
		pc.mu.Lock()
		h := pc.inRetry
		pc.mu.Unlock()
		if h == nil {
			continue
		}
		// Every record before h.Offset is finished (it is marked before its
		// retries start), so committing h.Offset is right even when the
		// marks had not reached it; a committed offset past it (never
		// expected) is not rewound.
		c, ok := committed[pc.partition]
		if ok && c.Offset > h.Offset {
			continue
		}
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition = pc.partition
		p.Offset = h.Offset
		p.LeaderEpoch = -1
		if ok && c.Offset == h.Offset {
			p.LeaderEpoch = c.Epoch
		}
		meta := h.metadata()
		p.Metadata = &meta
		t.Partitions = append(t.Partitions, p)
	}
	if len(t.Partitions) == 0 {
		return
	}
	// OffsetCommit v10+ names the topic by its id.
	topics, err := kadm.NewClient(w.cl).ListTopics(ctx, w.cfg.Topic)
	if err == nil {
		t.TopicID = topics[w.cfg.Topic].ID
		req.Topics = append(req.Topics, t)
		var resp *kmsg.OffsetCommitResponse
		resp, err = req.RequestWith(ctx, w.cl)
		if err == nil {
			err = commitError(resp)
		}
	}
	if err != nil {
		w.log.Warn("hand-off of first-failure times not committed; the next owner dates them from its own failures",
			"topic", w.cfg.Topic, "error", err)
	}
}

// commitError returns the first partition error of an OffsetCommit
// response.
func commitError(resp *kmsg.OffsetCommitResponse) error {
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return fmt.Errorf("partition %d: %w", rp.Partition, err)
			}
		}
	}
	return nil
}

// receiveHandoffs reads the hand-offs left in the committed offsets of the
// assigned partitions and gives each partition state its own.
func (w *Worker) receiveHandoffs(ctx context.Context, cl *kgo.Client, assigned []*partition) {
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, w.cfg.Group)
	if err != nil {
		w.log.Debug("committed offsets not read for hand-offs", "topic", w.cfg.Topic, "error", err)
		return
	}
	for _, pc := range assigned {
		o, ok := resp.Lookup(w.cfg.Topic, pc.partition)
		if !ok || o.Err != nil {
			continue
		}
		if h, ok := parseHandoff(o.Metadata, o.At); ok {
			pc.mu.Lock()
			pc.received = &h
			pc.mu.Unlock()
		}
	}
}
