package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

// env is a test environment for run.
type env map[string]string

func (e env) lookup(k string) (string, bool) { v, ok := e[k]; return v, ok }

// result is what one run of the command printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) lastLine() string {
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	return lines[len(lines)-1]
}

func runCmd(t *testing.T, e env, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr, e.lookup)
	return result{code, stdout.String(), stderr.String()}
}

// TestUsageErrors: exit status 2 and a message that names the flag, without
// touching Kafka (the brokers do not exist).
func TestUsageErrors(t *testing.T) {
	noKafka := env{"KAFKA_BROKERS": "127.0.0.1:1"}
	tests := []struct {
		name string
		env  env
		args []string
		want string // in stderr
	}{
		{"no command", noKafka, nil, "Usage: dlq-replayer <command>"},
		{"unknown command", noKafka, []string{"replay", "--all"}, `unknown command "replay"`},
		{"misspelt command", noKafka, []string{"lst", "--all"}, `unknown command "lst" (did you mean list?)`},
		{"flag of other commands", noKafka, []string{"list", "--all", "--dry-run"}, "--dry-run is a flag of retry and skip, not of list (dlq-replayer list -h lists the flags)"},
		{"flag of another command", noKafka, []string{"summary", "--all", "--reason", "x"}, "--reason is a flag of retry and skip, not of summary"},
		{"flag before the command", noKafka, []string{"--all", "list"}, `unknown command "--all": the command comes first, then its flags (dlq-replayer list --all ...)`},
		{"misspelt flag", noKafka, []string{"list", "--al"}, "unknown flag --al (did you mean --all?)"},
		{"no filter", noKafka, []string{"retry"}, "--all"},
		{"no filter for list", noKafka, []string{"list"}, "--all"},
		{"unknown flag", noKafka, []string{"list", "--all", "--nope"}, "-nope"},
		{"positional argument", noKafka, []string{"list", "--all", "production"}, `unexpected argument "production"`},
		{"bad output", noKafka, []string{"list", "--all", "--output", "xml"}, "--output"},
		{"wide json list", noKafka, []string{"list", "--all", "--output", "json", "--wide"}, "--wide (DLQ_WIDE) widens the table; --output json writes every field already"},
		{"wide json summary", noKafka, []string{"summary", "--all", "--output", "json", "--wide"}, "--wide (DLQ_WIDE) widens the table"},
		{"negative limit", noKafka, []string{"list", "--all", "--limit", "-1"}, "--limit"},
		{"bad group", noKafka, []string{"summary", "--all", "--by", "colour"}, "--by"},
		{"bad since", noKafka, []string{"list", "--since", "yesterday"}, "--since"},
		{"bad until", noKafka, []string{"list", "--until", "2024-13-01"}, "--until"},
		{"since after until", noKafka, []string{"list", "--since", "1h", "--until", "2h"}, "--since"},
		{"bad fingerprint", noKafka, []string{"list", "--fingerprint", "xyz"}, "--fingerprint"},
		// Refused, not matched against nothing (operator trial).
		{"tenant schema no dead letter holds", noKafka, []string{"retry", "--tenant-schema", "ACME_PROD"}, `--tenant-schema (DLQ_TENANT_SCHEMA): "ACME_PROD" is not a tenant schema name`},
		{"tenant schema of 64 bytes", noKafka, []string{"list", "--tenant-schema", strings.Repeat("t", 64)}, `--tenant-schema (DLQ_TENANT_SCHEMA): "tttt`},
		{"bad dlq topic name", noKafka, []string{"list", "--all", "--dlq-topic", "bad topic"}, "--dlq-topic"},
		{"same dlq and ledger topic", noKafka, []string{"list", "--all", "--dlq-topic", "x", "--ledger-topic", "x"}, "--ledger-topic"},
		{"max replays 0", noKafka, []string{"retry", "--all", "--max-replays", "0"}, "--max-replays"},
		{"negative rate", noKafka, []string{"retry", "--all", "--rate", "-5"}, "--rate"},
		{"rate NaN", noKafka, []string{"retry", "--all", "--rate", "NaN"}, "--rate"},
		// Named with its variable and the form wanted (fresh-user trial:
		// `invalid value "abc" for flag -rate: parse error`).
		{"rate not a number", noKafka, []string{"retry", "--all", "--rate", "abc"}, `--rate (DLQ_RATE) "abc": not a number: write it in decimal, e.g. 50 or 0.5`},
		{"rate infinite", noKafka, []string{"retry", "--all", "--rate", "Inf"}, `--rate (DLQ_RATE) "Inf": not a number`},
		{"rate beyond a double", noKafka, []string{"retry", "--all", "--rate", "1e400"}, `--rate (DLQ_RATE) "1e400": out of range for a number`},
		{"skip without reason", noKafka, []string{"skip", "--all", "--actor", "alice"}, "--reason"},
		{"skip without actor", noKafka, []string{"skip", "--all", "--reason", "bad data"}, "--actor"},
		{"bad env value", env{"KAFKA_BROKERS": "127.0.0.1:1", "DLQ_LIMIT": "many"}, []string{"list", "--all"}, "DLQ_LIMIT (flag --limit)"},
		{"bad sasl mechanism", noKafka, []string{"list", "--all", "--sasl-mechanism", "gssapi"}, "--kafka-sasl-mechanism"},
		{"missing tls ca", noKafka, []string{"list", "--all", "--tls-ca", "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"},
		{"tls ca flag beats env", env{"KAFKA_BROKERS": "127.0.0.1:1", "KAFKA_TLS_CA": "/from/env.pem"},
			[]string{"list", "--all", "--tls-ca", "/from/flag.pem"}, "/from/flag.pem"},
		{"bad brokers", env{"KAFKA_BROKERS": "kafka"}, []string{"list", "--all"}, "--brokers"},
		{"bad log level", noKafka, []string{"list", "--all", "--log-level", "loud"}, "--log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, tt.env, tt.args...)
			if r.code != 2 {
				t.Errorf("exit status %d, want 2\nstderr: %s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr does not name %q:\n%s", tt.want, r.stderr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"list", "-h"}} {
		if r := runCmd(t, env{}, args...); r.code != 0 {
			t.Errorf("%v: exit status %d", args, r.code)
		}
	}
}

// TestVersionPrintsOneLine: `version` prints the build version, one
// non-empty line, and exits 0 (the image test runs it from the image).
func TestVersionPrintsOneLine(t *testing.T) {
	r := runCmd(t, env{}, "version")
	if r.code != 0 {
		t.Fatalf("version: exit status %d\nstderr: %s", r.code, r.stderr)
	}
	if lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n"); len(lines) != 1 || strings.TrimSpace(lines[0]) == "" {
		t.Errorf("version printed %q, want one non-empty line", r.stdout)
	}
}

// TestVersionAndHelpTakeNoArguments: `version extra --json` and `help x`
// are usage errors (exit 2), not the version or the usage as if the rest
// were read (new-user trial).
func TestVersionAndHelpTakeNoArguments(t *testing.T) {
	for _, args := range [][]string{{"version", "extra", "--json"}, {"help", "retry"}, {"version", "-h", "x"}} {
		r := runCmd(t, env{}, args...)
		if r.code != 2 || !strings.Contains(r.stderr, args[0]+" takes no arguments") || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 saying it takes no arguments", args, r.code, r.stdout, r.stderr)
		}
	}
	// -h after version or help asks for help: the usage, exit 0 (docs
	// trial: `version -h` was refused, exit 2).
	for _, args := range [][]string{{"version", "-h"}, {"help", "--help"}, {"version", "-help"}} {
		r := runCmd(t, env{}, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Commands:") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 0 and the usage", args, r.code, r.stdout, r.stderr)
		}
	}
}

