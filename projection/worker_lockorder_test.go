package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/projection"
)

// TestWorkerPartitionsWritingOneRowDoNotDeadlock: two projections whose
// primary key is an account, not the event's entity (per-account rows
// written by the payments of many entities, on four partitions), applied
// in small batches by four partitions at once: no batch meets a deadlock
// (40P01), since every batch takes its row locks in one order, and each
// account ends at its newest payment. A new-user trial with such totals
// saw 30 deadlocks and about 200 events/s before the lock order.
func TestWorkerPartitionsWritingOneRowDoNotDeadlock(t *testing.T) {
	t.Run("clean", func(t *testing.T) { testPartitionsWritingOneRow(t, 8, 40, false) })
	// 300 accounts, 1 % of the payments refused by a CHECK constraint:
	// each COPY group with one is isolated, range by range (new-user
	// trial: 8 and 9 deadlocks in 20 000 events, all in isolations).
	t.Run("refused rows", func(t *testing.T) { testPartitionsWritingOneRow(t, 300, 400, true) })
}

func testPartitionsWritingOneRow(t *testing.T, accounts, batch int, refuse bool) {
	r := newRig(t, rigOptions{partitions: 4})
	defs := filepath.Join(t.TempDir(), "accounts.yaml")
	yaml := "irVersion: v42\nprojections:\n"
	for _, name := range []string{"account_last", "account_seen"} {
		yaml += "  - name: " + name + "\n    table: " + name + "\n    primaryKey: [account]\n    columns:\n" +
			"      account: { type: text, from: payload.account }\n      payment: { type: text, from: payload.payment }\n" +
			"    events:\n      PAYMENT_MADE: upsert\n"
	}
	if err := os.WriteFile(defs, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := projection.LoadDefinitions(defs)
	if err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(context.Background(), r.pool, d, r.tenant); err != nil {
		t.Fatal(err)
	}
	tps, err := projection.NewTableProjections(d)
	if err != nil {
		t.Fatal(err)
	}
	if refuse {
		for _, tab := range []string{"account_last", "account_seen"} {
			exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, tab}.Sanitize()+" ADD CONSTRAINT not_bad CHECK (payment NOT LIKE 'bad-%')")
		}
	}
	const events = 4000
	rng := rand.New(rand.NewPCG(1, 2))
	refused := 0
	keys, values := make([]string, events), make([]string, events)
	last := map[string]string{} // account → its newest payment
	for i := range events {
		payment, account := fmt.Sprintf("pay-%05d", i), fmt.Sprintf("acct-%d", rng.IntN(accounts))
		keys[i] = payment // the entity: payments spread over the partitions
		if refuse && rng.IntN(100) == 0 {
			// Refused by both tables, on an account of its own: one dead
			// letter per projection, no row.
			payment, account = "bad-"+payment, "bad-acct-"+payment
			refused++
		} else {
			last[account] = payment
		}
		values[i] = r.event("PAYMENT_MADE", keys[i], int64(i+1), fmt.Sprintf(`{"account":%q,"payment":%q}`, account, payment))
	}
	r.produceAll(keys, values)
	logs := &safeBuffer{}
	var handlers []projection.Handler
	for _, tp := range tps {
		handlers = append(handlers, tp)
	}
	start := time.Now()
	rn := r.start(func(c *projection.Config) {
		c.MaxBatchRecords = batch
		c.Breaker.Threshold = -1 // every refused pair retried in full, as the first ones are
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}, handlers...)
	r.waitCommitted(2 * time.Minute)
	took := time.Since(start)
	if err := rn.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "40P01"); n > 0 {
		t.Errorf("%d log lines name a deadlock (40P01) in %s; the first:\n%s", n, took, firstLineWith(logs.String(), "40P01"))
	}
	if got := len(r.deadLetters()); got != 2*refused {
		t.Errorf("%d dead letters, want one per refused pair: %d", got, 2*refused)
	}
	for _, tp := range tps {
		rows, err := r.pool.Query(context.Background(), "SELECT account, payment FROM "+pgx.Identifier{r.tenant, tp.Name()}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		var a, p string
		if _, err := pgx.ForEachRow(rows, []any{&a, &p}, func() error { got[a] = p; return nil }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(last) {
			t.Errorf("%s: %v, want each account's newest payment %v", tp.Name(), got, last)
		}
	}
}

// firstLineWith returns the first line of s that contains sub.
func firstLineWith(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}
