package projection

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestParseCheckExprReadsWhatPgGetExprPrints: the expressions as
// PostgreSQL 15–16's pg_get_expr prints common CHECK constraints (BETWEEN,
// IN and NOT IN expanded, negative and numeric literals cast) are read,
// with the columns they read by slot; a function, an arithmetic operator,
// a cast with a modifier, a bare keyword or broken syntax is not.
func TestParseCheckExprReadsWhatPgGetExprPrints(t *testing.T) {
	for _, tt := range []struct {
		expr string
		cols []string // nil: not read
	}{
		{"((stars >= 1) AND (stars <= 5))", []string{"stars"}},
		{"((b >= '-5'::integer) AND (b <= '9223372036854775807'::bigint))", []string{"b"}},
		{"((n > '-1.5'::numeric) AND (n <> (0)::numeric))", []string{"n"}},
		{"((b >= '-10'::integer) OR (b IS NULL))", []string{"b"}},
		{"(s = ANY (ARRAY['a'::text, 'b'::text]))", []string{"s"}},
		{"(stars <> ALL (ARRAY[7, 8]))", []string{"stars"}},
		{`("Odd Col" > 0)`, []string{"Odd Col"}},
		{"(NOT (stars = 4))", []string{"stars"}},
		{"((v)::text <> 'x'::text)", []string{"v"}},
		{"((stars)::numeric > 1.5)", []string{"stars"}},
		{"(s = 'it''s'::text)", []string{"s"}},
		{"(stars < b)", []string{"stars", "b"}},
		{"(s IS NOT NULL)", []string{"s"}},
		{"(n > '1000'::numeric)", []string{"n"}},
		{"(length(s) > 0)", nil},
		{"(LEAST(stars, (1000000 + 1)) <= 1000000)", nil}, // the soak's, which must stay PostgreSQL's (internal/soak RatingsCheckSQL)
		{"((stars + 1) > 2)", nil},
		{"((v)::character varying(3) = 'x'::text)", nil},
		{"(stars > '3000000000'::integer)", nil}, // beyond integer: PostgreSQL would not print it
		{"(n > 'NaN'::numeric)", nil},
		{"(stars)", nil},  // a value, not a truth value
		{"(true)", nil},   // a keyword
		{"(stars >", nil}, // broken
		{"(s ~~ 'a%'::text)", nil},
		{"(s = E'a'::text)", nil},
	} {
		e, err := parseCheckExpr(tt.expr)
		switch {
		case tt.cols == nil && err == nil:
			t.Errorf("%s: read (columns %q), want not read", tt.expr, e.cols)
		case tt.cols == nil && !errors.Is(err, errCheckUnread):
			t.Errorf("%s: error %v, want errCheckUnread", tt.expr, err)
		case tt.cols != nil && err != nil:
			t.Errorf("%s: %v, want read", tt.expr, err)
		case tt.cols != nil && fmt.Sprint(e.cols) != fmt.Sprint(tt.cols):
			t.Errorf("%s: columns %q, want %q", tt.expr, e.cols, tt.cols)
		}
	}
}

// checkExprColumns are the columns of TestCheckExprAgreesWithPostgres's
// projection (inlineDefinitions): types the checks read (text, integer,
// numeric, bigint) and some they do not (jsonb, double precision).
const checkExprColumns = `stars: { type: integer, from: payload.stars }
      n: { type: numeric, from: payload.n }
      b: { type: bigint, from: payload.b }
      s: { type: text, from: payload.s }
      v: { type: text, from: payload.v }
      f: { type: double precision, from: payload.f }
      j: { type: jsonb, from: payload.j }`

