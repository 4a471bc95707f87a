// Package topicready waits for newly created Kafka topics to be usable.
package topicready

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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
	wait := 50 * time.Millisecond
	for {
		details, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), topics...)
		var missing []string
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
		if len(missing) == 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("topics %v not ready: %w", missing, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
