package pgcopy_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
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
	n, err := pgcopy.From(ctx, tx, pgx.Identifier{"t x"}, []string{"a b", "C", "n"}, len(want), func(i int, r *pgcopy.Row) {
		r.Text(want[i].a)
		r.Text(want[i].c)
		r.Int8(want[i].n)
	})
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

// TestFromStreamsManyRowsAndEndsOnABadOne copies more rows than one
// chunk holds (the stream is read in 64 KiB pieces and a row may straddle
// two), then checks that a field of another type than text, or a row of
// too few or too many fields, ends the COPY with an error naming the row,
// after rows of it were sent: nothing is copied, the transaction needs its
// savepoint rolled back; and that PostgreSQL's refusal comes back as its
// *pgconn.PgError.
func TestFromStreamsManyRowsAndEndsOnABadOne(t *testing.T) {
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
	const many = 5000 // about 5 chunks
	value := func(i int) string { return fmt.Sprintf("row-%05d-%s", i, strings.Repeat("x", i%200)) }
	n, err := pgcopy.From(ctx, tx, pgx.Identifier{"t"}, cols, many, func(i int, r *pgcopy.Row) {
		r.Text(value(i))
		r.Text(nil)
	})
	if err != nil || n != many {
		t.Fatalf("From = %d, %v; want %d rows", n, err, many)
	}
	var count int
	var sum string
	if err := tx.QueryRow(ctx, "SELECT count(*), md5(string_agg(a, ',' ORDER BY a)) FROM t WHERE b IS NULL").Scan(&count, &sum); err != nil {
		t.Fatal(err)
	}
	var all []string
	for i := range many {
		all = append(all, value(i))
	}
	if wantSum := fmt.Sprintf("%x", md5.Sum([]byte(strings.Join(all, ",")))); count != many || sum != wantSum {
		t.Fatalf("copied %d rows (md5 %s), want %d (md5 %s)", count, sum, many, wantSum)
	}

	for name, tt := range map[string]struct {
		bad  func(r *pgcopy.Row) // row 3000
		want string
	}{
		"an int in a text field": {func(r *pgcopy.Row) { r.Text("x"); r.Text(7) }, "pgcopy: row 3000: a text field given a int"},
		"a row short of a field": {func(r *pgcopy.Row) { r.Text("x") }, "pgcopy: row 3000: 1 fields, want 2"},
		"a field too many":       {func(r *pgcopy.Row) { r.Text("x"); r.Text("y"); r.Text("z") }, "pgcopy: row 3000: 3 fields, want 2"},
	} {
		if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
			t.Fatal(err)
		}
		_, err := pgcopy.From(ctx, tx, pgx.Identifier{"t"}, cols, many, func(i int, r *pgcopy.Row) {
			if i == 3000 {
				tt.bad(r)
				return
			}
			r.Text("x")
			r.Text("y")
		})
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: err = %v, want %q", name, err, tt.want)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&count); err != nil || count != many {
		t.Fatalf("after the aborted COPYs: %d rows, %v; want the %d copied before", count, err, many)
	}

	_, err = pgcopy.From(ctx, tx, pgx.Identifier{"t"}, cols, 1, func(i int, r *pgcopy.Row) {
		r.Text(nil)
		r.Text("b")
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23502" {
		t.Fatalf("NULL into NOT NULL: err = %v, want SQLSTATE 23502", err)
	}
}

// TestWriteIsTheBinaryFormat pins the stream's bytes for two rows: the
// header, a text field, a NULL, a bigint, the trailer.
func TestWriteIsTheBinaryFormat(t *testing.T) {
	var b bytes.Buffer
	n, err := pgcopy.Write(&b, 2, 2, func(i int, r *pgcopy.Row) {
		if i == 0 {
			r.Text("hé")
		} else {
			r.Text(nil)
		}
		r.Int8(-2)
	})
	want := "PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" +
		"\x00\x02" + "\x00\x00\x00\x03hé" + "\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xfe" +
		"\x00\x02" + "\xff\xff\xff\xff" + "\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xfe" +
		"\xff\xff"
	if err != nil || n != int64(len(want)) || b.String() != want {
		t.Fatalf("Write = %d, %v:\n%q\nwant\n%q", n, err, b.String(), want)
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
