package dlq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/kafkatest"
)

// newAdmin returns the test's Kafka (KAFKA_BROKERS, else kfake; fake when
// the test injects faults), an admin client for it and topic names unique
// to the test.
func newAdmin(t *testing.T, fake bool) (*kafkatest.Broker, *kadm.Client, TopicConfig) {
	t.Helper()
	b := kafkatest.New(t)
	if fake {
		b = kafkatest.Fake(t)
	}
	return b, kadm.NewClient(b.Client(t)), TopicConfig{
		EventsTopic: kafkatest.TopicName(t, "events"),
		DLQTopic:    kafkatest.TopicName(t, "dlq"),
		LedgerTopic: kafkatest.TopicName(t, "ledger"),
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// topicConfig returns the value of config key of topic, waiting for a real
// broker to know a topic just created.
func topicConfig(t *testing.T, adm *kadm.Client, topic, key string) string {
	t.Helper()
	var rc kadm.ResourceConfig
	for try := 0; ; try++ {
		rcs, err := adm.DescribeTopicConfigs(testCtx(t), topic)
		if err != nil {
			t.Fatal(err)
		}
		if rc, err = rcs.On(topic, nil); err != nil {
			t.Fatal(err)
		}
		if rc.Err == nil {
			break
		}
		if !errors.Is(rc.Err, kerr.UnknownTopicOrPartition) || try == 50 {
			t.Fatalf("describe %s: %v", topic, rc.Err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range rc.Configs {
		if c.Key == key {
			return c.MaybeValue()
		}
	}
	t.Fatalf("%s has no config %s", topic, key)
	return ""
}

// partitionCounts returns the partition count of each of topics.
func partitionCounts(t *testing.T, adm *kadm.Client, topics ...string) map[string]int {
	t.Helper()
	got, err := topicPartitions(testCtx(t), adm, topics...)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestEnsureTopicsCreatesAllThree(t *testing.T) {
	_, adm, cfg := newAdmin(t, false)
	cfg.Partitions = 4
	rep, err := EnsureTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	maxBytes, err := strconv.Atoi(topicConfig(t, adm, cfg.DLQTopic, "max.message.bytes"))
	if err != nil {
		t.Fatal(err)
	}
	// A dead letter of a 1 MiB value that is not JSON (base64, 4/3 larger)
	// must fit.
	if maxBytes != TopicMaxMessageBytes {
		t.Errorf("dead-letter max.message.bytes %d, want %d", maxBytes, TopicMaxMessageBytes)
	}
	want := TopicReport{
		Created:            []string{cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic},
		EventsPartitions:   4,
		DLQPartitions:      4,
		DLQRetention:       30 * 24 * time.Hour,
		DLQMaxMessageBytes: maxBytes,
	}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	wantParts := map[string]int{cfg.EventsTopic: 4, cfg.DLQTopic: 4, cfg.LedgerTopic: 1}
	if diff := cmp.Diff(wantParts, partitionCounts(t, adm, cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic)); diff != "" {
		t.Errorf("partitions (-want +got):\n%s", diff)
	}
	if got := topicConfig(t, adm, cfg.DLQTopic, "retention.ms"); got != "2592000000" {
		t.Errorf("dead-letter retention.ms %s, want 2592000000", got)
	}
	if got := topicConfig(t, adm, cfg.LedgerTopic, "cleanup.policy"); got != "compact" {
		t.Errorf("ledger cleanup.policy %s, want compact", got)
	}
}

func TestEnsureTopicsDeadLetterTopicFollowsTheEventsTopic(t *testing.T) {
	b, adm, cfg := newAdmin(t, false)
	b.CreateTopic(t, cfg.EventsTopic, 6, nil)
	cfg.Partitions = 2
	rep, err := EnsureTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if diff := cmp.Diff([]string{cfg.DLQTopic, cfg.LedgerTopic}, rep.Created); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	if rep.EventsPartitions != 6 || rep.DLQPartitions != 6 {
		t.Errorf("events, dead-letter partitions = %d, %d; want 6, 6", rep.EventsPartitions, rep.DLQPartitions)
	}
	if got := partitionCounts(t, adm, cfg.DLQTopic)[cfg.DLQTopic]; got != 6 {
		t.Errorf("dead-letter topic has %d partitions, want 6", got)
	}
}

func TestEnsureTopicsReportsAnExistingDeadLetterTopicsRetention(t *testing.T) {
	tests := []struct {
		name          string
		retentionMs   string
		wantRetention time.Duration
		wantTooShort  bool
	}{
		{"one day is too short", "86400000", 24 * time.Hour, true},
		{"just under 30 days is too short", "2591999999", MinRetention - time.Millisecond, true},
		{"30 days", "2592000000", MinRetention, false},
		{"90 days", "7776000000", 90 * 24 * time.Hour, false},
		{"infinite", "-1", -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, adm, cfg := newAdmin(t, false)
			b.CreateTopic(t, cfg.DLQTopic, 3, map[string]*string{"retention.ms": kadm.StringPtr(tt.retentionMs)})
			cfg.Partitions = 5
			rep, err := EnsureTopics(testCtx(t), adm, cfg)
			if err != nil {
				t.Fatalf("EnsureTopics: %v", err)
			}
			if rep.DLQRetention != tt.wantRetention || rep.DLQRetentionTooShort != tt.wantTooShort {
				t.Errorf("retention %v, too short %v; want %v, %v", rep.DLQRetention, rep.DLQRetentionTooShort, tt.wantRetention, tt.wantTooShort)
			}
			if rep.DLQPartitions != 3 || rep.EventsPartitions != 5 {
				t.Errorf("dead-letter, events partitions = %d, %d; want 3, 5", rep.DLQPartitions, rep.EventsPartitions)
			}
			if diff := cmp.Diff([]string{cfg.EventsTopic, cfg.LedgerTopic}, rep.Created); diff != "" {
				t.Errorf("created (-want +got):\n%s", diff)
			}
			if got := topicConfig(t, adm, cfg.DLQTopic, "retention.ms"); got != tt.retentionMs {
				t.Errorf("existing dead-letter topic's retention.ms changed to %s", got)
			}
		})
	}
}

func TestEnsureTopicsIsIdempotent(t *testing.T) {
	_, adm, cfg := newAdmin(t, false)
	first, err := EnsureTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("first EnsureTopics: %v", err)
	}
	// Right away, with the same client: kgo's metadata cache still holds
	// the topics as missing from the first call's lookup.
	second, err := EnsureTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("second EnsureTopics: %v", err)
	}
	if len(first.Created) != 3 || first.EventsPartitions != DefaultPartitions {
		t.Errorf("first report %+v, want 3 topics created with %d partitions", first, DefaultPartitions)
	}
	first.Created = nil
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("second report differs from the first (-first +second):\n%s", diff)
	}
}

// TestEnsureTopicsTreatsAlreadyExistsAsSuccess simulates another worker
// creating the dead-letter topic between the lookup and the create.
func TestEnsureTopicsTreatsAlreadyExistsAsSuccess(t *testing.T) {
	b, adm, cfg := newAdmin(t, true)
	b.CreateTopic(t, cfg.DLQTopic, 2, map[string]*string{"retention.ms": nil}) // the broker's default
	lookup := b.Fake.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Metadata},
		Topic: cfg.DLQTopic,
		Err:   kerr.UnknownTopicOrPartition,
		When: func(r kmsg.Request) bool {
			return r.(*kmsg.MetadataRequest).IncludeTopicAuthorizedOperations // EnsureTopics' lookups only
		},
	})
	cfg.Partitions = 4
	rep, err := EnsureTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if diff := cmp.Diff([]string{cfg.EventsTopic, cfg.LedgerTopic}, rep.Created); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	if n := lookup.Hits(); n != 1 {
		t.Errorf("the lookup reported the topic missing %d times, want 1", n)
	}
	if rep.DLQPartitions != 2 {
		t.Errorf("dead-letter partitions %d, want 2 (the existing topic's)", rep.DLQPartitions)
	}
	if !rep.DLQRetentionTooShort || rep.DLQRetention != 7*24*time.Hour {
		t.Errorf("retention %v, too short %v; want the broker default 168h, too short", rep.DLQRetention, rep.DLQRetentionTooShort)
	}
}

