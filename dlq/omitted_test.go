package dlq_test

import (
	"bytes"
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
	src, err := f.cl.ProduceSync(testCtx(t), &kgo.Record{Topic: f.events, Key: []byte(key), Value: value}).First()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := dlq.NewRecord(dlq.DeadLetter{Source: src, Projection: "artist_followers", TenantSchema: "acme_prod",
		EventType: "ARTIST_FOLLOWED", Class: retry.Projection, Err: pgErr("42703", `column "x" does not exist`), Retries: 5},
		dlq.RecordConfig{Topic: f.dlqTopic, Worker: "test", MaxBytes: 2048}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := headerValue(rec.Headers, dlq.HeaderOriginalOmitted); !ok {
		t.Fatalf("a %d-byte original fit a 2048-byte dead letter: the test needs it left out", len(value))
	}
	f.produce(rec)
	return src
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
	var replayed *kgo.Record
	for _, r := range readTopic(t, b, f.events) {
		if _, ok := headerValue(r.Headers, dlq.HeaderReplaySource); ok {
			replayed = r
		}
	}
	if replayed == nil || !bytes.Equal(replayed.Value, big) {
		t.Fatalf("replayed record %v, want the original's %d bytes", replayed, len(big))
	}
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
	res, outs = f.retry(dlq.ReplayConfig{Actor: "alice"})
	if res.Refused != 1 || len(outs) != 2 {
		t.Fatalf("result %s, outcomes %+v; want the deleted original refused", res, outs)
	}
	for _, o := range outs {
		if o.Kind == dlq.OutcomeRefused && !strings.Contains(o.Reason, "no longer in the topic") {
			t.Errorf("refused with %q, want it to say the original is no longer in the topic", o.Reason)
		}
	}
}
