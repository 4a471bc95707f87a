package soak

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/kafkatest"
)

// brokerHooks are the soak's kfake control functions: they observe every
// dead letter a broker acknowledges and check every offset commit
// (invariant 2), fence members that died abruptly, and inject the Kafka
// faults that need a hand on the request (dead-letter produce refused,
// slow or unanswered; offset commits refused).
type brokerHooks struct {
	c        *kfake.Cluster
	group    string
	events   string
	eventsID [16]byte
	dlq      string
	dlqID    [16]byte
	checker  *CommitChecker
	onBad    func(...Violation)
	// commitAhead, when > 0, is added to every committed offset before it
	// is checked and stored (the checker's self-test).
	commitAhead int64

	mu       sync.Mutex
	rng      *rand.Rand
	acked    map[PairID]int
	fenced   map[string]bool
	produce  produceFault
	commitOn bool
	refused  map[string]int // produce/commit requests refused, by code
}

// produceFault is the current fault on dead-letter produce requests.
type produceFault struct {
	kind string // "", "refuse-retriable", "refuse-fatal", "slow", "unanswered"
	node int32  // the broker whose requests are hit
	slow time.Duration
}

var errFenced = errors.New("soak: this member died")

func (h *brokerHooks) install() {
	h.acked = map[PairID]int{}
	h.fenced = map[string]bool{}
	h.refused = map[string]int{}
	h.c.ControlKey(int16(kmsg.Produce), h.onProduce)
	h.c.ControlKey(int16(kmsg.OffsetCommit), h.onCommit)
	for _, k := range []kmsg.Key{kmsg.Heartbeat, kmsg.LeaveGroup, kmsg.JoinGroup, kmsg.SyncGroup} {
		h.c.ControlKey(int16(k), h.onGroup)
	}
}

// Acked reports whether a dead letter for id was acknowledged.
func (h *brokerHooks) Acked(id PairID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.acked[id] > 0
}

func (h *brokerHooks) fence(member string) {
	h.mu.Lock()
	h.fenced[member] = true
	h.mu.Unlock()
}

func (h *brokerHooks) isFenced(member string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return member != "" && h.fenced[member]
}

func (h *brokerHooks) setProduceFault(f produceFault) {
	h.mu.Lock()
	h.produce = f
	h.mu.Unlock()
}

func (h *brokerHooks) setCommitFault(on bool) {
	h.mu.Lock()
	h.commitOn = on
	h.mu.Unlock()
}

func (h *brokerHooks) onGroup(req kmsg.Request) (kmsg.Response, error, bool) {
	var members []string
	switch r := req.(type) {
	case *kmsg.HeartbeatRequest:
		members = []string{r.MemberID}
	case *kmsg.JoinGroupRequest:
		members = []string{r.MemberID}
	case *kmsg.SyncGroupRequest:
		members = []string{r.MemberID}
	case *kmsg.LeaveGroupRequest:
		members = []string{r.MemberID}
		for _, m := range r.Members {
			members = append(members, m.MemberID)
		}
	}
	for _, m := range members {
		if h.isFenced(m) {
			h.c.KeepControl()
			return nil, errFenced, true
		}
	}
	return nil, nil, false
}

func (h *brokerHooks) onProduce(req kmsg.Request) (kmsg.Response, error, bool) {
	pr := req.(*kmsg.ProduceRequest)
	ours := false
	for _, t := range pr.Topics {
		ours = ours || t.Topic == h.dlq || t.TopicID == h.dlqID
	}
	if !ours {
		return nil, nil, false
	}
	node := h.c.CurrentNode()
	h.mu.Lock()
	f := h.produce
	h.mu.Unlock()
	if f.kind != "" && node == f.node {
		switch f.kind {
		case "refuse-retriable", "refuse-fatal":
			// Every other request or so, so that one produce call of
			// several dead letters gets mixed answers.
			if !h.coin() {
				break
			}
			code := kerr.InvalidRecord
			if f.kind == "refuse-retriable" {
				code = kerr.NotLeaderForPartition
				if h.coin() {
					code = kerr.RequestTimedOut
				}
			}
			h.count("produce " + code.Message)
			h.c.KeepControl()
			return kafkatest.ProduceError(pr, code.Code), nil, true
		case "unanswered":
			h.count("produce unanswered")
			h.c.KeepControl()
			return nil, nil, true
		case "slow":
			h.c.SleepControl(func() { time.Sleep(f.slow) })
		}
	}
	// Passed on: the broker stores what it leads, and acknowledges it.
	for _, t := range pr.Topics {
		if t.Topic != h.dlq && t.TopicID != h.dlqID {
			continue
		}
		for _, p := range t.Partitions {
			if h.c.LeaderFor(h.dlq, p.Partition) != node {
				continue
			}
			h.observe(p.Records)
		}
	}
	return nil, nil, false
}

func (h *brokerHooks) coin() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rng.IntN(2) == 0
}

func (h *brokerHooks) count(what string) {
	h.mu.Lock()
	h.refused[what]++
	h.mu.Unlock()
}

// observe records the dead letters of a produced record batch as
// acknowledged.
func (h *brokerHooks) observe(raw []byte) {
	for len(raw) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw); err != nil {
			return
		}
		raw = raw[12+int(b.Length):]
		recs, err := kfake.BatchRecords(b)
		if err != nil {
			return
		}
		for _, r := range recs {
			hs := make([][2]string, len(r.Headers))
			for i, rh := range r.Headers {
				hs[i] = [2]string{rh.Key, string(rh.Value)}
			}
			dl, err := ParseDeadLetter(r.Key, r.Value, hs)
			if err != nil {
				continue
			}
			h.mu.Lock()
			h.acked[dl.Pair]++
			h.mu.Unlock()
		}
	}
}

func (h *brokerHooks) onCommit(req kmsg.Request) (kmsg.Response, error, bool) {
	cr := req.(*kmsg.OffsetCommitRequest)
	if cr.Group != h.group {
		return nil, nil, false
	}
	if h.isFenced(cr.MemberID) {
		h.c.KeepControl()
		return nil, errFenced, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range cr.Topics {
		t := &cr.Topics[i]
		if t.Topic != h.events && t.TopicID != h.eventsID {
			continue
		}
		for j := range t.Partitions {
			p := &t.Partitions[j]
			if h.commitAhead > 0 {
				p.Offset += h.commitAhead
			}
			if vs := h.checker.Check(ctx, cr.MemberID, p.Partition, p.Offset); len(vs) > 0 {
				h.onBad(vs...)
			}
		}
	}
	h.mu.Lock()
	refuse := h.commitOn && h.rng.IntN(2) == 0
	code := []*kerr.Error{kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.RequestTimedOut}[h.rng.IntN(3)]
	h.mu.Unlock()
	if !refuse {
		return nil, nil, false
	}
	h.count("commit " + code.Message)
	h.c.KeepControl()
	return kafkatest.CommitError(cr, code.Code), nil, true
}
