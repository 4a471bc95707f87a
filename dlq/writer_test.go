package dlq

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

// testBackoff keeps produce retries fast in tests.
var testBackoff = retry.Policy{Initial: 5 * time.Millisecond, Multiplier: 2, MaxInterval: 20 * time.Millisecond}

// newBroker returns the test's Kafka (KAFKA_BROKERS, else kfake; fake
// when the test injects faults) and a dead-letter topic of 3 partitions
// unique to the test.
func newBroker(t *testing.T, fake bool) (*kafkatest.Broker, string) {
	t.Helper()
	b := kafkatest.New(t)
	if fake {
		b = kafkatest.Fake(t)
	}
	topic := kafkatest.TopicName(t, "dlq")
	b.CreateTopic(t, topic, 3, nil)
	return b, topic
}

func newClient(t *testing.T, b *kafkatest.Broker, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return b.Client(t, append([]kgo.Opt{
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }),
		// A NOT_LEADER answer makes kgo refresh metadata first, at most
		// once per MetadataMinAge (default 5 s).
		kgo.MetadataMinAge(10 * time.Millisecond),
	}, opts...)...)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON log lines written so far.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func newWriter(t *testing.T, cl *kgo.Client, topic string, logs *syncBuffer) *Writer {
	t.Helper()
	cfg := WriterConfig{
		RecordConfig: RecordConfig{Topic: topic, Worker: "worker-1", Generation: "test/v42"},
		Backoff:      testBackoff,
	}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}
	w, err := NewWriter(cl, cfg)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w
}

// failProduces answers the first n produce requests (every one when n < 0)
// with code instead of writing them, calling before (if not nil) with the
// number of the failing request first. It returns the count of requests
// it failed.
func failProduces(t testing.TB, b *kafkatest.Broker, n int64, code int16, before func(int64)) *atomic.Int64 {
	return b.RefuseProduce(t, "", code, func(i int64) bool {
		if n >= 0 && i > n {
			return false
		}
		if before != nil {
			before(i)
		}
		return true
	})
}

