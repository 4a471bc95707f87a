package projection

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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
	tbl := testTable(t, pool, "(id int PRIMARY KEY, n int CHECK (n > 0), note text, u int UNIQUE DEFERRABLE INITIALLY DEFERRED)",
		"(id, n, u) VALUES (100, 1, 7)")
	ins := "INSERT INTO " + tbl + " (id, n, note, u) VALUES ($1::text::int, $2::text::int, $3::text, $4::text::int)"
	stmts := []Statement{
		{SQL: ins, Args: []any{"1", "1", "a", nil}},
		{SQL: ins, Args: []any{"2", "0", nil, nil}}, // CHECK: 23514
		{SQL: ins, Args: []any{"3", "3", nil, nil}},
		{SQL: "INSERT INTO " + strings.TrimSuffix(tbl, `"t"`) + `"missing" VALUES ($1::text::int)`, Args: []any{"4"}}, // 42P01 at parse
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

// onePool returns a pool of one connection, so that every call sees the
// statements the one before it prepared.
func onePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// preparedNames returns the statements execIndependently has prepared on
// the one connection of pool, sorted.
func preparedNames(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT name FROM pg_prepared_statements WHERE name LIKE 'causet\\_%' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestExecIndependentlyPreparesEachStatementOnce: the statements of a
// call are prepared on the connection in the call's round trip, once per
// SQL, and executed by name in the calls after it without being prepared
// again; one that cannot be prepared (its table does not exist) fails with
// PostgreSQL's error each time, every statement of its SQL in the round
// trip too (not with "prepared statement does not exist"), and is not
// kept.
func TestExecIndependentlyPreparesEachStatementOnce(t *testing.T) {
	pool := onePool(t)
	ctx := context.Background()
	schema := pgtest.NewSchemaName(t)
	tbl := pgx.Identifier{schema, "t"}.Sanitize()
	for _, sql := range []string{
		"CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize(),
		"CREATE TABLE " + tbl + " (id int PRIMARY KEY, n int CHECK (n > 0))",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	ins := "INSERT INTO " + tbl + " (id, n) VALUES ($1::text::int, $2::text::int) ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n"
	missing := "INSERT INTO " + pgx.Identifier{schema, "missing"}.Sanitize() + " VALUES ($1::text::int)"
	call := func(round int) {
		t.Helper()
		stmts := []Statement{
			{SQL: ins, Args: []any{"1", "1"}},
			{SQL: missing, Args: []any{"1"}},
			{SQL: ins, Args: []any{"2", "0"}}, // CHECK: 23514
			{SQL: missing, Args: []any{"2"}},
			{SQL: ins, Args: []any{"3", "3"}},
		}
		_, errs, err := execIndependently(ctx, pool, stmts)
		if err != nil || len(errs) != len(stmts) {
			t.Fatalf("round %d: execIndependently: %v (%d answers)", round, err, len(errs))
		}
		for i, want := range []string{"", "42P01", "23514", "42P01", ""} {
			if got := retry.SQLState(errs[i]); got != want {
				t.Errorf("round %d, statement %d: %v, want SQLSTATE %q", round, i+1, errs[i], want)
			}
		}
	}
	call(1)
	first := preparedNames(t, pool)
	if len(first) != 1 {
		t.Fatalf("prepared %q after the first call, want the upsert alone", first)
	}
	call(2)
	if got := preparedNames(t, pool); !slices.Equal(got, first) {
		t.Errorf("prepared %q after the second call, want %q: prepared again", got, first)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d rows (%v), want 2", n, err)
	}
}

// TestExecIndependentlyKeepsAtMostMaxPreparedStatements: beyond
// maxPreparedStatements, the least recently used statements are
// deallocated, never one the call itself uses; a statement that finds no
// room is executed unprepared. Every statement is applied either way.
func TestExecIndependentlyKeepsAtMostMaxPreparedStatements(t *testing.T) {
	defer func(n int) { maxPreparedStatements = n }(maxPreparedStatements)
	maxPreparedStatements = 2
	pool := onePool(t)
	ctx := context.Background()
	// Each SQL differs by its literal: a statement of its own.
	stmt := func(i int) Statement {
		return Statement{SQL: "SELECT $1::text::int + " + strconv.Itoa(i), Args: []any{"1"}}
	}
	for _, round := range [][]int{{1, 2, 3}, {4, 5}, {5, 6}, {1}} {
		var stmts []Statement
		for _, i := range round {
			stmts = append(stmts, stmt(i))
		}
		_, errs, err := execIndependently(ctx, pool, stmts)
		if err != nil || len(errs) != len(stmts) {
			t.Fatalf("statements %v: %v (%d answers)", round, err, len(errs))
		}
		for i, e := range errs {
			if e != nil {
				t.Errorf("statements %v: statement %d: %v", round, i+1, e)
			}
		}
		if got := preparedNames(t, pool); len(got) > maxPreparedStatements {
			t.Errorf("after statements %v: %d prepared (%q), want at most %d", round, len(got), got, maxPreparedStatements)
		}
	}
	if got := preparedOn(mustConn(t, pool)).lru.Len(); got != 2 {
		t.Errorf("%d statements known prepared, want 2", got)
	}
}

// mustConn returns the PgConn of pool's one connection, released at once.
func mustConn(t *testing.T, pool *pgxpool.Pool) *pgconn.PgConn {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	return c.Conn().PgConn()
}

// TestExecIndependentlyPreparesAgainAfterDeallocateAll: a statement
// deallocated behind execIndependently's back (DEALLOCATE ALL, a pooler)
// fails once with 26000 and is prepared again at the next call.
func TestExecIndependentlyPreparesAgainAfterDeallocateAll(t *testing.T) {
	pool := onePool(t)
	ctx := context.Background()
	stmts := []Statement{{SQL: "SELECT $1::text::int + 7", Args: []any{"1"}}}
	if _, errs, err := execIndependently(ctx, pool, stmts); err != nil || errs[0] != nil {
		t.Fatalf("first call: %v, %v", err, errs)
	}
	if _, err := pool.Exec(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	if _, errs, err := execIndependently(ctx, pool, stmts); err != nil || retry.SQLState(errs[0]) != "26000" {
		t.Fatalf("after DEALLOCATE ALL: %v, %v; want 26000", err, errs)
	}
	if _, errs, err := execIndependently(ctx, pool, stmts); err != nil || errs[0] != nil {
		t.Fatalf("the call after: %v, %v; want the statement prepared again", err, errs)
	}
}

// TestExecBoundedGivesUpOnALockAfterRideLockTimeout: the statements from
// the bound on wait for a row lock another session holds at most
// rideLockTimeout (55P03), those before it run as they would, and the
// connection's lock_timeout is its configured value again afterwards
// (ops trial: a retry that rode a batch waited for a row lock for as long
// as it was held, and its partition with it).
func TestExecBoundedGivesUpOnALockAfterRideLockTimeout(t *testing.T) {
	pool := onePool(t)
	other := pgtest.Pool(t)
	ctx := context.Background()
	tbl := testTable(t, other, "(id int PRIMARY KEY, n int)", "VALUES (1, 0), (2, 0)")
	lock, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, "SELECT 1 FROM "+tbl+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	upd := "UPDATE " + tbl + " SET n = n + 1 WHERE id = $1::text::int"
	stmts := []Statement{{SQL: upd, Args: []any{"2"}}, {SQL: upd, Args: []any{"1"}}, {SQL: upd, Args: []any{"2"}}}
	_, errs, err := execBounded(ctx, pool, stmts, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 3 || errs[0] != nil || retry.SQLState(errs[1]) != lockNotAvailable || errs[2] != nil {
		t.Fatalf("errors %v; want the locked row's update cancelled with %s and the others applied", errs, lockNotAvailable)
	}
	var n int
	if err := other.QueryRow(ctx, "SELECT n FROM "+tbl+" WHERE id = 2").Scan(&n); err != nil || n != 2 {
		t.Errorf("row 2: n = %d (%v), want 2", n, err)
	}
	var setting string
	if err := pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&setting); err != nil || setting != "0" {
		t.Errorf("lock_timeout after = %q (%v), want the configured 0", setting, err)
	}
}

// testTable creates table t with columns cols in a new schema, dropped
// when t ends, inserts rows (the INSERT's text after the table name), and
// returns its quoted name.
func testTable(t *testing.T, pool *pgxpool.Pool, cols, rows string) string {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchemaName(t)
	tbl := pgx.Identifier{schema, "t"}.Sanitize()
	for _, sql := range []string{
		"CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize(),
		"CREATE TABLE " + tbl + " " + cols,
		"INSERT INTO " + tbl + " " + rows,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return tbl
}
