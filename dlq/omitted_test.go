package dlq_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

// omittedDeadLetter produces value to f's events topic, then the dead
// letter of that record with a dead-letter limit of 2048 bytes, which
// value exceeds: the dead letter is written without it.
func omittedDeadLetter(t *testing.T, f *fixture, key string, value []byte) *kgo.Record {
	t.Helper()
	src, _ := deadLetterOver2048(t, f, &kgo.Record{Key: []byte(key), Value: value}, dlq.HeaderOriginalOmitted)
	return src
}

// deadLetterOver2048 produces rec to f's events topic, then its dead
// letter with a dead-letter limit of 2048 bytes, which rec exceeds: the
// dead letter, produced too, must have header omitted. It returns the
// produced record and the dead letter.
func deadLetterOver2048(t *testing.T, f *fixture, rec *kgo.Record, omitted string) (src, dl *kgo.Record) {
	t.Helper()
	rec.Topic = f.events
	src, err := f.cl.ProduceSync(testCtx(t), rec).First()
	if err != nil {
		t.Fatal(err)
	}
	dl = f.produceDeadLetter(src, 2048)
	if _, ok := headerValue(dl.Headers, omitted); !ok {
		t.Fatalf("a record of %d value bytes and %d headers fit a 2048-byte dead letter without %s: the test needs it", len(rec.Value), len(rec.Headers), omitted)
	}
	return src, dl
}

// produceDeadLetter produces to f's dead-letter topic, and returns, the
// dead letter of src (a missing column, 5 retries) with a limit of
// maxBytes (0: the default).
func (f *fixture) produceDeadLetter(src *kgo.Record, maxBytes int) *kgo.Record {
	f.t.Helper()
	dl, err := dlq.NewRecord(dlq.DeadLetter{Source: src, Projection: "artist_followers", TenantSchema: "acme_prod",
		EventType: "ARTIST_FOLLOWED", Class: retry.Projection, Err: pgErr("42703", `column "x" does not exist`), Retries: 5},
		dlq.RecordConfig{Topic: f.dlqTopic, Worker: "test", MaxBytes: maxBytes}, t0)
	if err != nil {
		f.t.Fatal(err)
	}
	f.produce(dl)
	return dl
}

// TestRetryReadsAnOmittedOriginalAgain: a dead letter whose original was
// left out (too large for the dead-letter topic) is replayed with the
// original bytes read again from the events topic; once the topic no longer
// retains them, the replayer refuses it and says why.
func TestRetryReadsAnOmittedOriginalAgain(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	big := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","forkId":"production","tenantSchema":"acme_prod","irVersion":"v1","sequenceNumber":1,"ts":1719331200000,"payload":{"blob":"` +
		strings.Repeat("x", 8000) + `"}}`)
	omittedDeadLetter(t, f, "user-1", big)
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Replayed != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want the omitted original replayed", res, outs)
	}
	checkReplayedValue(t, b, f.events, big)
	// Replayed again on purpose: read again too, not refused as if the
	// original had not been JSON (found by a new user).
	res, outs = f.retry(dlq.ReplayConfig{Actor: "alice", IncludeReplayed: true, DryRun: true})
	if res.Replayed != 1 || len(outs) != 1 || outs[0].Kind != dlq.OutcomeReplayed {
		t.Fatalf("with IncludeReplayed: result %s, outcomes %+v; want it replayable again", res, outs)
	}

	gone := omittedDeadLetter(t, f, "user-2", bytes.Replace(big, []byte("user-1"), []byte("user-2"), 1))
	adm := kadm.NewClient(f.cl)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: f.events, Partition: gone.Partition, At: gone.Offset + 1})
	if _, err := adm.DeleteRecords(testCtx(t), offs); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	f.wantOneRefusedOfTwo("no longer in the topic")
}

// TestRetryRefusalOfAnOmittedOriginalThatIsNoEventSaysWhereItIs: an
// original left out for size that, read again, is not an event the worker
// reads is refused with where its bytes are, not with originalValueBase64,
// which the dead letter left empty too (new-user trial).
func TestRetryRefusalOfAnOmittedOriginalThatIsNoEventSaysWhereItIs(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	src := omittedDeadLetter(t, f, "user-1", []byte(strings.Repeat("not json ", 1000)))
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Refused != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want it refused", res, outs)
	}
	where := fmt.Sprintf("at %s[%d]@%d (9000 bytes)", f.events, src.Partition, src.Offset)
	if r := outs[0].Reason; !strings.Contains(r, "originalEvent is null") || !strings.Contains(r, where) || strings.Contains(r, "originalValueBase64") {
		t.Errorf("refused with %q, want it to say its bytes are %s", r, where)
	}
}

