package dlq_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
)

// TestLedgerRecordsAndReadsBack creates the compacted ledger topic, records
// decisions, and reads them back in a new ledger; a later decision replaces
// an earlier one, a tombstone removes it, and records that are not decisions
// are ignored.
func TestLedgerRecordsAndReadsBack(t *testing.T) {
	b := kafkatest.New(t)
	topic := kafkatest.TopicName(t, "ledger")
	ctx := testCtx(t)

	l, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Len() != 0 {
		t.Fatalf("new ledger has %d decisions", l.Len())
	}
	a := dlq.Coordinates{Partition: 0, Offset: 7}
	c := dlq.Coordinates{Partition: 2, Offset: 1891}
	gone := dlq.Coordinates{Partition: 1, Offset: 1}
	replayed := dlq.Decision{Entry: a, Action: dlq.ActionReplayed, At: 1719331200000, Actor: "alice", RunID: "r1", ReplayCount: 1}
	skipped := dlq.Decision{Entry: a, Action: dlq.ActionSkipped, At: 1719331300000, Actor: "bob", RunID: "r2", Reason: "bad data"}
	other := dlq.Decision{Entry: c, Action: dlq.ActionReplayed, At: 1719331200000, Actor: "alice", RunID: "r1", ReplayCount: 3}
	if err := l.Record(ctx, replayed, other, dlq.Decision{Entry: gone, Action: dlq.ActionSkipped}); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, skipped); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.Lookup(a); got != skipped {
		t.Errorf("in-memory decision %+v, want %+v", got, skipped)
	}
	// A tombstone and two records that are not decisions, written by hand.
	cl := b.Client(t)
	for _, r := range []*kgo.Record{
		{Topic: topic, Key: []byte(gone.String()), Value: nil},
		{Topic: topic, Key: []byte("nonsense"), Value: []byte(`{"action":"replayed"}`)},
		{Topic: topic, Key: []byte("0:9"), Value: []byte(`{"action":"maybe"}`)},
	} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	again, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: topic, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[dlq.Coordinates]dlq.Decision{}
	for _, k := range []dlq.Coordinates{a, c, gone, {Partition: 0, Offset: 9}} {
		if d, ok := again.Lookup(k); ok {
			got[k] = d
		}
	}
	want := map[dlq.Coordinates]dlq.Decision{a: skipped, c: other}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decisions read back (-want +got):\n%s", diff)
	}
	if again.Status(a) != "skipped" || again.Status(gone) != "" {
		t.Errorf("Status: %q %q", again.Status(a), again.Status(gone))
	}
	if err := again.Record(ctx, replayed); err == nil {
		t.Error("Record on a read-only ledger: no error")
	}

	// The topic is compacted, and the value is the documented JSON.
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfgs.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	var policy string
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	if policy != "compact" {
		t.Errorf("cleanup.policy = %q, want compact", policy)
	}
	recs := readTopic(t, b, topic)
	if got, want := string(recs[0].Value), `{"action":"replayed","at":1719331200000,"actor":"alice","runId":"r1","reason":"","replayCount":1}`; got != want {
		t.Errorf("ledger value\n got %s\nwant %s", got, want)
	}
	if string(recs[0].Key) != "0:7" {
		t.Errorf("ledger key %q, want 0:7", recs[0].Key)
	}
}

