package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/internal/testtool"
)

// TestRunWarnsAtStartWhenTheDatabaseIsUnreachable (issue 12): a database
// that does not answer at start is reported at once, before any record
// arrives: a WARN naming the setting and the reason, the worker keeps
// running (it resumes when the database answers) and /readyz says why it is
// not ready.
func TestRunWarnsAtStartWhenTheDatabaseIsUnreachable(t *testing.T) {
	tests := []struct {
		mode     string // --on-infra-error
		wantThen string // what the warning says happens to records
	}{
		{mode: "pause", wantThen: "partitions pause until it answers"},
		{mode: "dlq", wantThen: "records are retried, then dead-lettered"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.New(t)
			w := startRun(t, "--brokers", strings.Join(b.Addrs, ","),
				"--database-url", "postgres://postgres:postgres@"+refusingAddr(t)+"/postgres?sslmode=disable",
				"--projections", exampleProjections, "--on-infra-error", tt.mode,
				"--topic", kafkatest.TopicName(t, "events"), "--dlq-topic", kafkatest.TopicName(t, "dlq"),
				"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"))
			w.waitFor(t, "a warning that the database is unreachable", 30*time.Second, func() bool {
				return w.logged("level=WARN msg=\"database unreachable at start")
			})
			for _, want := range []string{"DATABASE_URL", tt.wantThen, "connection refused"} {
				if !w.logged(want) {
					t.Errorf("the warning lacks %q\nstderr:\n%s", want, w.stderr.String())
				}
			}
			w.waitFor(t, "the worker started", 30*time.Second, func() bool { return w.logged("projection worker started") })
			if got := w.get(t, "/readyz"); !strings.HasPrefix(got, "503") || !strings.Contains(got, "database unreachable") {
				t.Errorf("GET /readyz = %q, want 503 naming the database", got)
			}
			w.shutdown(t)
		})
	}
}

// TestRunEndsWhenTheDatabaseRefusesItsURL: a server that answers and
// refuses the connection for what --database-url says ends the start with
// status 1 and a message naming the setting and PostgreSQL's reason, as a
// Kafka broker that refuses does; waiting would not change it (stop 41's
// trial: a misspelt parameter read as an outage, the worker waiting with
// "database unreachable").
func TestRunEndsWhenTheDatabaseRefusesItsURL(t *testing.T) {
	pool := pgtest.Pool(t)
	role := pgtest.NewSchemaName(t) // a fresh name, as a role's
	if _, err := pool.Exec(context.Background(), "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	base, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	with := func(edit func(u *url.URL, q url.Values)) string {
		u := *base
		q := u.Query()
		edit(&u, q)
		u.RawQuery = q.Encode()
		return u.String()
	}
	tests := []struct {
		name, url string
		want      []string
	}{
		{"misspelt parameter", with(func(_ *url.URL, q url.Values) { q.Set("sslmod", "disable") }),
			[]string{`unrecognized configuration parameter "sslmod"`, "42704", "sslmod for sslmode"}},
		{"value refused", with(func(_ *url.URL, q url.Values) { q.Set("lock_timeout", "soon") }),
			[]string{`invalid value for parameter "lock_timeout"`, "22023"}},
		{"no such database", with(func(u *url.URL, _ url.Values) { u.Path = "/causet_no_such_database" }),
			[]string{`database "causet_no_such_database" does not exist`, "3D000"}},
		{"role may not log in", with(func(u *url.URL, _ url.Values) { u.User = url.User(role) }),
			[]string{`role "` + role + `" is not permitted to log in`, "28000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.New(t)
			w := startRun(t, "--brokers", strings.Join(b.Addrs, ","), "--database-url", tt.url,
				"--projections", exampleProjections,
				"--topic", kafkatest.TopicName(t, "events"), "--dlq-topic", kafkatest.TopicName(t, "dlq"),
				"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"))
			if code := w.exit(t, 30*time.Second); code != 1 {
				t.Fatalf("exit status %d, want 1\nstderr:\n%s", code, w.stderr.String())
			}
			stderr := w.stderr.String()
			for _, want := range append([]string{"the database refuses the connection: " + tt.want[0], "check --database-url (DATABASE_URL)"}, tt.want...) {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, "database unreachable") {
				t.Errorf("stderr says unreachable:\n%s", stderr)
			}
		})
	}
}

