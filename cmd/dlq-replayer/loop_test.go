package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// definitions of the loop: v41 has no followed_at column, v42 adds it.
const definitionsV42 = `
irVersion: v42
projections:
  - name: artist_followers
    table: artist_followers
    primaryKey: [artist_id, user_id]
    columns:
      artist_id:   { type: text,        from: payload.artist_id }
      user_id:     { type: text,        from: payload.user_id }
      followed_at: { type: timestamptz, from: ts }
    events:
      ARTIST_FOLLOWED: upsert
  - name: user_follows
    table: user_follows
    primaryKey: [user_id, artist_id]
    columns:
      user_id:   { type: text, from: payload.user_id }
      artist_id: { type: text, from: payload.artist_id }
    events:
      ARTIST_FOLLOWED: upsert
`

var definitionsV41 = strings.NewReplacer("irVersion: v42", "irVersion: v41",
	"      followed_at: { type: timestamptz, from: ts }\n", "").Replace(definitionsV42)

// counting counts the Apply calls of a projection.
type counting struct {
	projection.Handler
	applied atomic.Int64
}

func (c *counting) Apply(ctx context.Context, db projection.DB, ev *projection.Event) (projection.Outcome, error) {
	c.applied.Add(1)
	return c.Handler.Apply(ctx, db, ev)
}

// TestLoopFailMigrateRetry is the full loop with the real worker: an event
// fails artist_followers for a missing column and is dead-lettered; a retry
// before the fix fails again (the new dead letter has replay-count 1 and the
// original firstFailedAt); `migrate` adds the column; `retry --fork-id
// production --projection artist_followers` replays it and the row appears,
// user_follows was applied once only, the ledger has both entries, and a
// second retry replays nothing.
func TestLoopFailMigrateRetry(t *testing.T) {
	b := kafkatest.New(t)
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	f := newFixture(t, b)
	tenant := pgtest.NewSchemaName(t)
	v41, err := projection.ParseDefinitions("v41.yaml", []byte(definitionsV41))
	if err != nil {
		t.Fatal(err)
	}
	v42, err := projection.ParseDefinitions("v42.yaml", []byte(definitionsV42))
	if err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, pool, v41, tenant); err != nil { // DDL behind the IR
		t.Fatal(err)
	}
	tps, err := projection.NewTableProjections(v42)
	if err != nil {
		t.Fatal(err)
	}
	var handlers []projection.Handler
	var userFollows *counting
	for _, p := range tps {
		c := &counting{Handler: p}
		if p.Name() == "user_follows" {
			userFollows = c
		}
		handlers = append(handlers, c)
	}

	writer, err := dlq.NewWriter(b.Client(t, kgo.ProducerLinger(0)), dlq.WriterConfig{
		RecordConfig: dlq.RecordConfig{Topic: f.dlqTopic, Worker: "loop-test", Generation: "test/v42"},
		Backoff:      retry.Policy{Initial: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 100 * time.Millisecond, Jitter: 0.2},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := projection.NewWorker(projection.Config{
		Topic:          f.events,
		Group:          kafkatest.TopicName(t, "group"),
		Retry:          retry.Policy{Initial: 5 * time.Millisecond, Multiplier: 2, MaxInterval: 40 * time.Millisecond, Jitter: 0.5, MaxRetries: 5},
		CommitInterval: 100 * time.Millisecond,
		ShutdownGrace:  20 * time.Second,
		Logger:         slog.New(slog.DiscardHandler),
	}, handlers, pool, writer, b.Opts()...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }() // ends when stop is called
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()

	value := fmt.Sprintf(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}}`, tenant)
	if err := f.cl.ProduceSync(ctx, &kgo.Record{Topic: f.events, Key: []byte("user-123"), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	first := waitDeadLetters(ctx, t, f, 1)[0]
	if first.ReplayCount != 0 || !strings.Contains(first.Message.Error, "42703") {
		t.Fatalf("first dead letter: replay-count %d, error %q", first.ReplayCount, first.Message.Error)
	}

	// Retry before the fix: fails again.
	r := runCmd(t, f.env, "retry", "--fork-id", "production", "--projection", "artist_followers")
	if r.code != 0 || r.lastLine() != "matched=1 replayed=1 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("retry before the fix: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	second := waitDeadLetters(ctx, t, f, 2)[1]
	if second.ReplayCount != 1 || second.Message.FirstFailedAt != first.Message.FirstFailedAt {
		t.Fatalf("dead letter of the replay: replay-count %d firstFailedAt %d, want 1 and %d",
			second.ReplayCount, second.Message.FirstFailedAt, first.Message.FirstFailedAt)
	}

	// The fix: migrate, then retry.
	if err := projection.Migrate(ctx, pool, v42, tenant); err != nil {
		t.Fatal(err)
	}
	r = runCmd(t, f.env, "retry", "--fork-id", "production", "--projection", "artist_followers")
	if r.code != 0 || r.lastLine() != "matched=2 replayed=1 skipped=0 already-replayed=1 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("retry after the fix: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	var seq int64
	for {
		err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT _causet_seq FROM %s.artist_followers WHERE artist_id = 'artist-456' AND user_id = 'user-123'`,
			pgx.Identifier{tenant}.Sanitize())).Scan(&seq)
		if err == nil {
			break
		}
		if err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("the replayed event was never applied")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if seq != 1891 {
		t.Errorf("_causet_seq = %d, want 1891", seq)
	}
	if n := userFollows.applied.Load(); n != 1 {
		t.Errorf("user_follows applied %d times, want 1 (replays name artist_followers only)", n)
	}
	if n := len(waitDeadLetters(ctx, t, f, 2)); n != 2 {
		t.Errorf("%d dead letters after the fix, want 2", n)
	}

	l, err := dlq.OpenLedger(ctx, b.Opts(), dlq.LedgerConfig{Topic: f.ledger, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []*dlq.Entry{first, second} {
		if d, ok := l.Lookup(e.Coordinates()); !ok || d.Action != dlq.ActionReplayed || d.ReplayCount != e.ReplayCount+1 {
			t.Errorf("ledger for %s: %+v, %t", e.Coordinates(), d, ok)
		}
	}
	r = runCmd(t, f.env, "retry", "--fork-id", "production", "--projection", "artist_followers")
	if r.code != 0 || r.lastLine() != "matched=2 replayed=0 skipped=0 already-replayed=2 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("second retry after the fix: exit %d %q", r.code, r.stdout)
	}
}

// waitDeadLetters waits until the dead-letter topic holds at least n dead
// letters and returns them in offset order (the topic has one partition).
func waitDeadLetters(ctx context.Context, t *testing.T, f *fixture, n int) []*dlq.Entry {
	t.Helper()
	adm := kadm.NewClient(f.b.Client(t))
	for {
		ends, err := adm.ListEndOffsets(ctx, f.dlqTopic)
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := ends.Lookup(f.dlqTopic, 0); o.Offset >= int64(n) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("fewer than %d dead letters", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var out []*dlq.Entry
	if _, err := dlq.Scan(ctx, f.b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}
