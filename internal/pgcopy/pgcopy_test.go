package pgcopy_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgcopy"
	"github.com/causet/projection-worker/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// copyTracer records what pgx's CopyFromTracer hooks were told.
type copyTracer struct {
	started []pgx.TraceCopyFromStartData
	ended   []pgx.TraceCopyFromEndData
}

func (t *copyTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (t *copyTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *copyTracer) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	t.started = append(t.started, d)
	return ctx
}
func (t *copyTracer) TraceCopyFromEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceCopyFromEndData) {
	t.ended = append(t.ended, d)
}

func connect(t *testing.T, tracer pgx.QueryTracer) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestFromCopiesTextNullsAndBigints checks the encoding against what
// PostgreSQL reads back: text of every kind a row can hold (empty, NUL-free
// multi-byte UTF-8, tabs, newlines and backslashes, which the text format
// would have to escape, a value of 1 MiB), NULL, and bigints at both ends
// of their range, in column names that need quoting; and that the tracer
// sees the COPY.
func TestFromCopiesTextNullsAndBigints(t *testing.T) {
	ctx := context.Background()
	tr := &copyTracer{}
	conn := connect(t, tr)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE "t x" ("a b" text, "C" text, n bigint)`); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("é", 1<<19) // 1 MiB
	want := []struct {
		a, c any
		n    int64
	}{
		{"", nil, 0},
		{"tab\there\nline\\back\r", "日本語 ✓", -9223372036854775808},
		{nil, big, 9223372036854775807},
		{"{\"k\": [1, 2]}", "'quoted' \"both\"", 42},
	}
	rows := pgcopy.NewRows(3)
	for _, w := range want {
		rows.Row()
		rows.Text(w.a)
		rows.Text(w.c)
		rows.Int8(w.n)
	}
	if rows.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", rows.Len(), len(want))
	}
	n, err := pgcopy.From(ctx, tx, pgx.Identifier{"t x"}, []string{"a b", "C", "n"}, rows)
	rows.Release()
	if err != nil || n != int64(len(want)) {
		t.Fatalf("From = %d, %v; want %d rows", n, err, len(want))
	}
	got, err := pgx.CollectRows(mustQuery(t, tx, `SELECT "a b", "C", n FROM "t x" ORDER BY n`), func(r pgx.CollectableRow) ([3]any, error) {
		var a, c *string
		var n int64
		err := r.Scan(&a, &c, &n)
		return [3]any{deref(a), deref(c), n}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	order := []int{1, 0, 3, 2} // by n
	for i, j := range order {
		w := want[j]
		if got[i][0] != w.a || got[i][1] != w.c || got[i][2] != w.n {
			t.Errorf("row %d: got (%.40v, %.40v, %v), want (%.40v, %.40v, %v)", i, got[i][0], got[i][1], got[i][2], w.a, w.c, w.n)
		}
	}
	if len(tr.started) != 1 || len(tr.ended) != 1 {
		t.Fatalf("tracer: %d starts, %d ends; want 1 and 1", len(tr.started), len(tr.ended))
	}
	if s := tr.started[0]; s.TableName.Sanitize() != `"t x"` || strings.Join(s.ColumnNames, ",") != "a b,C,n" {
		t.Errorf("tracer start: table %s, columns %q", s.TableName.Sanitize(), s.ColumnNames)
	}
	if e := tr.ended[0]; e.Err != nil || e.CommandTag.RowsAffected() != int64(len(want)) {
		t.Errorf("tracer end: %v, %d rows", e.Err, e.CommandTag.RowsAffected())
	}
}

// TestFromRefusesBadRowsBeforeSending checks that a value of another type
// than text or a row short of fields is an error naming the row, and that
// nothing reaches PostgreSQL (the transaction is still usable); and that
// PostgreSQL's refusal comes back as its *pgconn.PgError.
func TestFromRefusesBadRowsBeforeSending(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, nil)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE t (a text NOT NULL, b text)`); err != nil {
		t.Fatal(err)
	}
	cols := []string{"a", "b"}
	for name, fill := range map[string]func(*pgcopy.Rows){
		"an int in a text field": func(r *pgcopy.Rows) {
			r.Row()
			r.Text("x")
			r.Text("y")
			r.Row()
			r.Text(7)
			r.Text("z")
		},
		"a row short of a field": func(r *pgcopy.Rows) { r.Row(); r.Text("x"); r.Row(); r.Text("y"); r.Text("z") },
		"the last row short":     func(r *pgcopy.Rows) { r.Row(); r.Text("x") },
	} {
		rows := pgcopy.NewRows(2)
		fill(rows)
		_, err := pgcopy.From(ctx, tx, pgx.Identifier{"t"}, cols, rows)
		rows.Release()
		if err == nil || !strings.Contains(err.Error(), "pgcopy: row ") {
			t.Errorf("%s: err = %v, want a pgcopy error naming the row", name, err)
		}
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 0 {
		t.Fatalf("after refused streams: %d rows, %v; want 0 rows, a usable transaction", n, err)
	}
	rows := pgcopy.NewRows(2)
	rows.Row()
	rows.Text(nil)
	rows.Text("b")
	_, err = pgcopy.From(ctx, tx, pgx.Identifier{"t"}, cols, rows)
	rows.Release()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23502" {
		t.Fatalf("NULL into NOT NULL: err = %v, want SQLSTATE 23502", err)
	}
}

func mustQuery(t *testing.T, tx pgx.Tx, sql string) pgx.Rows {
	t.Helper()
	rows, err := tx.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
