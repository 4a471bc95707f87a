package projection

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/retry"
)

// retrySet holds a partition's pairs that failed with a retriable error and
// wait for their next attempt, each on its own backoff, while the
// partition's later records go on (non-blocking retries). It is bounded by
// Config.MaxRetrying pairs and Config.MaxRetryingBytes; when full, the
// partition takes no new records and its fetching pauses (backpressure,
// never loss). It belongs to the partition's goroutine.
type retrySet struct {
	pairs []*retryPair
	bytes int // record bytes of the waiting pairs
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
	backoff *backoff.ExponentialBackOff // fresh per pair: not goroutine-safe
	fp      string                      // the failure's fingerprint (breaker)
	probe   bool                        // the half-open probe of fp's breaker
}

func (s *retrySet) hasRoom(cfg Config) bool {
	return len(s.pairs) < cfg.MaxRetrying && s.bytes < cfg.MaxRetryingBytes
}

func (s *retrySet) add(p *retryPair) {
	s.pairs = append(s.pairs, p)
	s.bytes += recordBytes(p.d.rec)
}

// dueOnOpenBreakers makes due now every waiting pair whose fingerprint's
// breaker opened since the last call (seen is the breaker's openings count
// then, updated), except the breakers' probes: retryDue then dead-letters
// them at once instead of at the end of their backoff.
func (s *retrySet) dueOnOpenBreakers(b *breaker, seen *uint64) {
	n := b.openings.Load()
	if n == *seen {
		return
	}
	*seen = n
	now := time.Now()
	for _, p := range s.pairs {
		if !p.probe && p.due.After(now) && b.isOpen(p.fp) {
			p.due = now
		}
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

// takeDue removes and returns the pairs due at now, in record order.
func (s *retrySet) takeDue(now time.Time) []*retryPair {
	var due []*retryPair
	kept := s.pairs[:0]
	for _, p := range s.pairs {
		if p.due.After(now) {
			kept = append(kept, p)
			continue
		}
		due = append(due, p)
		s.bytes -= recordBytes(p.d.rec)
	}
	clear(s.pairs[len(kept):])
	s.pairs = kept
	slices.SortStableFunc(due, func(a, b *retryPair) int { return int(a.d.rec.Offset - b.d.rec.Offset) })
	return due
}

// cancel drops every waiting pair (revoke or shutdown: a cancelled retry is
// not a failure and gets no dead letter) and frees the breaker probes among
// them.
func (s *retrySet) cancel(b *breaker) {
	for _, p := range s.pairs {
		if p.probe {
			b.cancelled(p.fp)
		}
	}
	s.pairs, s.bytes = nil, 0
}

// dropFrom drops the waiting pairs of records at offset from and after
// (they are delivered again), freeing their breaker probes.
func (s *retrySet) dropFrom(from int64, b *breaker) {
	kept := s.pairs[:0]
	for _, p := range s.pairs {
		if p.d.rec.Offset < from {
			kept = append(kept, p)
			continue
		}
		s.bytes -= recordBytes(p.d.rec)
		if p.probe {
			b.cancelled(p.fp)
		}
	}
	clear(s.pairs[len(kept):])
	s.pairs = kept
}

// schedule settles a pair whose attempt failed with a retriable error: it
// waits in the retry set for its next attempt, unless the retries ran out
// or the breaker of its fingerprint is open (at its first failure, or since
// it began to wait; not for the breaker's probe), in which case its dead
// letter is returned for the caller to write.
func (pc *partition) schedule(p *retryPair) *dlq.DeadLetter {
	w := pc.w
	if p.retries == 0 { // the first failure: ask the breaker
		dl := w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, 0, p.firstAt)
		p.fp = dl.Fingerprint()
		probe, err := w.breaker.admit(p.fp)
		if err != nil {
			dl.ShortCircuit = p.fp
			return &dl
		}
		p.probe = probe
		p.backoff = w.cfg.Retry.NewBackOff()
	} else if dl := pc.shortCircuit(p); dl != nil {
		return dl
	}
	wait := p.backoff.NextBackOff()
	if p.retries >= w.cfg.Retry.MaxRetries || wait == backoff.Stop {
		w.breaker.exhausted(p.fp, p.probe)
		dl := w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, p.retries, p.firstAt)
		return &dl
	}
	ev := p.d.ev
	level := slog.LevelWarn
	if p.retries > 0 {
		level = slog.LevelDebug // the first failure of the pair is at WARN
	}
	w.log.Log(context.Background(), level, "projection failed, retrying",
		"topic", p.d.rec.Topic, "partition", p.d.rec.Partition, "offset", p.d.rec.Offset,
		"projection", p.h.Name(), "tenant_schema", ev.TenantSchema,
		"retry", p.retries+1, "wait", wait, "error", p.err)
	p.due = time.Now().Add(wait)
	pc.retries.add(p)
	return nil
}

// shortCircuit returns the dead letter of a waiting pair whose
// fingerprint's breaker opened while it waited (another pair's exhaustion),
// nil when the pair goes on: the breaker is closed, or the pair is its
// probe. The dead letter keeps the pair's last error and retry count.
func (pc *partition) shortCircuit(p *retryPair) *dlq.DeadLetter {
	if p.probe || !pc.w.breaker.isOpen(p.fp) {
		return nil
	}
	dl := pc.w.newDeadLetter(p.d, p.h.Name(), retry.Classify(p.err), p.err, p.stack, p.retries, p.firstAt)
	dl.ShortCircuit = p.fp
	return &dl
}

// retryDue makes the next attempt of every pair that is due, settles each
// (applied, waiting again, or dead-lettered) and advances the watermark. A
// due pair whose fingerprint's breaker opened while it waited is
// dead-lettered without the attempt: the breaker already says how it
// would end. It returns ctx's error when ctx is done first; the pairs not
// attempted are dropped with the partition.
func (pc *partition) retryDue(ctx context.Context) error {
	due := pc.retries.takeDue(time.Now())
	if len(due) == 0 {
		return nil
	}
	w := pc.w
	var dead []dlq.DeadLetter
	for i, p := range due {
		if dl := pc.shortCircuit(p); dl != nil {
			dead = append(dead, *dl)
			continue
		}
		_, err := pc.attempt(ctx, p.h, p.d.ev)
		if ctx.Err() != nil {
			for _, rest := range due[i:] {
				pc.retries.add(rest) // for release to free their probes
			}
			return ctx.Err()
		}
		p.retries++
		w.cfg.Metrics.retried(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema))
		if err == nil {
			w.breaker.succeeded(p.fp, p.probe)
			pc.finish(p.d.rec.Offset, p.h.Name())
			continue
		}
		p.err, p.stack = err, stackOf(err)
		if retry.IsPermanent(err) {
			if p.probe {
				w.breaker.cancelled(p.fp)
			}
			dl := w.newDeadLetter(p.d, p.h.Name(), retry.Permanent, err, p.stack, p.retries, p.firstAt)
			dead = append(dead, dl)
			continue
		}
		if dl := pc.schedule(p); dl != nil {
			dead = append(dead, *dl)
		}
	}
	return pc.conclude(ctx, dead)
}

// conclude ends a round of settling pairs: it updates the retrying gauge,
// writes the round's dead letters and advances the watermark. It returns
// an error only when ctx is done first.
func (pc *partition) conclude(ctx context.Context, dead []dlq.DeadLetter) error {
	pc.setRetrying(len(pc.retries.pairs))
	if err := pc.writeDeadLetters(ctx, dead); err != nil {
		return err
	}
	pc.advance()
	return nil
}
