package projection

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/causet/projection-worker/retry"
)

// fakeClock is a settable clock for the breaker.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClockedBreaker(cfg BreakerConfig) (*breaker, *fakeClock, *[]string) {
	var changes []string
	b := newBreaker(cfg, func(fp string, open bool, _ int, _ string) {
		if open {
			changes = append(changes, "open "+fp)
		} else {
			changes = append(changes, "close "+fp)
		}
	})
	c := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	b.now = c.now
	return b, c, &changes
}

func TestBreakerOpensAfterThresholdWithinWindow(t *testing.T) {
	cfg := BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second}
	b, clock, changes := newClockedBreaker(cfg)
	for range 2 {
		b.exhausted("fp", false)
		clock.add(10 * time.Second)
	}
	if _, err := b.admit("fp"); err != nil {
		t.Fatalf("admit after 2 exhaustions = %v, want retried", err)
	}
	clock.add(time.Minute) // the first two fall out of the window
	b.exhausted("fp", false)
	if _, err := b.admit("fp"); err != nil {
		t.Fatalf("admit after exhaustions spread over more than the window = %v, want retried", err)
	}
	b.exhausted("fp", false)
	b.exhausted("fp", false)
	if _, err := b.admit("fp"); err != errShortCircuit {
		t.Fatalf("admit after 3 exhaustions within the window = %v, want short-circuit", err)
	}
	if _, err := b.admit("other"); err != nil {
		t.Errorf("another fingerprint = %v, want retried", err)
	}
	if got := b.open(); got != 1 {
		t.Errorf("open breakers = %d, want 1", got)
	}
	if len(*changes) != 1 || (*changes)[0] != "open fp" {
		t.Errorf("changes = %v, want [open fp]", *changes)
	}
}

func TestBreakerHalfOpenProbeClosesOnSuccess(t *testing.T) {
	cfg := BreakerConfig{Threshold: 1, Window: time.Minute, ProbeInterval: 30 * time.Second}
	b, clock, changes := newClockedBreaker(cfg)
	b.exhausted("fp", false)
	if _, err := b.admit("fp"); err != errShortCircuit {
		t.Fatalf("admit right after opening = %v, want short-circuit", err)
	}
	clock.add(30 * time.Second)
	probe, err := b.admit("fp")
	if err != nil || !probe {
		t.Fatalf("admit after the probe interval = %v probe %v, want the probe", err, probe)
	}
	if _, err := b.admit("fp"); err != errShortCircuit {
		t.Errorf("admit while the probe runs = %v, want short-circuit", err)
	}
	b.exhausted("fp", true) // the probe failed: still open, next probe an interval later
	clock.add(10 * time.Second)
	if _, err := b.admit("fp"); err != errShortCircuit {
		t.Errorf("admit 10 s after a failed probe = %v, want short-circuit", err)
	}
	clock.add(30 * time.Second)
	if probe, err := b.admit("fp"); err != nil || !probe {
		t.Fatalf("second probe = %v probe %v", err, probe)
	}
	b.succeeded("fp", true)
	if _, err := b.admit("fp"); err != nil {
		t.Errorf("admit after a successful probe = %v, want closed", err)
	}
	if got := *changes; len(got) != 2 || got[1] != "close fp" {
		t.Errorf("changes = %v, want [open fp, close fp]", got)
	}
}

func TestBreakerCancelledProbeLetsAnotherProbe(t *testing.T) {
	b, clock, _ := newClockedBreaker(BreakerConfig{Threshold: 1, Window: time.Minute, ProbeInterval: time.Second})
	b.exhausted("fp", false)
	clock.add(time.Second)
	if probe, _ := b.admit("fp"); !probe {
		t.Fatal("want a probe")
	}
	b.cancelled("fp")
	clock.add(time.Second)
	if probe, err := b.admit("fp"); err != nil || !probe {
		t.Errorf("admit after a cancelled probe = %v probe %v, want a new probe", err, probe)
	}
}

func TestBreakerDisabled(t *testing.T) {
	b, _, _ := newClockedBreaker(BreakerConfig{Threshold: -1})
	for range 10 {
		b.exhausted("fp", false)
	}
	if _, err := b.admit("fp"); err != nil {
		t.Errorf("disabled breaker admit = %v", err)
	}
}

func TestBreakerConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  BreakerConfig
		want BreakerConfig
		ok   bool
	}{
		{"defaults", BreakerConfig{}, BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second, RetrySlots: 32}, true},
		{"disabled", BreakerConfig{Threshold: -1}, BreakerConfig{Threshold: -1, Window: time.Minute, ProbeInterval: 30 * time.Second, RetrySlots: 32}, true},
		{"slots at least the threshold", BreakerConfig{Threshold: 50}, BreakerConfig{Threshold: 50, Window: time.Minute, ProbeInterval: 30 * time.Second, RetrySlots: 50}, true},
		{"no slots", BreakerConfig{RetrySlots: -1}, BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second, RetrySlots: -1}, true},
		{"fewer slots than the threshold", BreakerConfig{Threshold: 5, RetrySlots: 3}, BreakerConfig{}, false},
		{"bad slots", BreakerConfig{RetrySlots: -2}, BreakerConfig{}, false},
		{"bad threshold", BreakerConfig{Threshold: -2}, BreakerConfig{}, false},
		{"bad window", BreakerConfig{Window: -time.Second}, BreakerConfig{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok %v", err, tt.ok)
			}
			if tt.ok && tt.cfg != tt.want {
				t.Errorf("after Validate = %+v, want %+v", tt.cfg, tt.want)
			}
		})
	}
}

// TestBreakerClosesAfterAQuietWindow: an open breaker that sees no failure
// of its fingerprint for a window closes (the cause was fixed: a later
// incident gets its retries again), lazily at the next failure or when the
// worker sweeps; a failure within the window keeps it open, and so does a
// probe under way.
func TestBreakerClosesAfterAQuietWindow(t *testing.T) {
	cfg := BreakerConfig{Threshold: 1, Window: time.Minute, ProbeInterval: 30 * time.Second}
	b, clock, changes := newClockedBreaker(cfg)
	b.exhausted("fp", false) // opens
	clock.add(50 * time.Second)
	if probe, err := b.admit("fp"); err != nil || !probe {
		t.Fatalf("admit 50 s later = %v, %v; want the probe", probe, err)
	}
	clock.add(2 * time.Minute)
	b.closeQuiet()
	if !b.isOpen("fp") {
		t.Fatal("the breaker closed while its probe was under way")
	}
	b.cancelled("fp") // the quiet window starts now
	clock.add(30 * time.Second)
	if _, err := b.admit("fp"); err != nil {
		t.Fatalf("admit 30 s after the cancelled probe = %v, want the next probe", err)
	}
	if _, err := b.admit("fp"); err != errShortCircuit {
		t.Fatalf("admit during the probe = %v, want short-circuit", err)
	}
	b.cancelled("fp")
	clock.add(59 * time.Second)
	b.closeQuiet()
	if !b.isOpen("fp") {
		t.Fatal("closed 59 s after the last failure, want open for a window")
	}
	clock.add(time.Second)
	b.closeQuiet()
	if b.isOpen("fp") || b.open() != 0 {
		t.Fatal("open a window after the last failure, want closed")
	}
	// Opened again, then the next failure comes after a quiet window: it
	// is retried (a new incident), and the breaker is closed.
	b.exhausted("fp", false)
	clock.add(2 * time.Minute)
	if probe, err := b.admit("fp"); err != nil || probe {
		t.Fatalf("admit after a quiet window = %v, %v; want retried as usual", probe, err)
	}
	if b.isOpen("fp") {
		t.Error("still open after a failure that followed a quiet window")
	}
	want := []string{"open fp", "close fp", "open fp", "close fp"}
	if len(*changes) != len(want) {
		t.Fatalf("changes = %v, want %v", *changes, want)
	}
	for i := range want {
		if (*changes)[i] != want[i] {
			t.Errorf("changes = %v, want %v", *changes, want)
			break
		}
	}
}