// TestRetryReplaysAnEventLargerThanKgosDefaultBatch: an event larger
// than kgo's default producer batch limit (1,000,012 bytes), which the
// events topic takes (its max.message.bytes raised), is replayed: the
// replayer produces with the topic's limit. Before, every such replay
// failed with MESSAGE_TOO_LARGE before it reached the broker (new-user
// trial: a 1.5 MB and a 5 MB event).
func TestRetryReplaysAnEventLargerThanKgosDefaultBatch(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	adm := kadm.NewClient(f.cl)
	if _, err := adm.AlterTopicConfigs(testCtx(t), []kadm.AlterConfig{{Name: "max.message.bytes", Value: kadm.StringPtr("4194304")}}, f.events); err != nil {
		t.Fatal(err)
	}
	big := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","forkId":"production","tenantSchema":"acme_prod","irVersion":"v1","sequenceNumber":1,"ts":1719331200000,"payload":{"blob":"` +
		strings.Repeat("x", 1_500_000) + `"}}`)
	big4 := b.Client(t, kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(4<<20))
	src, err := big4.ProduceSync(testCtx(t), &kgo.Record{Topic: f.events, Key: []byte("user-1"), Value: big}).First()
	if err != nil {
		t.Fatalf("produce the %d-byte event: %v", len(big), err)
	}
	rec, err := dlq.NewRecord(dlq.DeadLetter{Source: src, Projection: "artist_followers", TenantSchema: "acme_prod",
		EventType: "ARTIST_FOLLOWED", Class: retry.Projection, Err: pgErr("42P01", `relation "x" does not exist`), Retries: 5},
		dlq.RecordConfig{Topic: f.dlqTopic, Worker: "test"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	f.produce(rec)
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Replayed != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want the large event replayed", res, outs)
	}
	checkReplayedValue(t, b, f.events, big)
}

// checkReplayedValue checks that the last record of topic with a replay
// source header holds want.
func checkReplayedValue(t *testing.T, b *kafkatest.Broker, topic string, want []byte) {
	t.Helper()
	var replayed *kgo.Record
	for _, r := range readTopic(t, b, topic) {
		if _, ok := headerValue(r.Headers, dlq.HeaderReplaySource); ok {
			replayed = r
		}
	}
	if replayed == nil || !bytes.Equal(replayed.Value, want) {
		t.Fatalf("replayed record %v, want the original's %d bytes", replayed, len(want))
	}
}

// TestRetryReadsOmittedHeadersAgain: a dead letter whose event's own
// headers were left out (too large for the dead-letter topic) is replayed
// with those headers, read again from the events topic and checked, in
// their order, before the replay headers; a dead letter whose digest does
// not match the record at its offset is refused, saying so.
func TestRetryReadsOmittedHeadersAgain(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	value := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","forkId":"production","tenantSchema":"acme_prod","irVersion":"v1","sequenceNumber":1,"ts":1719331200000,"payload":{}}`)
	own := []kgo.RecordHeader{
		{Key: "content-type", Value: []byte("application/json")},
		{Key: "x-baggage", Value: bytes.Repeat([]byte("b"), 4000)},
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
	}
	_, rec := deadLetterOver2048(t, f, &kgo.Record{Key: []byte("user-1"), Value: value, Headers: own}, dlq.HeaderOriginalHeadersOmitted)
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Replayed != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want the event replayed with its headers", res, outs)
	}
	checkReplayedValue(t, b, f.events, value)
	var replayed *kgo.Record
	for _, r := range readTopic(t, b, f.events) {
		if _, ok := headerValue(r.Headers, dlq.HeaderReplaySource); ok {
			replayed = r
		}
	}
	var got []string
	for _, h := range replayed.Headers {
		got = append(got, h.Key)
	}
	want := []string{"content-type", "x-baggage", "traceparent", dlq.HeaderReplayProjection, dlq.HeaderReplaySource, dlq.HeaderReplayCountOut, dlq.HeaderReplayFirstFailedAt}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("replayed headers %v, want %v", got, want)
	}
	for i, h := range own {
		if !bytes.Equal(replayed.Headers[i].Value, h.Value) {
			t.Errorf("replayed header %s is %d bytes, want the original's %d", h.Key, len(replayed.Headers[i].Value), len(h.Value))
		}
	}

	// Another digest: not the record at that offset.
	forged := *rec
	forged.Headers = nil
	for _, h := range rec.Headers {
		if h.Key == dlq.HeaderOriginalHeadersOmitted {
			h.Value = []byte("count=3 size=4083 sha256=" + strings.Repeat("0", 64))
		}
		forged.Headers = append(forged.Headers, h)
	}
	f.produce(&forged)
	f.wantOneRefusedOfTwo("not the failed record")
}

