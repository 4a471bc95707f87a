package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// noSecret fails t when text, printed at where, holds one of secrets.
func noSecret(t *testing.T, where, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s holds the secret %q:\n%s", where, s, text)
		}
	}
}

// TestNoPasswordInUsageErrors: a connection string pgx cannot parse, or
// parses with part of the password as the host (an unencoded '@'), is a
// usage error of run and migrate that names DATABASE_URL and holds no part
// of the password (issue 14: pgx printed some of them whole).
func TestNoPasswordInUsageErrors(t *testing.T) {
	clearSettingsEnv(t)
	noKafka := closedAddr(t)
	db := closedAddr(t)
	host, port, _ := strings.Cut(db, ":")
	tests := []struct {
		name, connString string
		secrets          []string
	}{
		{"URL, unencoded '@' in the password", "postgres://u:Sekr@t-7Hq2@" + db + "/postgres?sslmode=disable", []string{"Sekr@t-7Hq2", "t-7Hq2"}},
		{"URL, unencoded '/' in the password", "postgres://u:Slsh1/ash-88Qz@" + db + "/postgres", []string{"Slsh1", "ash-88Qz"}},
		{"URL, password parameter and a bad sslmode", "postgres://u@" + db + "/postgres?password=Qry-pw-3311&sslmode=bogus", []string{"Qry-pw-3311"}},
		{"key=value, spaces around = and a typo", "host=" + host + " port=" + port + " user=u password = Kv-Spaced-5521 dbname=postgres sslmode=disabel", []string{"Kv-Spaced-5521"}},
		{"key=value, unquoted password with a space", "host=" + host + " port=" + port + " user=u password=Half1-pw Half2-pw dbname=postgres", []string{"Half1-pw", "Half2-pw"}},
	}
	for _, tt := range tests {
		for _, args := range [][]string{
			{"run", "--brokers", noKafka, "--projections", exampleProjections, "--http-addr", "", "--log-level", "debug", "--database-url", tt.connString},
			{"migrate", "--projections", exampleProjections, "--tenant-schema", "t1", "--log-level", "debug", "--database-url", tt.connString},
		} {
			t.Run(args[0]+" "+tt.name, func(t *testing.T) {
				r := runCmd(t, 30*time.Second, args...)
				if r.code != 2 || !strings.Contains(r.stderr, "DATABASE_URL") {
					t.Errorf("want exit 2 naming DATABASE_URL\n%s", r)
				}
				noSecret(t, "the output", r.stdout+r.stderr, tt.secrets...)
			})
		}
	}
}

