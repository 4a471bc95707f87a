// Package topicready waits for newly created Kafka topics to be usable.
package topicready

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/causet/projection-worker/retry"
)

// Wait waits until every topic is listed by the broker with a leader
// for each partition: a real broker answers UNKNOWN_TOPIC_OR_PARTITION for a
// short while after CreateTopics returns, and clients that produce at once
// can give up. It polls every 50 ms (growing to 500 ms) and returns ctx's
// error, naming the topics still missing, when ctx ends first.
func Wait(ctx context.Context, adm *kadm.Client, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	// Polled until ctx ends: 50 ms, doubling to 500 ms, no jitter.
	poll := retry.Policy{Initial: 50 * time.Millisecond, Multiplier: 2, MaxInterval: 500 * time.Millisecond, MaxRetries: math.MaxInt}
	var missing []string
	_, err := poll.Do(ctx, func(ctx context.Context) error {
		details, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), topics...)
		missing = missing[:0]
		for _, t := range topics {
			d, ok := details[t]
			if err != nil || !ok || d.Err != nil || len(d.Partitions) == 0 {
				missing = append(missing, t)
				continue
			}
			for _, p := range d.Partitions {
				if p.Err != nil || p.Leader < 0 {
					missing = append(missing, t)
					break
				}
			}
		}
		if len(missing) > 0 {
			return errNotReady
		}
		return nil
	}, nil)
	if err != nil {
		return fmt.Errorf("topics %v not ready: %w", missing, ctx.Err())
	}
	return nil
}

// errNotReady is a lookup that found a topic missing or without leaders.
var errNotReady = errors.New("topics not ready")
