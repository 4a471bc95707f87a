package projection

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig configures the fingerprint breaker (SPEC §5): when pairs
// with one failure fingerprint (SPEC §6) have exhausted their retries
// Threshold times within Window, later pairs failing with that fingerprint
// are dead-lettered at once, without retries (header
// causet.dlq.short-circuit); every ProbeInterval one of them is still
// retried in full (half-open), and its success closes the breaker; so does
// a Window in which no pair failed with the fingerprint (the cause was
// fixed, or no event meets it any more), so that a later incident of the
// same fingerprint gets its retries again. A tenant
// that is not migrated then costs seconds of dead letters instead of hours
// of retries; `migrate` and `dlq-replayer retry --fingerprint F` fix them.
type BreakerConfig struct {
	// Threshold is how many exhausted pairs open a fingerprint's breaker.
	// Default 3; -1 disables the breaker.
	Threshold int
	// Window is how recent those exhaustions must be. Default 1 min.
	Window time.Duration
	// ProbeInterval is how often an open breaker lets one pair be retried
	// in full. Default 30 s.
	ProbeInterval time.Duration
	// RetrySlots is how many pairs of one fingerprint are retried at a
	// time while its breaker is closed (breaker.lead); the others wait.
	// Default DefaultBreakerRetrySlots, or Threshold when larger (no fewer:
	// the breaker opens on Threshold exhaustions); -1: no slots, every
	// pair is retried on its own.
	RetrySlots int
}

// Defaults for BreakerConfig.
const (
	DefaultBreakerThreshold     = 3
	DefaultBreakerWindow        = time.Minute
	DefaultBreakerProbeInterval = 30 * time.Second
	// DefaultBreakerRetrySlots: enough pairs that the Threshold-th
	// exhaustion, which opens the breaker, comes early (the third fastest
	// of 32 jittered schedules of the default policy comes about 1.4
	// standard deviations, 1.5 s, before their mean of 6.2 s; the slowest
	// of 3 about 0.9 s after it, and meanwhile the waiting pairs fill the
	// retry sets), few enough that their retries cost PostgreSQL little
	// (160 statements).
	DefaultBreakerRetrySlots = 32
)

// Validate fills in defaults and returns an error naming the first invalid
// field.
func (c *BreakerConfig) Validate() error {
	if c.Threshold == 0 {
		c.Threshold = DefaultBreakerThreshold
	}
	if c.Window == 0 {
		c.Window = DefaultBreakerWindow
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultBreakerProbeInterval
	}
	c.defaultRetrySlots()
	switch {
	case c.RetrySlots < -1 || c.RetrySlots >= 0 && c.RetrySlots < c.Threshold:
		return fmt.Errorf("breaker retry slots must be at least the threshold (%d), or -1 for none, got %d", c.Threshold, c.RetrySlots)
	case c.Threshold < -1:
		return fmt.Errorf("breaker threshold must be >= 1, or -1 to disable the breaker, got %d", c.Threshold)
	case c.Window < 0:
		return fmt.Errorf("breaker window must be > 0, got %s", c.Window)
	case c.ProbeInterval < 0:
		return fmt.Errorf("breaker probe interval must be > 0, got %s", c.ProbeInterval)
	}
	return nil
}

// breaker is the worker's fingerprint breaker, shared by its partitions.
// It is safe for concurrent use.
type breaker struct {
	cfg BreakerConfig
	now func() time.Time
	// onChange is called, outside the lock, when a fingerprint's breaker
	// opens (open true, n the exhaustions in the window) or closes (why
	// says how: closedByProbe or closedQuiet; n the pairs dead-lettered at
	// once while it was open, counted by shortCircuited).
	onChange func(fingerprint string, open bool, n int, why string)

	mu sync.Mutex
	fp map[string]*fingerprintState
	// openings counts the times a breaker opened; partitions compare it
	// with what they saw to find waiting pairs to dead-letter now.
	openings atomic.Uint64
	// slots holds, by fingerprint, the retry slots taken (lead): at most
	// RetrySlots pairs of one fingerprint are retried at a time while its
	// breaker is closed; the others wait (retryPair.follow).
	slots  map[string][]retrySlot
	lastID uint64
	// releases counts the times a success released a fingerprint's
	// waiting pairs (succeeded); partitions compare it with what they saw.
	releases atomic.Uint64
	// onRelease, when not nil, is called after a release, outside the
	// lock (the worker wakes its partitions).
	onRelease func()
}

// retrySlot is a retry slot of a fingerprint, taken by one pair until it
// leaves the retry set (unlead) or until expires, whichever comes first.
type retrySlot struct {
	id      uint64
	expires time.Time
}

type fingerprintState struct {
	exhausted  []time.Time // within the window, oldest first
	open       bool
	probing    bool      // a probe pair is being retried
	lastProbe  time.Time // when the last probe started
	lastFailed time.Time // when a pair last failed with it (admit, exhausted)
	// shortCircuited counts the pairs dead-lettered at once (their
	// dead letters acknowledged) while the breaker was open.
	shortCircuited int
}

