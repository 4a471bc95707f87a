// Package pgtest is the PostgreSQL harness of the integration tests: [URL],
// [Pool], [NewSchemaName] and [StartOwn] honour DATABASE_URL, or start a
// throwaway server with package pgserver, and skip (or, with CI=true, fail)
// when PostgreSQL cannot be had. It imports package testing; binaries use
// pgserver directly.
package pgtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/pgserver"
)

// Server is a PostgreSQL server started by [StartOwn]; see
// [pgserver.Server] for its methods.
type Server = pgserver.Server

// shared is the server behind [URL] and [Pool]: started by the first test
// that needs it, once per test binary, and closed by [Main]. This is the
// package's only package-level state; it exists because a test binary has
// no other place to keep one server for all its tests, and it is never
// used outside tests.
var shared sharedServer

type sharedServer struct {
	main atomic.Bool // Main is running the tests, so it will close the server

	once sync.Once
	mu   sync.Mutex
	srv  *Server
	err  error
}

func (s *sharedServer) get() (*Server, error) {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv, err := pgserver.Start(ctx, pgserver.Options{})
		s.mu.Lock()
		s.srv, s.err = srv, err
		s.mu.Unlock()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv, s.err
}

func (s *sharedServer) close() error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// Main runs the tests of a package that uses [URL] or [Pool] and closes the
// shared server afterwards; it returns the exit code for os.Exit. Call it
// from the package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// An interrupt (SIGINT, SIGTERM, unless ignored) while the tests run
// closes the shared server too, then kills the process with the same
// signal. A failure to
// close the server turns exit code 0 into 1.
func Main(m *testing.M) int {
	shared.main.Store(true)
	sigs := make(chan os.Signal, 1)
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		if !signal.Ignored(sig) { // e.g. SIGINT in a background job stays ignored
			signal.Notify(sigs, sig)
		}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() { // exits when the tests end, or re-raises the signal
		defer close(exited)
		select {
		case sig := <-sigs:
			_ = shared.close()
			signal.Reset(sig.(syscall.Signal))
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		case <-done:
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(done)
	<-exited
	if err := shared.close(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: close the shared PostgreSQL server: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// URL returns a PostgreSQL connection string for t: DATABASE_URL when it is
// set, otherwise the URL of a server the test binary shares, started on
// first use with [pgserver.Start] and closed by [Main] (the package's TestMain must
// call Main; URL fails the test otherwise). Tests share the database, so
// each should work in its own schema ([NewSchemaName]).
//
// When no server can be started, URL skips t with the reason, or fails it
// when the environment variable CI is true (a missing service must not pass
// CI silently). The attempt is made once per test binary.
func URL(t testing.TB) string {
	t.Helper()
	if !shared.main.Load() {
		t.Fatal("pgtest: the package's TestMain must call pgtest.Main, which closes the shared server: " +
			"func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }")
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	srv, err := shared.get()
	if err != nil {
		unavailable(t, err)
	}
	return srv.URL()
}

// Pool returns a pgx pool connected to [URL] (default pool settings) and
// pinged, closed when t ends. It skips or fails t as URL does, and fails t
// when DATABASE_URL is set but unreachable.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: pool for %s: %v", redact(u), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("pgtest: ping %s: %v", redact(u), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// StartOwn starts a server of t's own, for tests that stop and restart the
// database (outages); it ignores DATABASE_URL, needs the server binaries,
// and is closed when t ends. Its progress is logged with t.Logf. It skips
// or fails t as [URL] does when the server cannot be started.
func StartOwn(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{Logf: t.Logf})
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("pgtest: close server: %v", err)
		}
	})
	return srv
}

// NewSchemaName returns a tenant schema name unique to this call, made of
// "t_", t's name (lower-cased, runs of characters other than [a-z0-9]
// turned into one "_", cut to fit) and "_" plus 8 random hex digits, e.g.
// "t_testapply_upsert_3fa94c1d". It always matches ^[a-z_][a-z0-9_]{0,62}$
// (at most 63 bytes, SPEC §3). It creates nothing; on a DATABASE_URL
// server the schemas a test creates stay unless it drops them.
func NewSchemaName(t testing.TB) string {
	t.Helper()
	const maxLen, suffixLen = 63, 9 // "_" + 8 hex digits
	var sb strings.Builder
	sb.WriteString("t_")
	underscore := true
	for _, r := range strings.ToLower(t.Name()) {
		if sb.Len() >= maxLen-suffixLen {
			break
		}
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			sb.WriteRune(r)
			underscore = false
		case !underscore:
			sb.WriteByte('_')
			underscore = true
		}
	}
	name := strings.TrimRight(sb.String(), "_")
	return fmt.Sprintf("%s_%08x", name, rand.Uint32())
}

// unavailable skips t, or fails it when CI is true.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("pgtest: PostgreSQL is required when CI is set: %v", err)
	}
	t.Skipf("pgtest: skipped, no PostgreSQL (set DATABASE_URL, or install the Debian package postgresql; with CI=true this fails): %v", err)
}

// redact hides a password in a connection string for messages.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable DATABASE_URL)"
	}
	return p.Redacted()
}
