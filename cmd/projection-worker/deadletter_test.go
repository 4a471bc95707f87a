package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/dlq"
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
			w := runWithDeadLetterFault(t, &kgo.Record{Key: []byte("poison-1"), Value: poison}, tt.fault)
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

// TestRunDeadLettersAnEventLargerThanTheDeadLetterTopicTakes: a record too
// large for the dead-letter topic even as a dead letter (10 MB, not JSON:
// base64 makes it larger still) once held its partition until someone
// raised max.message.bytes. Now its dead letter is written without the
// original (causet.dlq.original-omitted gives size and SHA-256), the
// partition is never stuck, and the records after it are applied. So is
// a poison record whose own headers are too large (8 KiB), or whose key
// is (5 KB), which still held their partition: they are dead-lettered
// without them (causet.dlq.original-headers-omitted, -key-omitted).
func TestRunDeadLettersAnEventLargerThanTheDeadLetterTopicTakes(t *testing.T) {
	t.Parallel()
	dlqTopic := kafkatest.TopicName(t, "bigdlq")
	b, events, w := startOnKfake(t, 1, "--dlq-max-bytes", "4096", "--dlq-topic", dlqTopic)
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(16<<20))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	huge := bytes.Repeat([]byte{0xfe}, 10<<20)
	bigHeaders := &kgo.Record{Key: []byte("big-headers"), Value: poison,
		Headers: []kgo.RecordHeader{{Key: "x-baggage", Value: bytes.Repeat([]byte("b"), 8<<10)}}}
	bigKey := &kgo.Record{Key: bytes.Repeat([]byte("k"), 5000), Value: poison}
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("huge"), Value: huge}, bigHeaders, bigKey, &kgo.Record{Key: []byte("poison-after"), Value: poison}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cons := b.Client(t, kgo.ConsumeTopics(dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var dls []*kgo.Record
	for len(dls) < 4 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d dead letters within a minute, want 4\nstderr:\n%s", len(dls), w.stderr.String())
		}
		dls = append(dls, fs.Records()...)
	}
	sum := sha256.Sum256(huge)
	want := fmt.Sprintf("size=%d sha256=%x", len(huge), sum)
	var omitted string
	for _, h := range dls[0].Headers {
		if h.Key == dlq.HeaderOriginalOmitted {
			omitted = string(h.Value)
		}
	}
	if string(dls[0].Key) != "huge" || omitted != want || len(dls[0].Value) > 4096 {
		t.Errorf("first dead letter: key %q, %d bytes, %s %q; want huge, <= 4096 bytes, %q", dls[0].Key, len(dls[0].Value), dlq.HeaderOriginalOmitted, omitted, want)
	}
	headersOmitted := ""
	for _, h := range dls[1].Headers {
		if h.Key == dlq.HeaderOriginalHeadersOmitted {
			headersOmitted = string(h.Value)
		}
		if h.Key == "x-baggage" {
			t.Errorf("second dead letter carries the record's %d-byte header", len(h.Value))
		}
	}
	if string(dls[1].Key) != "big-headers" || !strings.HasPrefix(headersOmitted, "count=1 size=8201 sha256=") {
		t.Errorf("second dead letter: key %q, %s %q; want big-headers, count=1 size=8201", dls[1].Key, dlq.HeaderOriginalHeadersOmitted, headersOmitted)
	}
	keyOmitted := ""
	for _, h := range dls[2].Headers {
		if h.Key == dlq.HeaderOriginalKeyOmitted {
			keyOmitted = string(h.Value)
		}
	}
	if len(dls[2].Key) != 0 || !strings.HasPrefix(keyOmitted, "size=5000 sha256=") {
		t.Errorf("third dead letter: key of %d bytes, %s %q; want none, size=5000", len(dls[2].Key), dlq.HeaderOriginalKeyOmitted, keyOmitted)
	}
	if string(dls[3].Key) != "poison-after" {
		t.Errorf("fourth dead letter key %q, want poison-after: the partition went on", dls[3].Key)
	}
	if body := w.get(t, "/readyz"); strings.Contains(body, "stuck") {
		t.Errorf("/readyz %q: a partition stuck on the large dead letter", body)
	}
	w.shutdown(t)
}

// TestRunStuckDeadLetterLinesCarryTheTrace: the lines about a dead letter
// that cannot be written carry its pair's trace_id and span_id, as the
// dead-lettered line does (tracing trial: a stuck partition, the most
// urgent dead-letter case, could not be tied to its trace).
func TestRunStuckDeadLetterLinesCarryTheTrace(t *testing.T) {
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	rec := &kgo.Record{Key: []byte("poison-1"), Value: poison,
		Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + traceID + "-00f067aa0ba902b7-01")}}}
	w := runWithDeadLetterFault(t, rec, func(b *kafkatest.Broker) {
		b.RefuseProduce(t, "", kerr.NotLeaderForPartition.Code, func(int64) bool { return true })
	})
	w.waitFor(t, "the dead letter not written logged", 30*time.Second, func() bool { return w.logged("dead letter not written") })
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if strings.Contains(line, "dead letter not written") && !strings.Contains(line, "trace_id="+traceID) {
			t.Errorf("line without the record's trace_id %s: %s", traceID, line)
		}
	}
	w.shutdown(t)
}

// runWithDeadLetterFault produces rec (a poison record) to a new events
// topic of one partition on a kfake broker of its own, then sets fault (so
// that only the worker's dead-letter producer meets it) and starts `run`
// with short retries and --dlq-write-timeout 200ms.
func runWithDeadLetterFault(t *testing.T, rec *kgo.Record, fault func(b *kafkatest.Broker)) *running {
	t.Helper()
	b := kafkatest.Fake(t)
	events := kafkatest.TopicName(t, "events")
	b.CreateTopic(t, events, 1, nil)
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fault(b)
	return startRun(t,
		"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
		"--projections", exampleProjections, "--topic", events,
		"--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
		"--group", kafkatest.TopicName(t, "group"),
		"--retry-initial", "10ms", "--retry-max-interval", "50ms", "--dlq-write-timeout", "200ms")
}

// TestRunSaysTheDeadLetterTopicIsMissing: the dead-letter topic deleted
// while the worker runs holds the partition of the next poison record;
// the line that says so names the missing topic and the command that
// creates it (new-user trial: it blamed Kafka's time to acknowledge), and
// once the topic is back the dead letter is written and the partition is
// ready again.
func TestRunSaysTheDeadLetterTopicIsMissing(t *testing.T) {
	t.Parallel()
	dlqTopic := kafkatest.TopicName(t, "gone")
	b, events, w := startOnKfake(t, 1, "--dlq-topic", dlqTopic, "--dlq-write-timeout", "200ms", "--log-format", "text")
	w.waitFor(t, "the worker ready", 30*time.Second, func() bool { return strings.HasPrefix(w.get(t, "/readyz"), "200") })
	adm := kadm.NewClient(b.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, dlqTopic); err != nil {
		t.Fatal(err)
	}
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("poison-1"), Value: poison}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := "the dead-letter topic " + dlqTopic + " does not exist (deleted?): create it (projection-worker topics)"
	w.waitFor(t, "the line naming the missing topic", 90*time.Second, func() bool {
		for _, l := range strings.Split(w.stderr.String(), "\n") {
			if strings.Contains(l, "dead letter not written") && strings.Contains(l, want) {
				return true
			}
		}
		return false
	})
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, dlqTopic); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "the dead letter written and the partition ready", 90*time.Second, func() bool {
		return w.logged("dead-lettered") && strings.HasPrefix(w.get(t, "/readyz"), "200")
	})
	w.shutdown(t)
}