// recordsOn returns how many records topic holds (the sum of its end
// offsets).
func recordsOn(t *testing.T, cl *kgo.Client, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := offs.Error(); err != nil {
		t.Fatal(err)
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// consume reads want records of topic from its start.
func consume(t *testing.T, b *kafkatest.Broker, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, b, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records: %v", len(recs), want, ctx.Err())
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", topic, p, err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func TestWriterWriteIsConsumedBack(t *testing.T) {
	b, topic := newBroker(t, false)
	cl := newClient(t, b)
	w := newWriter(t, cl, topic, nil)
	if w.Topic() != topic {
		t.Errorf("Topic() = %q, want %q", w.Topic(), topic)
	}
	dl := testDeadLetter([]byte(testEvent))

	before := time.Now()
	if err := w.Write(context.Background(), dl); err != nil {
		t.Fatalf("Write: %v", err)
	}
	after := time.Now()

	got := consume(t, b, topic, 1)[0]
	m := decodeMessage(t, got.Value)
	if m.FailedAt < before.UnixMilli() || m.FailedAt > after.UnixMilli() {
		t.Errorf("failedAt %d not within the Write call [%d, %d]", m.FailedAt, before.UnixMilli(), after.UnixMilli())
	}
	want, err := NewRecord(dl, w.cfg, time.UnixMilli(m.FailedAt))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(decodeMessage(t, want.Value), m); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
	if !bytes.Equal(got.Value, want.Value) {
		t.Errorf("value bytes differ:\n got %s\nwant %s", got.Value, want.Value)
	}
	if diff := cmp.Diff(want.Headers, got.Headers); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	if string(got.Key) != "user-123" {
		t.Errorf("key %q, want user-123", got.Key)
	}
	if got.Timestamp.UnixMilli() != m.FailedAt {
		t.Errorf("record timestamp %d, want failedAt %d", got.Timestamp.UnixMilli(), m.FailedAt)
	}
}

func TestWriterRetriesUntilTheProduceIsAcknowledged(t *testing.T) {
	tests := []struct {
		name string
		code int16
		// writerRetries is whether the Writer itself sees the failures:
		// kgo retries retriable errors inside one ProduceSync.
		writerRetries bool
	}{
		{"non-retriable error returned by kgo", kerr.TopicAuthorizationFailed.Code, true},
		{"retriable error retried inside kgo", kerr.NotLeaderForPartition.Code, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const failures = 3
			b, topic := newBroker(t, true)
			cl := newClient(t, b)
			var logs syncBuffer
			w := newWriter(t, cl, topic, &logs)
			failed := failProduces(t, b, failures, tt.code, nil)

			dl := testDeadLetter([]byte(testEvent))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.Write(ctx, dl); err != nil {
				t.Fatalf("Write: %v", err)
			}
			if n := failed.Load(); n != failures {
				t.Errorf("%d produce requests failed, want %d", n, failures)
			}
			if n := recordsOn(t, cl, topic); n != 1 {
				t.Errorf("dead-letter topic holds %d records, want exactly 1", n)
			}
			consume(t, b, topic, 1)

			lines := logs.lines(t)
			if !tt.writerRetries {
				if len(lines) != 0 {
					t.Errorf("logged %d lines, want none: %v", len(lines), lines)
				}
				return
			}
			// The first attempt's failure: the others repeat it, folded
			// (TestWriterFoldsItsRetryLines).
			if len(lines) != 1 {
				t.Fatalf("logged %d lines, want 1: %v", len(lines), lines)
			}
			for i, l := range lines {
				want := map[string]any{
					"level":         "WARN",
					"topic":         "causet.projection-events.v1",
					"partition":     float64(3),
					"offset":        float64(1891),
					"projection":    "artist_followers",
					"tenant_schema": "acme_concertapp_production",
					"dlq_topic":     topic,
					"attempt":       float64(i + 1),
				}
				for k, v := range want {
					if l[k] != v {
						t.Errorf("log line %d: %s = %v, want %v", i, k, l[k], v)
					}
				}
				if _, ok := l["error"]; !ok {
					t.Errorf("log line %d has no error", i)
				}
			}
		})
	}
}

func TestWriterStopsWhenTheContextEnds(t *testing.T) {
	b, topic := newBroker(t, true)
	cl := newClient(t, b)
	w := newWriter(t, cl, topic, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Every produce fails; the second one cancels the context while it is
	// in flight, as a partition revoke or SIGTERM would.
	failProduces(t, b, -1, kerr.TopicAuthorizationFailed.Code, func(i int64) {
		if i == 2 {
			cancel()
		}
	})

	done := make(chan error, 1)
	go func() { done <- w.Write(ctx, testDeadLetter([]byte(testEvent))) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Write did not return after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Write error %v, want context.Canceled", err)
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("Write error %v does not carry the last produce error", err)
	}
	if n := recordsOn(t, cl, topic); n != 0 {
		t.Errorf("dead-letter topic holds %d records, want none", n)
	}
}

func TestWriterReturnsBuildErrorsWithoutProducing(t *testing.T) {
	b, topic := newBroker(t, false)
	cl := newClient(t, b)
	w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic, MaxBytes: 4096}, Backoff: testBackoff})
	if err != nil {
		t.Fatal(err)
	}
	dl := testDeadLetter([]byte(testEvent))
	dl.Projection = strings.Repeat("p", 8192) // its own header: never left out
	if err := w.Write(context.Background(), dl); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Write error %v, want ErrTooLarge", err)
	}
	if n := recordsOn(t, cl, topic); n != 0 {
		t.Errorf("dead-letter topic holds %d records, want none", n)
	}
}

// TestRecordSizeIsWhatKgoCounts checks recordSize against kgo: a client
// whose ProducerBatchMaxBytes is the record's size accepts it, one byte
// less refuses it.
func TestRecordSizeIsWhatKgoCounts(t *testing.T) {
	b, topic := newBroker(t, false)
	rec := newRecord(t, testDeadLetter([]byte(testEvent)), RecordConfig{Topic: topic})
	size := recordSize(rec)
	for _, tt := range []struct {
		limit   int
		wantErr error
	}{
		{size, nil},
		{size - 1, kerr.MessageTooLarge},
	} {
		cl := newClient(t, b, kgo.ProducerBatchMaxBytes(int32(tt.limit)))
		r := &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Timestamp: rec.Timestamp}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cl.ProduceSync(ctx, r).FirstErr()
		cancel()
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("record of %d bytes with ProducerBatchMaxBytes %d: produce error %v, want %v", size, tt.limit, err, tt.wantErr)
		}
	}
}

