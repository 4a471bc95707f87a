package projection_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/projection"
)

// TestShutdownWhileTheGroupWaitsForACrashedMember: a worker stopped while
// its group's join waits for a member that crashed (its session not yet
// timed out) commits and leaves the group within its grace, where the
// client alone waits for the join (operator trial: SIGTERM 3 s after a
// member was killed and another started ran out of its 25 s grace,
// committed nothing, and its partitions were unread for 86 s). The crashed
// member is a static one that closed (a static member does not leave);
// the join starts when a second worker joins. The records the stopped
// worker applied after its last commit are committed: the second worker
// re-applies none of them.
func TestShutdownWhileTheGroupWaitsForACrashedMember(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 4})
	first := r.start(func(c *projection.Config) {
		c.ShutdownGrace = 15 * time.Second
		c.CommitInterval = time.Hour // only the shutdown commits
	})
	r.produce("joined", []byte(r.follow("joined", "artist-1", 1)))
	waitFor(t, "the first worker to join and apply a record", func() bool { return r.count("artist_followers") == 1 })
	assigned := make(chan struct{}, 1)
	crashed := r.broker.Client(t, kgo.ConsumerGroup(r.group), kgo.ConsumeTopics(r.topic), kgo.InstanceID("crashed"),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(45*time.Second),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			select {
			case assigned <- struct{}{}:
			default:
			}
		}))
	go func() {
		for ctx := context.Background(); ; {
			if f := crashed.PollFetches(ctx); f.IsClientClosed() {
				return
			}
		}
	}()
	select {
	case <-assigned:
	case <-time.After(testTimeout):
		t.Fatal("the member to crash was assigned no partition")
	}
	const n = 40
	for i := range n {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	crashed.Close() // static: no LeaveGroup, its session runs on
	waitFor(t, "the first worker to apply the records of its partitions", func() bool { return r.count("artist_followers") > 1 })

	r.start(nil) // its join starts the group's, which waits for the crashed member
	adm := kadm.NewClient(r.broker.Client(t))
	waitFor(t, "the group to rebalance", func() bool {
		groups, err := adm.DescribeGroups(context.Background(), r.group)
		return err == nil && groups[r.group].State == "PreparingRebalance"
	})
	time.Sleep(4 * time.Second) // a heartbeat interval (3 s): the first worker is in the join
	applied := r.count("artist_followers")

	err := first.stop(t)
	if err != nil {
		t.Errorf("Run = %v, want the shutdown to commit and leave within its grace", err)
	}
	groups, derr := adm.DescribeGroups(context.Background(), r.group)
	if derr != nil {
		t.Fatal(derr)
	}
	if members := groups[r.group].Members; len(members) > 2 {
		ids := make([]string, 0, len(members))
		for _, m := range members {
			ids = append(ids, m.MemberID)
		}
		slices.Sort(ids)
		t.Errorf("group members after the first worker stopped: %v, want the crashed one and the second worker", ids)
	}
	offsets, ferr := adm.FetchOffsets(context.Background(), r.group)
	if ferr != nil {
		t.Fatal(ferr)
	}
	committed := int64(0)
	offsets.Each(func(o kadm.OffsetResponse) {
		if o.Topic == r.topic && o.Err == nil {
			committed += o.At
		}
	})
	if committed < int64(applied) {
		t.Errorf("%d records committed after the first worker applied %d: its shutdown did not commit them", committed, applied)
	}
}
