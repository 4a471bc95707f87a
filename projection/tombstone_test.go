package projection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// TestTombstoneEntrySizeIsPostgreSQLs: for keys of one to three text
// columns and table names of 1, 16 and 63 bytes, a key whose tombstone
// entry takes exactly maxIndexTuple bytes (tombstoneEntrySize) is upserted
// and deleted, and one byte more is refused at its upsert's Plan (a
// *ValueError, permanent), where PostgreSQL refuses its delete's tombstone
// (54000): the size is PostgreSQL's, byte for byte (new-user trial: a key
// of 2 640 bytes was upserted, and its delete refused, so the row stayed
// beside a dead-lettered delete). The keys are random hexadecimal, which
// PostgreSQL does not compress. A projection without a delete takes the
// longer key.
func TestTombstoneEntrySizeIsPostgreSQLs(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	random := func(n int) string { return randomHex(t, n) }
	for _, table := range []string{"t", "artist_followers", strings.Repeat("x", 63)} {
		for _, cols := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("table %d bytes, %d key columns", len(table), cols), func(t *testing.T) {
				var names, columns, payload []string
				for i := range cols {
					names = append(names, fmt.Sprintf("k%d", i))
					columns = append(columns, fmt.Sprintf("      k%d: { type: text, from: payload.k%d }", i, i))
				}
				src := fmt.Sprintf("irVersion: v42\nprojections:\n  - name: p\n    table: %s\n    primaryKey: [%s]\n    columns:\n%s\n    events: { K_UP: upsert, K_DEL: delete }\n",
					table, strings.Join(names, ", "), strings.Join(columns, "\n"))
				defs, tps := keyProjections(t, src)
				p := tps[0]
				schema := migratedSchema(t, pool, defs)
				// The first columns "ab", the last as long as fits.
				short := make([]any, cols)
				for i := range cols - 1 {
					short[i] = "ab"
				}
				short[cols-1] = ""
				fits := maxIndexTuple - p.tombstoneEntrySize(short)
				for _, extra := range []int{0, 1} {
					payload = payload[:0]
					var keys []any
					for i := range cols - 1 {
						payload = append(payload, fmt.Sprintf(`"k%d":"ab"`, i))
						keys = append(keys, "ab")
					}
					last := random(fits + extra)
					payload = append(payload, fmt.Sprintf(`"k%d":%q`, cols-1, last))
					keys = append(keys, last)
					body := "{" + strings.Join(payload, ",") + "}"
					up, del := tblEvent(t, schema, "K_UP", 1, 1719331200000, body), tblEvent(t, schema, "K_DEL", 2, 1719331200000, body)
					st, planErr := p.Plan(up)
					_, delPlanErr := p.Plan(del)
					// The delete statement as Plan would make it, whether
					// Plan refuses it or not: PostgreSQL's answer.
					_, delErr := pool.Exec(ctx, p.delete.build(schema), append(keys, "2", p.table)...)
					if extra == 0 {
						if planErr != nil {
							t.Fatalf("key of %d bytes in the last column: Plan refused the upsert: %v", fits, planErr)
						}
						if _, err := pool.Exec(ctx, st.SQL, st.Args...); err != nil {
							t.Fatalf("upsert: %v", err)
						}
						if delErr != nil {
							t.Errorf("key of %d bytes in the last column (an entry of %d bytes): delete refused: %v", fits, maxIndexTuple, delErr)
						}
						continue
					}
					for op, err := range map[string]error{"upsert": planErr, "delete": delPlanErr} {
						var ve *ValueError
						if !errors.As(err, &ve) || !retry.IsPermanent(err) || ve.Column != names[cols-1] || !strings.Contains(err.Error(), "too long for its tombstone") {
							t.Errorf("key of %d bytes in the last column: Plan's error for the %s %v, want a permanent *ValueError naming column %s", fits+1, op, err, names[cols-1])
						}
					}
					// Each says what it means for that event: the upsert
					// that no delete could follow, the delete that leaves
					// its row to be deleted by hand (stop 42's trial: the
					// delete got the upsert's words).
					for _, c := range []struct {
						op, want string
						err      error
					}{{"upsert", "so a delete of it could never be applied", planErr}, {"delete", "so this delete cannot be applied", delPlanErr}} {
						if c.err == nil || !strings.Contains(c.err.Error(), c.want) || (c.op == "delete") != strings.Contains(c.err.Error(), "delete it by hand") {
							t.Errorf("key of %d bytes: the %s's error %v, want %q (and the hand delete for the delete alone)", fits+1, c.op, c.err, c.want)
						}
					}
					if retry.SQLState(delErr) != "54000" {
						t.Errorf("key of %d bytes in the last column: delete's error %v, want PostgreSQL's 54000 (the size is one byte over)", fits+1, delErr)
					}
				}
			})
		}
	}

	// The trial's keys: the example's artist_followers, artist "LONG",
	// user ids of 2 609 bytes (upserted and deleted) and 2 649 (its delete
	// refused with 54000; now its upsert is).
	tps, schema := exampleTables(t, pool)
	for n, want := range map[int]bool{2609: true, 2649: false} {
		_, err := tps[0].Plan(tblEvent(t, schema, "ARTIST_FOLLOWED", 100, 1719331200000, fmt.Sprintf(`{"artist_id":"LONG","user_id":%q}`, random(n))))
		if (err == nil) != want {
			t.Errorf("artist_followers, user_id of %d bytes: Plan's error %v, want accepted %v", n, err, want)
		}
	}

	// Without a delete, no tombstone: the limit is the table's own.
	_, tps = keyProjections(t, "irVersion: v42\nprojections:\n  - {name: p, table: t, primaryKey: [k], columns: {k: {type: text, from: payload.k}}, events: {K_UP: upsert}}\n")
	if _, err := tps[0].Plan(tblEvent(t, "acme", "K_UP", 1, 1719331200000, fmt.Sprintf(`{"k":%q}`, random(2690)))); err != nil {
		t.Errorf("a projection without a delete refused a key of 2690 bytes: %v", err)
	}
}

// TestTombstoneTextBounds: the length tombstoneEntrySize takes for a jsonb
// or numeric key value is at least that of the text PostgreSQL writes in
// the tombstone (keyTextOf).
func TestTombstoneTextBounds(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, tc := range []struct{ typ, value string }{
		{"jsonb", `{"a":1,"b":[1,2,{"c":"d:e,f"}]}`},
		{"jsonb", `[1,2,3]`},
		{"jsonb", `"\u00e9\/"`},
		{"numeric", "1e5"},
		{"numeric", "1.5E+3"},
		{"numeric", "12.3400"},
		{"numeric", "-7e-3"},
	} {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT length("+keyTextOf("$1::text::"+tc.typ, tc.typ)+")", tc.value).Scan(&n); err != nil {
			t.Fatal(err)
		}
		bound := len(tc.value) + strings.Count(tc.value, ",") + strings.Count(tc.value, ":")
		if tc.typ == "numeric" {
			bound = numericTextBound(tc.value)
		}
		if bound < n {
			t.Errorf("%s %s: bound %d, PostgreSQL's tombstone text has %d", tc.typ, tc.value, bound, n)
		}
	}
}
