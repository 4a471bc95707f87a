package dlq_test

import (
	"testing"
	"time"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
)

// TestReplayLockOneRunAtATime: while one run holds a ledger topic's replay
// lock, another waits (its waiting callback says so after 2 s) and gets
// the lock as soon as the first releases it; the first's Context ends on
// release. On kfake and on the real broker (KAFKA_BROKERS).
func TestReplayLockOneRunAtATime(t *testing.T) {
	b := kafkatest.New(t)
	ledger := kafkatest.TopicName(t, "ledger")
	b.CreateTopic(t, ledger, 1, nil)
	ctx := testCtx(t)
	first, err := dlq.LockReplays(ctx, b.Opts(), ledger, nil)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	type result struct {
		l   *dlq.ReplayLock
		err error
	}
	second := make(chan result, 1)
	go func() {
		l, err := dlq.LockReplays(ctx, b.Opts(), ledger, func() { close(waited) })
		second <- result{l, err}
	}()
	select {
	case <-waited: // 2 s without the lock: the first holds it
	case r := <-second:
		t.Fatalf("a second run took the replay lock while the first held it (err %v)", r.err)
	}
	first.Release()
	if first.Context().Err() == nil {
		t.Error("the released lock's Context has not ended")
	}
	select {
	case r := <-second:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Context().Err() != nil {
			t.Errorf("the second run's lock Context ended: %v", r.l.Context().Err())
		}
		r.l.Release()
	case <-time.After(45 * time.Second):
		t.Fatal("the second run did not get the replay lock within 45 s of the first releasing it")
	}
}
