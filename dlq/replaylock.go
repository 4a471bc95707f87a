package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrReplayLockReleased is the cause of a ReplayLock's Context after
// Release.
var ErrReplayLockReleased = errors.New("replay lock released")

// ReplayLockGroup returns the consumer group that LockReplays uses for
// ledgerTopic: "<ledgerTopic>.replay-lock".
func ReplayLockGroup(ledgerTopic string) string { return ledgerTopic + ".replay-lock" }

// replayLockSession is the lock group's session timeout: how long a run
// that died without leaving the group (kill -9, a lost node) keeps the lock.
const replayLockSession = 10 * time.Second

// ReplayLock is the right of one run at a time to write replay decisions
// to a ledger topic (LockReplays). Its Context ends when the lock is lost.
type ReplayLock struct {
	cl     *kgo.Client
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// LockReplays waits until this process holds the replay lock of
// ledgerTopic, and returns it; Release it when the run is done. Two runs
// that write decisions at once (retry, skip) would each read the ledger
// before the other wrote it, and both send an entry (day-2 trial: 12 dead
// letters, 24 events): the ledger keeps reruns apart, not concurrent runs.
//
// The lock is a consumer group, ReplayLockGroup(ledgerTopic), on the
// ledger topic (which exists: open the ledger first, or it is created
// here by nobody and the wait never ends), with a sticky balancer: the
// member assigned the topic's partition 0 holds it, and keeps it while
// other runs join; it passes on when its holder leaves the group
// (Release), or replayLockSession (10 s) after a holder that died. The
// group never fetches and never commits. waiting, when not nil, is called
// once if the lock is not held after 2 s (another run holds it).
//
// It returns an error when the client cannot be built, or ctx's error when
// ctx ends first.
func LockReplays(ctx context.Context, opts []kgo.Opt, ledgerTopic string, waiting func()) (*ReplayLock, error) {
	acquired := make(chan struct{})
	var once sync.Once
	lctx, cancel := context.WithCancelCause(context.Background())
	has0 := func(m map[string][]int32) bool { return slices.Contains(m[ledgerTopic], 0) }
	cl, err := kgo.NewClient(append(slices.Clone(opts),
		kgo.ConsumerGroup(ReplayLockGroup(ledgerTopic)),
		kgo.ConsumeTopics(ledgerTopic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(replayLockSession),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if has0(m) {
				once.Do(func() { close(acquired) })
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if has0(m) {
				cancel(fmt.Errorf("replay lock of %s lost: partition 0 of its group revoked", ledgerTopic))
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if has0(m) {
				cancel(fmt.Errorf("replay lock of %s lost: the group session ended", ledgerTopic))
			}
		}),
	)...)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("replay lock: kafka client: %w", err)
	}
	cl.PauseFetchTopics(ledgerTopic) // the group is the lock; the ledger is read elsewhere
	l := &ReplayLock{cl: cl, ctx: lctx, cancel: cancel}
	slow := time.NewTimer(2 * time.Second)
	defer slow.Stop()
	for {
		select {
		case <-acquired:
			return l, nil
		case <-slow.C:
			if waiting != nil {
				waiting()
			}
		case <-ctx.Done():
			l.Release()
			return nil, ctx.Err()
		}
	}
}

// Context returns a context that ends, with the cause
// (context.Cause), when the lock is lost (its group session ended or
// partition 0 was taken away) or released (ErrReplayLockReleased).
func (l *ReplayLock) Context() context.Context { return l.ctx }

// Release leaves the lock group, so that the next run takes the lock at
// once, and closes the client.
func (l *ReplayLock) Release() {
	l.cancel(ErrReplayLockReleased)
	l.cl.Close() // leaves the group (a dynamic member)
}
