package main

import (
	"context"
	"io"
	"net/http"
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

			addr := closedAddr(t)
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			var stdout, stderr syncBuffer
			done := make(chan int, 1)
			started := time.Now()
			go func() {
				done <- run(runCtx, []string{"run",
					"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
					"--projections", exampleProjections, "--topic", events,
					"--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
					"--group", kafkatest.TopicName(t, "group"), "--http-addr", addr, "--log-format", "text",
					"--retry-initial", "10ms", "--retry-max-interval", "50ms", "--dlq-write-timeout", "200ms",
				}, &stdout, &stderr)
			}()

			// Bound: 5 attempts × 200 ms + backoff waits (< 0.2 s), after
			// the worker has started and joined the group.
			var body string
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(body, "partition 0 stuck") {
				if time.Now().After(deadline) {
					t.Fatalf("/readyz after 30s: %q, want 503 naming partition 0 stuck\nstderr:\n%s", body, stderr.String())
				}
				select {
				case code := <-done:
					t.Fatalf("the worker exited early with %d\nstderr:\n%s", code, stderr.String())
				case <-time.After(50 * time.Millisecond):
				}
				body = readyz(t, addr)
			}
			t.Logf("stuck after %s: %s", time.Since(started).Round(time.Millisecond), body)
			if !strings.Contains(body, "did not acknowledge") {
				t.Errorf("/readyz %q does not say Kafka did not acknowledge the dead letter", body)
			}
			if !strings.Contains(stderr.String(), "dead letter not written") {
				t.Errorf("no error log for the dead letter not written\nstderr:\n%s", stderr.String())
			}

			stop()
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("the worker exited %d after cancel, want 0\nstderr:\n%s", code, stderr.String())
				}
			case <-time.After(40 * time.Second):
				t.Fatalf("the worker did not stop within 40s of cancel\nstderr:\n%s", stderr.String())
			}
		})
	}
}

// readyz returns "<status code> <body>" of GET /readyz on addr, or the
// error of the request.
func readyz(t *testing.T, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b)
}
