package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestMain closes the PostgreSQL server shared by the package's tests
// (pgtest.URL, pgtest.Pool) when they end.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// exampleProjections is the README's example definitions file, relative to
// this package's directory (where go test runs).
const exampleProjections = "../../examples/projections.yaml"

// settingsEnv are the environment variables the commands read. Tests of the
// command-line contract clear them, so that a developer's or CI's
// environment (DATABASE_URL, KAFKA_BROKERS) cannot fill a missing flag.
var settingsEnv = []string{
	"KAFKA_BROKERS", "KAFKA_TLS", "KAFKA_TLS_CA", "KAFKA_TLS_SERVER_NAME",
	"KAFKA_SASL_MECHANISM", "KAFKA_SASL_USER", "KAFKA_SASL_PASSWORD",
	"DATABASE_URL", "PROJECTIONS_FILE", "EVENTS_TOPIC", "DLQ_TOPIC", "LEDGER_TOPIC",
	"EVENTS_PARTITIONS", "LOG_FORMAT", "LOG_LEVEL", "CONSUMER_GROUP", "MAX_RETRIES",
	"RETRY_INITIAL", "RETRY_MAX_INTERVAL", "ON_INFRA_ERROR", "SHUTDOWN_GRACE",
	"HTTP_ADDR", "POD_NAME", "DLQ_MAX_BYTES", "DLQ_WRITE_TIMEOUT", "CREATE_TOPICS", "MAX_POLL_RECORDS",
	"MAX_BATCH_RECORDS", "TENANT_SCHEMAS", "TENANT_SCHEMA_PATTERN", "METRICS_MAX_TENANTS",
	"GROUP_INSTANCE_ID", "SESSION_TIMEOUT", "KAFKA_START_TIMEOUT",
}

