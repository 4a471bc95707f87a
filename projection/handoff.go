package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A hand-off tells a partition's next owner what its previous owner
// finished past the watermark, so that a rebalance or a graceful restart
// neither applies those records again nor writes their dead letters twice,
// and when the pairs it leaves unfinished first failed, so that their dead
// letters keep the original firstFailedAt (SPEC §6). With non-blocking
// retries the committed offset is the watermark (the lowest record with an
// unfinished pair) while the records after it go on; as Confluent's
// Parallel Consumer does, the unfinished ones above it travel in the
// metadata of the committed offset, the one place Kafka keeps per partition
// and group. The owner commits it when it stops a partition (revoke or
// shutdown), and the next owner reads it when the partition is assigned. An
// owner that dies abruptly leaves none: the next owner then processes
// everything from the watermark again (re-applied records are no-ops under
// the sequence guard; dead letters of that span can appear twice).

// handoffPrefix starts the metadata of a hand-off of the first format
// (JSON maps, about 90 bytes per open pair: 42 open records fitted),
// still read from an owner of an older version; handoffPrefixV2 starts
// the one written now (handoffWire). Other metadata (kgo commits the
// member id) is ignored.
const (
	handoffPrefix   = "causet.handoff.v1:"
	handoffPrefixV2 = "causet.handoff.v2:"
)

// maxHandoffBytes keeps a hand-off within Kafka's default
// offset.metadata.max.bytes (4096).
const maxHandoffBytes = 4000

// handoff is what a hand-off tells the next owner.
type handoff struct {
	// Offset is the watermark: the committed offset, the first open record.
	Offset int64 `json:"offset"`
	// UpTo is the last record the owner took: every record in
	// (Offset, UpTo] that Open does not list is finished.
	UpTo int64 `json:"upTo"`
	// Open maps the offset (decimal) of each record with unfinished pairs
	// to those pairs' projections ("" for the record itself) and the epoch
	// ms of their first failure.
	Open map[string]map[string]int64 `json:"open"`
	// Retries maps, in the same way, the pairs that were waiting for a
	// retry to the retries made, so that the next owner goes on counting
	// (a restart does not renew a pair's --max-retries). Absent from an
	// older owner's hand-off: its pairs count from there.
	Retries map[string]map[string]int `json:"retries,omitempty"`
}

// handoffWire is the JSON after handoffPrefixV2: the open pairs as
// integers, each a difference from the pair before, so that a few hundred
// open records fit in maxHandoffBytes (about 8 bytes a pair: 300 open
// records take 2509 bytes, TestHandoffHoldsHundredsOfOpenRecords).
type handoffWire struct {
	Offset int64 `json:"offset"`
	UpTo   int64 `json:"upTo"`
	// Names are the projections of Pairs ("" for the record itself), in
	// the order they first appear there.
	Names []string `json:"names"`
	// Pairs holds 4 integers per open pair, by offset and then by name:
	// its record's offset minus the previous pair's (the first pair's:
	// minus Offset), the index of its projection in Names, the epoch ms of
	// its first failure minus the previous pair's (the first pair's: minus
	// 0), and the retries it made.
	Pairs []int64 `json:"pairs"`
}

// handoffEncoder appends open records to a handoffWire, keeping count of
// the bytes of its JSON.
type handoffEncoder struct {
	w              handoffWire
	names          map[string]int
	prevOff, prevT int64
	size           int // bytes of the metadata so far
}

func newHandoffEncoder(offset, upTo int64) *handoffEncoder {
	e := &handoffEncoder{w: handoffWire{Offset: offset, UpTo: upTo, Names: []string{}, Pairs: []int64{}}, names: map[string]int{}, prevOff: offset}
	b, _ := json.Marshal(e.w)
	e.size = len(handoffPrefixV2) + len(b) + 40 // room for a longer upTo
	return e
}

// add appends the pairs of the record at offset (projection → first
// failure, retries made) unless the metadata would then exceed max bytes:
// false, and e is unchanged.
func (e *handoffEncoder) add(offset int64, pending map[string]int64, retries map[string]int, max int) bool {
	names := sortedKeys(pending)
	size, newNames := e.size, 0
	prevOff, prevT := e.prevOff, e.prevT
	var pairs []int64
	for _, name := range names {
		idx, ok := e.names[name]
		if !ok {
			idx = len(e.names) + newNames
			newNames++
			size += len(strconv.Quote(name)) + 1 // strconv.Quote's escapes cover JSON's for the names kept
		}
		t := pending[name]
		pairs = append(pairs, offset-prevOff, int64(idx), t-prevT, int64(retries[name]))
		prevOff, prevT = offset, t
	}
	for _, v := range pairs {
		size += len(strconv.FormatInt(v, 10)) + 1
	}
	if size > max {
		return false
	}
	for _, name := range names {
		if _, ok := e.names[name]; !ok {
			e.names[name] = len(e.w.Names)
			e.w.Names = append(e.w.Names, name)
		}
	}
	e.w.Pairs = append(e.w.Pairs, pairs...)
	e.size, e.prevOff, e.prevT = size, prevOff, prevT
	return true
}

