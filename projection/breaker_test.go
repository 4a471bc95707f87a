package projection

import (
	"testing"
	"time"
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
		{"defaults", BreakerConfig{}, BreakerConfig{Threshold: 3, Window: time.Minute, ProbeInterval: 30 * time.Second}, true},
		{"disabled", BreakerConfig{Threshold: -1}, BreakerConfig{Threshold: -1, Window: time.Minute, ProbeInterval: 30 * time.Second}, true},
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