// TestAFilterGivenTwiceIsRefused: a filter flag given twice is a usage
// error naming it, before anything is read (second new-user trial: the
// second --fingerprint alone was used); a repeat inside a value is not one.
func TestAFilterGivenTwiceIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"retry", "--dry-run", "--fingerprint", "537b419c1e06d9c6", "--fingerprint", "469990fb616fb6db"},
		{"list", "--tenant-schema=acme_a", "--tenant-schema", "acme_b"},
		{"skip", "--since", "1h", "--actor", "a", "--reason", "r", "--since=2h"},
		// Any flag (fresh-user trial: the second --dlq-topic, --topic was
		// taken without a word).
		{"retry", "--dry-run", "--all", "--dlq-topic", "a.dlq", "--dlq-topic", "b.dlq"},
		{"retry", "--all", "--topic", "a", "--force", "--topic", "b"},
		{"summary", "--all", "--by", "projection", "--by", "tenant-schema"},
	} {
		r := runCmd(t, env{"KAFKA_BROKERS": "127.0.0.1:1"}, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "is given 2 times") {
			t.Errorf("%q: exit %d, stderr %q; want 2 naming the repeated filter", args, r.code, r.stderr)
		}
	}
	r := runCmd(t, env{"KAFKA_BROKERS": "127.0.0.1:1"}, "skip", "--dry-run", "--reason", "--fingerprint", "--actor", "a", "--fingerprint", "537b419c1e06d9c6")
	if strings.Contains(r.stderr, "is given 2 times") {
		t.Errorf("a --reason of \"--fingerprint\" counted as a filter: %q", r.stderr)
	}
}

// fixture is a broker with an events topic, a dead-letter topic and the
// environment that points the command at them.
type fixture struct {
	b                        *kafkatest.Broker
	events, dlqTopic, ledger string
	env                      env
	cl                       *kgo.Client
	offsets                  int64 // the original offsets given so far: each dead letter another record's
}

func newFixture(t *testing.T, b *kafkatest.Broker) *fixture {
	f := &fixture{
		b:        b,
		events:   kafkatest.TopicName(t, "events"),
		dlqTopic: kafkatest.TopicName(t, "dlq"),
		ledger:   kafkatest.TopicName(t, "ledger"),
	}
	b.CreateTopic(t, f.events, 3, nil)
	b.CreateTopic(t, f.dlqTopic, 1, nil)
	f.cl = b.Client(t, kgo.ProducerLinger(0))
	f.env = env{
		"KAFKA_BROKERS": strings.Join(b.Addrs, ","),
		"EVENTS_TOPIC":  f.events,
		"DLQ_TOPIC":     f.dlqTopic,
		"LEDGER_TOPIC":  f.ledger,
		"USER":          "tester",
	}
	return f
}

var t0 = time.Date(2024, 6, 25, 12, 0, 0, 0, time.UTC)

