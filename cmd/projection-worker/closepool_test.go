package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestClosePoolWaitsBoundedForConnectionsInUse: a connection that is
// never given back (a statement of an abandoned batch waiting for a lock)
// holds closePool for its wait only, with a WARN line saying so
// (deployment trial: the process ran 5-8 s after "projection worker
// stopped", in pgxpool.Close, which waits for every connection); a pool
// whose connections are all back closes at once, without a word.
func TestClosePoolWaitsBoundedForConnectionsInUse(t *testing.T) {
	url := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release() // after the test: the pool is closed by then
	var buf bytes.Buffer
	start := time.Now()
	closePool(pool, 300*time.Millisecond, slog.New(slog.NewTextHandler(&buf, nil)))
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("closePool took %s with a connection in use, want about its wait", took)
	}
	if !strings.Contains(buf.String(), "database connections still in use at exit") || !strings.Contains(buf.String(), "connections=1") {
		t.Errorf("log %q, want a WARN naming 1 connection in use", buf.String())
	}

	idle, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	closePool(idle, time.Minute, slog.New(slog.NewTextHandler(&buf, nil)))
	if buf.Len() > 0 {
		t.Errorf("closing an idle pool logged %q, want nothing", buf.String())
	}
}
