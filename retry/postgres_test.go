package retry_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// TestMain closes the PostgreSQL server shared by the package's tests
// (pgtest.Pool) when they end.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestClassifyRealPostgreSQLFailures provokes each failure on a real
// PostgreSQL and checks the class of the error pgx returns: a statement
// that always times out must end as a projection error (retried, then
// dead-lettered) rather than pause its partition forever, and a read-only
// database (a failover) or a closed pool must pause rather than
// dead-letter a flood.
func TestClassifyRealPostgreSQLFailures(t *testing.T) {
	pool := pgtest.Pool(t)
	inTx := func(ctx context.Context, setup, stmt string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, setup); err != nil {
				t.Fatalf("%s: %v", setup, err)
			}
			_, err := tx.Exec(ctx, stmt)
			return err
		})
	}
	tests := []struct {
		name     string
		run      func(ctx context.Context) error
		want     retry.Class
		sqlstate string
	}{
		{"statement timeout is projection", func(ctx context.Context) error {
			return inTx(ctx, "SET LOCAL statement_timeout = '50ms'", "SELECT pg_sleep(10)")
		}, retry.Projection, "57014"},
		{"context deadline during a statement is projection", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := pool.Exec(ctx, "SELECT pg_sleep(10)")
			return err
		}, retry.Projection, ""},
		{"read-only transaction is infrastructure", func(ctx context.Context) error {
			return inTx(ctx, "SET TRANSACTION READ ONLY", "CREATE TABLE classify_read_only_probe (a int)")
		}, retry.Infrastructure, "25006"},
		{"lock wait timeout is projection", func(ctx context.Context) error {
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock(7305)"); err != nil {
				t.Fatal(err)
			}
			return inTx(ctx, "SET LOCAL lock_timeout = '50ms'", "SELECT pg_advisory_xact_lock(7305)")
		}, retry.Projection, "55P03"},
		{"terminated backend is infrastructure", func(ctx context.Context) error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", conn.Conn().PgConn().PID()); err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, "SELECT 1")
			return err
		}, retry.Infrastructure, ""},
		{"closed pool is infrastructure", func(ctx context.Context) error {
			closed, err := pgxpool.New(ctx, pool.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			closed.Close()
			_, err = closed.Exec(ctx, "SELECT 1")
			return err
		}, retry.Infrastructure, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := tt.run(ctx)
			if err == nil {
				t.Fatal("no error")
			}
			if tt.sqlstate != "" && retry.SQLState(err) != tt.sqlstate {
				t.Errorf("SQLSTATE of %v = %q, want %s", err, retry.SQLState(err), tt.sqlstate)
			}
			if got := retry.Classify(err); got != tt.want {
				t.Errorf("Classify(%v) = %s, want %s", err, got, tt.want)
			}
		})
	}
}