// clearSettingsEnv unsets (sets to "", which flagenv ignores) every
// variable of settingsEnv for the rest of t.
func clearSettingsEnv(t *testing.T) {
	t.Helper()
	for _, k := range settingsEnv {
		t.Setenv(k, "")
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a running
// worker (its logger) and the test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// result is what one in-process run of the command printed and returned.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %s\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// runCmd runs the command in-process, as main does, bounded by timeout.
func runCmd(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr syncBuffer
	start := time.Now()
	code := run(ctx, args, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
}

// closedAddr returns a 127.0.0.1 address nothing listens on: a connection
// to it is refused at once.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// refusingAddr returns a 127.0.0.1 address that refuses connections for
// the rest of the test: a TCP socket bound to it and never listening, so
// that no other test's listener takes the port meanwhile, as one took a
// closedAddr's (CI: the database "unreachable at start" test got a timeout
// from another test's server where it wanted connection refused).
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// writeFile writes content to name in a fresh temporary directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// badPrimaryKey is a definitions file whose primary key names a column the
// projection does not define.
const badPrimaryKey = `irVersion: v1
projections:
  - name: artist_followers
    table: artist_followers
    primaryKey: [artist_id, no_such_column]
    columns:
      artist_id: { type: text, from: payload.artist_id }
    events:
      ARTIST_FOLLOWED: upsert
`

// TestCommandLineContract covers the contract other tools rely on (issue 2):
// exit status 0 on success, 1 on a runtime failure, 2 on a usage error with
// a message that says what to set. None of these cases reaches Kafka or
// PostgreSQL: the addresses they are given refuse connections.
func TestCommandLineContract(t *testing.T) {
	clearSettingsEnv(t)
	noKafka := closedAddr(t)
	noDB := "postgres://postgres:postgres@" + closedAddr(t) + "/postgres?sslmode=disable"
	badDefs := writeFile(t, "projections.yaml", badPrimaryKey)
	// runArgs are the settings `run` requires, pointing nowhere.
	runArgs := func(extra ...string) []string {
		return append([]string{"run", "--brokers", noKafka, "--database-url", noDB,
			"--projections", exampleProjections, "--http-addr", ""}, extra...)
	}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string // each must appear in stdout
		wantStderr []string // each must appear in stderr
	}{
		{name: "no arguments", args: nil, wantCode: 2, wantStderr: []string{"Commands:", "run", "migrate", "topics", "validate", "version"}},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantStderr: []string{`unknown command "frobnicate"`, "Commands:"}},
		{name: "misspelt command", args: []string{"rnu"}, wantCode: 2, wantStderr: []string{`unknown command "rnu" (did you mean run?)`, "Commands:"}},
		{name: "flag before the command", args: []string{"--max-retries", "3", "run"}, wantCode: 2, wantStderr: []string{`unknown command "--max-retries": the command comes first, then its flags (projection-worker run --max-retries ...)`}},
		{name: "misspelt flag", args: runArgs("--max-retires", "3"), wantCode: 2, wantStderr: []string{"unknown flag --max-retires (did you mean --max-retries?)"}},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: []string{"Commands:"}},
		{name: "run -h", args: []string{"run", "-h"}, wantCode: 0, wantStderr: []string{"-database-url", "DATABASE_URL", "-on-infra-error"}},
		{name: "run unknown flag", args: runArgs("--frobnicate"), wantCode: 2, wantStderr: []string{"unknown flag --frobnicate (projection-worker run -h lists the flags)"}},
		{name: "migrate unknown flag", args: []string{"migrate", "--frobnicate"}, wantCode: 2, wantStderr: []string{"-frobnicate"}},
		{name: "migrate grant given twice", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "t", "--grant", "a", "--grant", "b"},
			wantCode: 2, wantStderr: []string{"--grant is given 2 times"}},
		// Fresh-user trial: a second --database-url or --projections was
		// taken without a word.
		{name: "migrate database url given twice", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "t", "--tenant-schema", "u", "--database-url", noDB},
			wantCode: 2, wantStderr: []string{"--database-url is given 2 times"}},
		{name: "topics partitions given twice", args: []string{"topics", "--brokers", noKafka, "--partitions", "3", "--partitions", "12"},
			wantCode: 2, wantStderr: []string{"--partitions is given 2 times"}},
		{name: "topics unknown flag", args: []string{"topics", "--frobnicate"}, wantCode: 2, wantStderr: []string{"-frobnicate"}},
		{name: "validate unknown flag", args: []string{"validate", "--frobnicate"}, wantCode: 2, wantStderr: []string{"-frobnicate"}},
		{name: "run positional argument", args: runArgs("extra"), wantCode: 2, wantStderr: []string{`unexpected argument "extra"`}},
		// Security trial: the URL was printed as an unexpected argument.
		{name: "run flag without its value before a secret", args: []string{"run", "--projections", exampleProjections, "--group", "--database-url", "postgres://u:S3cretPw@h/db"},
			wantCode: 2, wantStderr: []string{"--group needs a value, and was given the flag --database-url as one"}},
		{name: "run without database url", args: []string{"run", "--brokers", noKafka, "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"--database-url", "DATABASE_URL"}},
		{name: "run without projections", args: []string{"run", "--brokers", noKafka, "--database-url", noDB},
			wantCode: 2, wantStderr: []string{"--projections", "PROJECTIONS_FILE"}},
		// With --create-topics=false nothing is asked of Kafka before the
		// worker's configuration is checked; see
		// TestRunRejectsBadSettingsBeforeConnecting for the default.
		{name: "run on-infra-error maybe", args: runArgs("--on-infra-error=maybe", "--create-topics=false"),
			wantCode: 2, wantStderr: []string{"on-infra-error", `"maybe"`}},
		{name: "run max-retries -1", args: runArgs("--max-retries", "-1"), wantCode: 2, wantStderr: []string{"--max-retries", "-1"}},
		{name: "run database url garbage", args: []string{"run", "--brokers", noKafka, "--database-url", "garbage", "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"DATABASE_URL"}},
		{name: "run database url of another database", args: []string{"run", "--brokers", noKafka, "--database-url", "mysql://u:p@h/db", "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"DATABASE_URL", `scheme "mysql" is not PostgreSQL's`}},
		// White space around the string is ignored (fresh-user trial: a
		// leading space made the URL read as key=value).
		{name: "run database url with white space around", args: []string{"run", "--brokers", noKafka, "--database-url", " mysql://u:p@h/db\n", "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"DATABASE_URL", `scheme "mysql" is not PostgreSQL's`}},
		{name: "run database url password redacted", args: []string{"run", "--brokers", noKafka, "--database-url", "postgres://u:s3cretpw@h:notaport/db", "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"DATABASE_URL", "invalid port"}},
		{name: "run brokers without port", args: runArgs("--brokers", "nohostport"), wantCode: 2, wantStderr: []string{"--brokers", `"nohostport" is not host:port (it has no port)`}},
		{name: "run broker port out of range", args: runArgs("--brokers", "127.0.0.1:9092,127.0.0.1:99999"), wantCode: 2, wantStderr: []string{"--brokers", `"127.0.0.1:99999": the port must be a number from 1 to 65535`}},
		{name: "run database wait below its floor", args: runArgs("--database-wait-max-interval", "0s"), wantCode: 2, wantStderr: []string{"--database-wait-max-interval", "DATABASE_WAIT_MAX_INTERVAL", "must be at least 100ms"}},
		{name: "run http addr port out of range", args: runArgs("--http-addr", "127.0.0.1:99999"), wantCode: 2, wantStderr: []string{"--http-addr", "HTTP_ADDR", "invalid port"}},
		{name: "run broker port not a number", args: runArgs("--brokers", "kafka:http"), wantCode: 2, wantStderr: []string{"--brokers", `entry 1 ("kafka:…"): the port must be a number from 1 to 65535`}},
		{name: "run projections file missing", args: runArgs("--projections", "/nonexistent/projections.yaml"),
			wantCode: 2, wantStderr: []string{"/nonexistent/projections.yaml", "no such file"}},
		{name: "validate example", args: []string{"validate", "--projections", exampleProjections},
			wantCode: 0, wantStdout: []string{exampleProjections, "IR v42", "3 projections: ok"}},
		{name: "validate without projections", args: []string{"validate"}, wantCode: 2, wantStderr: []string{"--projections", "PROJECTIONS_FILE"}},
		// Not the last file alone, its ok read as both's (new-user trial).
		{name: "validate two files", args: []string{"validate", "--projections", badDefs, "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"--projections given 2 times: validate checks one definitions file; run it once for each"}},
		{name: "validate unknown primary key column", args: []string{"validate", "--projections", badDefs},
			wantCode: 2, wantStderr: []string{badDefs, `projection "artist_followers"`, "primaryKey", `"no_such_column"`}},
		{name: "validate missing file", args: []string{"validate", "--projections", "/nonexistent/projections.yaml"},
			wantCode: 2, wantStderr: []string{"/nonexistent/projections.yaml", "no such file"}},
		{name: "run duration without unit", args: runArgs("--retry-initial", "5"),
			wantCode: 2, wantStderr: []string{`--retry-initial (RETRY_INITIAL) "5": a duration needs a unit, e.g. 5s or 5ms`}},
		{name: "run bool with a separate value", args: runArgs("--create-topics", "maybe"),
			wantCode: 2, wantStderr: []string{`unexpected argument "maybe" after --create-topics: a bool flag takes its value after =, e.g. --create-topics=false`}},
		{name: "run bool not a bool", args: runArgs("--create-topics=maybe"),
			wantCode: 2, wantStderr: []string{`--create-topics (CREATE_TOPICS) "maybe": not true or false`}},
		{name: "migrate bad tenant schema", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", `bad"name`},
			wantCode: 2, wantStderr: []string{"--tenant-schema", `bad\"name`, "^[a-z_][a-z0-9_]{0,62}$"}},
		{name: "migrate public", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "public"},
			wantCode: 2, wantStderr: []string{"--tenant-schema", `"public"`, "not one of PostgreSQL's own schemas"}},
		{name: "migrate pg_catalog", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "t1", "--tenant-schema", "pg_catalog"},
			wantCode: 2, wantStderr: []string{"--tenant-schema", `"pg_catalog"`}},
		{name: "migrate tenant outside the pattern", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections,
			"--tenant-schema-pattern", "acme_[a-z0-9_]+", "--tenant-schema", "acme_prod", "--tenant-schema", "t1"},
			wantCode: 2, wantStderr: []string{"--tenant-schema", `"t1"`, "acme_[a-z0-9_]+", "(--tenant-schema-pattern, TENANT_SCHEMA_PATTERN)"}},
		{name: "migrate pattern that does not compile", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections,
			"--tenant-schema-pattern", "acme_(", "--tenant-schema", "acme_prod"},
			wantCode: 2, wantStderr: []string{"--tenant-schema-pattern", "acme_("}},
		{name: "run pattern that does not compile", args: runArgs("--tenant-schema-pattern", "[z-a]", "--create-topics=false"),
			wantCode: 2, wantStderr: []string{"--tenant-schema-pattern", "[z-a]"}},
		{name: "run pattern that matches no tenant schema", args: runArgs("--tenant-schema-pattern", "pg_.*", "--create-topics=false"),
			wantCode: 2, wantStderr: []string{"--tenant-schema-pattern (TENANT_SCHEMA_PATTERN)", "matches no valid tenant schema", `starts with "pg_"`}},
		{name: "migrate pattern that matches no tenant schema", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections,
			"--tenant-schema-pattern", "public", "--tenant-schema", "acme_prod"},
			wantCode: 2, wantStderr: []string{"--tenant-schema-pattern", `the only name it matches is "public"`}},
		{name: "migrate without tenant schema", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections},
			wantCode: 2, wantStderr: []string{"--tenant-schema (TENANT_SCHEMAS) is required"}},
		// new-user trial: the flag takes one tenant schema, not a list.
		{name: "migrate a comma-separated --tenant-schema", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "t1,t2"},
			wantCode: 2, wantStderr: []string{"--tenant-schema", `"t1,t2"`, "repeat the flag for several"}},
		{name: "migrate without database url", args: []string{"migrate", "--projections", exampleProjections, "--tenant-schema", "t1"},
			wantCode: 2, wantStderr: []string{"DATABASE_URL"}},
		// White space only, as a Secret's lone newline (fresh-user trial:
		// taken, and pgx connected to its defaults).
		{name: "migrate with a database url of white space", args: []string{"migrate", "--database-url", " \n", "--projections", exampleProjections, "--tenant-schema", "t1"},
			wantCode: 2, wantStderr: []string{"--database-url (DATABASE_URL) is required"}},
		{name: "run with a database url of white space", args: []string{"run", "--database-url", "\n", "--projections", exampleProjections, "--create-topics=false"},
			wantCode: 2, wantStderr: []string{"--database-url (DATABASE_URL) is required"}},
		{name: "topics brokers without port", args: []string{"topics", "--brokers", "nohostport"}, wantCode: 2, wantStderr: []string{"--brokers (KAFKA_BROKERS)"}},
		{name: "version", args: []string{"version"}, wantCode: 0},
		{name: "migrate bad log level", args: []string{"migrate", "--log-level", "verbose"}, wantCode: 2, wantStderr: []string{"--log-level (LOG_LEVEL)", `"verbose"`}},
		{name: "topics bad log format", args: []string{"topics", "--log-format", "xml"}, wantCode: 2, wantStderr: []string{"--log-format"}},
		{name: "version with arguments", args: []string{"version", "extra", "--json"}, wantCode: 2, wantStderr: []string{"version takes no arguments", `"extra"`}},
		{name: "help with arguments", args: []string{"help", "run"}, wantCode: 2, wantStderr: []string{"help takes no arguments"}},
		// -h after version or help asks for help, exit 0 (docs trial:
		// `version -h` was refused, exit 2).
		{name: "version -h", args: []string{"version", "-h"}, wantCode: 0, wantStdout: []string{"Commands:"}},
		{name: "help --help", args: []string{"help", "--help"}, wantCode: 0, wantStdout: []string{"Commands:"}},
		{name: "version -h extra", args: []string{"version", "-h", "x"}, wantCode: 2, wantStderr: []string{"version takes no arguments"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, 30*time.Second, tt.args...)
			if r.code != tt.wantCode {
				t.Errorf("run(%q) = %d, want %d\n%s", tt.args, r.code, tt.wantCode, r)
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("stdout lacks %q\n%s", w, r)
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q\n%s", w, r)
				}
			}
			if r.stdout == "" && r.stderr == "" {
				t.Errorf("run(%q) printed nothing\n%s", tt.args, r)
			}
			if r.took > 10*time.Second {
				t.Errorf("run(%q) took %s: a usage error must not wait for a service", tt.args, r.took)
			}
		})
	}
}

// TestExitStatusIsOneRuleForEveryCommand (issue 12): every command exits 2
// when its command line, environment or definitions file is wrong, found
// before it connects to anything, and 1 when it fails while working. `run`
// failing while working is TestRunHTTPAddrInUseExitsOne; `dev` is
// TestDevExitStatusFollowsTheRule (a -tags dev build).
func TestExitStatusIsOneRuleForEveryCommand(t *testing.T) {
	clearSettingsEnv(t)
	noKafka := closedAddr(t)
	noDB := "postgres://postgres:postgres@" + closedAddr(t) + "/postgres?sslmode=disable"
	badDefs := writeFile(t, "projections.yaml", badPrimaryKey)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{name: "run bad definitions", args: []string{"run", "--brokers", noKafka, "--database-url", noDB, "--projections", badDefs, "--http-addr", ""},
			wantCode: 2, wantStderr: "--projections (PROJECTIONS_FILE): " + badDefs},
		{name: "run bad flag value", args: []string{"run", "--brokers", noKafka, "--database-url", noDB, "--projections", exampleProjections, "--shutdown-grace", "25"},
			wantCode: 2, wantStderr: `--shutdown-grace (SHUTDOWN_GRACE) "25": a duration needs a unit`},
		{name: "migrate bad definitions", args: []string{"migrate", "--database-url", noDB, "--projections", badDefs, "--tenant-schema", "t1"},
			wantCode: 2, wantStderr: "--projections (PROJECTIONS_FILE): " + badDefs},
		// Named as run names it (fresh-user trial: the driver's error alone).
		{name: "migrate database unreachable", args: []string{"migrate", "--database-url", noDB, "--projections", exampleProjections, "--tenant-schema", "t1"},
			wantCode: 1, wantStderr: "the database does not answer: check --database-url (DATABASE_URL)"},
		{name: "validate bad definitions", args: []string{"validate", "--projections", badDefs},
			wantCode: 2, wantStderr: "--projections (PROJECTIONS_FILE): " + badDefs},
		{name: "topics bad flag value", args: []string{"topics", "--brokers", noKafka, "--partitions", "eight"},
			wantCode: 2, wantStderr: `--partitions (EVENTS_PARTITIONS) "eight": not an integer`},
		// Nothing answers at noKafka: the command fails while working when
		// its context ends (here after 3s; its own limit is 30s).
		{name: "topics kafka unreachable", args: []string{"topics", "--brokers", noKafka},
			wantCode: 1, wantStderr: "topics:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, 3*time.Second, tt.args...)
			if r.code != tt.wantCode || !strings.Contains(r.stderr, tt.wantStderr) {
				t.Errorf("run(%q) = %d, want %d with %q on stderr\n%s", tt.args, r.code, tt.wantCode, tt.wantStderr, r)
			}
		})
	}
}