func TestNewWriterRefusesUnsafeClients(t *testing.T) {
	tests := []struct {
		name    string
		opts    []kgo.Opt
		cfg     WriterConfig
		wantErr bool
	}{
		{"defaults", nil, WriterConfig{}, false},
		{"default produce topic always, same topic", []kgo.Opt{kgo.DefaultProduceTopic(DefaultTopic), kgo.DefaultProduceTopicAlways()}, WriterConfig{}, false},
		{"default produce topic, not always", []kgo.Opt{kgo.DefaultProduceTopic("other")}, WriterConfig{}, false},
		{"leader acks", []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()}, WriterConfig{}, true},
		{"idempotency disabled", []kgo.Opt{kgo.DisableIdempotentWrite()}, WriterConfig{}, true},
		{"transactional", []kgo.Opt{kgo.TransactionalID("tx")}, WriterConfig{}, true},
		{"default produce topic always, other topic", []kgo.Opt{kgo.DefaultProduceTopic("other"), kgo.DefaultProduceTopicAlways()}, WriterConfig{}, true},
		{"batch max bytes below max bytes", []kgo.Opt{kgo.ProducerBatchMaxBytes(600000)}, WriterConfig{}, true},
		{"batch max bytes with smaller max bytes", []kgo.Opt{kgo.ProducerBatchMaxBytes(600000)}, WriterConfig{RecordConfig: RecordConfig{MaxBytes: 600000}}, false},
		{"buffered bytes below max bytes", []kgo.Opt{kgo.MaxBufferedBytes(1000)}, WriterConfig{}, true},
		{"invalid record config", nil, WriterConfig{RecordConfig: RecordConfig{Topic: "a b"}}, true},
		{"invalid backoff", nil, WriterConfig{Backoff: retry.Policy{Initial: -1}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if _, err := NewWriter(cl, tt.cfg); (err != nil) != tt.wantErr {
				t.Errorf("NewWriter error %v, want error %v", err, tt.wantErr)
			}
		})
	}
	if _, err := NewWriter(nil, WriterConfig{}); err == nil {
		t.Error("NewWriter(nil) returned no error")
	}
}

// TestWriterGivesUpAfterMaxAttempts: a dead-letter topic that keeps refusing
// writes must not hold Write forever, or the worker could not report it.
func TestWriterGivesUpAfterMaxAttempts(t *testing.T) {
	b, topic := newBroker(t, true)
	cl := newClient(t, b)
	w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic}, Backoff: testBackoff, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	refused := failProduces(t, b, -1, kerr.TopicAuthorizationFailed.Code, nil)
	err = w.Write(context.Background(), testDeadLetter([]byte(testEvent)))
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, context.Canceled) {
		t.Errorf("Write = %v, want the produce error", err)
	}
	if got := refused.Load(); got < 3 {
		t.Errorf("produce attempts = %d, want at least 3", got)
	}
	if n := recordsOn(t, cl, topic); n != 0 {
		t.Errorf("dead-letter topic holds %d records, want none", n)
	}
}

// TestWriterFoldsItsRetryLines: a dead letter the topic keeps refusing
// with the same error gets one WARN "dead-letter write failed, retrying"
// for its source partition, then one a minute with repeats, over Writes
// and attempts (pathological-stream trial: 4 lines every cycle of every
// stuck partition, for as long as the topic refused); another error is
// written at once.
func TestWriterFoldsItsRetryLines(t *testing.T) {
	b, topic := newBroker(t, true)
	cl := newClient(t, b)
	var logs bytes.Buffer
	w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic}, Backoff: testBackoff, MaxAttempts: 3,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var second atomic.Bool // the second error from the third Write on
	b.RefuseProduce(t, "", kerr.TopicAuthorizationFailed.Code, func(int64) bool { return !second.Load() })
	b.RefuseProduce(t, "", kerr.PolicyViolation.Code, func(int64) bool { return second.Load() })
	for i := range 3 {
		second.Store(i == 2)
		if err := w.Write(context.Background(), testDeadLetter([]byte(testEvent))); err == nil {
			t.Fatal("Write succeeded against a refusing topic")
		}
	}
	if n := strings.Count(logs.String(), `"msg":"dead-letter write failed, retrying"`); n != 2 {
		t.Errorf("%d retry lines over 3 Writes of 3 attempts, 2 errors; want 2:\n%s", n, logs.String())
	}
}

