package projection

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/trace"
)

// retrySet holds a partition's pairs that failed with a retriable error and
// wait for their next attempt, each on its own backoff, while the
// partition's later records go on (non-blocking retries). It is bounded by
// Config.MaxRetrying pairs, and by Config.MaxRetryingBytes for all the
// partitions' sets together; when full, the partition takes no new records
// and its fetching pauses (backpressure, never loss). It belongs to the
// partition's goroutine.
type retrySet struct {
	pairs []*retryPair
	bytes int // record bytes of the waiting pairs
	// flying and flyingBytes count the pairs of the round of retries in
	// flight (retryRound), taken from pairs but still held.
	flying, flyingBytes int
	// total is the record bytes held by every partition's set (waiting and
	// in flight), the worker's; nil: this set's alone.
	total *atomic.Int64
}

// held adds n record bytes to what the worker's sets hold (total).
func (s *retrySet) held(n int) {
	if s.total != nil {
		s.total.Add(int64(n))
	}
}

// retryPair is a pair waiting in a retrySet.
type retryPair struct {
	d       *decoded
	h       Handler
	err     error // the last failure
	stack   callStack
	retries int // retries made
	firstAt time.Time
	due     time.Time
	wait    time.Duration // the backoff wait that ends at due
	// attemptedAt is when the last attempt's round of retries ended (zero
	// for a pair whose last attempt was its batch's): its next wait runs
	// from then, not from when the partition's goroutine settled it.
	attemptedAt time.Time
	backoff     *backoff.ExponentialBackOff // fresh per pair: not goroutine-safe
	fp          string                      // the failure's fingerprint (breaker)
	probe       bool                        // the half-open probe of fp's breaker
	span        trace.Span                  // the pair's span (tracing.go), nil without tracing
	// noRide: a ride of its (rideRetries) found a lock; it is retried in
	// rounds of its own only, which wait for a lock aside.
	noRide bool
	// slot is the retry slot of fp it holds (breaker.lead), 0 for none;
	// follow says it waits for one, without retries, until due.
	slot   uint64
	follow bool
}

// hasRoom reports whether the partition may take new records: its set
// holds fewer than cfg.MaxRetrying pairs, and the worker's sets fewer than
// cfg.MaxRetryingBytes record bytes, unless this one holds none (a
// partition without retries never waits for another's; what its next
// batch adds is within the fetch caps). The bytes were bounded per
// partition before, so that 12 partitions of a tenant not migrated held
// 12 × 16 MiB of 50 KB records, and their dead letters as many again when
// the breaker opened: 675 MiB in a pod limited to 512 MiB (deployment
// trial).
func (s *retrySet) hasRoom(cfg Config) bool {
	if len(s.pairs)+s.flying >= cfg.MaxRetrying {
		return false
	}
	own := s.bytes + s.flyingBytes
	if s.total == nil {
		return own < cfg.MaxRetryingBytes
	}
	return own == 0 || s.total.Load() < int64(cfg.MaxRetryingBytes)
}

// waiting returns the pairs held: waiting in the set or in the round in
// flight.
func (s *retrySet) waiting() int { return len(s.pairs) + s.flying }

// fly counts ps, taken from the set, as in flight (sign 1) or no longer
// (sign −1).
func (s *retrySet) fly(ps []*retryPair, sign int) {
	for _, p := range ps {
		s.flying += sign
		s.flyingBytes += sign * recordBytes(p.d.rec)
		s.held(sign * recordBytes(p.d.rec))
	}
}

func (s *retrySet) add(p *retryPair) {
	s.pairs = append(s.pairs, p)
	s.bytes += recordBytes(p.d.rec)
	s.held(recordBytes(p.d.rec))
}

// breakerSeen holds the breaker's counts (openings, releases) a partition
// last saw.
type breakerSeen struct{ openings, releases uint64 }

