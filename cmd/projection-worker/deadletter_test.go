package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestRunReportsStuckWhenTheDeadLetterTopicNeverAcknowledges: a dead-letter
// topic that keeps answering a retriable error, or a broker that never
// answers, must not stall the partition silently (kgo retries both without
// limit): within the bound of --dlq-write-timeout (5 attempts of it plus
// the backoff waits) /readyz answers 503 naming the stuck partition, and
// SIGTERM still stops the worker.
func TestRunReportsStuckWhenTheDeadLetterTopicNeverAcknowledges(t *testing.T) {
	tests := []struct {
		name  string
		fault func(b *kafkatest.Broker)
	}{
		{"NOT_LEADER_FOR_PARTITION forever", func(b *kafkatest.Broker) {
			b.RefuseProduce(t, "", kerr.NotLeaderForPartition.Code, func(int64) bool { return true })
		}},
		{"broker never answers", func(b *kafkatest.Broker) {
			b.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				b.Fake.KeepControl()
				return nil, nil, true // read, never answered
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.Fake(t)
			events := kafkatest.TopicName(t, "events")
			b.CreateTopic(t, events, 1, nil)
			prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("poison-1"), Value: poison}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			tt.fault(b) // only the worker's dead-letter producer produces from here on

			w := startRun(t,
				"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
				"--projections", exampleProjections, "--topic", events,
				"--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
				"--group", kafkatest.TopicName(t, "group"),
				"--retry-initial", "10ms", "--retry-max-interval", "50ms", "--dlq-write-timeout", "200ms")
			started := time.Now()

			// Bound: 5 attempts × 200 ms + backoff waits (< 0.2 s), after
			// the worker has started and joined the group.
			var body string
			w.waitFor(t, "/readyz names partition 0 stuck", 30*time.Second, func() bool {
				body = w.get(t, "/readyz")
				return strings.Contains(body, "partition 0 stuck")
			})
			t.Logf("stuck after %s: %s", time.Since(started).Round(time.Millisecond), body)
			if !strings.HasPrefix(body, "503 ") || !strings.Contains(body, "did not acknowledge") {
				t.Errorf("/readyz %q, want 503 saying Kafka did not acknowledge the dead letter", body)
			}
			if !w.logged("dead letter not written") {
				t.Errorf("no error log for the dead letter not written\nstderr:\n%s", w.stderr.String())
			}
			w.shutdown(t)
		})
	}
}
