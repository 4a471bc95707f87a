package main

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgtest"
)

// ownDatabaseURL creates a database of its own for the test, named prefix
// and a new schema name, with options after CREATE DATABASE's name, drops
// it when the test ends, and returns its URL on the test server.
func ownDatabaseURL(t *testing.T, prefix, options string) string {
	t.Helper()
	admin := pgtest.Pool(t)
	db := prefix + pgtest.NewSchemaName(t)
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()+options); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

// TestPoolSpeaksUTF8ToADatabaseOfAnotherEncoding: the worker's connections
// send UTF-8 whatever the database's encoding, so PostgreSQL converts each
// value, and refuses one the database cannot hold (22P05) instead of
// storing its UTF-8 bytes as other characters (new-user trial: in a LATIN1
// database "é" read back as "Ã©" and an emoji as four Latin-1 letters).
func TestPoolSpeaksUTF8ToADatabaseOfAnotherEncoding(t *testing.T) {
	ctx := context.Background()
	pool, err := newPool(ctx, ownDatabaseURL(t, "latin1_", " ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE t (v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO t VALUES ($1)", "café"); err != nil {
		t.Fatal(err)
	}
	var got string
	var octets int
	if err := pool.QueryRow(ctx, "SELECT v, octet_length(v) FROM t").Scan(&got, &octets); err != nil {
		t.Fatal(err)
	}
	if got != "café" || octets != 4 { // é is one byte in LATIN1
		t.Errorf("stored %q (%d bytes in the database), want café in 4", got, octets)
	}
	_, err = pool.Exec(ctx, "INSERT INTO t VALUES ($1)", "😀")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P05" {
		t.Errorf("an emoji into a LATIN1 database: %v, want SQLSTATE 22P05", err)
	}
}

// TestPoolNamesItsSessions: the worker's sessions show as
// projection-worker in pg_stat_activity, unless the connection string
// names them itself (new-user trial: an operator looking for the worker's
// sessions, to find who held a lock, saw them with an empty name).
func TestPoolNamesItsSessions(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct{ query, want string }{{"", defaultApplicationName}, {"application_name=ops-worker-7", "ops-worker-7"}} {
		u, err := url.Parse(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if tt.query != "" {
			k, v, _ := strings.Cut(tt.query, "=")
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		pool, err := newPool(ctx, u.String(), 1)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&got)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got != tt.want {
			t.Errorf("URL with %q: application_name %q, want %q", tt.query, got, tt.want)
		}
	}
}