// dueOnBreakers readies the waiting pairs for takeDue by what the breaker
// b says (seen: its counts at the last call, updated; term: how long a
// retry slot taken now is held at most):
//   - a breaker opened since: every waiting pair of its fingerprint but
//     the breaker's probe is due now, so that startRetries dead-letters it
//     at once instead of at the end of its backoff;
//   - a success released a fingerprint's pairs that wait for a slot: due
//     now, retried without one;
//   - a pair that waits for a slot and is due asks for one (breaker.lead):
//     it is retried with it, or due again when the first slot expires.
func (s *retrySet) dueOnBreakers(b *breaker, seen *breakerSeen, term time.Duration) {
	now := time.Now()
	if n := b.openings.Load(); n != seen.openings {
		seen.openings = n
		for _, p := range s.pairs {
			if !p.probe && p.due.After(now) && b.isOpen(p.fp) {
				p.due = now
			}
		}
	}
	if n := b.releases.Load(); n != seen.releases {
		seen.releases = n
		for _, p := range s.pairs {
			if p.follow && !b.waiting(p.fp) {
				p.follow, p.due = false, now
			}
		}
	}
	for _, p := range s.pairs {
		if !p.follow || p.due.After(now) {
			continue
		}
		id, ok := b.lead(p.fp, now.Add(term))
		if ok {
			p.slot, p.follow = id, false
			continue
		}
		p.due = b.holdUntil(p.fp)
		if !p.due.After(now) { // freed meanwhile: ask again soon
			p.due = now.Add(maxRetryEarly)
		}
		p.wait = p.due.Sub(now)
	}
}

// nextDue returns how long until the earliest pair is due, at most limit.
func (s *retrySet) nextDue(limit time.Duration) time.Duration {
	d := limit
	now := time.Now()
	for _, p := range s.pairs {
		d = min(d, p.due.Sub(now))
	}
	return max(d, 0)
}

// maxRetryEarly is how early a pair may be taken with others due before
// it (takeDue): at most a tenth of its wait, and 10 ms.
const maxRetryEarly = 10 * time.Millisecond

// takeDue removes and returns the pairs due at now, in record order, and
// those due within a tenth of their wait after now (at most maxRetryEarly),
// so that pairs that failed together, due microseconds apart, are retried
// together (attemptTogether) rather than one timer each; the waits have
// their jitter (±50 % by default) anyway. With only not nil, only the due
// pairs it reports true for are taken.
func (s *retrySet) takeDue(now time.Time, only func(*retryPair) bool) []*retryPair {
	var due []*retryPair
	kept := s.pairs[:0]
	for _, p := range s.pairs {
		if p.due.After(now.Add(min(p.wait/10, maxRetryEarly))) || only != nil && !only(p) {
			kept = append(kept, p)
			continue
		}
		due = append(due, p)
		s.bytes -= recordBytes(p.d.rec)
		s.held(-recordBytes(p.d.rec))
	}
	clear(s.pairs[len(kept):])
	s.pairs = kept
	slices.SortStableFunc(due, func(a, b *retryPair) int { return int(a.d.rec.Offset - b.d.rec.Offset) })
	return due
}

// counts returns the retries each waiting pair has made, by pair.
func (s *retrySet) counts() map[pairKey]int {
	out := make(map[pairKey]int, len(s.pairs))
	for _, p := range s.pairs {
		out[pairKey{p.d.rec.Offset, p.h.Name()}] = p.retries
	}
	return out
}

// cancel drops every waiting pair (revoke or shutdown: a cancelled retry is
// not a failure and gets no dead letter) and frees the breaker probes and
// retry slots among them.
func (s *retrySet) cancel(b *breaker) {
	for _, p := range s.pairs {
		b.left(p)
	}
	s.held(-s.bytes)
	s.pairs, s.bytes = nil, 0
}

// dropFrom drops the waiting pairs of records at offset from and after
// (they are delivered again), freeing their breaker probes and retry
// slots.
func (s *retrySet) dropFrom(from int64, b *breaker) {
	kept := s.pairs[:0]
	for _, p := range s.pairs {
		if p.d.rec.Offset < from {
			kept = append(kept, p)
			continue
		}
		s.bytes -= recordBytes(p.d.rec)
		s.held(-recordBytes(p.d.rec))
		b.left(p)
	}
	clear(s.pairs[len(kept):])
	s.pairs = kept
}
