package main

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestRunSaysTheBrokersCannotBeReached: the brokers go away under a running
// worker. Its ERROR says they cannot be reached (not that they refuse its
// connection, with an empty cause), the join's error each poll is written
// when it changes or once a minute, not every few seconds, and no
// "partitions lost" WARN names no partition (operator trial: all three,
// every few seconds of a broker outage).
func TestRunSaysTheBrokersCannotBeReached(t *testing.T) {
	t.Parallel()
	events, dlqTopic, ledger := kafkatest.TopicName(t, "events"), kafkatest.TopicName(t, "dlq"), kafkatest.TopicName(t, "ledger")
	b := kafkatest.Fake(t, kfake.SeedTopics(2, events, dlqTopic, ledger))
	w := startRun(t, "--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t), "--projections", exampleProjections,
		"--topic", events, "--dlq-topic", dlqTopic, "--ledger-topic", ledger, "--group", kafkatest.TopicName(t, "group"),
		"--shutdown-grace", "2s")
	w.waitFor(t, "the worker ready", 30*time.Second, func() bool { return strings.HasPrefix(w.get(t, "/readyz"), "200") })
	b.Fake.Close()
	w.waitFor(t, "an ERROR saying the brokers cannot be reached", 45*time.Second, func() bool {
		return w.logged(`level=ERROR msg="consumer group not joined: the brokers cannot be reached"`)
	})
	if got := w.get(t, "/readyz"); !strings.HasPrefix(got, "503 ") || !strings.Contains(got, "the brokers cannot be reached: ") {
		t.Errorf("/readyz = %q, want 503 saying the brokers cannot be reached", got)
	}
	time.Sleep(15 * time.Second) // several of franz-go's join retries
	log := w.stderr.String()
	notJoined := 0
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "refuse the worker's connection"):
			t.Errorf("a line says the brokers refuse the connection, for brokers that are gone: %s", l)
		case strings.Contains(l, `msg="partitions lost"`) && strings.Contains(l, "partitions=[]"):
			t.Errorf("a partitions lost WARN names no partition: %s", l)
		case strings.Contains(l, `level=ERROR msg="consumer group not joined"`):
			notJoined++
		}
	}
	if notJoined > 3 {
		t.Errorf("%d ERROR lines consumer group not joined within a minute of the outage, want its changes only (at most 3)\n%s", notJoined, log)
	}
	w.stop()
	w.exit(t, 40*time.Second)
}
