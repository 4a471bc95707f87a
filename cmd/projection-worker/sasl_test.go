package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestRunOverSASLAndTLSWithAPrivateCA: against the real broker's SASL_SSL
// listener (SCRAM-SHA-512, a certificate signed by a private CA: make
// kafka-up), `run` with --kafka-tls-ca and the SASL flags creates its
// topics, applies an event and dead-letters a poison one; with a wrong
// password it stops at start with an error saying authentication failed,
// and the password appears in no output.
func TestRunOverSASLAndTLSWithAPrivateCA(t *testing.T) {
	sb := kafkatest.Secure(t)
	tenant := pgtest.NewSchemaName(t)
	if r := runCmd(t, time.Minute, "migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections, "--tenant-schema", tenant); r.code != 0 {
		t.Fatalf("migrate exited %d:\n%s", r.code, r.stderr)
	}
	events, dlqTopic := kafkatest.TopicName(t, "events"), kafkatest.TopicName(t, "dlq")
	topicArgs := []string{"--database-url", pgtest.URL(t), "--projections", exampleProjections, "--topic", events,
		"--dlq-topic", dlqTopic, "--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group")}
	w := startRun(t, append(sb.Args(), topicArgs...)...)
	w.waitFor(t, "the worker ready over SASL_SSL", time.Minute, func() bool { return strings.HasPrefix(w.get(t, "/readyz"), "200") })

	opts, err := sb.Opts()
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx,
		&kgo.Record{Key: []byte("user-123"), Value: fmt.Appendf(nil, specExample, tenant)},
		&kgo.Record{Key: []byte("poison-1"), Value: poison}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	w.waitFor(t, "the event applied and the poison dead-lettered", time.Minute, func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{tenant, "artist_followers"}.Sanitize()).Scan(&n)
		return n == 1 && w.logged("dead-lettered")
	})
	w.shutdown(t)

	wrong := append(append([]string{"run", "--http-addr", closedAddr(t), "--log-format", "text"}, sb.Args()...), topicArgs...)
	for i, a := range wrong {
		if a == sb.Password {
			wrong[i] = "not-" + sb.Password
		}
	}
	r := runCmd(t, 2*time.Minute, wrong...)
	if r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "authentication failed") {
		t.Errorf("run with a wrong SASL password exited %d, want an error saying authentication failed:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, sb.Password) {
		t.Errorf("the SASL password appears in the output of the refused worker")
	}
}