// TestOnInfraErrorTakesAnyCase: ON_INFRA_ERROR=DLQ is dlq, as LOG_FORMAT=JSON
// is json (new-user trial: one was refused, the other taken); an unknown
// mode is still refused, naming the flag.
func TestOnInfraErrorTakesAnyCase(t *testing.T) {
	clearSettingsEnv(t)
	for v, want := range map[string]string{"DLQ": "dlq", "Pause": "pause", "dlq": "dlq", "maybe": ""} {
		t.Setenv("ON_INFRA_ERROR", v)
		var s settings
		if err := parseFlags(runFlags(&s, io.Discard), nil); err != nil {
			t.Fatal(err)
		}
		err := s.checkRun()
		switch {
		case want == "" && (err == nil || !strings.Contains(err.Error(), "--on-infra-error")):
			t.Errorf("ON_INFRA_ERROR=%s: checkRun error %v, want one naming --on-infra-error", v, err)
		case want != "" && (err != nil || s.onInfraError != want):
			t.Errorf("ON_INFRA_ERROR=%s: checkRun error %v, mode %q; want %q", v, err, s.onInfraError, want)
		}
	}
}

// TestReadyzSaysBusyWhenEveryConnectionIsInUse: a ping that waited for a
// connection until its deadline, every connection of the pool in use, is
// "database busy" with the fix, not "database unreachable" (ops trial: a
// table locked by another session read as unreachable); a ping refused is
// still unreachable.
func TestReadyzSaysBusyWhenEveryConnectionIsInUse(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx) // the one connection, held as a locked statement holds it
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	got := pingError(pool.Ping(pctx), pool.Stat()).Error()
	conn.Release()
	if !strings.HasPrefix(got, "database busy: all 1 connections of the pool in use") || !strings.Contains(got, "lock_timeout") {
		t.Errorf("busy pool: %q, want database busy naming lock_timeout", got)
	}

	cfg, err = pgxpool.ParseConfig("postgres://postgres:postgres@" + closedAddr(t) + "/postgres?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	refused, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	pctx2, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if got := pingError(refused.Ping(pctx2), refused.Stat()).Error(); !strings.HasPrefix(got, "database unreachable: ") {
		t.Errorf("refused: %q, want database unreachable", got)
	}
}

// TestWatchDatabaseSaysWhenTheDatabaseAnswers: after an unreachable start,
// the worker says every `still` that the database still does not answer,
// and once it does, that it answers, with nothing else to apply (new-user
// trial: silence after the first warning). The database comes up at an
// address that refused connections before: a proxy to the test's.
func TestWatchDatabaseSaysWhenTheDatabaseAnswers(t *testing.T) {
	target, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := closedAddr(t)
	u := *target
	u.Host = addr
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); watchDatabase(ctx, pool, log, 50*time.Millisecond, 200*time.Millisecond) }()
	for !strings.Contains(logs.String(), "database still unreachable") {
		if ctx.Err() != nil {
			t.Fatalf("no 'still unreachable' line:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	ln, err := net.Listen("tcp", addr) // the database comes up there
	if err != nil {
		t.Fatal(err)
	}
	testtool.Serve(t, ln, func(c net.Conn) {
		pg, err := net.Dial("tcp", target.Host)
		if err != nil {
			return
		}
		defer pg.Close()
		go func() { _, _ = io.Copy(pg, c) }()
		_, _ = io.Copy(c, pg)
	})
	select {
	case <-done:
	case <-ctx.Done():
	}
	if out := logs.String(); !strings.Contains(out, `level=INFO msg="database answers now"`) || !strings.Contains(out, "connection refused") {
		t.Errorf("logs lack the database answering, or the reason it did not:\n%s", out)
	}
}
