package pgtest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func connect(ctx context.Context, t *testing.T, url string) (*pgx.Conn, error) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
	}
	return conn, err
}

// TestServerOutage starts a server, stops it (connections are refused),
// restarts it on the same port with its data, and closes it (data directory
// removed).
func TestServerOutage(t *testing.T) {
	ctx := t.Context()
	srv := pgtest.StartOwn(t)

	wantURL := "postgres://postgres@127.0.0.1:" + strconv.Itoa(srv.Port()) + "/postgres?sslmode=disable"
	if diff := cmp.Diff(wantURL, srv.URL()); diff != "" {
		t.Errorf("URL (-want +got):\n%s", diff)
	}

	conn, err := connect(ctx, t, srv.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v bigint); INSERT INTO kept VALUES (9007199254740993)`); err != nil {
		t.Fatalf("create table: %v", err)
	}
	var settings []string
	rows, err := conn.Query(ctx, `SELECT name || '=' || setting FROM pg_settings
		WHERE name IN ('fsync', 'full_page_writes', 'max_connections', 'listen_addresses', 'server_encoding', 'lc_collate')
		ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	settings, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fsync=off", "full_page_writes=off", "lc_collate=C", "listen_addresses=127.0.0.1", "max_connections=200", "server_encoding=UTF8"}
	if diff := cmp.Diff(want, settings); diff != "" {
		t.Errorf("settings (-want +got):\n%s", diff)
	}

	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("ping on a connection to a stopped server succeeded")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = pgx.Connect(cctx, srv.URL())
	cancel()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect to stopped server: got %v, want connection refused", err)
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	for _, step := range []string{"after restart", "after restart of a running server"} {
		conn, err := connect(ctx, t, srv.URL())
		if err != nil {
			t.Fatalf("%s: connect: %v", step, err)
		}
		var v int64
		if err := conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 9007199254740993 {
			t.Fatalf("%s: read kept row: %d, %v", step, v, err)
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatalf("%s: Restart: %v", step, err)
		}
	}

	dataDir := srv.DataDir()
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(dataDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary directory %s after Close: %v, want it removed", filepath.Dir(dataDir), err)
	}
	if err := srv.Restart(ctx); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

// TestStartDir checks that a given data directory is created, reused with
// its data by a second Start, and left in place when it existed before.
func TestStartDir(t *testing.T) {
	ctx := t.Context()
	// Not t.TempDir: when running as root, the user postgres must be able to
	// reach the directory, and t.TempDir's parent is private.
	parent, err := os.MkdirTemp("", "pgtest-dir-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "nested", "data")

	first, err := pgtest.Start(ctx, pgtest.Options{Dir: dir, Logf: t.Logf})
	if err != nil {
		skipOrFail(t, err)
	}
	t.Cleanup(func() { first.Close() })
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, first.URL())
	if err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	if err := first.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err = connect(ctx, t, first.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v text)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	second, err := pgtest.Start(ctx, pgtest.Options{Dir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start on an existing cluster: %v", err)
	}
	conn, err = connect(ctx, t, second.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO kept VALUES ('reused')`); err != nil {
		t.Errorf("table from the first run: %v", err)
	}
	conn.Close(ctx)
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		t.Errorf("Close removed a data directory that existed before Start: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close of the Start that created %s: %v, want it removed", dir, err)
	}
}

func TestStartMissingBinaries(t *testing.T) {
	_, err := pgtest.Start(t.Context(), pgtest.Options{BinDir: t.TempDir()})
	if !errors.Is(err, pgtest.ErrNotInstalled) {
		t.Fatalf("Start: got %v, want ErrNotInstalled", err)
	}
	if !strings.Contains(err.Error(), "Debian package postgresql") {
		t.Errorf("error %q does not say what to install", err)
	}
}

func TestURLAndPool(t *testing.T) {
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if got, again := pgtest.URL(t), pgtest.URL(t); got != again {
		t.Errorf("URL changed between calls: %q, %q", got, again)
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
	t.Run("parallel pools share the server", func(t *testing.T) {
		for _, name := range []string{"a", "b", "c"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				schema := pgtest.NewSchemaName(t)
				p := pgtest.Pool(t)
				if _, err := p.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
					t.Fatalf("create schema %s: %v", schema, err)
				}
			})
		}
	})
}

func TestNewSchemaName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tests := []struct {
		name   string
		prefix string // wanted start of the schema name, given t.Name()
	}{
		{name: "plain", prefix: "t_testnewschemaname_plain_"},
		{name: "Mixed Case & spaces", prefix: "t_testnewschemaname_mixed_case_spaces_"},
		{name: "ünïcödé/ünd-dash", prefix: "t_testnewschemaname_n_c_d_nd_dash_"},
		{name: strings.Repeat("long", 40), prefix: "t_testnewschemaname_longlong"},
		{name: "trailing___", prefix: "t_testnewschemaname_trailing_"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 20 {
				got := pgtest.NewSchemaName(t)
				if !valid.MatchString(got) {
					t.Fatalf("NewSchemaName = %q, not a valid tenant schema", got)
				}
				if !strings.HasPrefix(got, tt.prefix) {
					t.Errorf("NewSchemaName = %q, want prefix %q", got, tt.prefix)
				}
				if seen[got] {
					t.Errorf("NewSchemaName returned %q twice", got)
				}
				seen[got] = true
			}
		})
	}
	t.Run("accepted by PostgreSQL", func(t *testing.T) {
		pool := pgtest.Pool(t)
		name := pgtest.NewSchemaName(t)
		if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+name); err != nil {
			t.Fatalf("CREATE SCHEMA %s (unquoted): %v", name, err)
		}
		var got string
		if err := pool.QueryRow(t.Context(), `SELECT nspname FROM pg_namespace WHERE nspname = $1`, name).Scan(&got); err != nil {
			t.Fatalf("schema %s not found as written: %v", name, err)
		}
	})
}

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(err)
	}
	t.Skip(err)
}
