package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestRunTwinGroupInstanceIDs: two workers given one --group-instance-id
// (GROUP_INSTANCE_ID set in a ConfigMap that every replica of a
// Deployment shares): the broker fences the first when the second joins.
// The fenced one gives up its partitions, and its /readyz and an ERROR
// line say why, with the fix; the other is ready and applies the events.
// Against kfake and the real broker alike: franz-go keeps its member id
// when fenced, so its joins are fenced again and the two do not take the
// group slot back and forth.
func TestRunTwinGroupInstanceIDs(t *testing.T) {
	b := kafkatest.New(t)
	events := kafkatest.TopicName(t, "events")
	b.CreateTopic(t, events, 4, nil)
	t.Setenv("GROUP_INSTANCE_ID", kafkatest.TopicName(t, "twin"))
	dlqTopic := kafkatest.TopicName(t, "dlq")
	args := []string{
		"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
		"--projections", exampleProjections, "--topic", events,
		"--dlq-topic", dlqTopic, "--ledger-topic", kafkatest.TopicName(t, "ledger"),
		"--group", kafkatest.TopicName(t, "group")}
	first := startRun(t, append(args, "--worker-id", "first")...)
	first.waitFor(t, "the first worker ready", 30*time.Second, func() bool { return strings.HasPrefix(first.get(t, "/readyz"), "200") })
	second := startRun(t, append(args, "--worker-id", "second")...)
	second.waitFor(t, "the second worker ready", 30*time.Second, func() bool { return strings.HasPrefix(second.get(t, "/readyz"), "200") })
	first.waitFor(t, "the first worker fenced", 30*time.Second, func() bool { return first.logged(`msg="partitions lost"`) })
	const fix = "--group-instance-id (GROUP_INSTANCE_ID), so the broker keeps this one out: give each worker its own"
	first.waitFor(t, "the fenced worker's ERROR line with the fix", 30*time.Second, func() bool {
		return first.logged(`level=ERROR msg="consumer group not joined"`) && first.logged(fix)
	})
	if got := first.get(t, "/readyz"); !strings.HasPrefix(got, "503") || !strings.Contains(got, fix) || !strings.Contains(got, "FENCED_INSTANCE_ID") {
		t.Errorf("the fenced worker's /readyz = %q, want 503 with the fix and FENCED_INSTANCE_ID", got)
	}
	// Events go to the ready worker; the fenced one holds no partition.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	for i := range 8 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "poison-%d", i), Value: poison}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	rd := b.Client(t, kgo.ConsumeTopics(dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	byWorker := map[string]int{}
	for n := 0; n < 8; {
		fs := rd.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("reading the dead-letter topic: %v (%d of 8 read)", err, n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			n++
			for _, h := range r.Headers {
				if h.Key == dlq.HeaderWorker {
					byWorker[string(h.Value)]++
				}
			}
		})
	}
	if byWorker["second"] != 8 {
		t.Errorf("dead letters by worker (causet.dlq.worker) %v, want all 8 by the ready worker, none by the fenced one", byWorker)
	}
	second.shutdown(t)
	first.shutdown(t)
}
