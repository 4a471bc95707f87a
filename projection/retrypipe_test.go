package projection

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// TestExecIndependentlyRollsBackOnlyTheRefusedStatements: in one round
// trip, a statement PostgreSQL refuses when it runs (CHECK), one it refuses
// at parse (undefined table) and one whose COMMIT it refuses (a deferred
// unique constraint) each fail alone with their SQLSTATE and are not
// applied, while the statements around them are; a NULL argument and a
// statement without arguments run; the connection goes back to the pool
// usable.
func TestExecIndependentlyRollsBackOnlyTheRefusedStatements(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := pgtest.NewSchemaName(t)
	tbl := pgx.Identifier{schema, "t"}.Sanitize()
	for _, sql := range []string{
		"CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize(),
		"CREATE TABLE " + tbl + " (id int PRIMARY KEY, n int CHECK (n > 0), note text," +
			" u int UNIQUE DEFERRABLE INITIALLY DEFERRED)",
		"INSERT INTO " + tbl + " (id, n, u) VALUES (100, 1, 7)",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	ins := "INSERT INTO " + tbl + " (id, n, note, u) VALUES ($1::text::int, $2::text::int, $3::text, $4::text::int)"
	stmts := []Statement{
		{SQL: ins, Args: []any{"1", "1", "a", nil}},
		{SQL: ins, Args: []any{"2", "0", nil, nil}}, // CHECK: 23514
		{SQL: ins, Args: []any{"3", "3", nil, nil}},
		{SQL: "INSERT INTO " + pgx.Identifier{schema, "missing"}.Sanitize() + " VALUES ($1::text::int)", Args: []any{"4"}}, // 42P01 at parse
		{SQL: ins, Args: []any{"5", "5", nil, "7"}}, // deferred unique: 23505 at COMMIT
		{SQL: "UPDATE " + tbl + " SET note = 'b' WHERE id = 1"},
	}
	tags, errs, err := execIndependently(ctx, pool, stmts)
	if err != nil {
		t.Fatalf("execIndependently: %v", err)
	}
	if len(errs) != len(stmts) || len(tags) != len(stmts) {
		t.Fatalf("%d tags and %d errors for %d statements", len(tags), len(errs), len(stmts))
	}
	wantState := []string{"", "23514", "", "42P01", "23505", ""}
	for i, want := range wantState {
		if got := retry.SQLState(errs[i]); got != want || (want == "") != (errs[i] == nil) {
			t.Errorf("statement %d: error %v, want SQLSTATE %q", i+1, errs[i], want)
		}
		if want == "" && tags[i].RowsAffected() != 1 {
			t.Errorf("statement %d: %q, want 1 row", i+1, tags[i])
		}
	}
	var rows []string
	r, err := pool.Query(ctx, "SELECT id::text || ':' || coalesce(note, '-') FROM "+tbl+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(rows, " "), "1:b 3:- 100:-"; got != want {
		t.Errorf("rows %q, want %q", got, want)
	}
	// Every connection of the pool is usable afterwards.
	for range 2 * pool.Config().MaxConns {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("the pool after execIndependently: %v", err)
		}
	}
}

// TestExecIndependentlyRefusesAnArgumentThatIsNotText: a statement argument
// that is neither a string nor nil is an error before anything is sent.
func TestExecIndependentlyRefusesAnArgumentThatIsNotText(t *testing.T) {
	pool := pgtest.Pool(t)
	before := pool.Stat().AcquireCount()
	_, errs, err := execIndependently(context.Background(), pool, []Statement{{SQL: "SELECT $1::int", Args: []any{1}}})
	if err == nil || !strings.Contains(err.Error(), "statement 1: argument 1 is int") || len(errs) != 0 {
		t.Fatalf("execIndependently with an int argument: %v (%d answers), want an error naming argument 1", err, len(errs))
	}
	if n := pool.Stat().AcquireCount() - before; n != 0 {
		t.Errorf("%d connections acquired, want none", n)
	}
}