// TestWriteBatchKeepsOrderAndReportsEachDeadLetter: the dead letters of a
// batch are written in one round trip, in order; one that cannot be built
// (too large) gets its own error and does not stop the others.
func TestWriteBatchKeepsOrderAndReportsEachDeadLetter(t *testing.T) {
	b, topic := newBroker(t, false)
	cl := newClient(t, b)
	w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic, MaxBytes: 64 << 10}, Backoff: testBackoff})
	if err != nil {
		t.Fatal(err)
	}
	var dls []DeadLetter
	for i := range 5 {
		dl := testDeadLetter([]byte(testEvent))
		src := *dl.Source
		src.Key, src.Offset = []byte("same-key"), int64(i) // one dead-letter partition
		dl.Source = &src
		if i == 2 {
			dl.Projection = strings.Repeat("p", 128<<10) // its own header over the limit (a key, value or headers would be left out)
		}
		dls = append(dls, dl)
	}
	errs := w.WriteBatch(context.Background(), dls)
	for i, err := range errs {
		if (i == 2) != (err != nil) {
			t.Errorf("dead letter %d: error %v", i, err)
		}
	}
	if !errors.Is(errs[2], ErrTooLarge) {
		t.Errorf("dead letter 2: %v, want ErrTooLarge", errs[2])
	}
	if diff := cmp.Diff([]string{"0", "1", "3", "4"}, originalOffsets(t, cl, topic)); diff != "" {
		t.Errorf("original offsets in dead-letter order (-want +got):\n%s", diff)
	}
}

// originalOffsets returns the causet.dlq.original-offset header of every
// record of topic, partition by partition in offset order.
func originalOffsets(t *testing.T, cl *kgo.Client, topic string) []string {
	t.Helper()
	n := recordsOn(t, cl, topic)
	rd, err := kgo.NewClient(kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for int64(len(out)) < n {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records", len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == HeaderOriginalOffset {
					out = append(out, string(h.Value))
				}
			}
		})
	}
	return out
}

// newSpreadBroker returns a kfake cluster of three brokers and a
// dead-letter topic of three partitions, partition i led by broker i, so
// that the dead letters of one WriteBatch go out in one produce request
// per broker and come back in whatever order the brokers answer.
func newSpreadBroker(t *testing.T) (*kafkatest.Broker, string) {
	t.Helper()
	b := kafkatest.Fake(t, kfake.NumBrokers(3))
	topic := kafkatest.TopicName(t, "dlq")
	b.CreateTopic(t, topic, 3, nil)
	for p := range int32(3) {
		if err := b.Fake.MoveTopicPartition(topic, p, p); err != nil {
			t.Fatal(err)
		}
	}
	return b, topic
}

// deadLetterOn returns a dead letter of source offset offset whose key
// kgo's default partitioner (murmur2, as ReplayPartitioner.Hash) sends to
// dead-letter partition p of a topic of partitions partitions.
func deadLetterOn(t *testing.T, p, partitions int32, offset int64) DeadLetter {
	t.Helper()
	parter := NewReplayPartitioner(partitions)
	for i := 0; ; i++ {
		key := []byte("entity-" + strconv.Itoa(i))
		if parter.Hash(key) != p {
			continue
		}
		dl := testDeadLetter([]byte(testEvent))
		src := *dl.Source
		src.Key, src.Offset = key, offset
		dl.Source = &src
		return dl
	}
}