// newHandoff describes a stopped partition's open records, or returns nil
// when it has nothing to hand off. Past maxHandoffBytes it hands off a
// prefix: UpTo stops before the first open record that does not fit, and
// the next owner processes the rest again.
func newHandoff(open []*recordState, last *kgo.Record, retried map[pairKey]int) *handoff {
	if len(open) == 0 || last == nil {
		return nil
	}
	h := &handoff{Offset: open[0].d.rec.Offset, UpTo: last.Offset, Open: make(map[string]map[string]int64, len(open))}
	enc := newHandoffEncoder(h.Offset, h.UpTo)
	for _, rs := range open {
		if len(rs.pending) == 0 {
			continue
		}
		entry := make(map[string]int64, len(rs.pending))
		var counts map[string]int
		for name, t := range rs.pending {
			entry[name] = t.UnixMilli()
			if r := retried[pairKey{rs.d.rec.Offset, name}]; r > 0 {
				if counts == nil {
					counts = map[string]int{}
				}
				counts[name] = r
			}
		}
		if !enc.add(rs.d.rec.Offset, entry, counts, maxHandoffBytes) {
			h.UpTo = rs.d.rec.Offset - 1
			break
		}
		off := strconv.FormatInt(rs.d.rec.Offset, 10)
		h.Open[off] = entry
		if counts != nil {
			if h.Retries == nil {
				h.Retries = map[string]map[string]int{}
			}
			h.Retries[off] = counts
		}
	}
	return h
}

// pairKey names a pair of a partition: its record's offset and its
// projection ("" for the record itself).
type pairKey struct {
	offset     int64
	projection string
}

// metadata is h in the current format (handoffWire), its open records by
// offset as newHandoff added them.
func (h handoff) metadata() string {
	offsets := make([]int64, 0, len(h.Open))
	for off := range h.Open {
		n, _ := strconv.ParseInt(off, 10, 64)
		offsets = append(offsets, n)
	}
	slices.Sort(offsets)
	enc := newHandoffEncoder(h.Offset, h.UpTo)
	for _, off := range offsets {
		k := strconv.FormatInt(off, 10)
		enc.add(off, h.Open[k], h.Retries[k], math.MaxInt)
	}
	b, _ := json.Marshal(enc.w) // strings and integers always encode
	return handoffPrefixV2 + string(b)
}

// parseHandoff returns the hand-off in a committed offset's metadata, of
// either format, and false when there is none for offset at (or it does
// not read as one).
func parseHandoff(metadata string, at int64) (handoff, bool) {
	var h handoff
	if rest, ok := strings.CutPrefix(metadata, handoffPrefix); ok {
		if err := json.Unmarshal([]byte(rest), &h); err != nil {
			return handoff{}, false
		}
	} else if rest, ok := strings.CutPrefix(metadata, handoffPrefixV2); ok {
		var w handoffWire
		if err := json.Unmarshal([]byte(rest), &w); err != nil || len(w.Pairs)%4 != 0 {
			return handoff{}, false
		}
		h = handoff{Offset: w.Offset, UpTo: w.UpTo, Open: map[string]map[string]int64{}}
		off, t := w.Offset, int64(0)
		for i := 0; i < len(w.Pairs); i += 4 {
			off, t = off+w.Pairs[i], t+w.Pairs[i+2]
			idx, retries := w.Pairs[i+1], w.Pairs[i+3]
			if idx < 0 || idx >= int64(len(w.Names)) || off < w.Offset || off > w.UpTo || retries < 0 {
				return handoff{}, false
			}
			k, name := strconv.FormatInt(off, 10), w.Names[idx]
			if h.Open[k] == nil {
				h.Open[k] = map[string]int64{}
			}
			h.Open[k][name] = t
			if retries > 0 {
				if h.Retries == nil {
					h.Retries = map[string]map[string]int{}
				}
				if h.Retries[k] == nil {
					h.Retries[k] = map[string]int{}
				}
				h.Retries[k][name] = int(retries)
			}
		}
	} else {
		return handoff{}, false
	}
	if h.Offset != at || h.UpTo < h.Offset {
		return handoff{}, false
	}
	return h, true
}

// handedOff says what is left of record d after the previous owner's
// hand-off: skip true when the record is finished; else only, when not nil,
// names the projections still to apply (nil: all of them).
func (pc *partition) handedOff(d *decoded) (only map[string]bool, skip bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	h := pc.received
	if h == nil {
		return nil, false
	}
	off := d.rec.Offset
	if off > h.UpTo || off < h.Offset {
		// Past the hand-off (or before it). It is kept all the same, for
		// the assignment: the pairs it lists may fail in this very batch,
		// and settle then reads their first failure and retries from it
		// (ops trial: dropped here at the first record past it, they were
		// dated anew with their retries counted from 0).
		return nil, false
	}
	entry, ok := h.Open[strconv.FormatInt(off, 10)]
	if !ok {
		return nil, true
	}
	only = make(map[string]bool, len(entry))
	for name := range entry {
		if name == "" || !pc.w.hasHandler(name) {
			return nil, false // the whole record again
		}
		only[name] = true
	}
	return only, false
}

