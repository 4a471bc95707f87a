package projection

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestTextArrayReadsBackAsItsValues: textArray's literal is read by
// PostgreSQL as the very values, whatever characters they hold.
func TestTextArrayReadsBackAsItsValues(t *testing.T) {
	pool := pgtest.Pool(t)
	vals := []string{"", "a", "a,b", `"quoted"`, `back\slash`, "{braces}", "NULL", " padded ", "ünïcödé", "line\nbreak", `\"`, "}{,\"\\"}
	var got []string
	if err := pool.QueryRow(context.Background(), "SELECT $1::text::text[]", textArray(vals)).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, vals) {
		t.Errorf("textArray read back as %q, want %q", got, vals)
	}
	if err := pool.QueryRow(context.Background(), "SELECT $1::text::text[]", textArray(nil)).Scan(&got); err != nil || len(got) != 0 {
		t.Errorf("textArray(nil) read back as %q (%v), want an empty array", got, err)
	}
}

// TestSweepFindsTheTombstoneOfEverySpellingOfAKey: the sweep of an upsert
// (or a delete) deletes the row that a tombstone at least as new covers
// when the tombstone was written for another spelling of the key that
// PostgreSQL deems equal (numeric scale, −0, a timestamptz offset, uuid
// case, jsonb number spelling; a text with array punctuation), and also
// for a tombstone an older worker wrote (the numeric as text); and it
// leaves a row newer than the tombstone.
func TestSweepFindsTheTombstoneOfEverySpellingOfAKey(t *testing.T) {
	src := `irVersion: v42
projections:
  - name: sk
    table: sk
    primaryKey: [s, n, d, r, ts, u, j]
    columns:
      s:  { type: text, from: payload.s }
      n:  { type: numeric, from: payload.n }
      d:  { type: double precision, from: payload.d }
      r:  { type: real, from: payload.r }
      ts: { type: timestamptz, from: payload.ts }
      u:  { type: uuid, from: payload.u }
      j:  { type: jsonb, from: payload.j }
      v:  { type: text, from: payload.v }
    events: { K_UP: upsert, K_DEL: delete }
`
	defs, tps := keyProjections(t, src)
	p := tps[0]
	pool := pgtest.Pool(t)
	ctx := context.Background()
	const (
		deleted = `{"s":"a,\"b\"\\{c}","n":"7.5","d":0,"r":0,"ts":"2024-06-25T14:00:00Z","u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","j":{"x":1}}`
		upsert  = `{"s":"a,\"b\"\\{c}","n":"7.50","d":-0,"r":"-0","ts":"2024-06-25T16:00:00+02:00","u":"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11","j":{"x":1.0},"v":"back"}`
	)
	for _, tc := range []struct {
		name       string
		legacy     bool  // the tombstone as an older worker wrote it
		upsertSeq  int64 // the row's
		sweepOf    string
		wantSweeps int64
	}{
		{"the upsert's keys", false, 150, "K_UP", 1},
		{"the delete's keys", false, 150, "K_DEL", 1},
		{"an older worker's tombstone", true, 150, "K_UP", 1},
		{"a row newer than the tombstone", false, 250, "K_UP", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := migratedSchema(t, pool, defs)
			tombstones := pgx.Identifier{schema, tombstoneTable}.Sanitize()
			plan := func(typ string, seq int64, payload string) pair {
				pr, err := plannedPair(p, tblEvent(t, schema, typ, seq, 1719331200000, payload))
				if err != nil {
					t.Fatal(err)
				}
				return pr
			}
			exec := func(sql string, args ...any) int64 {
				tag, err := pool.Exec(ctx, sql, args...)
				if err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				return tag.RowsAffected()
			}
			// The tombstone at 200, moved below the upsert while it writes
			// the row, then back: the state a race leaves.
			del := plan("K_DEL", 200, deleted)
			exec(del.stmt.SQL, del.stmt.Args...)
			if tc.legacy {
				// Numeric, double precision and real as their text:
				// the upsert's spellings.
				exec("UPDATE " + tombstones + " SET pk[2] = '7.50', pk[3] = '-0', pk[4] = '-0'")
			}
			exec("UPDATE " + tombstones + " SET _causet_seq = 1")
			up := plan("K_UP", tc.upsertSeq, upsert)
			if n := exec(up.stmt.SQL, up.stmt.Args...); n != 1 {
				t.Fatalf("upsert wrote %d rows, want 1", n)
			}
			exec("UPDATE " + tombstones + " SET _causet_seq = 200")

			swept := up
			if tc.sweepOf == "K_DEL" {
				swept = del
			}
			groups := sweepGroups([]pair{swept})
			if len(groups) != 1 {
				t.Fatalf("%d sweep groups, want 1", len(groups))
			}
			st := groups[0].statement()
			if n := exec(st.SQL, st.Args...); n != tc.wantSweeps {
				t.Errorf("the sweep deleted %d rows, want %d", n, tc.wantSweeps)
			}
		})
	}
}

// TestDocsQuoteTheSweepsLine: docs/events.md quotes the sweep's INFO line
// as the worker writes it (fresh-helper trial: the quote was a prefix).
func TestDocsQuoteTheSweepsLine(t *testing.T) {
	b, err := os.ReadFile("../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(b)), " "), "`"+sweptMessage+"`") {
		t.Errorf("docs/events.md does not quote the sweep's line %q", sweptMessage)
	}
}