func TestEnsureTopicsNamesTheTopicItCannotCreate(t *testing.T) {
	b, adm, cfg := newAdmin(t, true)
	b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Topic: cfg.DLQTopic, Err: kerr.TopicAuthorizationFailed})
	rep, err := EnsureTopics(testCtx(t), adm, cfg)
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || !strings.Contains(err.Error(), cfg.DLQTopic) {
		t.Fatalf("EnsureTopics error %v, want TOPIC_AUTHORIZATION_FAILED naming %s", err, cfg.DLQTopic)
	}
	if diff := cmp.Diff([]string{cfg.EventsTopic}, rep.Created); diff != "" {
		t.Errorf("partial report's created (-want +got):\n%s", diff)
	}
}

// TestCheckTopicsReportsWithoutCreating: CheckTopics reads what
// EnsureTopics reports (partitions, the dead-letter topic's retention and
// max.message.bytes, a retention under 30 days) and lists missing topics
// instead of creating them.
func TestCheckTopicsReportsWithoutCreating(t *testing.T) {
	b, adm, cfg := newAdmin(t, false)
	b.CreateTopic(t, cfg.EventsTopic, 2, nil)
	b.CreateTopic(t, cfg.DLQTopic, 2, map[string]*string{
		"retention.ms":      kadm.StringPtr("86400000"),
		"max.message.bytes": kadm.StringPtr("2000000"),
	})
	rep, err := CheckTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("CheckTopics: %v", err)
	}
	want := TopicReport{
		EventsPartitions:     2,
		DLQPartitions:        2,
		DLQRetention:         24 * time.Hour,
		DLQRetentionTooShort: true,
		DLQMaxMessageBytes:   2000000,
		Missing:              []string{cfg.LedgerTopic},
	}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}

	_, adm, cfg = newAdmin(t, false)
	rep, err = CheckTopics(testCtx(t), adm, cfg)
	if err != nil {
		t.Fatalf("CheckTopics without topics: %v", err)
	}
	if diff := cmp.Diff(TopicReport{Missing: []string{cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic}}, rep); diff != "" {
		t.Errorf("report without topics (-want +got):\n%s", diff)
	}
	if got := partitionCounts(t, adm, cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic); len(got) != 0 {
		t.Errorf("CheckTopics created topics: %v", got)
	}
}

func TestTopicConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     TopicConfig
		wantErr bool
	}{
		{"zero value", TopicConfig{}, true},
		{"events topic only", TopicConfig{EventsTopic: "e"}, false},
		{"custom", TopicConfig{EventsTopic: "e", DLQTopic: "d", LedgerTopic: "l", Partitions: 1, ReplicationFactor: 3}, false},
		{"same events and dead-letter topic", TopicConfig{EventsTopic: DefaultTopic}, true},
		{"same dead-letter and ledger topic", TopicConfig{EventsTopic: "e", LedgerTopic: DefaultTopic}, true},
		{"illegal name", TopicConfig{EventsTopic: "e", LedgerTopic: "ledger!"}, true},
		{"negative partitions", TopicConfig{EventsTopic: "e", Partitions: -1}, true},
		{"replication factor below -1", TopicConfig{EventsTopic: "e", ReplicationFactor: -2}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error %v", err, tt.wantErr)
			}
		})
	}
	want := TopicConfig{EventsTopic: "e", DLQTopic: DefaultTopic, LedgerTopic: DefaultLedgerTopic, Partitions: 8, ReplicationFactor: -1}
	got := TopicConfig{EventsTopic: "e"}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}
