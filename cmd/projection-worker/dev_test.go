//go:build dev

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/devstack"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/internal/redact"
	"github.com/causet/projection-worker/projection"
)

// TestDevShowsRowsAndEveryDocumentedFailure runs what `make run` runs, on a
// free port and a PostgreSQL of its own, and checks what the README
// promises: the example rows are projected and each documented failure
// cause becomes a dead letter; Ctrl-C (ctx) stops it with status 0.
func TestDevShowsRowsAndEveryDocumentedFailure(t *testing.T) {
	clearSettingsEnv(t)
	// A fresh server of the test's own, as make run's throwaway one: the
	// example tenants have fixed names.
	db := pgtest.StartOwn(t)
	// A password the server does not ask for (trust authentication): as a
	// DATABASE_URL's, it must not be printed.
	const password = "s3cret-dev-pw"
	dbURL := strings.Replace(db.URL(), "postgres@", "postgres:"+password+"@", 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--kafka-port", "-1", "--http-addr", "", "--database-url", dbURL,
			"--projections", exampleProjections, "--retry-initial", "5ms", "--retry-max-interval", "20ms"}, &stdout, &stderr)
	}()
	// The SPEC example and friends, and six dead letters: 42703, a null
	// into a notNull column, 42P01 twice (two projections), division by
	// zero, not JSON.
	const want = "artist_followers=2 user_follows=3 artist_ratings=0); dead letters: 6"
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(stdout.String(), want) && time.Now().Before(deadline) {
		select {
		case code := <-done:
			t.Fatalf("dev exited early with %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !strings.Contains(stdout.String(), want) {
		t.Fatalf("dev never printed %q\nstdout:\n%s\nstderr:\n%s", want, stdout.String(), stderr.String())
	}
	if strings.Contains(stdout.String()+stderr.String(), password) {
		t.Errorf("dev printed DATABASE_URL's password (new-user trial: in its psql hint)\nstdout:\n%s", stdout.String())
	}
	// The hint runs as printed, the password left out (new-user trial: it
	// printed psql 'xxxxx' when the user was named as the password).
	if hint := "psql '" + redact.WithoutPassword(dbURL) + "'"; !strings.Contains(stdout.String(), hint) || !strings.Contains(hint, "postgres@") {
		t.Errorf("stdout lacks the psql hint %s\n%s", hint, stdout.String())
	}
	// The README says this line means it is ready.
	if ready := fmt.Sprintf("dev: produced %d example events:", len(devstack.Examples(time.Now()))); !strings.Contains(stdout.String(), ready) {
		t.Errorf("stdout lacks %q\n%s", ready, stdout.String())
	}
	// franz-go's group-join and metadata steps are at debug level: the
	// terminal shows the worker's own lines (issue 12).
	if strings.Contains(stderr.String(), "component=kgo") {
		t.Errorf("the log shows the Kafka client's INFO lines, want them at debug level only\nstderr:\n%s", stderr.String())
	}
	for _, cause := range []string{`column \"followed_at\" of relation \"artist_followers\" does not exist`, "null value in a notNull column", "SQLSTATE 42P01", "division by zero"} {
		if !strings.Contains(stderr.String(), cause) {
			t.Errorf("the log shows no dead letter for %s", cause)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("dev exited with %d after Ctrl-C, want 0\nstderr:\n%s", code, stderr.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatal("dev did not stop within 40s of Ctrl-C")
	}
}

// TestDevStartsItsExampleSchemasAnew: a second dev on the database an
// earlier one left (DATABASE_URL) shows the rows the README shows, not
// those the earlier run, or anyone since, left in its example schemas
// (new-user trial: 14 rows where the README says 5).
func TestDevStartsItsExampleSchemasAnew(t *testing.T) {
	clearSettingsEnv(t)
	db := pgtest.StartOwn(t)
	const want = "projected rows in acme_concertapp_production: 5 (artist_followers=2 user_follows=3 artist_ratings=0); dead letters: 6"
	devUntil := func(t *testing.T) {
		t.Helper()
		devUntilPrinted(t, want, "--database-url", db.URL(), "--projections", exampleProjections,
			"--retry-initial", "5ms", "--retry-max-interval", "20ms")
	}
	devUntil(t)
	pool, err := pgxpool.New(context.Background(), db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO acme_concertapp_production.artist_followers (artist_id, user_id, _causet_seq) VALUES ('artist-x', 'someone-else', 1)`); err != nil {
		t.Fatal(err)
	}
	devUntil(t)
}

// TestDevExitStatusFollowsTheRule: dev exits as every command does (see
// TestExitStatusIsOneRuleForEveryCommand): 2 for a bad definitions file or
// flag, before it starts anything.
func TestDevExitStatusFollowsTheRule(t *testing.T) {
	clearSettingsEnv(t)
	badDefs := writeFile(t, "projections.yaml", badPrimaryKey)
	for _, args := range [][]string{
		{"dev", "--kafka-port", "-1", "--projections", badDefs},
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--retry-initial", "5"},
		// Checked before the embedded Kafka and PostgreSQL start (new-user
		// trial: they were started, and the tenants migrated, first).
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--copy-min-rows", "0"},
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--max-batch-records", "0"},
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--retry-initial", "1h"}, // new-user trial: after the stack started
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--max-retries", "-3"},
		{"dev", "--kafka-port", "-1", "--projections", exampleProjections, "--database-wait-max-interval", "0s"},
	} {
		r := runCmd(t, 10*time.Second, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "projection-worker: --") || strings.Contains(r.stdout, "dev:") {
			t.Errorf("run(%q) = %d, want 2 naming the flag, before starting anything\n%s", args, r.code, r)
		}
	}
}

// TestDevCtrlCWhileStartingIsAStop: Ctrl-C (ctx) while make run starts
// its throwaway PostgreSQL stops it with status 0 and a line that says so,
// not with initdb's log and status 1 (new-user trial, Ctrl-C after 0.8 s).
func TestDevCtrlCWhileStartingIsAStop(t *testing.T) {
	clearSettingsEnv(t)
	for _, after := range []time.Duration{0, 300 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(after, cancel)
		var stdout, stderr syncBuffer
		code := run(ctx, []string{"dev", "--kafka-port", "-1", "--http-addr", "", "--projections", exampleProjections}, &stdout, &stderr)
		cancel()
		if code != 0 || strings.Contains(stderr.String(), "FATAL") || strings.Contains(stderr.String(), "initdb") {
			t.Errorf("Ctrl-C after %s: exit %d, want 0 without initdb's log\nstdout:\n%s\nstderr:\n%s", after, code, stdout.String(), stderr.String())
		}
	}
}

// TestDevSaysATakenHTTPAddressFirst: a taken --http-addr stops make run
// with status 1 before the throwaway PostgreSQL and the embedded Kafka
// start (new-user trial: it was said after initdb and the migrations).
func TestDevSaysATakenHTTPAddressFirst(t *testing.T) {
	clearSettingsEnv(t)
	ln := takenPort(t)
	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"dev", "--kafka-port", "-1", "--http-addr", ln.Addr().String(), "--projections", exampleProjections}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--http-addr "+ln.Addr().String()) || strings.Contains(stdout.String(), "throwaway") || strings.Contains(stdout.String(), "kfake") {
		t.Errorf("exit %d, want 1 naming --http-addr before anything starts\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	// The hint names another port that is free (new-user trials: it named
	// the taken one, then the next port, taken too).
	_, hint, ok := strings.Cut(stderr.String(), "pass --http-addr ")
	hint, _, _ = strings.Cut(hint, ",")
	if !ok || hint == ln.Addr().String() {
		t.Fatalf("stderr does not suggest another --http-addr:\n%s", stderr.String())
	}
	free, err := net.Listen("tcp", hint)
	if err != nil {
		t.Errorf("the suggested --http-addr %s is not free: %v", hint, err)
	} else {
		free.Close()
	}
}

// TestOtherAddrSkipsTakenPorts: the suggestion is free, past the taken
// ports after the one asked for.
func TestOtherAddrSkipsTakenPorts(t *testing.T) {
	var taken []net.Listener
	defer func() {
		for _, ln := range taken {
			ln.Close()
		}
	}()
	first := takenPort(t)
	_, port, _ := net.SplitHostPort(first.Addr().String())
	n, _ := strconv.Atoi(port)
	for p := n + 1; p <= n+3 && p < 65535; p++ {
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			taken = append(taken, ln)
		}
	}
	got := otherAddr(first.Addr().String())
	for _, ln := range taken {
		if got == ln.Addr().String() {
			t.Fatalf("otherAddr(%s) = %s, a taken port", first.Addr(), got)
		}
	}
	ln, err := net.Listen("tcp", got)
	if err != nil {
		t.Fatalf("otherAddr(%s) = %s, not free: %v", first.Addr(), got, err)
	}
	ln.Close()
	if got := otherAddr("no-port"); got != "127.0.0.1:18080" {
		t.Errorf("otherAddr(no-port) = %s, want 127.0.0.1:18080", got)
	}
}

// TestDevKafkaPortZeroIsAnyFreePort: --kafka-port 0 takes any free port, as
// -1 does (new-user trial: it silently meant 9092).
func TestDevKafkaPortZeroIsAnyFreePort(t *testing.T) {
	clearSettingsEnv(t)
	for _, arg := range []string{"0", "-1"} {
		if _, port, err := parseDev([]string{"--kafka-port", arg}, io.Discard); err != nil || port != -1 {
			t.Errorf("parseDev(--kafka-port %s) = %d, %v; want -1 (any free port), nil", arg, port, err)
		}
	}
	if _, port, err := parseDev([]string{"--kafka-port", "29092"}, io.Discard); err != nil || port != 29092 {
		t.Errorf("parseDev(--kafka-port 29092) = %d, %v; want 29092, nil", port, err)
	}
}

// TestDevLogsTextUnlessAsked: the dev command (make run) logs text by
// default, says so in its help, and takes json from --log-format or
// LOG_FORMAT like run (new-user trial: its help said json while it logged
// text, and LOG_FORMAT=json was ignored).
func TestDevLogsTextUnlessAsked(t *testing.T) {
	tests := []struct {
		name, env string
		args      []string
		want      string
	}{
		{"default", "", nil, "text"},
		{"LOG_FORMAT", "json", nil, "json"},
		{"flag", "", []string{"--log-format", "json"}, "json"},
		{"flag over LOG_FORMAT", "json", []string{"--log-format", "text"}, "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearSettingsEnv(t)
			t.Setenv("LOG_FORMAT", tt.env)
			s, _, err := parseDev(tt.args, io.Discard)
			if err != nil || s.logFormat != tt.want {
				t.Errorf("parseDev(%q) with LOG_FORMAT=%q: log format %q, %v; want %q", tt.args, tt.env, s.logFormat, err, tt.want)
			}
		})
	}
	clearSettingsEnv(t)
	var stdout, stderr syncBuffer
	run(context.Background(), []string{"dev", "-h"}, &stdout, &stderr)
	if help := stdout.String() + stderr.String(); !strings.Contains(help, "log format: json or text (env LOG_FORMAT) (default \"text\")") {
		t.Errorf("dev -h does not give text as the default log format:\n%s", help)
	}
}

// TestDevExampleLinesAccountForEveryEvent: the ready message's lines say what
// the examples show, and a case of several events says how many, so that
// "produced N example events" adds up.
func TestDevExampleLinesAccountForEveryEvent(t *testing.T) {
	examples := devstack.Examples(time.Now())
	lines := exampleLines(examples)
	total := 0
	for _, l := range lines {
		n := 1
		if i := strings.LastIndex(l, " ("); i >= 0 && strings.HasSuffix(l, " events)") {
			var err error
			if n, err = strconv.Atoi(l[i+2 : len(l)-len(" events)")]); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
		}
		total += n
	}
	if total != len(examples) {
		t.Errorf("the lines account for %d events, want %d:\n%s", total, len(examples), strings.Join(lines, "\n"))
	}
	if !slices.Contains(lines, "a follow then an unfollow: deleted, tombstone kept (2 events)") {
		t.Errorf("lines %q lack the follow-then-unfollow case with its 2 events", lines)
	}
}

// TestDevLeavesAnExampleSchemaItDidNotMake: with DATABASE_URL, dev stops
// before changing anything when the database holds an example tenant
// schema that dev did not make (a user's own data under that name), and
// says which; before, it dropped acme_concertapp_legacy and a column of
// acme_concertapp_staging in whatever database it was given (new-user
// trial).
func TestDevLeavesAnExampleSchemaItDidNotMake(t *testing.T) {
	clearSettingsEnv(t)
	db := pgtest.StartOwn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA acme_concertapp_legacy; CREATE TABLE acme_concertapp_legacy.important (id int); INSERT INTO acme_concertapp_legacy.important VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	code := run(ctx, []string{"dev", "--kafka-port", "-1", "--http-addr", "", "--database-url", db.URL(),
		"--projections", exampleProjections}, &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "acme_concertapp_legacy, which dev did not make") ||
		!strings.Contains(stderr.String(), `psql "$DATABASE_URL" -c 'DROP SCHEMA "acme_concertapp_legacy" CASCADE'`) {
		t.Errorf("dev exited %d, want an error naming acme_concertapp_legacy and how to drop it\nstderr:\n%s", code, stderr.String())
	}
	check := context.Background() // ctx may be done if dev ran until its deadline
	var n int
	if err := pool.QueryRow(check, "SELECT count(*) FROM acme_concertapp_legacy.important").Scan(&n); err != nil || n != 2 {
		t.Errorf("the user's table after dev: %d rows, %v; want its 2 rows", n, err)
	}
	var staging bool
	if err := pool.QueryRow(check, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'acme_concertapp_staging')").Scan(&staging); err != nil || staging {
		t.Errorf("dev made the staging schema (%v, %v) before stopping, want nothing changed", staging, err)
	}
}

// TestDevSaysATakenKafkaPort: a taken --kafka-port stops make run with
// status 1 and says how to take a free one (new-user trial: no hint).
func TestDevSaysATakenKafkaPort(t *testing.T) {
	clearSettingsEnv(t)
	ln := takenPort(t)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"dev", "--kafka-port", port, "--http-addr", "", "--projections", exampleProjections}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "127.0.0.1:"+port) || !strings.Contains(stderr.String(), "--kafka-port 0 takes any free port") {
		t.Errorf("exit %d, want 1 naming the port and --kafka-port 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// TestDevSaysBothTakenPortsAtOnce: with --http-addr and --kafka-port both
// taken, make run names both, each with its fix, before starting anything
// (new-user trial: only the HTTP one was said; the Kafka one came after a
// second try).
func TestDevSaysBothTakenPortsAtOnce(t *testing.T) {
	clearSettingsEnv(t)
	// Adjacent ports, Kafka's below HTTP's: the first free one after
	// each is the same, unless the suggestions keep apart (third new-user
	// trial: both were told the same port).
	var kafkaLn, httpLn net.Listener
	for range 50 {
		kafkaLn = takenPort(t)
		_, p, _ := net.SplitHostPort(kafkaLn.Addr().String())
		n, _ := strconv.Atoi(p)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n+1))); err == nil {
			httpLn = ln
			t.Cleanup(func() { ln.Close() })
			break
		}
	}
	if httpLn == nil {
		t.Fatal("no two adjacent free ports")
	}
	_, kport, _ := net.SplitHostPort(kafkaLn.Addr().String())
	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"dev", "--kafka-port", kport, "--http-addr", httpLn.Addr().String(), "--projections", exampleProjections}, &stdout, &stderr)
	out := stderr.String()
	for _, want := range []string{"--http-addr " + httpLn.Addr().String(), "pass --http-addr", "127.0.0.1:" + kport, "--kafka-port 0 takes any free port", "is free now: pass --kafka-port "} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	httpFree := regexp.MustCompile(`pass --http-addr 127\.0\.0\.1:(\d+)`).FindStringSubmatch(out)
	kafkaFree := regexp.MustCompile(`pass --kafka-port (\d+)`).FindStringSubmatch(out)
	if httpFree == nil || kafkaFree == nil || httpFree[1] == kafkaFree[1] {
		t.Errorf("suggested ports %v and %v: want two, apart\n%s", httpFree, kafkaFree, out)
	}
	if code != 1 || strings.Contains(stdout.String(), "embedded kafka (kfake) listening") {
		t.Errorf("exit %d, want 1 before the stack started\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), out)
	}
}

// TestDevRefusesOnePortForBoth: --kafka-port and --http-addr on one port
// is exit 2 before anything starts (third new-user trial: found after the
// stack had started).
func TestDevRefusesOnePortForBoth(t *testing.T) {
	clearSettingsEnv(t)
	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"dev", "--kafka-port", "18693", "--http-addr", "127.0.0.1:18693", "--projections", exampleProjections}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "are the same port") {
		t.Errorf("exit %d, want 2 saying the ports are the same\n%s", code, stderr.String())
	}
}

// TestDevSaysAMalformedHTTPAddressIsAUsageError: a port out of range or no
// port is exit 2 naming the flag, as for run, without a free port to try
// (new-user trial: exit 1 and "127.0.0.1:18080 is free now").
func TestDevSaysAMalformedHTTPAddressIsAUsageError(t *testing.T) {
	clearSettingsEnv(t)
	for _, addr := range []string{"127.0.0.1:99999", "nonsense"} {
		var stdout, stderr syncBuffer
		code := run(context.Background(), []string{"dev", "--kafka-port", "-1", "--http-addr", addr, "--projections", exampleProjections}, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "--http-addr") || strings.Contains(stderr.String(), "is free now") || strings.Contains(stdout.String(), "kfake") {
			t.Errorf("--http-addr %s: exit %d, want 2 naming the flag before anything starts, no free-port hint\nstdout:\n%s\nstderr:\n%s", addr, code, stdout.String(), stderr.String())
		}
	}
}

// TestDevStatusSaysWhenTheDatabaseDoesNotAnswer: while the database does
// not answer, make run's status line says so instead of "0 rows"
// (new-user trial: "projected rows in acme_concertapp_production: 0 ()"
// while its PostgreSQL was stopped).
func TestDevStatusSaysWhenTheDatabaseDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	pool, err := pgxpool.New(context.Background(), "postgres://u:p@"+addr+"/db?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	line := firstStatusLine(t, pool)
	if !strings.Contains(line, "not counted, the database does not answer") || strings.Contains(line, ": 0 (") {
		t.Errorf("status line while the database does not answer: %q", line)
	}
}

// TestDevStatusDoesNotTotalTheTablesItCounted: when one table's count
// fails and the others' do not, the status line says which and gives no
// total (new-user trial: with the worker's sessions terminated, the line
// went from 5 rows to 3 and back, as if rows had vanished). Here the
// production tenant schema of a database of its own lacks artist_ratings.
func TestDevStatusDoesNotTotalTheTablesItCounted(t *testing.T) {
	ctx := context.Background()
	pool, err := newPool(ctx, ownDatabaseURL(t, "status_", ""), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := pgx.Identifier{devstack.TenantProduction}.Sanitize()
	for _, sql := range []string{"CREATE SCHEMA " + schema,
		"CREATE TABLE " + schema + ".artist_followers AS SELECT 1 AS x", "CREATE TABLE " + schema + ".user_follows AS SELECT 1 AS x"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if line := firstStatusLine(t, pool); !strings.Contains(line, "not counted, counting artist_ratings failed (") || strings.Contains(line, ": 2 (") {
		t.Errorf("status line with artist_ratings not counted: %q", line)
	}
}

// firstStatusLine returns the first line printStatus prints for the
// example definitions' tables in pool's database (an empty dead-letter
// topic of a fake broker).
func firstStatusLine(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	b := kafkatest.Fake(t)
	defs, err := projection.LoadDefinitions(exampleProjections)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, w := io.Pipe()
	go func() {
		printStatus(ctx, w, pool, b.Opts(), "dlq", defs, slog.New(slog.DiscardHandler))
		w.Close()
	}()
	line, err := bufio.NewReader(r).ReadString('\n')
	cancel()
	go func() { _, _ = io.Copy(io.Discard, r) }()
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// TestDevRunsDefinitionsOfTheUsersOwn: make run ARGS='--projections F'
// with definitions other than the examples' migrates and applies F's
// projections with every column (second trial: F's own artist_followers
// lost followed_at in staging), does not say what the example events show
// (that holds with the examples' only), and counts F's tables (new-user
// trial: dev stopped on 42P01, at the staging example's table F did not
// have).
func TestDevRunsDefinitionsOfTheUsersOwn(t *testing.T) {
	clearSettingsEnv(t)
	defs := writeFile(t, "own.yaml", `irVersion: v42
projections:
  - name: follows
    table: artist_followers
    primaryKey: [user_id, artist_id]
    columns:
      user_id:     { type: text, from: payload.user_id }
      artist_id:   { type: text, from: payload.artist_id }
      followed_at: { type: timestamptz, from: ts }
    events:
      ARTIST_FOLLOWED: upsert
`)
	db := pgtest.StartOwn(t)
	// The examples' ARTIST_FOLLOWED events of the production tenant:
	// 4 follows (the unfollow is not F's, and F has no derive to fail).
	stdout := devUntilPrinted(t, "projected rows in acme_concertapp_production: 4 (artist_followers=4)",
		"--database-url", db.URL(), "--projections", defs, "--retry-initial", "5ms", "--retry-max-interval", "20ms")
	// The ready line the README gives for definitions of one's own.
	if ready := fmt.Sprintf("dev: produced the %d example events", len(devstack.Examples(time.Now()))); !strings.Contains(stdout, ready) {
		t.Errorf("stdout has no %q (README, make run):\n%s", ready, stdout)
	}
	if !strings.Contains(stdout, "yours applies what it handles of them") || !strings.Contains(stdout, `-c 'table "acme_concertapp_production"."artist_followers"'`) {
		t.Errorf("stdout does not say that F applies what it handles, or its psql hint does not name F's table:\n%s", stdout)
	}
	if strings.Contains(stdout, "the example event (docs/events.md): projected") {
		t.Errorf("stdout says what the example events show with the example definitions:\n%s", stdout)
	}
	pool, err := pgxpool.New(context.Background(), db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = 'acme_concertapp_staging' AND table_name = 'artist_followers' AND column_name = 'followed_at'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("staging's artist_followers of F has followed_at %d times (%v), want once: dev dropped a column of the user's own", n, err)
	}
}

// devUntilPrinted runs dev with args (and any free Kafka port, no HTTP)
// until it prints want, then stops it as Ctrl-C does, and returns what it
// printed. It fails the test when dev exits before or does not exit 0.
func devUntilPrinted(t *testing.T, want string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"dev", "--kafka-port", "-1", "--http-addr", ""}, args...), &stdout, &stderr)
	}()
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(stdout.String(), want) {
		select {
		case code := <-done:
			t.Fatalf("dev exited early with %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev never printed %q\nstdout:\n%s\nstderr:\n%s", want, stdout.String(), stderr.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("dev exited with %d after Ctrl-C\nstderr:\n%s", code, stderr.String())
	}
	return stdout.String()
}