func TestLedgerReadOnlyWithoutTopicIsEmpty(t *testing.T) {
	b := kafkatest.New(t)
	topic := kafkatest.TopicName(t, "ledger")
	l, err := dlq.OpenLedger(testCtx(t), b.Opts(), dlq.LedgerConfig{Topic: topic, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.Len() != 0 {
		t.Errorf("len %d", l.Len())
	}
	tds, err := kadm.NewClient(b.Client(t)).ListTopics(testCtx(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(topic) && tds[topic].Err == nil {
		t.Error("a read-only ledger created its topic")
	}
}

func TestLedgerConfigValidateFillsDefaults(t *testing.T) {
	var c dlq.LedgerConfig
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Topic != dlq.DefaultLedgerTopic || c.Partitions != dlq.LedgerPartitions || c.ReplicationFactor != -1 || c.Logger == nil {
		t.Errorf("defaults: %+v", c)
	}
	bad := dlq.LedgerConfig{ReplicationFactor: -2}
	if err := bad.Validate(); err == nil {
		t.Error("replication factor -2: no error")
	}
}

// TestLedgerKeepsTheDecisionsOfOneDeadLetterTopic: a decision names its
// dead-letter topic, and a ledger opened for another one is refused, read
// only or not (replayer trial: a second DLQ topic on the default ledger
// read its dead letters 0:0, 1:0, 2:0 as already replayed, from the first
// topic's decisions, and never sent them); a ledger opened for the same
// topic, or for none, reads the decisions.
func TestLedgerKeepsTheDecisionsOfOneDeadLetterTopic(t *testing.T) {
	b := kafkatest.New(t)
	topic := kafkatest.TopicName(t, "ledger")
	ctx := testCtx(t)
	// Topics of their own: a real broker keeps them from run to run.
	dlqA, dlqB := kafkatest.TopicName(t, "dlq-a"), kafkatest.TopicName(t, "dlq-b")
	b.CreateTopic(t, dlqA, 1, nil)
	b.CreateTopic(t, dlqB, 1, nil)
	l, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: topic, DLQTopic: dlqA})
	if err != nil {
		t.Fatal(err)
	}
	d := dlq.Decision{Entry: dlq.Coordinates{Partition: 1, Offset: 0}, Action: dlq.ActionReplayed, At: 1719331200000, Actor: "alice", RunID: "r1", ReplayCount: 1}
	err = l.Record(ctx, d)
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, readOnly := range []bool{true, false} {
		_, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: topic, DLQTopic: dlqB, DLQTopicSetting: "--dlq-topic", TopicSetting: "--ledger-topic", ReadOnly: readOnly})
		want := `--ledger-topic "` + topic + `" holds decisions about the dead letters of "` + dlqA + `", keyed by partition and offset only, so it cannot also keep those of --dlq-topic "` + dlqB + `"`
		if !errors.Is(err, dlq.ErrLedgerOfAnotherTopic) || !strings.Contains(err.Error(), want) {
			t.Errorf("read-only %v: OpenLedger for %s: %v; want ErrLedgerOfAnotherTopic saying %q", readOnly, dlqB, err, want)
		}
	}
	for _, dlqTopic := range []string{dlqA, ""} {
		again, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: topic, DLQTopic: dlqTopic, ReadOnly: true})
		if err != nil {
			t.Fatalf("OpenLedger for %q: %v", dlqTopic, err)
		}
		if got, ok := again.Lookup(d.Entry); !ok || got != d {
			t.Errorf("OpenLedger for %q: decision %+v, %v; want %+v", dlqTopic, got, ok, d)
		}
		again.Close()
	}
}

// TestLedgerOfAMissingDeadLetterTopicFailsFirst: a dead-letter topic that
// does not exist is said before anything about the ledger, and no ledger
// topic is created for it (operator trial: a mistyped --dlq-topic was
// blamed on a ledger holding another topic's decisions, and retry created
// a ledger topic for it, left behind).
func TestLedgerOfAMissingDeadLetterTopicFailsFirst(t *testing.T) {
	b := kafkatest.New(t)
	ctx := testCtx(t)
	dlqTopic := kafkatest.TopicName(t, "dlq")
	b.CreateTopic(t, dlqTopic, 1, nil)
	used := kafkatest.TopicName(t, "ledger")
	l, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: used, DLQTopic: dlqTopic})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Record(ctx, dlq.Decision{Entry: dlq.Coordinates{Partition: 0, Offset: 0}, Action: dlq.ActionSkipped, At: 1719331200000, Actor: "alice", RunID: "r1", Reason: "test"})
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	fresh := kafkatest.TopicName(t, "fresh-ledger")
	for _, tt := range []struct {
		name   string
		ledger string
	}{{"ledger of another topic", used}, {"no ledger yet", fresh}} {
		for _, readOnly := range []bool{true, false} {
			_, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: tt.ledger, DLQTopic: dlqTopic + "-typo", ReadOnly: readOnly})
			want := "describe dead-letter topic " + dlqTopic + "-typo: " + dlq.ErrTopicNotFound.Error()
			if !errors.Is(err, dlq.ErrTopicNotFound) || err.Error() != want {
				t.Errorf("%s, read-only %v: %v; want %q", tt.name, readOnly, err, want)
			}
		}
	}
	tds, err := kadm.NewClient(b.Client(t)).ListTopics(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(fresh) && tds[fresh].Err == nil {
		t.Error("a ledger topic was created for a dead-letter topic that does not exist")
	}
}