// wantOneRefusedOfTwo retries f's dead-letter topic, which holds one
// dead letter replayed before and one to refuse, and checks that the
// refusal's reason says why.
func (f *fixture) wantOneRefusedOfTwo(why string) {
	f.t.Helper()
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Refused != 1 || len(outs) != 2 {
		f.t.Fatalf("result %s, outcomes %+v; want one of the two refused", res, outs)
	}
	for _, o := range outs {
		if o.Kind == dlq.OutcomeRefused && !strings.Contains(o.Reason, why) {
			f.t.Errorf("refused with %q, want it to say %q", o.Reason, why)
		}
	}
}

// TestRetryReadsAnOmittedKeyAgain: a dead letter whose event's key was
// left out (too large for the dead-letter topic) is replayed with that
// key, read again from the events topic and checked, to the partition it
// was first read from.
func TestRetryReadsAnOmittedKeyAgain(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	value := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","forkId":"production","tenantSchema":"acme_prod","irVersion":"v1","sequenceNumber":1,"ts":1719331200000,"payload":{}}`)
	key := bytes.Repeat([]byte("k"), 4000)
	src, dl := deadLetterOver2048(t, f, &kgo.Record{Key: key, Value: value}, dlq.HeaderOriginalKeyOmitted)
	if dl.Key != nil {
		t.Fatalf("dead letter key of %d bytes, want none", len(dl.Key))
	}
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Replayed != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want the event replayed with its key", res, outs)
	}
	checkReplayedValue(t, b, f.events, value)
	for _, r := range readTopic(t, b, f.events) {
		if _, ok := headerValue(r.Headers, dlq.HeaderReplaySource); ok && (!bytes.Equal(r.Key, key) || r.Partition != src.Partition) {
			t.Errorf("replayed record: key %d bytes, partition %d; want the original's %d bytes, partition %d", len(r.Key), r.Partition, len(key), src.Partition)
		}
	}
}

// TestRetryReplaysAnEventTheTopicTookCompressed: an event larger than the
// events topic's limit before compression, which the topic took
// compressed (a 3 MiB key of one letter), is replayed: kgo counts a batch
// before compression, so such an event goes on its own, through a client
// without that limit, and the broker judges it compressed (third new-user
// trial: MESSAGE_TOO_LARGE from the replayer's own client, every run).
func TestRetryReplaysAnEventTheTopicTookCompressed(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	value := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","forkId":"production","tenantSchema":"acme_prod","irVersion":"v1","sequenceNumber":1,"ts":1719331200000,"payload":{}}`)
	key := bytes.Repeat([]byte("k"), 3<<20)
	big := b.Client(t, kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(8<<20), kgo.ProducerBatchCompression(kgo.GzipCompression()))
	src, err := big.ProduceSync(testCtx(t), &kgo.Record{Topic: f.events, Key: key, Value: value}).First()
	if err != nil {
		t.Fatalf("produce the 3 MiB key compressed: %v", err)
	}
	f.produceDeadLetter(src, 0)
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Replayed != 1 || len(outs) != 1 {
		t.Fatalf("result %s, outcomes %+v; want the event replayed", res, outs)
	}
	checkReplayedValue(t, b, f.events, value)
	for _, r := range readTopic(t, b, f.events) {
		if _, ok := headerValue(r.Headers, dlq.HeaderReplaySource); ok && !bytes.Equal(r.Key, key) {
			t.Errorf("replayed key of %d bytes, want the original's %d", len(r.Key), len(key))
		}
	}
}