// TestCheckExprAgreesWithPostgres adds CHECK constraints one at a time to
// a table (v a character varying(5)), reads them through the catalog as
// the worker does (tableCatalog, rowCheck.withChecks), and applies
// upserts that break each column one way or another: wherever Go says a
// constraint is false, PostgreSQL refuses the row with 23514, and wherever
// Go says it is true, PostgreSQL takes it (NULL and values Go does not read
// claim nothing). Each constraint read refuses some row; those Go does not
// read are left to PostgreSQL (not bound).
func TestCheckExprAgreesWithPostgres(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	d, err := ParseDefinitions("check.yaml", inlineDefinitions(checkExprColumns))
	if err != nil {
		t.Fatal(err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		t.Fatal(err)
	}
	p := tps[0]
	schema := migratedSchema(t, pool, d)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" ALTER COLUMN v TYPE character varying(5)"); err != nil {
		t.Fatal(err)
	}
	// Each payload breaks the baseline in one field.
	payloads := []string{
		`{}`,
		`{"stars":1}`, `{"stars":5}`, `{"stars":0}`, `{"stars":6}`, `{"stars":-1}`, `{"stars":4}`, `{"stars":7}`,
		`{"stars":2147483647}`, `{"stars":-2147483648}`, `{"stars":2}`,
		`{"n":1.5}`, `{"n":-1.5}`, `{"n":-1.49}`, `{"n":0}`, `{"n":0.0}`, `{"n":1000}`, `{"n":1000.0001}`, `{"n":1e3}`, `{"n":-1e-3}`,
		`{"b":-10}`, `{"b":-11}`, `{"b":-5}`, `{"b":-6}`, `{"b":9223372036854775807}`, `{"b":-9223372036854775808}`,
		`{"s":"a"}`, `{"s":"b"}`, `{"s":"c"}`, `{"s":"it's"}`, `{"s":""}`, `{"s":"A"}`, `{"s":"a "}`,
		`{"v":"x"}`, `{"v":"y"}`, `{"v":"x    "}`, `{"v":"x     "}`, `{"v":"X"}`,
		`{"stars":3,"b":2}`, `{"stars":3,"b":4}`, `{"stars":3,"b":3}`,
		`{"f":1.5}`, `{"j":{"a":1}}`,
		`{"stars":null}`, `{"n":null}`, `{"b":null}`, `{"s":null}`, `{"v":null}`,
	}
	for _, tt := range []struct {
		check string
		read  bool
	}{
		{"stars BETWEEN 1 AND 5", true},
		{"n > -1.5 AND n <> 0", true},
		{"b >= -10 OR b IS NULL", true},
		{"s IN ('a', 'b')", true},
		{"stars IN (1, 2, 3)", true},
		{"NOT (stars = 4)", true},
		{"v <> 'x'", true},
		{"stars > 1.5", true},
		{"b BETWEEN -5 AND 9223372036854775807", true},
		{"stars < b", true},
		{"s IS NOT NULL", true},
		{"n > 1e3", true},
		{"stars NOT IN (7, 8)", true},
		{"s = 'it''s' OR s IS NULL", true},
		{"n IS NULL OR n >= -0.001", true},
		{"length(s) > 0", false},
		{"s < 'm'", false},   // text ordering: the collation's
		{"f > 0", false},     // double precision
		{"j IS NULL", false}, // jsonb
		{"stars::text <> '5'", false},
		{"n::integer <> 2", false},
	} {
		t.Run(tt.check, func(t *testing.T) {
			if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" ADD CONSTRAINT c CHECK ("+tt.check+")"); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" DROP CONSTRAINT c"); err != nil {
					t.Fatal(err)
				}
			}()
			cat := newTableCatalog(pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
			cols := cat.columns(ctx, schema, "t")
			checks := cat.checks(schema, "t")
			if len(checks) != 1 {
				t.Fatalf("catalog: %d checks, want 1", len(checks))
			}
			rc := (*rowCheck)(nil).withChecks(p, checks, cols)
			if read := rc != nil; read != tt.read {
				t.Fatalf("%q (%s): read %v, want %v", tt.check, checks[0].expr, read, tt.read)
			}
			refusedSome := false
			for i, payload := range payloads {
				ev := hotEvent(t, fmt.Sprintf(`{"eventType":"E","entityId":"e%d","forkId":"production","tenantSchema":%q,`+
					`"irVersion":"v1","sequenceNumber":1,"ts":1772366400014,"payload":%s}`, i, schema, baselined(payload)))
				st, err := p.Plan(ev)
				if err != nil {
					t.Fatalf("%s: %v", payload, err)
				}
				var verdict tri
				if rc != nil {
					verdict = rc.checks[0].eval(rc.checks[0].e.root, st.Args)
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, st.SQL, st.Args...)
					if err == nil {
						err = errRolledBack
					}
					return err
				})
				var pgErr *pgconn.PgError
				refused := errors.As(err, &pgErr) && pgErr.Code == "23514"
				if !refused && !errors.Is(err, errRolledBack) {
					t.Fatalf("%s: %v", payload, err)
				}
				switch {
				case verdict == triFalse && !refused:
					t.Errorf("%s: Go says %q refuses it; PostgreSQL takes it", payload, checks[0].expr)
				case verdict == triTrue && refused:
					t.Errorf("%s: Go says %q takes it; PostgreSQL refuses it", payload, checks[0].expr)
				}
				refusedSome = refusedSome || verdict == triFalse
			}
			if tt.read && !refusedSome {
				t.Errorf("%q refused no payload in Go: the test shows nothing of it", checks[0].expr)
			}
		})
	}
}