// TestWriteBatchReportsExactlyTheRefusedDeadLetters: kgo's ProduceSync
// returns results in the order the brokers answer, not in the order of the
// records. A batch spread over partitions led by different brokers, where
// the broker of one partition refuses its dead letters at once and another
// answers late, must report an error for exactly the refused dead letters:
// a refused one reported as written would have its source offset committed
// and be lost.
func TestWriteBatchReportsExactlyTheRefusedDeadLetters(t *testing.T) {
	b, topic := newSpreadBroker(t)
	const slow, fast, refusing = 0, 1, 2 // partition = its leader's node id
	refused := make(chan struct{})
	var refuseOnce sync.Once
	b.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.Fake.KeepControl()
		switch b.Fake.CurrentNode() {
		case slow:
			// Answer after the refusal has reached the client.
			b.Fake.SleepControl(func() {
				select {
				case <-refused:
					time.Sleep(200 * time.Millisecond)
				case <-time.After(10 * time.Second):
				}
			})
		case refusing:
			refuseOnce.Do(func() { close(refused) })
			return kafkatest.ProduceError(req.(*kmsg.ProduceRequest), kerr.InvalidRecord.Code), nil, true
		}
		return nil, nil, false
	})
	cl := newClient(t, b)
	w := newWriter(t, cl, topic, nil)

	// In input order the dead letters of the slow broker come first, the
	// refused ones last: by completion order the refused ones come first.
	partitions := []int32{slow, slow, fast, refusing, refusing}
	var dls []DeadLetter
	for i, p := range partitions {
		dls = append(dls, deadLetterOn(t, p, 3, int64(i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := w.WriteBatch(ctx, dls)
	for i, err := range errs {
		if want := partitions[i] == refusing; (err != nil) != want || want && !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("dead letter %d (partition %d): error %v, want refused: %v", i, partitions[i], err, want)
		}
	}
	got := originalOffsets(t, cl, topic)
	slices.Sort(got)
	if diff := cmp.Diff([]string{"0", "1", "2"}, got); diff != "" {
		t.Errorf("original offsets on the dead-letter topic (-want +got):\n%s", diff)
	}
}

// neverAnswerProduces makes the kfake cluster read every produce request
// and never answer it, as a broker that hangs.
func neverAnswerProduces(b *kafkatest.Broker) {
	b.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.Fake.KeepControl()
		return nil, nil, true // handled, no response: the client waits
	})
}

// TestWriterReturnsWithinTheAttemptBoundWhenKafkaDoesNotAcknowledge: kgo
// retries retriable produce errors and unanswered requests without limit
// inside one produce. A dead-letter topic that keeps answering
// NOT_LEADER_FOR_PARTITION or REQUEST_TIMED_OUT, or a broker that never
// answers, must still make Write and WriteBatch return an error within the
// documented bound (MaxAttempts × AttemptTimeout plus the backoff waits),
// so that the worker can report the partition stuck instead of stalling
// silently. With kgo.AllowIdempotentProduceCancellation, as the worker's
// producer has, kgo also drops the dead letters it was not given back for.
func TestWriterReturnsWithinTheAttemptBoundWhenKafkaDoesNotAcknowledge(t *testing.T) {
	const (
		attempts = 3
		timeout  = 300 * time.Millisecond
		// slack covers the backoff waits (5 ms + 10 ms) and a loaded
		// machine running the race detector.
		slack = 1500 * time.Millisecond
	)
	tests := []struct {
		name  string
		fault func(*kafkatest.Broker)
		// cancel is whether the client has
		// kgo.AllowIdempotentProduceCancellation.
		cancel bool
	}{
		{"NOT_LEADER_FOR_PARTITION forever", func(b *kafkatest.Broker) {
			failProduces(t, b, -1, kerr.NotLeaderForPartition.Code, nil)
		}, true},
		{"REQUEST_TIMED_OUT forever", func(b *kafkatest.Broker) {
			failProduces(t, b, -1, kerr.RequestTimedOut.Code, nil)
		}, true},
		{"broker never answers", neverAnswerProduces, true},
		{"broker never answers, client without cancellation", neverAnswerProduces, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, topic := newBroker(t, true)
			opts := []kgo.Opt{kgo.ProducerLinger(0)}
			if tt.cancel {
				opts = append(opts, kgo.AllowIdempotentProduceCancellation())
			}
			cl := newClient(t, b, opts...)
			w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic}, Backoff: testBackoff, MaxAttempts: attempts, AttemptTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			tt.fault(b)

			// An attempt ends at its timeout, or earlier when kgo fails its
			// record together with the timed-out one of an earlier attempt
			// queued ahead of it: at least one attempt runs its course.
			checkErr := func(call string, err error, took, bound time.Duration) {
				t.Helper()
				if !errors.Is(err, ErrAttemptTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Errorf("%s = %v, want ErrAttemptTimeout and no context error", call, err)
				}
				if took < timeout || took > bound+slack {
					t.Errorf("%s returned after %s, want within [%s, %s]", call, took, timeout, bound+slack)
				}
			}
			start := time.Now()
			err = returnsWithin(t, attempts*timeout+slack+5*time.Second, func() error {
				return w.Write(context.Background(), testDeadLetter([]byte(testEvent)))
			})
			checkErr("Write", err, time.Since(start), attempts*timeout)

			dls := []DeadLetter{deadLetterOn(t, 0, 3, 1), deadLetterOn(t, 1, 3, 2)}
			var errs []error
			start = time.Now()
			returnsWithin(t, timeout+slack+5*time.Second, func() error {
				errs = w.WriteBatch(context.Background(), dls)
				return nil
			})
			took := time.Since(start)
			for i, err := range errs {
				checkErr(fmt.Sprintf("WriteBatch error %d", i), err, took, timeout)
			}

			if tt.cancel {
				deadline := time.Now().Add(5 * time.Second)
				for cl.BufferedProduceRecords() > 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := cl.BufferedProduceRecords(); n > 0 {
					t.Errorf("client still holds %d dead letters whose attempts timed out", n)
				}
			}
		})
	}
}