// receivedFirstFailedAt returns when the pair (offset, projection) first
// failed at a previous owner, from the hand-off read at assignment.
func (pc *partition) receivedFirstFailedAt(offset int64, projection string) (time.Time, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.received == nil {
		return time.Time{}, false
	}
	ms, ok := pc.received.Open[strconv.FormatInt(offset, 10)][projection]
	return time.UnixMilli(ms), ok
}

// receivedRetries returns the retries the pair (offset, projection) had
// made at a previous owner, from the hand-off read at assignment: 0 when
// it lists none.
func (pc *partition) receivedRetries(offset int64, projection string) int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.received == nil {
		return 0
	}
	return pc.received.Retries[strconv.FormatInt(offset, 10)][projection]
}

// commitHandoffs commits, for each stopped partition with open records, its
// watermark with the hand-off as metadata. Call it after the marked offsets
// are committed, while the member still owns the partitions, with the
// partitions' goroutines stopped (stuck lists those that did not stop; they
// are left out). Failures are logged: a lost hand-off costs the next owner
// work done again, never a record.
func (w *Worker) commitHandoffs(ctx context.Context, stopped []*partition, stuck []int32) {
	committed := w.cl.CommittedOffsets()[w.cfg.Topic]
	var t kmsg.OffsetCommitRequestTopic
	openRecords := map[int32]int{}
	for _, pc := range stopped {
		if containsPartition(stuck, pc.partition) {
			continue
		}
		h := newHandoff(pc.open, pc.lastDone, pc.retriedAtRelease)
		if h == nil {
			continue
		}
		if h.UpTo < pc.lastDone.Offset {
			w.log.Warn("hand-off holds only the open records that fit in the offset metadata: the next owner processes the records after up_to again (their dead letters can be written twice)",
				"topic", w.cfg.Topic, "partition", pc.partition, "open_records", len(h.Open), "up_to", h.UpTo, "last_offset", pc.lastDone.Offset)
		}
		openRecords[pc.partition] = len(h.Open)
		// Every record before h.Offset is finished, so committing it is
		// right even when the marks had not reached it; a committed offset
		// past it (never expected) is not rewound.
		c, ok := committed[pc.partition]
		if ok && c.Offset > h.Offset {
			continue
		}
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition = pc.partition
		p.Offset = h.Offset
		p.LeaderEpoch = pc.open[0].d.rec.LeaderEpoch
		meta := h.metadata()
		p.Metadata = &meta
		t.Partitions = append(t.Partitions, p)
	}
	if len(t.Partitions) == 0 {
		return
	}
	if err := w.commitDirect(ctx, t.Partitions); err != nil {
		w.log.Warn("hand-off not committed; the next owner processes the open records again and dates their failures anew",
			"topic", w.cfg.Topic, "error", err)
		return
	}
	for _, p := range t.Partitions {
		w.log.Info("hand-off committed", "topic", w.cfg.Topic, "partition", p.Partition, "offset", p.Offset, "open_records", openRecords[p.Partition], "metadata_bytes", len(*p.Metadata))
	}
}

func containsPartition(ps []int32, p int32) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// commitDirect commits offsets ps of the worker's topic in one
// OffsetCommit request of its own, with the member ID and generation the
// client holds, beside the client's commit path: for offsets with
// metadata (the hand-off), and at shutdown when the client holds its
// commits back because a join is in flight (commitAtShutdown). Errors:
// the request's, or the first partition's.
func (w *Worker) commitDirect(ctx context.Context, ps []kmsg.OffsetCommitRequestTopicPartition) error {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = w.cfg.Group
	req.MemberID, req.Generation = w.cl.GroupMetadata()
	if id, ok := w.cl.OptValue(kgo.InstanceID).(string); ok && id != "" {
		req.InstanceID = &id
	}
	// OffsetCommit v10+ names the topic by its id.
	topics, err := kadm.NewClient(w.cl).ListTopics(ctx, w.cfg.Topic)
	if err != nil {
		return err
	}
	if first := w.topicID(w.cfg.Topic); first != (kadm.TopicID{}) && first != topics[w.cfg.Topic].ID {
		return errTopicRecreated
	}
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic, t.TopicID, t.Partitions = w.cfg.Topic, topics[w.cfg.Topic].ID, ps
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, w.cl)
	if err != nil {
		return err
	}
	return commitError(resp)
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
			w.log.Info("hand-off received", "topic", w.cfg.Topic, "partition", pc.partition, "offset", h.Offset, "up_to", h.UpTo, "open_records", len(h.Open))
		} else if strings.HasPrefix(o.Metadata, handoffPrefix) || strings.HasPrefix(o.Metadata, handoffPrefixV2) {
			w.log.Warn("hand-off ignored: it is not for the committed offset", "topic", w.cfg.Topic, "partition", pc.partition, "offset", o.At)
		}
	}
}