// TestNoPasswordInAnyOutput: with every accepted form of connection string
// (URL, percent-encoded, key=value with spaces around '=', quoted,
// PGPASSWORD, the passfile) and a role the database refuses once the worker
// has started (made NOLOGIN, its sessions ended), `run` logs (debug level),
// answers /readyz and /metrics and writes dead letters; then `run` ends its
// start on the refusal (status 1) and `migrate` fails; none of it holds
// the database password or the Kafka SASL password.
func TestNoPasswordInAnyOutput(t *testing.T) {
	clearSettingsEnv(t)
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	pg, err := pgconn.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	// The role the worker connects as: allowed to log in at start (a
	// refusal then ends the start), refused once the worker runs.
	pool := pgtest.Pool(t)
	role := pgtest.NewSchemaName(t) // a fresh name, as a role's
	if _, err := pool.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN SUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	refuse := func(t *testing.T) {
		t.Helper()
		for _, sql := range []string{"ALTER ROLE " + role + " NOLOGIN",
			"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + role + "'"} {
			if _, err := pool.Exec(context.Background(), sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	hostPort := fmt.Sprintf("%s:%d", pg.Host, pg.Port)
	kv := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", pg.Host, pg.Port, role, pg.Database)

	tests := []struct {
		name, connString string
		env              map[string]string // set for the run; "passfile" is written as the passfile
		secrets          []string
	}{
		{name: "URL", connString: "postgres://" + role + ":Url-Run-pw-4417@" + hostPort + "/" + pg.Database + "?sslmode=disable",
			secrets: []string{"Url-Run-pw-4417"}},
		{name: "URL, percent-encoded '@'", connString: "postgres://" + role + ":Enc%40Run-pw-5150@" + hostPort + "/" + pg.Database + "?sslmode=disable",
			secrets: []string{"Enc%40Run-pw-5150", "Enc@Run-pw-5150"}},
		{name: "key=value, spaces around =", connString: kv + " password = Kv-Run-pw-1234", secrets: []string{"Kv-Run-pw-1234"}},
		{name: "key=value, quoted with a space", connString: kv + " password='Kv Quoted-6621'", secrets: []string{"Kv Quoted-6621"}},
		{name: "PGPASSWORD", connString: kv, env: map[string]string{"PGPASSWORD": "Env-Run-pw-7781"}, secrets: []string{"Env-Run-pw-7781"}},
		{name: "passfile", connString: kv, env: map[string]string{"passfile": fmt.Sprintf("*:*:*:%s:File-Run-pw-9912\n", role)},
			secrets: []string{"File-Run-pw-9912"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := pool.Exec(context.Background(), "ALTER ROLE "+role+" LOGIN"); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.env {
				if k == "passfile" {
					p := filepath.Join(t.TempDir(), "pgpass")
					if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
						t.Fatal(err)
					}
					t.Setenv("PGPASSFILE", p)
					continue
				}
				t.Setenv(k, v)
			}
			secrets := append([]string{saslPassword}, tt.secrets...)

			b := kafkatest.Fake(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "worker", saslPassword))
			sasl := kgo.SASL(scram.Auth{User: "worker", Pass: saslPassword}.AsSha512Mechanism())
			events, dlqTopic := kafkatest.TopicName(t, "events"), kafkatest.TopicName(t, "dlq")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			w := startRun(t, "--brokers", strings.Join(b.Addrs, ","), "--database-url", tt.connString,
				"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "worker", "--kafka-sasl-password", saslPassword,
				"--projections", exampleProjections, "--topic", events, "--dlq-topic", dlqTopic,
				"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"), "--partitions", "1",
				"--on-infra-error", "dlq", "--max-retries", "1", "--retry-initial", "10ms", "--retry-max-interval", "20ms",
				"--log-level", "debug")
			w.waitFor(t, "the worker is up", 30*time.Second, func() bool { return w.logged("projection worker started") })
			refuse(t)
			prod := b.Client(t, sasl, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("user-123"), Value: []byte(fmt.Sprintf(specExample, "redact_tenant"))}).FirstErr(); err != nil {
				t.Fatal(err)
			}

			cons := b.Client(t, sasl, kgo.ConsumeTopics(dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			var deadLetters strings.Builder
			for deadLetters.Len() == 0 {
				fetches := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("no dead letter\nstderr:\n%s", w.stderr.String())
				}
				fetches.EachRecord(func(r *kgo.Record) {
					deadLetters.Write(r.Value)
					for _, h := range r.Headers {
						fmt.Fprintf(&deadLetters, "\n%s: %s", h.Key, h.Value)
					}
				})
			}
			// An event carrying the password as a value it is refused
			// for: its dead letter keeps the event as it is, but the
			// error and stackTrace the worker writes mask it, inner
			// errors of the chain too (second new-user trial: the
			// stackTrace repeated the ValidationError unmasked).
			carried := tt.secrets[len(tt.secrets)-1]
			bad := strings.Replace(fmt.Sprintf(specExample, "redact_tenant"), `"sequenceNumber":1891`, `"sequenceNumber":`+strconv.Quote(carried), 1)
			if !strings.Contains(bad, carried) {
				t.Fatalf("the event does not carry the password: %s", bad)
			}
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("user-carrier"), Value: []byte(bad)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			var refused dlq.Message
			for refused.Error == "" {
				fetches := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("no dead letter of the event carrying the password\nstderr:\n%s", w.stderr.String())
				}
				fetches.EachRecord(func(r *kgo.Record) {
					if string(r.Key) == "user-carrier" {
						if err := json.Unmarshal(r.Value, &refused); err != nil {
							t.Fatal(err)
						}
					}
				})
			}
			if !strings.Contains(refused.StackTrace, "sequenceNumber") {
				t.Errorf("the dead letter's stackTrace does not show the refusal: %s", refused.StackTrace)
			}
			noSecret(t, "the error of the dead letter of an event carrying the password", refused.Error, secrets...)
			noSecret(t, "the stackTrace of the dead letter of an event carrying the password", refused.StackTrace, secrets...)
			readyz, metrics := w.get(t, "/readyz"), w.get(t, "/metrics")
			w.shutdown(t)
			if !strings.Contains(deadLetters.String(), role) || !strings.Contains(readyz, role) {
				t.Errorf("want the refused role %s named in the dead letter and /readyz (the test must see the database error)\ndead letter:\n%s\n/readyz: %s",
					role, deadLetters.String(), readyz)
			}
			if !strings.Contains(w.stderr.String(), "level=DEBUG") {
				t.Errorf("no debug line logged\nstderr:\n%s", w.stderr.String())
			}
			noSecret(t, "the log", w.stderr.String()+w.stdout.String(), secrets...)
			noSecret(t, "/readyz", readyz, secrets...)
			noSecret(t, "/metrics", metrics, secrets...)
			noSecret(t, "the dead letter", deadLetters.String(), secrets...)

			r := runCmd(t, 30*time.Second, "run", "--database-url", tt.connString, "--http-addr", closedAddr(t),
				"--brokers", strings.Join(b.Addrs, ","), "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "worker", "--kafka-sasl-password", saslPassword,
				"--projections", exampleProjections, "--topic", events, "--dlq-topic", dlqTopic,
				"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"))
			if r.code != 1 || !strings.Contains(r.stderr, "the database refuses the connection") || !strings.Contains(r.stderr, role) {
				t.Errorf("run with the refused role: want exit 1 naming the refusal and the role\n%s", r)
			}
			noSecret(t, "run's output at a refused start", r.stdout+r.stderr, secrets...)

			m := runCmd(t, 30*time.Second, "migrate", "--database-url", tt.connString, "--projections", exampleProjections, "--tenant-schema", "redact_tenant")
			if m.code != 1 || !strings.Contains(m.stderr, role) {
				t.Errorf("migrate: want exit 1 naming the refused role\n%s", m)
			}
			noSecret(t, "migrate's output", m.stdout+m.stderr, secrets...)
		})
	}
}
