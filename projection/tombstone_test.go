package projection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/jsonstrict"
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
					// The size said is PostgreSQL's (definitions trial:
					// 2708 bytes for its "index row size 2712").
					var pgSize, ourSize int
					var pgErr *pgconn.PgError
					if errors.As(delErr, &pgErr) {
						fmt.Sscanf(pgErr.Message, "index row size %d", &pgSize)
					}
					if _, after, ok := strings.Cut(fmt.Sprint(planErr), "tombstone: "); ok {
						fmt.Sscanf(after, "%d bytes", &ourSize)
					}
					if pgSize == 0 || ourSize != pgSize {
						t.Errorf("key of %d bytes: the error says %d bytes, PostgreSQL %d (%v)", fits+1, ourSize, pgSize, delErr)
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

// TestTombstoneTextLengthsArePostgreSQLs: the length tombstoneEntrySize
// takes for a jsonb or numeric key value is that of the text PostgreSQL
// writes in the tombstone (keyTextOf), in bytes, for the value as Plan
// sends it (a jsonb key's numbers in canonicalJSONNumbers' spelling). The
// new-user trial's keys: 1e300 (301 digits in the tombstone, where the
// text as sent has 5) and 1.5 (15e-1 as sent, 1.5 in the tombstone).
func TestTombstoneTextLengthsArePostgreSQLs(t *testing.T) {
	pool := pgtest.Pool(t)
	jsonbKeys := []string{
		`{"a":1,"b":[1,2,{"c":"d:e,f"}]}`, `[1,2,3]`, `"\u00e9\/"`, `{}`, `[]`, `""`, `[[],{},[{}]]`,
		`{"n":1e300}`, `[1.5,1.50,-0.0015,100,1e2,0.001e5,12345678901234567890.123456789,-0,0e10]`,
		`{"s":"tab\there, \"quoted\" \\ \u0001\u001f\u007f \u2028\u2029 \ud83d\ude00 é <>&","t":true,"f":false,"z":null}`,
		`{"b":{"y":[1e-7,123e-1,-5e2]},"a":"x","aa":[true,false,null]}`,
	}
	for _, v := range jsonbKeys {
		tree, err := jsonstrict.ParseTree([]byte(v))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		text, err := jsonbText(&treeNode{tree, 0})
		if err != nil {
			t.Fatal(err)
		}
		sent := canonicalJSONNumbers(text) // as Plan sends a jsonb key
		var want int
		if err := pool.QueryRow(context.Background(), "SELECT octet_length("+keyTextOf("$1::text::jsonb", "jsonb")+")", sent).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got, ok := pgJSONBTextLen(sent); !ok || got != want {
			t.Errorf("jsonb %s (sent as %s): %d, %v; PostgreSQL's tombstone text has %d bytes", v, sent, got, ok, want)
		}
	}
	for _, v := range []string{"1e5", "1.5E+3", "12.3400", "-7e-3", "0", "-0.000", "0.5", "123456e-3", "1e-300", "+42", " 7.50 ", ".5", "5.", "NaN", "Infinity", "-Infinity"} {
		var want int
		if err := pool.QueryRow(context.Background(), "SELECT octet_length("+keyTextOf("$1::text::numeric", "numeric")+")", v).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := pgNumericTextLen(v); got != want {
			t.Errorf("numeric %q: %d; PostgreSQL's tombstone text has %d bytes", v, got, want)
		}
	}
}

// TestJSONBKeyFitsItsTombstoneAsPostgreSQLWritesIt: a jsonb key is
// accepted exactly when its tombstone, as PostgreSQL writes it, fits the
// index, so that every key upserted can be deleted (new-user trial: a key
// of 2 450 random characters and 1e300, 5 bytes as sent and 301 in the
// tombstone, was upserted and its delete refused with 54000; 450 × 1.5,
// 2 250 bytes in the tombstone, was refused as 3 208).
func TestJSONBKeyFitsItsTombstoneAsPostgreSQLWritesIt(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	defs, tps := keyProjections(t, jsonbKeyDefinitions)
	p := tps[0]
	schema := migratedSchema(t, pool, defs)
	halves := strings.Repeat("1.5,", 449) + "1.5"
	for _, tc := range []struct {
		name, key string
		fits      bool
	}{
		{"random text and 1e300", `{"r":"` + randomHex(t, 2450) + `","n":1` + strings.Repeat("0", 300) + `}`, false},
		{"random text and 1e300 as an exponent", `{"r":"` + randomHex(t, 2450) + `","n":1e300}`, false},
		{"450 × 1.5", "[" + halves + "]", true},
		{"450 × 1.50", "[" + strings.ReplaceAll(halves, "1.5", "1.50") + "]", true},
		{"random text that fits", `{"r":"` + randomHex(t, 2600) + `"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"u":"` + tc.name + `","j":` + tc.key + `}`
			up, del := tblEvent(t, schema, "K_UP", 1, 1719331200000, body), tblEvent(t, schema, "K_DEL", 2, 1719331200000, body)
			st, upErr := p.Plan(up)
			dst, delErr := p.Plan(del)
			if !tc.fits {
				if upErr == nil || delErr == nil || !strings.Contains(upErr.Error(), "too long for its tombstone") || !strings.Contains(upErr.Error(), "JSON object") {
					t.Fatalf("Plan: upsert %v, delete %v; want both refused as too long for the tombstone, naming a JSON object", upErr, delErr)
				}
				return
			}
			if upErr != nil || delErr != nil {
				t.Fatalf("Plan: upsert %v, delete %v; want both planned", upErr, delErr)
			}
			if _, err := pool.Exec(ctx, st.SQL, st.Args...); err != nil {
				t.Fatalf("upsert: %v", err)
			}
			if _, err := pool.Exec(ctx, dst.SQL, dst.Args...); err != nil {
				t.Fatalf("delete of a key Plan accepted: %v", err)
			}
		})
	}
}
