package soak

import (
	"testing"
	"time"
)

// TestKafkaSoakRecoveryCountsAChainOfFaultsOnce: faults that follow each
// other before the group is ready again recover once, from the last
// one's end; a fault the workers recover from before the next one counts
// on its own; a fault never recovered from is not counted.
func TestKafkaSoakRecoveryCountsAChainOfFaultsOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	starts := []time.Time{at(0), at(10), at(20), at(100)}
	ends := []kafkaSoakEvent{{at(1), "sigkill"}, {at(11), "sigterm"}, {at(21), "sigkill"}, {at(101), "broker-restart"}}
	samples := []kafkaSoakEvent{
		{at(2), "w1 not ready"}, {at(30), "w2 not ready"}, {at(66), "ready"}, // the chain 0–21 recovers at 66: 45 s after 21
		{at(102), "not ready"}, {at(110), "ready"}, // 9 s after 101
	}
	got, after := kafkaSoakRecovery(starts, ends, samples)
	if got != 45*time.Second || after != "sigkill" {
		t.Errorf("recovery %s after %q, want 45s after the chain's last sigkill", got, after)
	}
	// Without the chain's last fault the recovery counts from the one before.
	got, after = kafkaSoakRecovery(starts[:2], ends[:2], samples[:3])
	if got != 55*time.Second || after != "sigterm" {
		t.Errorf("recovery %s after %q, want 55s after the sigterm", got, after)
	}
	// Never ready again: nothing to count.
	if got, _ := kafkaSoakRecovery(starts[:1], ends[:1], samples[:2]); got != 0 {
		t.Errorf("recovery %s with no ready sample, want 0", got)
	}
}