// returnsWithin runs fn and returns its error, failing t when fn has not
// returned within limit (fn is then left running).
func returnsWithin(t *testing.T, limit time.Duration, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("did not return within %s", limit)
		return nil
	}
}

// TestWriterTimeoutFailsTheDeadLettersQueuedBehindAsTimeouts: kgo keeps a
// partition gapless, so when it drops a dead letter whose attempt timed out
// it fails every record queued behind it in that partition, with the
// timed-out attempt's context error. A concurrent Write whose own context
// and attempt are still running must see that as ErrAttemptTimeout, not as
// a context error that a caller would take for its own cancellation.
func TestWriterTimeoutFailsTheDeadLettersQueuedBehindAsTimeouts(t *testing.T) {
	b, topic := newBroker(t, true)
	cl := newClient(t, b, kgo.ProducerLinger(0), kgo.AllowIdempotentProduceCancellation())
	w, err := NewWriter(cl, WriterConfig{RecordConfig: RecordConfig{Topic: topic}, Backoff: testBackoff, MaxAttempts: 1, AttemptTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	neverAnswerProduces(b)
	first := make(chan error, 1)
	go func() { first <- w.Write(context.Background(), testDeadLetter([]byte(testEvent))) }()
	time.Sleep(200 * time.Millisecond) // the first dead letter is in flight
	// Same key, same partition: queued behind the first.
	second := returnsWithin(t, 10*time.Second, func() error {
		return w.Write(context.Background(), testDeadLetter([]byte(testEvent)))
	})
	for i, err := range []error{<-first, second} {
		if !errors.Is(err, ErrAttemptTimeout) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Write %d = %v, want ErrAttemptTimeout and no context error", i+1, err)
		}
	}
}

func TestWriterConfigValidateFillsDefaults(t *testing.T) {
	var c WriterConfig
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.RecordConfig != (RecordConfig{}).WithDefaults() || c.Backoff != retry.DefaultPolicy() || c.Logger == nil ||
		c.MaxAttempts != 5 || c.AttemptTimeout != DefaultAttemptTimeout {
		t.Errorf("defaults: %+v", c)
	}
	for _, bad := range []WriterConfig{
		{MaxAttempts: -2},
		{Backoff: retry.Policy{Initial: -1}},
		{RecordConfig: RecordConfig{Topic: "a b"}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", bad)
		}
	}
}