// TestBreakerRetrySlots: at most RetrySlots pairs of one fingerprint hold
// a retry slot; a slot frees when its pair leaves (unlead) or expires; a
// success frees them all and counts a release; an open breaker drops them
// and lets every pair through without one; a disabled breaker, or
// RetrySlots -1, never makes a pair wait.
func TestBreakerRetrySlots(t *testing.T) {
	cfg := BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second, RetrySlots: 3}
	b, clock, _ := newClockedBreaker(cfg)
	expires := clock.now().Add(20 * time.Second)
	var ids []uint64
	for i := range 3 {
		id, ok := b.lead("fp", expires.Add(time.Duration(i)*time.Second))
		if !ok || id == 0 {
			t.Fatalf("lead %d = %d, %v; want a slot", i+1, id, ok)
		}
		ids = append(ids, id)
	}
	if id, ok := b.lead("fp", expires); ok || id != 0 {
		t.Fatalf("a 4th pair of fp: lead = %d, %v; want to wait", id, ok)
	}
	if !b.waiting("fp") {
		t.Error("waiting(fp) = false with its slots held")
	}
	if got, want := b.holdUntil("fp"), expires; !got.Equal(want) {
		t.Errorf("holdUntil = %s, want the first expiry %s", got, want)
	}
	if _, ok := b.lead("other", expires); !ok {
		t.Error("another fingerprint waits for fp's slots")
	}
	b.unlead("fp", ids[1])
	id, ok := b.lead("fp", expires)
	if !ok {
		t.Fatal("no slot after one was freed")
	}
	if _, ok := b.lead("fp", expires); ok {
		t.Fatal("a 4th slot after one was freed and taken again")
	}
	clock.add(20 * time.Second) // the slots expiring at expires have expired
	if _, ok := b.lead("fp", clock.now().Add(time.Minute)); !ok {
		t.Fatal("no slot once the first ones expired")
	}
	b.unlead("fp", id)

	before := b.releases.Load()
	b.succeeded("fp", false)
	if b.releases.Load() != before+1 || b.waiting("fp") {
		t.Errorf("after a success: releases %d (was %d), waiting %v; want one more and no slot held", b.releases.Load(), before, b.waiting("fp"))
	}
	for range 3 {
		b.lead("fp", clock.now().Add(time.Minute))
	}
	for range 3 {
		b.exhausted("fp", false)
	}
	if !b.isOpen("fp") {
		t.Fatal("breaker not open after 3 exhaustions")
	}
	if id, ok := b.lead("fp", clock.now().Add(time.Minute)); !ok || id != 0 || b.waiting("fp") {
		t.Errorf("open breaker: lead = %d, %v, waiting %v; want through without a slot", id, ok, b.waiting("fp"))
	}

	for _, cfg := range []BreakerConfig{{Threshold: -1}, {Threshold: 3, RetrySlots: -1}} {
		off, _, _ := newClockedBreaker(cfg)
		for i := range 10 {
			if id, ok := off.lead("fp", clock.now().Add(time.Minute)); !ok || id != 0 {
				t.Fatalf("%+v: lead %d = %d, %v; want through without a slot", cfg, i+1, id, ok)
			}
		}
	}
}

// TestReadmeStatesTheRetrySlots: the README's "Retry slots" paragraph
// gives the default number of slots and how long a slot is held at most,
// from the constants the worker uses.
func TestReadmeStatesTheRetrySlots(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	term := retry.DefaultPolicy().Longest() + slotSlack
	for _, want := range []string{
		fmt.Sprintf("at most %d of its pairs (or `--breaker-threshold`, if larger)", DefaultBreakerRetrySlots),
		fmt.Sprintf("plus %s: %.1f s with the defaults", strings.TrimSuffix(slotSlack.String(), "s")+" s", term.Seconds()),
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}

// TestBreakerClosingCountsTheShortCircuitedPairs: the close of a breaker
// reports the pairs it dead-lettered at once while open (the worker's
// "breaker closed" line), each incident its own; a count for a
// fingerprint whose breaker is closed is dropped.
func TestBreakerClosingCountsTheShortCircuitedPairs(t *testing.T) {
	var closes []string
	b := newBreaker(BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second}, func(fp string, open bool, n int, why string) {
		if !open {
			closes = append(closes, fmt.Sprintf("%s %d %s", fp, n, why))
		}
	})
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	b.now = clock.now
	open := func() {
		for range 3 {
			b.exhausted("fp", false)
		}
	}
	b.shortCircuited("fp") // closed: not counted
	open()
	for range 4 {
		b.shortCircuited("fp")
	}
	b.shortCircuited("other")
	clock.add(30 * time.Second)
	if probe, err := b.admit("fp"); !probe || err != nil {
		t.Fatalf("admit after the probe interval = %v, %v; want a probe", probe, err)
	}
	b.succeeded("fp", true)
	open()
	b.shortCircuited("fp")
	clock.add(2 * time.Minute)
	b.closeQuiet()
	want := []string{"fp 4 " + closedByProbe, "fp 1 " + closedQuiet}
	if strings.Join(closes, "|") != strings.Join(want, "|") {
		t.Errorf("closes %q, want %q", closes, want)
	}
}
