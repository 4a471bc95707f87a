package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
)

// TestRunWithoutCreateTopicsStillChecksTheTopics: --create-topics=false
// skips creating topics, nothing else. The worker still describes the
// existing topics: it warns about and exports (causet_dlq_retention_seconds) a
// dead-letter topic that keeps less than 30 days (SPEC §2), and sizes dead
// letters by the topic's max.message.bytes. A missing events or dead-letter
// topic stops it with an error naming the topic and the flag; a missing
// ledger topic (only dlq-replayer uses it) is a warning. It creates nothing.
func TestRunWithoutCreateTopicsStillChecksTheTopics(t *testing.T) {
	tests := []struct {
		name string
		// missing is the topic not created beforehand: "events", "dlq",
		// "ledger", or "" for none.
		missing string
	}{
		{name: "existing topics, short retention"},
		{name: "missing dead-letter topic", missing: "dlq"},
		{name: "missing events topic", missing: "events"},
		{name: "missing ledger topic", missing: "ledger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.New(t)
			topics := map[string]string{}
			for _, kind := range []string{"events", "dlq", "ledger"} {
				topics[kind] = kafkatest.TopicName(t, kind)
			}
			configs := map[string]map[string]*string{
				"dlq": {
					"retention.ms":      kadm.StringPtr("86400000"), // 1 day
					"max.message.bytes": kadm.StringPtr("2000000"),
				},
				"ledger": {"cleanup.policy": kadm.StringPtr("compact")},
			}
			for kind, name := range topics {
				if kind != tt.missing {
					b.CreateTopic(t, name, 1, configs[kind])
				}
			}

			w := startRun(t, "--create-topics=false",
				"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
				"--projections", exampleProjections, "--topic", topics["events"],
				"--dlq-topic", topics["dlq"], "--ledger-topic", topics["ledger"],
				"--group", kafkatest.TopicName(t, "group"))
			missingNamed := func() bool {
				return w.logged(topics[tt.missing]) && w.logged("--create-topics=false")
			}
			switch tt.missing {
			case "events", "dlq":
				if code := w.exit(t, 60*time.Second); code != 1 {
					t.Errorf("exit %d, want 1\nstderr:\n%s", code, w.stderr.String())
				}
				if !missingNamed() {
					t.Errorf("the error does not name topic %s and --create-topics=false\nstderr:\n%s", topics[tt.missing], w.stderr.String())
				}
			default:
				w.waitFor(t, "the worker started", 60*time.Second, func() bool { return w.logged("projection worker started") })
				if tt.missing == "ledger" && !missingNamed() {
					t.Errorf("no warning naming topic %s and --create-topics=false\nstderr:\n%s", topics["ledger"], w.stderr.String())
				}
				if !w.logged("dead-letter topic keeps less than 30 days") {
					t.Errorf("no warning about the dead-letter topic's 1-day retention\nstderr:\n%s", w.stderr.String())
				}
				if !w.logged("dlq_max_bytes=2000000") {
					t.Errorf("dead letters not sized by the topic's max.message.bytes 2000000\nstderr:\n%s", w.stderr.String())
				}
				if want := fmt.Sprintf("max_batch_records=%d", projection.DefaultMaxBatchRecords); !w.logged(want) { // the default, in the started line (new-user trial)
					t.Errorf("the started line does not give --max-batch-records' default (%s)\nstderr:\n%s", want, w.stderr.String())
				}
				var metrics string
				w.waitFor(t, "/metrics exports causet_dlq_retention_seconds", 10*time.Second, func() bool {
					metrics = w.get(t, "/metrics")
					return metricLine(metrics, "causet_dlq_retention_seconds") != ""
				})
				if line := metricLine(metrics, "causet_dlq_retention_seconds"); !strings.HasSuffix(line, " 86400") {
					t.Errorf("/metrics: %q, want causet_dlq_retention_seconds 86400 (1 day)", line)
				}
				w.shutdown(t)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if tt.missing != "" {
				details, err := kadm.NewClient(b.Client(t)).ListTopics(ctx, topics[tt.missing])
				if err != nil {
					t.Fatal(err)
				}
				if d, ok := details[topics[tt.missing]]; ok && d.Err == nil {
					t.Errorf("topic %s was created with --create-topics=false", topics[tt.missing])
				}
			}
		})
	}
}

// metricLine returns the first sample line of the Prometheus text
// exposition whose metric name starts with name, or "".
func metricLine(exposition, name string) string {
	for _, l := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(l, name) {
			return l
		}
	}
	return ""
}

// TestRunWarnsWhenItCreatesTheEventsTopic: a worker that creates its
// events topic (--create-topics, the default) warns that nothing was
// produced to it and names --topic (operator trial: a typo in --topic made
// a new, empty topic with an INFO line and a ready worker reading
// nothing); the other topics it creates are INFO lines.
func TestRunWarnsWhenItCreatesTheEventsTopic(t *testing.T) {
	t.Parallel()
	b := kafkatest.New(t)
	events, dlqTopic := kafkatest.TopicName(t, "events-typo"), kafkatest.TopicName(t, "dlq")
	w := startRun(t, "--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
		"--projections", exampleProjections, "--topic", events, "--dlq-topic", dlqTopic,
		"--ledger-topic", kafkatest.TopicName(t, "ledger"))
	w.waitFor(t, "the events topic's creation to be said", 30*time.Second, func() bool {
		return w.logged(`level=WARN msg="events topic created: it did not exist`) && w.logged("fix --topic (EVENTS_TOPIC)")
	})
	if !w.logged(`level=INFO msg="topic created" topic=` + dlqTopic) {
		t.Errorf("no INFO line for the dead-letter topic created\nstderr:\n%s", w.stderr.String())
	}
}