// How a breaker closed (onChange's why).
const (
	closedByProbe = "a probe pair with this fingerprint was applied"
	closedQuiet   = "no pair failed with this fingerprint for a breaker window"
)

func newBreaker(cfg BreakerConfig, onChange func(fingerprint string, open bool, exhausted int, why string)) *breaker {
	if onChange == nil {
		onChange = func(string, bool, int, string) {}
	}
	cfg.defaultRetrySlots() // not validated (tests)
	return &breaker{cfg: cfg, now: time.Now, onChange: onChange, fp: make(map[string]*fingerprintState), slots: map[string][]retrySlot{}}
}

// lead asks for a retry slot of fingerprint fp for a pair whose first
// attempt failed with it, to hold until it leaves the retry set or until
// expires (a bound for a pair that left unseen). It returns the slot's id
// (not 0) and true when the pair is to be retried now as usual: fewer than
// RetrySlots pairs of fp hold a slot. It returns 0 and true without a slot
// when no slot is needed: the breaker or its slots are disabled, or fp's
// breaker is open
// (the pair's own path then dead-letters it or probes). It returns 0 and
// false when the pair is to wait (retryPair.follow): until a slot frees
// (ask again at holdUntil), until a pair of fp is applied (succeeded
// releases every waiting pair) or until fp's breaker opens (the waiting
// pairs are dead-lettered at once). So a cause that fails every pair of a
// fingerprint costs RetrySlots pairs' retries before the breaker opens,
// not every pair's.
func (b *breaker) lead(fp string, expires time.Time) (uint64, bool) {
	if b.cfg.Threshold < 0 || b.cfg.RetrySlots < 0 {
		return 0, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.fp[fp]; st != nil && st.open {
		return 0, true
	}
	now := b.now()
	held := slices.DeleteFunc(b.slots[fp], func(s retrySlot) bool { return !now.Before(s.expires) })
	if len(held) >= b.cfg.RetrySlots {
		b.slots[fp] = held
		return 0, false
	}
	if len(b.slots) >= maxTrackedFingerprints && b.slots[fp] == nil {
		for f, ss := range b.slots { // forget the expired
			if ss = slices.DeleteFunc(ss, func(s retrySlot) bool { return !now.Before(s.expires) }); len(ss) == 0 {
				delete(b.slots, f)
			} else {
				b.slots[f] = ss
			}
		}
	}
	b.lastID++
	b.slots[fp] = append(held, retrySlot{id: b.lastID, expires: expires})
	return b.lastID, true
}

// holdUntil returns when the first slot of fp expires: when a waiting pair
// of fp asks for a slot again. It is the zero time when none is held.
func (b *breaker) holdUntil(fp string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for _, s := range b.slots[fp] {
		if first.IsZero() || s.expires.Before(first) {
			first = s.expires
		}
	}
	return first
}

// unlead frees fp's slot id (0: none), taken by lead.
func (b *breaker) unlead(fp string, id uint64) {
	if id == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ss := slices.DeleteFunc(b.slots[fp], func(s retrySlot) bool { return s.id == id })
	if len(ss) == 0 {
		delete(b.slots, fp)
		return
	}
	b.slots[fp] = ss
}

// waiting reports whether a pair of fp that waits for a slot is to wait
// on: fp's slots are not all free and fp's breaker is closed.
func (b *breaker) waiting(fp string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.fp[fp]
	return len(b.slots[fp]) > 0 && (st == nil || !st.open)
}

// defaultRetrySlots fills in RetrySlots when unset: DefaultBreakerRetrySlots,
// or Threshold when larger.
func (c *BreakerConfig) defaultRetrySlots() {
	if c.RetrySlots == 0 {
		c.RetrySlots = max(DefaultBreakerRetrySlots, c.Threshold)
	}
}

// errShortCircuit is returned by admit for a pair to dead-letter at once.
var errShortCircuit = errors.New("breaker open")

// admit is asked when a pair first fails with a retriable error of
// fingerprint fp. It returns nil and probe false when the pair is to be
// retried as usual; nil and probe true when the breaker is open and this
// pair is its half-open probe (report its end with probeDone); and
// errShortCircuit when the breaker is open and the pair is to be
// dead-lettered at once.
func (b *breaker) admit(fp string) (probe bool, err error) {
	if b.cfg.Threshold < 0 {
		return false, nil
	}
	b.mu.Lock()
	st := b.fp[fp]
	if st == nil || !st.open {
		b.mu.Unlock()
		return false, nil
	}
	now := b.now()
	if b.quiet(st, now) {
		// The first failure after a quiet window: a new incident, retried.
		delete(b.fp, fp)
		b.mu.Unlock()
		b.onChange(fp, false, st.shortCircuited, closedQuiet)
		return false, nil
	}
	defer b.mu.Unlock()
	st.lastFailed = now
	if !st.probing && now.Sub(st.lastProbe) >= b.cfg.ProbeInterval {
		st.probing, st.lastProbe = true, now
		return true, nil
	}
	return false, errShortCircuit
}

// exhausted records a pair of fingerprint fp that ran out of retries (probe
// says whether it was the breaker's probe). It opens the breaker once
// Threshold exhaustions fall within Window, and then returns true and the
// exhaustions within Window.
func (b *breaker) exhausted(fp string, probe bool) (opened bool, n int) {
	if b.cfg.Threshold < 0 {
		return false, 0
	}
	b.mu.Lock()
	st := b.fp[fp]
	if st == nil {
		st = &fingerprintState{}
		b.fp[fp] = st
	}
	if probe {
		st.probing = false
	}
	now := b.now()
	st.lastFailed = now
	st.exhausted = append(st.exhausted, now)
	for len(st.exhausted) > 0 && now.Sub(st.exhausted[0]) > b.cfg.Window {
		st.exhausted = st.exhausted[1:]
	}
	if len(b.fp) > maxTrackedFingerprints {
		b.forgetQuiet(now)
	}
	opened = !st.open && len(st.exhausted) >= b.cfg.Threshold
	if opened {
		st.open, st.lastProbe = true, now
		delete(b.slots, fp) // its waiting pairs are dead-lettered
		b.openings.Add(1)
	}
	n = len(st.exhausted)
	b.mu.Unlock()
	if opened {
		b.onChange(fp, true, n, "")
	}
	return opened, n
}

// quiet reports whether the open breaker st has seen no failure for a
// window and no probe is under way. b.mu is held.
func (b *breaker) quiet(st *fingerprintState, now time.Time) bool {
	return st.open && !st.probing && now.Sub(st.lastFailed) >= b.cfg.Window
}

// closeQuiet closes every open breaker that has seen no failure of its
// fingerprint for a window (and has no probe under way). The worker calls
// it periodically, so that the open-breakers gauge tells the truth while
// nothing fails.
func (b *breaker) closeQuiet() {
	if b.cfg.Threshold < 0 {
		return
	}
	b.mu.Lock()
	now := b.now()
	closed := map[string]int{} // fingerprint → its pairs short-circuited
	for fp, st := range b.fp {
		if b.quiet(st, now) {
			delete(b.fp, fp)
			closed[fp] = st.shortCircuited
		}
	}
	b.mu.Unlock()
	for fp, n := range closed {
		b.onChange(fp, false, n, closedQuiet)
	}
}

// maxTrackedFingerprints bounds the closed fingerprints the breaker keeps
// before it forgets those with no exhaustion within the window.
const maxTrackedFingerprints = 1024

// forgetQuiet drops the closed fingerprints with no exhaustion within the
// window. b.mu is held.
func (b *breaker) forgetQuiet(now time.Time) {
	for fp, st := range b.fp {
		if !st.open && (len(st.exhausted) == 0 || now.Sub(st.exhausted[len(st.exhausted)-1]) > b.cfg.Window) {
			delete(b.fp, fp)
		}
	}
}

// succeeded records that a retried pair of fingerprint fp was applied. The
// success of the breaker's probe closes it; any success forgets the
// fingerprint's exhaustions and frees its retry slots, releasing the pairs
// that wait for one (lead): the cause may be fixed.
func (b *breaker) succeeded(fp string, probe bool) {
	if b.cfg.Threshold < 0 {
		return
	}
	b.mu.Lock()
	st := b.fp[fp]
	closed := st != nil && st.open && probe
	short := 0
	if closed {
		short = st.shortCircuited
	}
	if st != nil && (!st.open || probe) {
		delete(b.fp, fp)
	}
	_, released := b.slots[fp]
	if released {
		delete(b.slots, fp)
		b.releases.Add(1)
	}
	b.mu.Unlock()
	if released && b.onRelease != nil {
		b.onRelease()
	}
	if closed {
		b.onChange(fp, false, short, closedByProbe)
	}
}

// shortCircuited counts a pair of fingerprint fp that an open breaker
// dead-lettered at once, for the line that says it closed.
func (b *breaker) shortCircuited(fp string) {
	b.mu.Lock()
	if st := b.fp[fp]; st != nil && st.open {
		st.shortCircuited++
	}
	b.mu.Unlock()
}

// cancelled records that a probe pair ended without an outcome (revoke or
// shutdown), so that another pair may probe. The probe was failing until
// then, as far as anyone knows: the quiet window starts now.
func (b *breaker) cancelled(fp string) {
	b.mu.Lock()
	if st := b.fp[fp]; st != nil {
		st.probing = false
		st.lastFailed = b.now()
	}
	b.mu.Unlock()
}

// left records that p left the retry set without an outcome for its
// fingerprint (revoke, shutdown, a record delivered again, a permanent
// error): its probe and retry slot are free for another pair.
func (b *breaker) left(p *retryPair) {
	if p.probe {
		b.cancelled(p.fp)
	}
	b.unlead(p.fp, p.slot)
	p.slot = 0
}

// isOpen reports whether fp's breaker is open.
func (b *breaker) isOpen(fp string) bool {
	if b.cfg.Threshold < 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.fp[fp]
	return st != nil && st.open
}

// open returns the number of fingerprints whose breaker is open.
func (b *breaker) open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, st := range b.fp {
		if st.open {
			n++
		}
	}
	return n
}