// errRolledBack rolls back TestCheckExprAgreesWithPostgres's upserts.
var errRolledBack = errors.New("rolled back")

// baselined returns payload, a JSON object, over a baseline that every
// constraint of TestCheckExprAgreesWithPostgres takes: its fields win.
func baselined(payload string) string {
	base := `"stars":2,"n":5,"b":100,"s":"a","v":"y"`
	if payload == `{}` {
		return "{" + base + "}"
	}
	// Later keys of a JSON object would be refused as duplicates by the
	// decoder: drop the baseline's keys the payload sets.
	out := "{"
	for _, kv := range []struct{ k, v string }{{"stars", "2"}, {"n", "5"}, {"b", "100"}, {"s", `"a"`}, {"v", `"y"`}} {
		if !containsKey(payload, kv.k) {
			out += `"` + kv.k + `":` + kv.v + ","
		}
	}
	return out + payload[1:]
}

// containsKey reports whether the JSON object text payload has the key k.
func containsKey(payload, k string) bool {
	return strings.Contains(payload, `{"`+k+`":`) || strings.Contains(payload, `,"`+k+`":`)
}

// FuzzParseCheckExpr: any text parses or is refused with errCheckUnread,
// never panics; what parses binds and evaluates on any arguments without
// panicking.
func FuzzParseCheckExpr(f *testing.F) {
	for _, s := range []string{
		"((stars >= 1) AND (stars <= 5))", "(s = ANY (ARRAY['a'::text, 'b'::text]))", "(NOT (stars = 4))",
		"((n > '-1.5'::numeric) AND (n <> (0)::numeric))", `("Odd Col" > 0)`, "(stars < b)", "(b IS NULL)",
		"((stars)::numeric > 1.5e3)", "(s = 'it''s'::text)", "(stars <> ALL (ARRAY[7, 8]))",
	} {
		f.Add(s)
	}
	p := inlineProjection(f, `stars: { type: integer, from: payload.stars }`)
	cols := map[string]catalogColumn{"id": parseCatalogType("text"), "stars": parseCatalogType("integer")}
	f.Fuzz(func(t *testing.T, expr string) {
		e, err := parseCheckExpr(expr)
		if err != nil {
			if !errors.Is(err, errCheckUnread) {
				t.Fatalf("%q: %v, want errCheckUnread", expr, err)
			}
			return
		}
		if b, ok := e.bind(p, cols); ok {
			for _, args := range [][]any{{"a", "3", "1"}, {"a", nil, "1"}, {"a", "x", "1"}, {"a", " -7 ", "1"}} {
				b.refuses(args)
			}
		}
	})
}
