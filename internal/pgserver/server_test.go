package pgserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgserver"
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

	first, err := pgserver.Start(ctx, pgserver.Options{Dir: dir, Logf: t.Logf})
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

	second, err := pgserver.Start(ctx, pgserver.Options{Dir: dir, Logf: t.Logf})
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
	_, err := pgserver.Start(t.Context(), pgserver.Options{BinDir: t.TempDir()})
	if !errors.Is(err, pgserver.ErrNotInstalled) {
		t.Fatalf("Start: got %v, want ErrNotInstalled", err)
	}
	if !strings.Contains(err.Error(), "Debian package postgresql") {
		t.Errorf("error %q does not say what to install", err)
	}
}

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(err)
	}
	t.Skip(err)
}