// TestVersionPrintsOneLine: `version` prints the build version, one
// non-empty line.
func TestVersionPrintsOneLine(t *testing.T) {
	r := runCmd(t, 10*time.Second, "version")
	if r.code != 0 {
		t.Fatalf("version: %s", r)
	}
	if lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n"); len(lines) != 1 || strings.TrimSpace(lines[0]) == "" {
		t.Errorf("version printed %q, want one non-empty line", r.stdout)
	}
}

// TestRunNamesTheEnvironmentVariableOfABadSetting (new-user trial): a
// setting out of range given by its environment variable (as the
// Kubernetes ConfigMap gives every setting) is refused with a message
// naming the variable as well as the flag, as a parse error does.
func TestRunNamesTheEnvironmentVariableOfABadSetting(t *testing.T) {
	clearSettingsEnv(t)
	noKafka := closedAddr(t)
	noDB := "postgres://postgres:postgres@" + closedAddr(t) + "/postgres?sslmode=disable"
	var s settings
	env := runFlags(&s, io.Discard).Env()
	for _, tt := range []struct{ flag, value string }{
		{"max-batch-records", "0"}, {"max-poll-records", "0"}, {"copy-min-rows", "0"}, {"partitions", "0"},
		{"shutdown-grace", "0s"}, {"breaker-threshold", "0"}, {"dlq-write-timeout", "0s"},
		{"metrics-max-tenants", "-1"}, {"trace-queue-size", "0"}, {"failure-log-interval", "0s"},
		{"kafka-start-timeout", "-1s"}, {"max-retrying", "0"},
	} {
		t.Run(tt.flag, func(t *testing.T) {
			name := env[tt.flag]
			if name == "" {
				t.Fatalf("--%s has no environment variable", tt.flag)
			}
			t.Setenv(name, tt.value)
			r := runCmd(t, 30*time.Second, "run", "--brokers", noKafka, "--database-url", noDB,
				"--projections", exampleProjections, "--http-addr", "")
			if want := "--" + tt.flag + " (" + name + ")"; r.code != 2 || !strings.Contains(r.stderr, want) {
				t.Errorf("%s=%s: exit %d, want 2 and a message naming %s\n%s", name, tt.value, r.code, want, r)
			}
		})
	}
}