// add writes a dead letter as the worker does.
func (f *fixture) add(t *testing.T, key, fork, tenant, projection string, err error, failedAt time.Time) dlq.Coordinates {
	t.Helper()
	defer func() { f.offsets++ }()
	value := fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":%q,"tenantSchema":%q,"irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"a-1"}}`,
		key, fork, tenant, key)
	rec, nerr := dlq.NewRecord(dlq.DeadLetter{
		Source:     &kgo.Record{Topic: f.events, Partition: 2, Offset: 10 + f.offsets, Key: []byte(key), Value: value},
		Projection: projection, TenantSchema: tenant, ForkID: fork, EventType: "ARTIST_FOLLOWED",
		Class: retry.Classify(err), Err: err, Retries: 5,
	}, dlq.RecordConfig{Topic: f.dlqTopic}, failedAt)
	if nerr != nil {
		t.Fatal(nerr)
	}
	r, perr := f.cl.ProduceSync(context.Background(), rec).First()
	if perr != nil {
		t.Fatal(perr)
	}
	return dlq.Coordinates{Partition: r.Partition, Offset: r.Offset}
}

var columnErr = &pgconn.PgError{Severity: "ERROR", Code: "42703", Message: `column "followed_at" of relation "artist_followers" does not exist`}

// seed writes three dead letters: two production artist_followers (column
// missing) and one staging artist_stats.
func (f *fixture) seed(t *testing.T) []dlq.Coordinates {
	return []dlq.Coordinates{
		f.add(t, "user-1", "production", "acme_prod", "artist_followers", columnErr, t0),
		f.add(t, "user-2", "production", "acme_prod", "artist_followers", columnErr, t0.Add(time.Minute)),
		f.add(t, "user-3", "staging", "acme_staging", "artist_stats", retry.MarkPermanent(errors.New("derive score: division by zero")), t0.Add(2*time.Minute)),
	}
}

func (f *fixture) eventsCount(t *testing.T) int64 {
	t.Helper()
	ends, err := kadm.NewClient(f.b.Client(t)).ListEndOffsets(context.Background(), f.events)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// TestAFilterFromTheEnvironmentIsSaid: a filter variable left set (here
// DLQ_FINGERPRINT) narrows even --all; the command says so in a WARN line
// naming the variable and its value, and a filter given on the command
// line instead is not reported (second new-user trial: 1 of 21 listed,
// nothing said outside the JSON log).
func TestAFilterFromTheEnvironmentIsSaid(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	e := env{"DLQ_FINGERPRINT": "537b419c1e06d9c6"}
	for k, v := range f.env {
		e[k] = v
	}
	r := runCmd(t, e, "list", "--all", "--log-format", "text")
	if r.code != 0 || !strings.Contains(r.stderr, "filters set in the environment apply") || !strings.Contains(r.stderr, "DLQ_FINGERPRINT=537b419c1e06d9c6") {
		t.Errorf("list --all with DLQ_FINGERPRINT set: exit %d, want 0 and a WARN naming the variable\n%s", r.code, r.stderr)
	}
	r = runCmd(t, f.env, "list", "--fingerprint", "537b419c1e06d9c6", "--log-format", "text")
	if r.code != 0 || strings.Contains(r.stderr, "filters set in the environment") {
		t.Errorf("list --fingerprint: exit %d, want 0 and no environment WARN\n%s", r.code, r.stderr)
	}
	// DLQ_ALL selects everything where the command line gives no filter
	// (docs trial: a retry so selected every dead letter without a word).
	e = env{"DLQ_ALL": "true"}
	for k, v := range f.env {
		e[k] = v
	}
	r = runCmd(t, e, "retry", "--dry-run", "--log-format", "text")
	if r.code != 0 || !strings.Contains(r.stderr, "filters set in the environment apply") || !strings.Contains(r.stderr, "DLQ_ALL=true") {
		t.Errorf("retry --dry-run with DLQ_ALL=true: exit %d, want 0 and a WARN naming DLQ_ALL\n%s", r.code, r.stderr)
	}
}

// TestAMissingTopicNamesItsFlag: a dead-letter or events topic that does
// not exist fails the command with a cause naming its flag and variable, as
// the ledger topic's warning does (new-user trial: "list offsets of
// nosuch.dlq: topic does not exist" named no flag), also when the ledger
// holds decisions about another dead-letter topic, and without creating a
// ledger topic (operator trial: a mistyped --dlq-topic was blamed on the
// ledger, and retry left a ledger topic created for it).
func TestAMissingTopicNamesItsFlag(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b)
	f.seed(t)
	if r := runCmd(t, f.env, "skip", "--all", "--reason", "test", "--actor", "alice"); r.code != 0 {
		t.Fatalf("skip: exit %d\n%s", r.code, r.stderr)
	}
	missing := kafkatest.TopicName(t, "nosuch")
	freshLedger := kafkatest.TopicName(t, "fresh-ledger")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--all", "--dlq-topic", missing}, "check --dlq-topic (DLQ_TOPIC)"},
		{[]string{"summary", "--all", "--dlq-topic", missing}, "check --dlq-topic (DLQ_TOPIC)"},
		{[]string{"retry", "--all", "--dlq-topic", missing}, "check --dlq-topic (DLQ_TOPIC)"},
		{[]string{"retry", "--all", "--dlq-topic", missing, "--ledger-topic", freshLedger}, "check --dlq-topic (DLQ_TOPIC)"},
		{[]string{"skip", "--all", "--reason", "r", "--actor", "a", "--dlq-topic", missing, "--ledger-topic", freshLedger}, "check --dlq-topic (DLQ_TOPIC)"},
		{[]string{"retry", "--all", "--topic", missing}, "check --topic (EVENTS_TOPIC)"},
	} {
		r := runCmd(t, f.env, c.args...)
		if r.code != 1 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, missing) {
			t.Errorf("%v: exit %d, want 1 and %q with the topic's name\n%s", c.args, r.code, c.want, r.stderr)
		}
	}
	tds, err := kadm.NewClient(b.Client(t)).ListTopics(context.Background(), freshLedger)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(freshLedger) && tds[freshLedger].Err == nil {
		t.Errorf("ledger topic %s created for a dead-letter topic that does not exist", freshLedger)
	}
}

// TestSeedCommands runs the seed's proposed `causet dlq` commands as
// dlq-replayer commands, then checks the summary line, the ledger status in
// list, and that a second retry replays nothing.
func TestSeedCommands(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	at := f.seed(t)

	r := runCmd(t, f.env, "list", "--fork-id", "production", "--projection", "artist_followers")
	if r.code != 0 {
		t.Fatalf("list: exit %d\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "DLQ ") {
		t.Fatalf("list table:\n%s", r.stdout)
	}
	if got := strings.Fields(lines[0]); !slices.Equal(got, []string{"DLQ", "FAILED", "AT", "PROJECTION", "TENANT", "LEDGER", "ERROR"}) {
		t.Errorf("default table header %q, want DLQ FAILED AT PROJECTION TENANT LEDGER ERROR", lines[0])
	}
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("default table line of %d columns, want <= 100: %s", n, l)
		}
	}
	if !strings.HasPrefix(lines[1], at[0].String()+" ") || !strings.Contains(lines[1], "2024-06-25T12:00:00Z") ||
		!strings.Contains(lines[1], `ERROR: column "followed_at"`) || !strings.Contains(lines[1], " — ") || !strings.HasSuffix(lines[1], "…") {
		t.Errorf("list row (the long error cut with an ellipsis): %s", lines[1])
	}

	r = runCmd(t, f.env, "list", "--fork-id", "production", "--projection", "artist_followers", "--wide")
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Fatalf("list --wide: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, col := range []string{"FAILED AT", "PROJECTION", "TENANT", "EVENT TYPE", "ENTITY", "RETRIES", "REPLAYS", "LEDGER", "FINGERPRINT", "ERROR"} {
		if !strings.Contains(lines[0], col) {
			t.Errorf("--wide table header has no %s column: %s", col, lines[0])
		}
	}
	if !strings.Contains(lines[1], at[0].String()) || !strings.Contains(lines[1], "user-1") ||
		!strings.HasSuffix(lines[1], `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`) {
		t.Errorf("--wide list row: %s", lines[1])
	}

	r = runCmd(t, f.env, "retry", "--fork-id", "production", "--all")
	if r.code != 0 || r.lastLine() != "matched=2 replayed=2 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("retry: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	if n := f.eventsCount(t); n != 2 {
		t.Errorf("events topic has %d records, want 2", n)
	}
	r = runCmd(t, f.env, "retry", "--fork-id", "production", "--all")
	if r.code != 0 || r.lastLine() != "matched=2 replayed=0 skipped=0 already-replayed=2 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("second retry: exit %d, stdout %q", r.code, r.stdout)
	}
	l, err := dlq.OpenLedger(context.Background(), f.b.Opts(), dlq.LedgerConfig{Topic: f.ledger, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Lookup(at[0]); d.Action != dlq.ActionReplayed || d.Actor != "tester" || len(d.RunID) != 16 || d.ReplayCount != 1 {
		t.Errorf("ledger decision %+v, want replayed by tester ($USER)", d)
	}

	r = runCmd(t, f.env, "list", "--all", "--output", "json")
	if r.code != 0 {
		t.Fatalf("list json: exit %d\n%s", r.code, r.stderr)
	}
	type line struct {
		DLQPartition   int32           `json:"dlqPartition"`
		DLQOffset      int64           `json:"dlqOffset"`
		LedgerStatus   string          `json:"ledgerStatus"`
		ProjectionName string          `json:"projectionName"`
		OriginalEvent  json.RawMessage `json:"originalEvent"`
		Ledger         *dlq.Decision   `json:"ledger"`
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var v line
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("json line %q: %v", l, err)
		}
		if len(v.OriginalEvent) == 0 || (v.LedgerStatus == "replayed") != (v.Ledger != nil) {
			t.Errorf("json line %s", l)
		}
		got = append(got, fmt.Sprintf("%d:%d %s %s", v.DLQPartition, v.DLQOffset, v.ProjectionName, v.LedgerStatus))
	}
	want := []string{at[0].String() + " artist_followers replayed", at[1].String() + " artist_followers replayed", at[2].String() + " artist_stats "}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("json lines (-want +got):\n%s", diff)
	}
	r = runCmd(t, f.env, "list", "--all", "--limit", "1", "--output", "json")
	if n := strings.Count(r.stdout, "\n"); r.code != 0 || n != 1 {
		t.Errorf("--limit 1: exit %d, %d lines", r.code, n)
	}
}

func TestSummary(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	r := runCmd(t, f.env, "summary", "--all", "--by", "projection", "--wide")
	if r.code != 0 {
		t.Fatalf("summary: exit %d\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("summary:\n%s", r.stdout)
	}
	for i, want := range []string{"COUNT", "2 ", "1 "} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], want)
		}
	}
	// By projection, the projection is the key: no PROJECTIONS column
	// beside it (new-user trial).
	if got, want := strings.Fields(lines[0]), []string{"COUNT", "REPLAYED", "SKIPPED", "FIRST", "FAILED", "LAST", "FAILED", "PROJECTION", "SAMPLE", "ERROR"}; !slices.Equal(got, want) {
		t.Errorf("header %q, want the words %q", lines[0], want)
	}
	if !strings.Contains(lines[1], "artist_followers") || !strings.Contains(lines[1], "2024-06-25T12:00:00Z") || !strings.Contains(lines[1], "2024-06-25T12:01:00Z") {
		t.Errorf("largest group: %s", lines[1])
	}
	r = runCmd(t, f.env, "summary", "--all", "--output", "json")
	var g struct {
		By    string `json:"by"`
		Key   string `json:"key"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal([]byte(strings.SplitN(r.stdout, "\n", 2)[0]), &g); err != nil || g.By != "fingerprint" || g.Count != 2 || len(g.Key) != 16 {
		t.Errorf("summary json: %+v, %v\n%s", g, err, r.stdout)
	}
}