// TestRunRejectsBadSettingsBeforeConnecting: a setting that can be checked
// without a service must be refused (exit 2, naming the flag) before the
// worker dials Kafka, and so before it creates any topic. Kafka and
// PostgreSQL are given as addresses that refuse connections, so a command
// that connects first exits 1 with a dial error instead.
func TestRunRejectsBadSettingsBeforeConnecting(t *testing.T) {
	clearSettingsEnv(t)
	noKafka := closedAddr(t)
	noDB := "postgres://postgres:postgres@" + closedAddr(t) + "/postgres?sslmode=disable"
	tests := []struct {
		flag  string   // the flag (or environment variable) that is wrong
		args  []string // added to a run command that is otherwise valid
		env   []string // environment variables set, name then value
		says  string   // when set, stderr must say this too (the limit)
		hides string   // when set, stderr must not say this (a secret)
	}{
		{flag: "--max-retries", args: []string{"--max-retries", "-1"}},
		{flag: "--retry-initial", args: []string{"--retry-initial", "0s"}, says: "at least 1ms"}, // trial: said "> 0"
		{flag: "--dlq-max-bytes", args: []string{"--dlq-max-bytes", "10"}},
		{flag: "--dlq-max-bytes", args: []string{"--dlq-max-bytes", "4095"}, says: "4096..1073741824"},
		{flag: "--partitions", args: []string{"--partitions", "0"}},
		{flag: "--log-level", args: []string{"--log-level", "loud"}},
		{flag: "--log-format", args: []string{"--log-format", "xml"}},
		{flag: "--brokers", args: []string{"--brokers", "nohostport"}},
		{flag: "--kafka-sasl-mechanism", args: []string{"--kafka-sasl-mechanism", "gssapi"}},
		{flag: "--on-infra-error", args: []string{"--on-infra-error", "maybe"}},
		{flag: "--max-poll-records", args: []string{"--max-poll-records", "-1"}},
		{flag: "--max-batch-records", args: []string{"--max-batch-records", "-1"}},
		{flag: "--shutdown-grace", args: []string{"--shutdown-grace", "-1s"}},
		{flag: "--topic", args: []string{"--topic", "bad name"}},
		{flag: "--group", args: []string{"--group", ""}},
		{flag: "--http-addr", args: []string{"--http-addr", "nonsense"}},
		{flag: "--projections", args: []string{"--projections", "/nonexistent/defs.yaml"}},
		{flag: "--max-queued-bytes", args: []string{"--max-queued-bytes", "0"}},
		{flag: "--fetch-max-bytes", args: []string{"--fetch-max-bytes", "0"}},
		{flag: "--fetch-max-bytes", args: []string{"--fetch-max-bytes", "2147483648"}},
		{flag: "--fetch-max-partition-bytes", args: []string{"--fetch-max-partition-bytes", "-1"}},
		{flag: "--fetch-max-partition-bytes", args: []string{"--fetch-max-partition-bytes", "1073741825"}},
		{flag: "--dlq-write-timeout", args: []string{"--dlq-write-timeout", "0s"}},
		{flag: "--max-retrying", args: []string{"--max-retrying", "0"}},
		{flag: "--max-retrying-bytes", args: []string{"--max-retrying-bytes", "-5"}},
		{flag: "--breaker-threshold", args: []string{"--breaker-threshold", "0"}},
		{flag: "--breaker-window", args: []string{"--breaker-window", "0s"}},
		{flag: "--tenant-schema-pattern", args: []string{"--tenant-schema-pattern", "("}},
		{flag: "--copy-min-rows", args: []string{"--copy-min-rows", "-2"}},
		{flag: "--copy-min-rows", args: []string{"--copy-min-rows", "0"}},
		{flag: "--worker-id", args: []string{"--worker-id", ""}},
		{flag: "--dlq-max-bytes", args: []string{"--dlq-max-bytes", "4294967296"}},
		{flag: "--breaker-threshold", args: []string{"--breaker-threshold", "-2"}},
		{flag: "--breaker-probe-interval", args: []string{"--breaker-probe-interval", "-1s"}},
		{flag: "--retry-max-interval", args: []string{"--retry-max-interval", "1ms"}},
		{flag: "--retry-initial", args: []string{"--retry-initial", "5"}},
		{flag: "--retry-initial", args: []string{"--retry-initial", "1h"}}, // above the default maximum (trial: blamed --retry-max-interval)
		{flag: "RETRY_INITIAL", env: []string{"RETRY_INITIAL", "1h"}},
		{flag: "--retry-max-interval", args: []string{"--retry-max-interval", "25h"}},     // jitter overflowed a wait far beyond it
		{flag: "--trace-queue-size", args: []string{"--trace-queue-size", "99999999999"}}, // trial: out of memory at start
		// Durations accepted down to 1ns before (new-user trial): below
		// their floors the flags do not do what they say.
		{flag: "--retry-initial", args: []string{"--retry-initial", "1ns"}},
		{flag: "--retry-initial", args: []string{"--retry-initial", "999us"}},
		{flag: "--dlq-write-timeout", args: []string{"--dlq-write-timeout", "1ns"}},
		{flag: "DLQ_WRITE_TIMEOUT", env: []string{"DLQ_WRITE_TIMEOUT", "99ms"}},
		{flag: "--shutdown-grace", args: []string{"--shutdown-grace", "1ns"}},
		{flag: "--shutdown-grace", args: []string{"--shutdown-grace", "999ms"}},
		{flag: "--breaker-window", args: []string{"--breaker-window", "1ns"}},
		{flag: "--breaker-probe-interval", args: []string{"--breaker-probe-interval", "1ns"}},
		// Second trial: 1ns kept a core busy while the database was down.
		{flag: "--database-wait-max-interval", args: []string{"--database-wait-max-interval", "1ns"}, says: "at least 100ms"},
		{flag: "DATABASE_WAIT_MAX_INTERVAL", env: []string{"DATABASE_WAIT_MAX_INTERVAL", "99ms"}},
		{flag: "--create-topics", args: []string{"--create-topics", "maybe"}},
		{flag: "--max-poll-records", args: []string{"--max-poll-records", "ten"}},
		{flag: "--metrics-max-tenants", args: []string{"--metrics-max-tenants", "-1"}},
		{flag: "--kafka-start-timeout", args: []string{"--kafka-start-timeout", "-1s"}},
		{flag: "--session-timeout", args: []string{"--session-timeout", "5s"}},
		{flag: "--session-timeout", args: []string{"--session-timeout", "31m"}},
		{flag: "--session-timeout", args: []string{"--session-timeout", "45"}},
		{flag: "SESSION_TIMEOUT", env: []string{"SESSION_TIMEOUT", "1s"}},
		{flag: "--group-instance-id", args: []string{"--group-instance-id", "pod/0"}},
		{flag: "--group-instance-id", args: []string{"--group-instance-id", ".."}},
		{flag: "--group-instance-id", args: []string{"--group-instance-id", strings.Repeat("p", 250)}},
		{flag: "GROUP_INSTANCE_ID", env: []string{"GROUP_INSTANCE_ID", "worker 0"}},
		// OpenTelemetry's variables, which the SDK would only log about and
		// ignore (an invalid sampler traces every span).
		{flag: "LOG_LEVEL", env: []string{"LOG_LEVEL", "chatty"}},
		{flag: "LOG_FORMAT", env: []string{"LOG_FORMAT", "xml"}},
		{flag: "RETRY_MAX_INTERVAL", env: []string{"RETRY_MAX_INTERVAL", "1ms"}},
		{flag: "OTEL_TRACES_SAMPLER", env: []string{"OTEL_TRACES_SAMPLER", "bogus"}},
		{flag: "OTEL_TRACES_SAMPLER_ARG", env: []string{"OTEL_TRACES_SAMPLER", "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG", "abc"}},
		{flag: "OTEL_TRACES_SAMPLER_ARG", env: []string{"OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "5"}},
		{flag: "OTEL_TRACES_SAMPLER_ARG", env: []string{"OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "-1"}},
		{flag: "OTEL_TRACES_SAMPLER_ARG", env: []string{"OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "NaN"}}, // tracing trial: sampled everything
		{flag: "OTEL_RESOURCE_ATTRIBUTES", env: []string{"OTEL_RESOURCE_ATTRIBUTES", "garbage"}},
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "not a url"}},
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x:99"}},
		{flag: "OTEL_EXPORTER_OTLP_PROTOCOL", env: []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}},
		{flag: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon"}},
		// Tracing trial: a header written with a colon was logged, token
		// and all, and dropped; a bad escape likewise.
		{flag: "OTEL_EXPORTER_OTLP_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer SECRETOTLPTOKEN123"}, says: "header 1 of 1", hides: "SECRETOTLPTOKEN123"},
		{flag: "OTEL_EXPORTER_OTLP_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_HEADERS", "x-team=a,Authorization: Bearer x=SECRETOTLPTOKEN123"}, says: "header 2 of 2", hides: "SECRETOTLPTOKEN123"},
		{flag: "OTEL_EXPORTER_OTLP_TRACES_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "Authorization=Bearer SECRET%zzTOKEN"}, says: "Authorization", hides: "SECRET"},
		{flag: "OTEL_EXPORTER_OTLP_METRICS_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_METRICS_HEADERS", "=SECRETOTLPTOKEN123"}, hides: "SECRETOTLPTOKEN123"},
		// Tracing trial: started, and exported the value undecoded.
		{flag: "OTEL_RESOURCE_ATTRIBUTES", env: []string{"OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=a%zz"}, says: "team"},
		// Tracing trial: a signal's endpoint is used as given, so every
		// span went to the path /.
		{flag: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel-collector:4318"}, says: "/v1/traces"},
		{flag: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://otel-collector:4318/"}, says: "/v1/metrics"},
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://user:SECRETPW@x:99"}, hides: "SECRETPW"},
		// Fresh-user trial: the query's token printed twice, the path
		// suggested after it; a query the exporter drops.
		{flag: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel:4318?token=QueryTok5"}, says: "drops a URL's query", hides: "QueryTok5"},
		{flag: "OTEL_RESOURCE_ATTRIBUTES", env: []string{"OTEL_RESOURCE_ATTRIBUTES", "team=a,secret:ResSecret1"}, says: "pair 2 of 2", hides: "ResSecret1"},
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/?api_key=QueryTok6"}, says: "drops a URL's query", hides: "QueryTok6"},
		// Second fresh-user trial: each started, and the setting failed or
		// was left out at run time.
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://USERSECRET:PW7@otel:4318"}, says: "sends no user or password", hides: "USERSECRET"},
		{flag: "OTEL_EXPORTER_OTLP_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20TOK8%0d%0aX-Evil=1"}, says: "control character", hides: "TOK8"},
		{flag: "OTEL_METRIC_EXPORT_INTERVAL", env: []string{"OTEL_METRIC_EXPORT_INTERVAL", "0"}, says: "above 0"},
		{flag: "OTEL_BSP_SCHEDULE_DELAY", env: []string{"OTEL_BSP_SCHEDULE_DELAY", " 500"}},
		{flag: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:99999"}, says: "not a TCP port"},
		{flag: "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", env: []string{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "abc"}, says: "below 0: no limit"},
		// Tracing trial: logged at ERROR and ignored by the SDK.
		{flag: "OTEL_EXPORTER_OTLP_TIMEOUT", env: []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "abc"}},
		{flag: "OTEL_METRIC_EXPORT_INTERVAL", env: []string{"OTEL_METRIC_EXPORT_INTERVAL", "5s"}, says: "milliseconds"},
		{flag: "OTEL_SPAN_LINK_COUNT_LIMIT", env: []string{"OTEL_SPAN_LINK_COUNT_LIMIT", "abc"}},
		{flag: "OTEL_EXPORTER_OTLP_COMPRESSION", env: []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"}, says: "gzip"},
		{flag: "OTEL_EXPORTER_OTLP_CERTIFICATE", env: []string{"OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"}, says: "no such file"},
	}
	for _, tt := range tests {
		name := strings.TrimPrefix(tt.flag, "--")
		if len(tt.args) > 0 {
			name += " " + tt.args[len(tt.args)-1]
		} else {
			name += " " + tt.env[len(tt.env)-1]
		}
		t.Run(name, func(t *testing.T) {
			for i := 0; i < len(tt.env); i += 2 {
				t.Setenv(tt.env[i], tt.env[i+1])
			}
			args := append([]string{"run", "--brokers", noKafka, "--database-url", noDB,
				"--projections", exampleProjections, "--http-addr", ""}, tt.args...)
			r := runCmd(t, 30*time.Second, args...)
			if r.code != 2 {
				t.Errorf("run %q = %d, want 2\n%s", tt.args, r.code, r)
			}
			if !strings.Contains(r.stderr, tt.flag) {
				t.Errorf("stderr does not name %s\n%s", tt.flag, r)
			}
			if !strings.Contains(r.stderr, tt.says) {
				t.Errorf("stderr does not say %q\n%s", tt.says, r)
			}
			if tt.hides != "" && strings.Contains(r.stdout+r.stderr, tt.hides) {
				t.Errorf("the output says %q, a secret\n%s", tt.hides, r)
			}
			// The retry flags are checked together: the message names the one at fault.
			for _, other := range []string{"--max-retries", "--retry-initial", "--retry-max-interval"} {
				if strings.HasPrefix(tt.flag, "--") && other != tt.flag && strings.Contains(r.stderr, other) {
					t.Errorf("stderr names %s too, want %s alone\n%s", other, tt.flag, r)
				}
			}
			if strings.Contains(r.stderr, "dial") {
				t.Errorf("the worker dialled a service before refusing %s\n%s", tt.flag, r)
			}
		})
	}
}

// TestTopicsCreatesDeadLetterTopicLikeTheEventsTopic: `topics` creates the
// events, dead-letter and ledger topics; the dead-letter topic keeps at
// least 30 days (retention.ms >= 2592000000, SPEC §2) and has the events
// topic's partition count, whether topics creates the events topic or finds
// it. A second run changes nothing.
func TestTopicsCreatesDeadLetterTopicLikeTheEventsTopic(t *testing.T) {
	tests := []struct {
		name           string
		existingEvents int32 // partitions of an events topic made beforehand; 0: none
		partitionsFlag string
		wantPartitions int
	}{
		{name: "creates the events topic", partitionsFlag: "3", wantPartitions: 3},
		{name: "finds the events topic", existingEvents: 5, partitionsFlag: "2", wantPartitions: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.New(t)
			events := kafkatest.TopicName(t, "events")
			dlqTopic := kafkatest.TopicName(t, "dlq")
			ledger := kafkatest.TopicName(t, "ledger")
			if tt.existingEvents > 0 {
				b.CreateTopic(t, events, tt.existingEvents, nil)
			}
			args := []string{"topics", "--brokers", strings.Join(b.Addrs, ","), "--topic", events,
				"--dlq-topic", dlqTopic, "--ledger-topic", ledger, "--partitions", tt.partitionsFlag}
			r := runCmd(t, 60*time.Second, args...)
			if r.code != 0 {
				t.Fatalf("topics: %s", r)
			}
			t.Logf("topics printed:\n%s", r.stdout)
			if !strings.Contains(r.stdout, "created "+dlqTopic) {
				t.Errorf("stdout does not report creating %s\n%s", dlqTopic, r)
			}
			if strings.Contains(r.stdout, "WARNING") {
				t.Errorf("a freshly created dead-letter topic got a retention warning\n%s", r)
			}
			// An existing events topic's count differs from --partitions:
			// said, not silent (new-user trial).
			note := fmt.Sprintf("NOTE: %s existed with %d partitions and is left so; --partitions %s applies", events, tt.existingEvents, tt.partitionsFlag)
			if got := strings.Contains(r.stdout, note); got != (tt.existingEvents > 0) {
				t.Errorf("note that --partitions was not applied: %v, want %v\n%s", got, tt.existingEvents > 0, r)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			adm := kadm.NewClient(b.Client(t))
			details := waitTopics(ctx, t, adm, events, dlqTopic, ledger)
			if n := len(details[events].Partitions); n != tt.wantPartitions {
				t.Errorf("events topic partitions = %d, want %d", n, tt.wantPartitions)
			}
			if n := len(details[dlqTopic].Partitions); n != len(details[events].Partitions) {
				t.Errorf("dead-letter topic partitions = %d, want the events topic's %d", n, len(details[events].Partitions))
			}
			retention := topicConfig(ctx, t, adm, dlqTopic, "retention.ms")
			ms, err := strconv.ParseInt(retention, 10, 64)
			if err != nil {
				t.Fatalf("retention.ms of %s = %q: %v", dlqTopic, retention, err)
			}
			if ms != -1 && ms < dlq.MinRetention.Milliseconds() {
				t.Errorf("retention.ms of %s = %d, want >= %d (30 days)", dlqTopic, ms, dlq.MinRetention.Milliseconds())
			}
			if policy := topicConfig(ctx, t, adm, ledger, "cleanup.policy"); policy != "compact" {
				t.Errorf("cleanup.policy of the ledger topic = %q, want compact", policy)
			}

			again := runCmd(t, 60*time.Second, args...)
			if again.code != 0 || strings.Contains(again.stdout, "created") {
				t.Errorf("second topics run, want exit 0 and nothing created:\n%s", again)
			}
		})
	}
}

// TestTopicsWarnsAboutShortDeadLetterRetention: an existing dead-letter
// topic that keeps less than 30 days is reported, not changed.
func TestTopicsWarnsAboutShortDeadLetterRetention(t *testing.T) {
	t.Parallel()
	b := kafkatest.New(t)
	events := kafkatest.TopicName(t, "events")
	dlqTopic := kafkatest.TopicName(t, "dlq")
	ledger := kafkatest.TopicName(t, "ledger")
	b.CreateTopic(t, events, 2, nil)
	b.CreateTopic(t, dlqTopic, 2, map[string]*string{"retention.ms": kadm.StringPtr("86400000")})
	r := runCmd(t, 60*time.Second, "topics", "--brokers", strings.Join(b.Addrs, ","),
		"--topic", events, "--dlq-topic", dlqTopic, "--ledger-topic", ledger)
	if r.code != 0 {
		t.Fatalf("topics: %s", r)
	}
	if want := fmt.Sprintf("WARNING: %s keeps less than 30 days; set retention.ms >= 2592000000", dlqTopic); !strings.Contains(r.stdout, want) {
		t.Errorf("stdout lacks %q\n%s", want, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got := topicConfig(ctx, t, kadm.NewClient(b.Client(t)), dlqTopic, "retention.ms"); got != "86400000" {
		t.Errorf("retention.ms of the existing dead-letter topic = %q, want it left at 86400000", got)
	}
}

// TestRunHTTPAddrInUseExitsOne: a taken --http-addr is a runtime failure
// (exit 1) that names the flag and the address.
func TestRunHTTPAddrInUseExitsOne(t *testing.T) {
	t.Parallel()
	b := kafkatest.New(t)
	ln := takenPort(t)
	r := runCmd(t, 60*time.Second, "run",
		"--brokers", strings.Join(b.Addrs, ","),
		"--database-url", "postgres://postgres:postgres@"+closedAddr(t)+"/postgres?sslmode=disable",
		"--projections", exampleProjections,
		"--topic", kafkatest.TopicName(t, "events"), "--dlq-topic", kafkatest.TopicName(t, "dlq"),
		"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"),
		"--partitions", "1", "--http-addr", ln.Addr().String())
	if r.code != 1 {
		t.Errorf("exit %d, want 1\n%s", r.code, r)
	}
	if want := "--http-addr " + ln.Addr().String(); !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("stderr lacks %q and \"address already in use\"\n%s", want, r)
	}
}

// TestRunWarnsOfARepeatedFlag: run takes the last of a repeated flag (a
// Deployment's arguments can be overridden by appending one) and says so in
// a WARN line with the value in effect, its password masked (new-user
// trial: "--max-retries 1 --max-retries 2" started saying nothing of it,
// where the replayer and migrate refuse a repeated filter or grant).
func TestRunWarnsOfARepeatedFlag(t *testing.T) {
	t.Parallel()
	b := kafkatest.New(t)
	ln := takenPort(t) // run exits 1 once its settings are read
	db := "postgres://postgres:Repeat-pw-6203@" + closedAddr(t) + "/postgres?sslmode=disable"
	r := runCmd(t, 60*time.Second, "run",
		"--brokers", strings.Join(b.Addrs, ","),
		"--database-url", "postgres://postgres:postgres@"+closedAddr(t)+"/postgres", "--database-url", db,
		"--projections", exampleProjections, "--max-retries", "1", "--max-retries=2", "--max-retries", "3",
		"--topic", kafkatest.TopicName(t, "events"), "--dlq-topic", kafkatest.TopicName(t, "dlq"),
		"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"),
		"--partitions", "1", "--http-addr", ln.Addr().String(), "--log-format", "text",
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "bob", "--kafka-sasl-password=p5", "--kafka-sasl-password=5")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\n%s", r.code, r)
	}
	warned := map[string]string{}
	for _, line := range strings.Split(r.stderr, "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "flag given more than once") {
			_, flag, _ := strings.Cut(line, "flag=")
			flag, _, _ = strings.Cut(flag, " ")
			warned[flag] = line
		}
	}
	if len(warned) != 3 || !strings.Contains(warned["--max-retries"], "times=3 value=3") || !strings.Contains(warned["--database-url"], "times=2") ||
		!strings.Contains(warned["--kafka-sasl-password"], "times=2 value=xxxxx") {
		t.Errorf("want one WARN line for --max-retries (times=3 value=3), --database-url (times=2) and --kafka-sasl-password (times=2 value=xxxxx: a short password too, second trial), got %q\n%s", warned, r)
	}
	if strings.Contains(r.stderr, "Repeat-pw-6203") {
		t.Errorf("the password of the repeated --database-url is in the output\n%s", r)
	}
}

// waitTopics returns the details of topics once the broker's metadata
// shows all of them: a real broker may answer UNKNOWN_TOPIC_OR_PARTITION
// for a moment after CreateTopics has returned.
func waitTopics(ctx context.Context, t *testing.T, adm *kadm.Client, topics ...string) kadm.TopicDetails {
	t.Helper()
	for {
		details, err := adm.ListTopics(ctx, topics...)
		missing := ""
		for _, topic := range topics {
			if d, ok := details[topic]; err == nil && (!ok || d.Err != nil) {
				missing = fmt.Sprintf("topic %s not created: %v", topic, d.Err)
				break
			}
		}
		if err == nil && missing == "" {
			return details
		}
		select {
		case <-ctx.Done():
			t.Fatalf("list topics: %v %s", err, missing)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// topicConfig returns the value of one config key of topic.
func topicConfig(ctx context.Context, t *testing.T, adm *kadm.Client, topic, key string) string {
	t.Helper()
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatalf("describe configs of %s: %v", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		t.Fatalf("describe configs of %s: %v", topic, err)
	}
	if rc.Err != nil {
		t.Fatalf("describe configs of %s: %v", topic, rc.Err)
	}
	for _, c := range rc.Configs {
		if c.Key == key {
			return c.MaybeValue()
		}
	}
	t.Fatalf("%s has no config %s", topic, key)
	return ""
}

// takenPort returns a listener on a free port of 127.0.0.1, closed when
// the test ends: a port another service holds.
func takenPort(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