func TestSkipThenRetryAllSendsNothingForTheSkippedEntry(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	r := runCmd(t, f.env, "skip", "--fork-id", "staging", "--reason", "division by zero is upstream's bug", "--actor", "alice")
	if r.code != 0 || r.lastLine() != "matched=1 replayed=0 skipped=1 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("skip: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, f.env, "retry", "--all", "--include-replayed", "--force")
	if r.code != 0 || r.lastLine() != "matched=3 replayed=2 skipped=0 already-replayed=0 already-skipped=1 refused=0 failed=0" {
		t.Fatalf("retry --all: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, f.env, "list", "--fork-id", "staging")
	if !strings.Contains(r.stdout, " skipped ") {
		t.Errorf("list does not show the skip:\n%s", r.stdout)
	}
}

// TestALedgerOfAnotherDeadLetterTopicIsRefused: a second dead-letter
// topic given the first one's ledger topic is refused at once, exit 2,
// naming both topics and --ledger-topic (replayer trial: its dead letters
// at the offsets the first topic's replays had were listed replayed and
// never sent, exit 0).
func TestALedgerOfAnotherDeadLetterTopicIsRefused(t *testing.T) {
	b := kafkatest.New(t)
	first, second := newFixture(t, b), newFixture(t, b)
	second.ledger = first.ledger
	second.env["LEDGER_TOPIC"] = first.ledger
	first.seed(t)
	second.seed(t)
	if r := runCmd(t, first.env, "retry", "--all"); r.code != 0 {
		t.Fatalf("retry of the first topic: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	sent := second.eventsCount(t)
	for _, args := range [][]string{{"retry", "--all"}, {"list", "--all"}, {"summary", "--all"}, {"skip", "--all", "--reason", "r", "--actor", "a"}} {
		r := runCmd(t, second.env, args...)
		want := `holds decisions about the dead letters of "` + first.dlqTopic + `", keyed by partition and offset only, so it cannot also keep those of --dlq-topic (DLQ_TOPIC) "` + second.dlqTopic + `"`
		if r.code != 2 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "a ledger topic of its own (--ledger-topic (LEDGER_TOPIC))") {
			t.Errorf("%s on the second topic: exit %d, want 2 and %q\nstdout:\n%s\nstderr:\n%s", args[0], r.code, want, r.stdout, r.stderr)
		}
	}
	if n := second.eventsCount(t); n != sent {
		t.Errorf("%d events sent for the second topic, want none", n-sent)
	}
}

// TestSkipKeepsTheLedgersEarlierDecision (new-user trial): skipping a dead
// letter that was replayed already counts it as already-replayed and
// leaves the ledger saying replayed; a second skip keeps the first one's
// actor and reason; dry runs of retry and skip call an entry skipped
// before "already skipped", not "would skip".
func TestSkipKeepsTheLedgersEarlierDecision(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	r := runCmd(t, f.env, "retry", "--fork-id", "production")
	if r.code != 0 || r.lastLine() != "matched=2 replayed=2 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("retry: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, f.env, "skip", "--all", "--reason", "bad upstream data", "--actor", "alice")
	if r.code != 0 || r.lastLine() != "matched=3 replayed=0 skipped=1 already-replayed=2 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("skip after the replay: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	// The second skip records nothing: already-skipped, not skipped
	// (new-user trial: it said skipped=1).
	r = runCmd(t, f.env, "skip", "--all", "--reason", "again", "--actor", "bob")
	if r.code != 0 || r.lastLine() != "matched=3 replayed=0 skipped=0 already-replayed=2 already-skipped=1 refused=0 failed=0" {
		t.Fatalf("second skip: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	// The finished log line has the summary line's counts (new-user trial:
	// it lacked already_skipped).
	if !strings.Contains(r.stderr, `"already_replayed":2,"already_skipped":1,`) {
		t.Errorf("the finished log line does not count already_skipped=1:\n%s", r.stderr)
	}
	r = runCmd(t, f.env, "list", "--all", "--output", "json")
	var replayed, skipped int
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m struct {
			Ledger *struct{ Action, Actor, Reason string } `json:"ledger"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil || m.Ledger == nil {
			t.Fatalf("list line %q: %v, or no ledger decision", line, err)
		}
		switch d := *m.Ledger; {
		case d.Action == "replayed" && d.Reason == "":
			replayed++
		case d == struct{ Action, Actor, Reason string }{"skipped", "alice", "bad upstream data"}:
			skipped++
		default:
			t.Errorf("ledger decision %+v", d)
		}
	}
	if replayed != 2 || skipped != 1 {
		t.Errorf("ledger: %d replayed and %d skipped, want 2 and 1\n%s", replayed, skipped, r.stdout)
	}
	for _, cmd := range [][]string{
		{"retry", "--all", "--include-replayed", "--force", "--dry-run"},
		{"skip", "--all", "--reason", "r", "--actor", "carol", "--dry-run"},
	} {
		r = runCmd(t, f.env, cmd...)
		if !strings.Contains(r.stdout, "already skipped ") || strings.Contains(r.stdout, "would skip") ||
			!strings.Contains(r.stdout, "skipped by alice: bad upstream data") {
			t.Errorf("%s: the skipped entry is not said already skipped by alice:\n%s", cmd[0], r.stdout)
		}
	}
}

func TestDryRunSendsNothing(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	at := f.seed(t)
	r := runCmd(t, f.env, "retry", "--all", "--dry-run")
	if r.code != 0 {
		t.Fatalf("dry run: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "would replay "+at[0].String()+" -> "+f.events+"[2] (original partition)") {
		t.Errorf("dry run output:\n%s", r.stdout)
	}
	if got := r.lastLine(); got != "matched=3 would-replay=3 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0 (dry run: nothing sent or recorded)" {
		t.Errorf("summary line %q", got)
	}
	// The log line says what would have been done too, not "replayed".
	if !strings.Contains(r.stderr, `"would_replay":3`) || strings.Contains(r.stderr, `"replayed":`) {
		t.Errorf("the finished log line of a dry run does not say would_replay:\n%s", r.stderr)
	}
	if n := f.eventsCount(t); n != 0 {
		t.Errorf("dry run sent %d records", n)
	}
	tds, err := kadm.NewClient(f.b.Client(t)).ListTopics(context.Background(), f.ledger)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(f.ledger) && tds[f.ledger].Err == nil {
		t.Error("dry run created the ledger topic")
	}
	// The ledger topic does not exist: said, as a mistyped --ledger-topic
	// would otherwise look like a ledger without decisions (new-user trial).
	if !strings.Contains(r.stderr, "the ledger topic does not exist") || !strings.Contains(r.stderr, f.ledger) ||
		!strings.Contains(r.stderr, "check --ledger-topic (LEDGER_TOPIC)") {
		t.Errorf("a dry run on a ledger topic that does not exist does not say so, naming the flag:\n%s", r.stderr)
	}
	// A real run creates it (and says so); the next one finds it.
	if r := runCmd(t, f.env, "retry", "--all"); r.code != 0 || !strings.Contains(r.stderr, "did not exist and was created empty") {
		t.Fatalf("retry: exit %d, want 0 and the ledger topic said created\n%s", r.code, r.stderr)
	}
	if r := runCmd(t, f.env, "retry", "--all", "--dry-run"); strings.Contains(r.stderr, "the ledger topic d") {
		t.Errorf("the ledger topic exists, yet a run says it did not:\n%s", r.stderr)
	}
}

// TestProduceFailureExitsOne fails the produce to the events topic (kfake):
// exit status 1, failed=1 in the summary line, and the next run replays it.
func TestProduceFailureExitsOne(t *testing.T) {
	b := kafkatest.Fake(t)
	f := newFixture(t, b)
	f.add(t, "user-1", "production", "acme_prod", "artist_followers", columnErr, t0)
	b.RefuseProduce(t, f.events, kerr.InvalidRecord.Code, func(n int64) bool { return n == 1 })
	r := runCmd(t, f.env, "retry", "--all")
	if r.code != 1 || r.lastLine() != "matched=1 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=1" {
		t.Fatalf("retry: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, `"level":"ERROR"`) || !strings.Contains(r.stderr, "INVALID_RECORD") {
		t.Errorf("stderr has no error log of the produce failure:\n%s", r.stderr)
	}
	r = runCmd(t, f.env, "retry", "--all")
	if r.code != 0 || r.lastLine() != "matched=1 replayed=1 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("second retry: exit %d, %q", r.code, r.stdout)
	}
}

// TestRetryStoppedBeforeTheEndSaysSo: a retry that fails as a whole (its
// --topic does not exist) prints its counters as stopped before the end,
// not as a finished run's line ("matched=0 ..." read like nothing matched;
// new-user trial), and exits 1.
func TestRetryStoppedBeforeTheEndSaysSo(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.add(t, "user-1", "production", "acme_prod", "artist_followers", columnErr, t0)
	r := runCmd(t, f.env, "retry", "--all", "--topic", kafkatest.TopicName(t, "missing"))
	if r.code != 1 || !strings.HasPrefix(r.lastLine(), "stopped before the end: matched=") {
		t.Errorf("retry to a missing topic: exit %d, last line %q, want 1 and the counters said stopped\n%s", r.code, r.lastLine(), r.stderr)
	}
}

// TestInterruptedRetrySaysHowFarItRead: a retry interrupted in the middle
// of the topic (--rate 1: one dead letter a second) says how many of the
// topic's records it read before its counters, which count only those
// (operator trial: "matched=5 ... not-done=1" of 12 read as if 5 matched).
func TestInterruptedRetrySaysHowFarItRead(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	for i := range 12 {
		f.add(t, fmt.Sprintf("user-%d", i), "production", "acme_prod", "artist_followers", columnErr, t0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"retry", "--all", "--rate", "1"}, &stdout, &stderr, f.env.lookup)
	r := result{code, stdout.String(), stderr.String()}
	m := regexp.MustCompile(`^stopped before the end \(([0-9]+) of 12 records of the dead-letter topic read\): matched=([0-9]+) `).FindStringSubmatch(r.lastLine())
	if r.code != 1 || m == nil {
		t.Fatalf("interrupted retry: exit %d, last line %q; want 1 and how many of the 12 records it read\n%s", r.code, r.lastLine(), r.stderr)
	}
	if m[1] == "12" || m[1] != m[2] {
		t.Errorf("read %s of 12, matched %s: want fewer than 12 read (interrupted), each matched (--all)", m[1], m[2])
	}
}

func TestMissingDeadLetterTopicExitsOne(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.env["DLQ_TOPIC"] = kafkatest.TopicName(t, "missing")
	r := runCmd(t, f.env, "list", "--all")
	if r.code != 1 || !strings.Contains(r.stderr, "topic does not exist") {
		t.Errorf("exit %d\n%s", r.code, r.stderr)
	}
	if r.stdout != "" { // new-user trial: a table header, then the error
		t.Errorf("stdout %q, want nothing before the error", r.stdout)
	}
}

// TestRetryAndSkipSayWhenNothingMatched: a filter that selects nothing is
// said on stdout ("no dead letter matched the filter") before the counters,
// exit 0; with --fail-on-empty the exit status is 3, for scripts (issue 12).
func TestRetryAndSkipSayWhenNothingMatched(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"retry", []string{"retry", "--projection", "nope"}, 0,
			"no dead letter matched the filter\nmatched=0 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0\n"},
		{"retry --fail-on-empty", []string{"retry", "--projection", "nope", "--fail-on-empty"}, 3,
			"no dead letter matched the filter\nmatched=0 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0\n"},
		{"retry --dry-run --fail-on-empty", []string{"retry", "--projection", "nope", "--dry-run", "--fail-on-empty"}, 3,
			"no dead letter matched the filter\nmatched=0 would-replay=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0 (dry run: nothing sent or recorded)\n"},
		{"skip", []string{"skip", "--fork-id", "nope", "--reason", "r", "--actor", "a"}, 0,
			"no dead letter matched the filter\nmatched=0 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0\n"},
		{"skip --fail-on-empty", []string{"skip", "--fork-id", "nope", "--reason", "r", "--actor", "a", "--fail-on-empty"}, 3,
			"no dead letter matched the filter\nmatched=0 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0\n"},
		{"skip --fail-on-empty with a match", []string{"skip", "--fork-id", "staging", "--reason", "r", "--actor", "a", "--fail-on-empty", "--dry-run"}, 0,
			"would skip 0:2 key=\"user-3\" projection=\"artist_stats\" tenant=\"acme_staging\" event=\"ARTIST_FOLLOWED\" replay-count=0: r\n" +
				"matched=1 replayed=0 would-skip=1 already-replayed=0 already-skipped=0 refused=0 failed=0 (dry run: nothing sent or recorded)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, f.env, tt.args...)
			if r.code != tt.wantCode {
				t.Errorf("exit status %d, want %d\nstderr: %s", r.code, tt.wantCode, r.stderr)
			}
			if diff := cmp.Diff(tt.wantOut, r.stdout); diff != "" {
				t.Errorf("stdout (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSummaryCountsReplayedAndSkipped: summary shows, per group, how many
// dead letters the ledger marks replayed and skipped, in the table and in
// JSON (issue 12).
func TestSummaryCountsReplayedAndSkipped(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	f.add(t, "user-4", "production", "acme_prod", "artist_followers", columnErr, t0.Add(3*time.Minute))
	if r := runCmd(t, f.env, "skip", "--fork-id", "staging", "--reason", "upstream bug", "--actor", "alice"); r.code != 0 {
		t.Fatalf("skip: exit %d\n%s", r.code, r.stderr)
	}
	if r := runCmd(t, f.env, "retry", "--tenant-schema", "acme_prod", "--until", "2024-06-25T12:02:00Z"); r.code != 0 {
		t.Fatalf("retry: exit %d\n%s", r.code, r.stderr)
	}
	r := runCmd(t, f.env, "summary", "--all", "--by", "projection")
	if r.code != 0 {
		t.Fatalf("summary: exit %d\n%s", r.code, r.stderr)
	}
	var got [][]string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		got = append(got, strings.Fields(l)[:4])
	}
	want := [][]string{
		{"COUNT", "REPLAYED", "SKIPPED", "PROJECTION"},
		{"3", "2", "0", "artist_followers"},
		{"1", "0", "1", "artist_stats"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summary table, first columns (-want +got):\n%s\n%s", diff, r.stdout)
	}
	r = runCmd(t, f.env, "summary", "--all", "--by", "projection", "--output", "json")
	var counts []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var g dlq.Group
		if err := json.Unmarshal([]byte(l), &g); err != nil {
			t.Fatalf("json line %q: %v", l, err)
		}
		counts = append(counts, fmt.Sprintf("%s %d %d %d", g.Key, g.Count, g.Replayed, g.Skipped))
	}
	if diff := cmp.Diff([]string{"artist_followers 3 2 0", "artist_stats 1 0 1"}, counts); diff != "" {
		t.Errorf("summary json (-want +got):\n%s", diff)
	}
}

// TestRetryRefusesAnEventThatFailsValidation: a dead letter whose event
// the worker refuses whatever was fixed (its tenant schema is public) is
// refused, not sent round again until --max-replays stops it (new-user
// trial); --force sends it all the same.
func TestRetryRefusesAnEventThatFailsValidation(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.add(t, "user-1", "production", "acme_prod", "artist_followers", columnErr, t0)
	f.add(t, "user-2", "production", "public", "", retry.MarkPermanent(errors.New("tenantSchema: must name a tenant")), t0)
	r := runCmd(t, f.env, "retry", "--all")
	if r.code != 0 || !strings.Contains(r.lastLine(), "replayed=1 ") || !strings.Contains(r.lastLine(), "refused=1 ") {
		t.Fatalf("retry: exit %d, summary %q, want 1 replayed and 1 refused\n%s", r.code, r.lastLine(), r.stderr)
	}
	if !strings.Contains(r.stderr, "fails validation, which a replay cannot change") || !strings.Contains(r.stderr, "tenantSchema") {
		t.Errorf("the refusal does not say why:\n%s", r.stderr)
	}
	if n := f.eventsCount(t); n != 1 {
		t.Errorf("%d events sent, want the valid one alone", n)
	}
	r = runCmd(t, f.env, "retry", "--all", "--force")
	if r.code != 0 || !strings.Contains(r.lastLine(), "replayed=1 ") {
		t.Fatalf("retry --force: exit %d, summary %q, want the refused one replayed\n%s", r.code, r.lastLine(), r.stderr)
	}
	if n := f.eventsCount(t); n != 2 {
		t.Errorf("%d events sent after --force, want 2", n)
	}
}

// TestUnreachableKafkaSaysSo: when no broker of --brokers answers, each
// command fails with exit 1 and an ERROR line whose cause names
// --brokers and the addresses (new-user trial: "read ledger: list offsets
// of ...: unable to dial" blamed the ledger).
func TestUnreachableKafkaSaysSo(t *testing.T) {
	for _, args := range [][]string{{"list", "--all"}, {"summary", "--all"}, {"retry", "--all", "--dry-run"}} {
		t.Run(args[0], func(t *testing.T) {
			r := runCmd(t, env{"KAFKA_BROKERS": "127.0.0.1:1"}, args...)
			const want = `"cause":"no broker of --brokers (KAFKA_BROKERS) 127.0.0.1:1 answers: check the addresses and that Kafka is running"`
			if r.code != 1 || !strings.Contains(r.stderr, want) {
				t.Errorf("%v against 127.0.0.1:1 = %d, want 1 and %s\nstderr: %s", args, r.code, want, r.stderr)
			}
		})
	}
}

// TestConcurrentRetriesSendEachEntryOnce: two `retry --all` runs started
// together (the second while the first, slowed by --rate, still sends;
// both slowed, so that whichever runs first makes the other wait)
// send each of 20 dead letters once: the run without the replay lock
// waits for it (its WARN line says so), then reads the other's decisions
// and finds them replayed (day-2 trial: both runs sent all 12, 24 events). On kfake
// and on the real broker.
func TestConcurrentRetriesSendEachEntryOnce(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	const n = 20
	for i := range n {
		f.add(t, fmt.Sprintf("user-%d", i), "production", "acme_prod", "artist_followers", columnErr, t0)
	}
	first := make(chan result, 1)
	go func() { first <- runCmd(t, f.env, "retry", "--all", "--rate", "4", "--log-format", "text") }()
	time.Sleep(500 * time.Millisecond) // the first holds the lock and sends, 4 a second: 5 s
	second := runCmd(t, f.env, "retry", "--all", "--rate", "4", "--log-format", "text")
	r1 := <-first
	// Which run takes the lock first is the group's choice (on a real
	// broker both may join in its initial rebalance delay): one sends all
	// 20, the other waits, then finds them replayed.
	const sent, found = "matched=20 replayed=20 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0",
		"matched=20 replayed=0 skipped=0 already-replayed=20 already-skipped=0 refused=0 failed=0"
	runs := []result{r1, second}
	if r1.lastLine() == found {
		runs = []result{second, r1}
	}
	if runs[0].code != 0 || runs[0].lastLine() != sent || runs[1].code != 0 || runs[1].lastLine() != found {
		t.Errorf("runs: exit %d %q and exit %d %q; want one to send all 20 and the other to find them replayed\nfirst:\n%s\nsecond:\n%s",
			r1.code, r1.lastLine(), second.code, second.lastLine(), r1.stderr, second.stderr)
	}
	if !strings.Contains(runs[1].stderr, "waiting for the replay lock") {
		t.Errorf("the run that found them replayed did not wait for the replay lock (did the runs overlap?)\n%s", runs[1].stderr)
	}
	if got := f.eventsCount(t); got != n {
		t.Errorf("events topic has %d records, want each of the %d dead letters sent once", got, n)
	}
}

// TestListAndSummaryWithNoMatchSaySo: a filter that selects nothing ends
// the table with a line saying so and how many dead letters were scanned,
// where only the header was printed (new-user trial); JSON output stays
// empty, and exit status 0 (nothing failed).
func TestListAndSummaryWithNoMatchSaySo(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	for _, cmd := range []string{"list", "summary"} {
		r := runCmd(t, f.env, cmd, "--fork-id", "no-such-fork")
		if want := "no dead letter matched the filter (3 dead letters scanned)"; r.code != 0 || r.lastLine() != want {
			t.Errorf("%s: exit %d, last line %q, want %q\n%s", cmd, r.code, r.lastLine(), want, r.stdout)
		}
		r = runCmd(t, f.env, cmd, "--fork-id", "no-such-fork", "--output", "json")
		if r.code != 0 || strings.TrimSpace(r.stdout) != "" {
			t.Errorf("%s --output json: exit %d, stdout %q, want nothing", cmd, r.code, r.stdout)
		}
	}
}

// TestNoMatchCountsRecordsThatAreNotDeadLetters: when no dead letter
// matches, the line counts the records that are not dead letters apart
// from the dead letters, and a topic holding none says so and names
// --dlq-topic (new-user trial: list --dlq-topic <the events topic> ended
// with "no dead letter matched the filter (30660 dead letters scanned)").
func TestNoMatchCountsRecordsThatAreNotDeadLetters(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b)
	f.seed(t)
	other := kafkatest.TopicName(t, "other-events") // another service's events
	b.CreateTopic(t, other, 2, nil)
	for i := range 4 {
		event := &kgo.Record{Topic: other, Key: []byte("user-1"), Value: fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":"user-1","sequenceNumber":%d}`, i)}
		if err := f.cl.ProduceSync(context.Background(), event).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if i < 2 { // two records in the dead-letter topic that are not dead letters
			event.Topic = f.dlqTopic
			if err := f.cl.ProduceSync(context.Background(), event).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--fork-id", "no-such-fork"}, "no dead letter matched the filter (3 dead letters scanned, and 2 records that are not dead letters)"},
		{[]string{"summary", "--fork-id", "no-such-fork"}, "no dead letter matched the filter (3 dead letters scanned, and 2 records that are not dead letters)"},
		{[]string{"list", "--all", "--dlq-topic", other}, "no dead letter: 4 records scanned, none of them a dead letter (is --dlq-topic the dead-letter topic?)"},
		{[]string{"skip", "--all", "--dlq-topic", other, "--actor", "a", "--reason", "r"}, "no dead letter: 4 records scanned, none of them a dead letter (is --dlq-topic the dead-letter topic?)"},
	} {
		r := runCmd(t, f.env, tc.args...)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || !slices.Contains(lines, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, want the line %q\n%s", tc.args, r.code, r.stdout, tc.want, r.stderr)
		}
	}
}

// TestKafkaCauseNamesTheSecuritySettings: a broker that closed the
// connection (SASL to a listener without it) or never answered in time
// (--tls to a plaintext listener) is explained in terms of the flags
// (new-user trial: a bare "EOF", and "unable to dial: context deadline
// exceeded").
func TestKafkaCauseNamesTheSecuritySettings(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("read ledger: list offsets of l: %w", io.EOF),
		fmt.Errorf("read ledger: list offsets of l: unable to dial: %w", context.DeadlineExceeded),
	} {
		if got := kafkaCause(err, "b:9092"); !strings.Contains(got, "--kafka-tls") || !strings.Contains(got, "--kafka-sasl-mechanism") {
			t.Errorf("kafkaCause(%v) = %q, want the TLS and SASL flags named", err, got)
		}
	}
}

// TestAnAliasAndItsFlagTogetherAreRefused: --tls with --kafka-tls=false
// (or any alias with its flag) on one command line is exit 2 naming both,
// not the alias winning silently (new-user trial); an alias on the
// command line over its flag's environment variable is taken.
func TestAnAliasAndItsFlagTogetherAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"list", "--all", "--tls", "--kafka-tls=false"},
		{"list", "--all", "--kafka-sasl-user", "a", "--sasl-user", "b", "--sasl-mechanism", "plain"},
	} {
		r := runCmd(t, env{"KAFKA_BROKERS": "127.0.0.1:1"}, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "are one setting, given twice") {
			t.Errorf("%v: exit %d, want 2 naming both flags\n%s", args, r.code, r.stderr)
		}
	}
	r := runCmd(t, env{"KAFKA_BROKERS": "127.0.0.1:1", "KAFKA_SASL_USER": "a"}, "list", "--all", "--sasl-user", "b")
	if strings.Contains(r.stderr, "given twice") {
		t.Errorf("an alias over its flag's variable: %s", r.stderr)
	}
}
