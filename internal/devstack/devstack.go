// Package devstack is the embedded default behind `make run`: an in-process
// Kafka (franz-go kfake) on 127.0.0.1:9092, a throwaway PostgreSQL (or
// DATABASE_URL), and example events that show rows being projected and each
// documented failure cause becoming a dead letter.
package devstack

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/pgserver"
	"github.com/causet/projection-worker/projection"
)

// Tenants of the example: the first is migrated, the second is migrated and
// then loses a column, the third is never migrated.
const (
	TenantProduction = "acme_concertapp_production"
	TenantStaging    = "acme_concertapp_staging"
	TenantLegacy     = "acme_concertapp_legacy"
)

// Options configure Start.
type Options struct {
	// KafkaPort is the port of the in-process broker on 127.0.0.1. Default
	// 9092 (kcat's and the worker's default); -1 picks a free port.
	KafkaPort int
	// Partitions of the events topic. Default 3.
	Partitions int32
	// DatabaseURL, when set, is used instead of a throwaway PostgreSQL.
	DatabaseURL string
	// Logf receives progress lines. Default: discarded.
	Logf func(format string, args ...any)
}

// Stack is a running embedded Kafka and PostgreSQL.
type Stack struct {
	// Brokers is the broker address ("127.0.0.1:9092").
	Brokers string
	// DatabaseURL is the PostgreSQL connection string.
	DatabaseURL string

	kafka *kfake.Cluster
	pg    *pgserver.Server
}

// Start starts the broker and, unless opts.DatabaseURL is set, a throwaway
// PostgreSQL cluster made with the machine's initdb/pg_ctl. It fails with a
// message saying what to install or free when it cannot.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.KafkaPort == 0 {
		opts.KafkaPort = 9092
	}
	if opts.KafkaPort < 0 {
		opts.KafkaPort = 0
	}
	if opts.Partitions == 0 {
		opts.Partitions = 3
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(opts.KafkaPort), kfake.DefaultNumPartitions(int(opts.Partitions)))
	if err != nil {
		return nil, kafkaPortError(opts.KafkaPort, err)
	}
	s := &Stack{Brokers: kc.ListenAddrs()[0], kafka: kc, DatabaseURL: opts.DatabaseURL}
	opts.Logf("embedded kafka (kfake) listening on %s", s.Brokers)
	if s.DatabaseURL == "" {
		pg, err := pgserver.Start(ctx, pgserver.Options{})
		if err != nil {
			kc.Close()
			return nil, fmt.Errorf("throwaway postgresql: %w (or set DATABASE_URL)", err)
		}
		s.pg = pg
		s.DatabaseURL = pg.URL()
		opts.Logf("throwaway postgresql at %s", s.DatabaseURL)
	} else {
		opts.Logf("using DATABASE_URL")
	}
	return s, nil
}

// Close stops the broker and removes the throwaway PostgreSQL.
func (s *Stack) Close() error {
	s.kafka.Close()
	if s.pg != nil {
		return s.pg.Close()
	}
	return nil
}

// Throwaway reports whether the stack's PostgreSQL is its own throwaway
// cluster (DATABASE_URL was not set).
func (s *Stack) Throwaway() bool { return s.pg != nil }

// exampleMark is the comment PrepareTenants sets on the example tenant
// schemas it makes, so that a later run changes and drops only those
// (an SQL literal as it is: no quote in it).
const exampleMark = "made by projection-worker dev (make run): changed and dropped by it"

// PrepareTenants drops the example tenant schemas an earlier run left,
// with their rows (so that every run projects the rows the README shows),
// migrates the production and staging tenants anew, drops followed_at
// from staging's artist_followers with the example definitions
// (ExampleDefinitions; so its events fail with `column "followed_at" ...
// does not exist`), not from a table of the user's own, and leaves the legacy tenant
// unmigrated (`relation ... does not exist`). Unless throwaway (the stack's own cluster), it first
// checks that every example tenant schema that exists was made by an
// earlier run (exampleMark) and returns an error naming the others:
// a database given by DATABASE_URL may hold a schema of that name with
// data of its own, which the changes above would destroy.
func PrepareTenants(ctx context.Context, pool *pgxpool.Pool, defs *projection.Definitions, throwaway bool) error {
	tenants := []string{TenantProduction, TenantStaging, TenantLegacy}
	if !throwaway {
		rows, err := pool.Query(ctx, `SELECT nspname FROM pg_catalog.pg_namespace
			WHERE nspname = ANY($1) AND pg_catalog.obj_description(oid, 'pg_namespace') IS DISTINCT FROM $2 ORDER BY nspname`,
			tenants, exampleMark)
		if err != nil {
			return fmt.Errorf("look up the example tenant schemas: %w", err)
		}
		foreign, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("look up the example tenant schemas: %w", err)
		}
		if len(foreign) > 0 {
			// The README's fix of the legacy tenant's dead letters migrates
			// it, and so makes one (operator trial): say how to drop it.
			drop := make([]string, len(foreign))
			for i, f := range foreign {
				drop[i] = pgx.Identifier{f}.Sanitize()
			}
			return fmt.Errorf("DATABASE_URL's database has schema %s, which dev did not make: dev drops its example tenant schemas and makes them anew at each start, so it stops here; unset DATABASE_URL for a throwaway PostgreSQL, or use a database without them. If a migrate after an earlier dev run made it (the README's replay example), and nothing of yours is in it, drop it: psql \"$DATABASE_URL\" -c 'DROP SCHEMA %s CASCADE'",
				strings.Join(foreign, ", "), strings.Join(drop, ", "))
		}
	}
	// An earlier run's (exampleMark, checked above): rows it or anyone
	// wrote since would change the counts the README shows (new-user
	// trial: 14 rows where it says 5). The legacy tenant stays unmigrated.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{TenantProduction}.Sanitize()+", "+
		pgx.Identifier{TenantStaging}.Sanitize()+", "+pgx.Identifier{TenantLegacy}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("reset the example tenants: %w", err)
	}
	for _, t := range tenants[:2] {
		if err := projection.Migrate(ctx, pool, defs, t); err != nil {
			return err // Migrate's error names the tenant schema
		}
		if _, err := pool.Exec(ctx, "COMMENT ON SCHEMA "+pgx.Identifier{t}.Sanitize()+" IS '"+exampleMark+"'"); err != nil {
			return fmt.Errorf("mark %s as the example's: %w", t, err)
		}
	}
	// Definitions of the user's own (--projections) keep every column
	// they define (new-user trials: dev stopped on 42P01 when they had no
	// such table, and dropped the column from one of theirs).
	if !ExampleDefinitions(defs) {
		return nil
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE acme_concertapp_staging.artist_followers DROP COLUMN IF EXISTS followed_at`); err != nil {
		return fmt.Errorf("drop column for the staging example: %w", err)
	}
	return nil
}

// ExampleDefinitions reports whether defs has the projections that the
// example events are made for (examples/projections.yaml's
// artist_followers, user_follows and artist_ratings, by name): what
// Examples says each shows holds only with them.
func ExampleDefinitions(defs *projection.Definitions) bool {
	want := map[string]bool{"artist_followers": true, "user_follows": true, "artist_ratings": true}
	for _, p := range defs.Projections {
		delete(want, p.Name)
	}
	return len(want) == 0
}

// Example is one example event and what it shows.
type Example struct {
	// Shows says what the example shows; "" when it is the next event of
	// the example before it.
	Shows string
	Key   string
	Value string
}

// Examples are the seeded events: the example event and friends, which
// project rows, and one event for each documented data failure cause.
func Examples(now time.Time) []Example {
	ts := now.UnixMilli()
	ev := func(typ, entity, tenant string, seq int64, payload string) string {
		return fmt.Sprintf(`{"eventType":%q,"entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":%d,"payload":%s}`,
			typ, entity, tenant, seq, ts, payload)
	}
	return []Example{
		{"the example event (docs/events.md): projected", "user-123", `{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":"acme_concertapp_production","irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}}`},
		{"a follow with a score: projected", "user-124", ev("ARTIST_FOLLOWED", "user-124", TenantProduction, 7, `{"user_id":"user-124","artist_id":"artist-456","points":9007199254740993,"games":1}`)},
		{"a follow then an unfollow: deleted, tombstone kept", "user-125", ev("ARTIST_FOLLOWED", "user-125", TenantProduction, 1, `{"user_id":"user-125","artist_id":"artist-789"}`)},
		{"", "user-125", ev("ARTIST_UNFOLLOWED", "user-125", TenantProduction, 2, `{"user_id":"user-125","artist_id":"artist-789"}`)},
		{"tenant whose table lacks a column: column ... does not exist (42703), retried then dead-lettered", "user-200", ev("ARTIST_FOLLOWED", "user-200", TenantStaging, 1, `{"user_id":"user-200","artist_id":"artist-456"}`)},
		{"derive returning null into a notNull column: refused before SQL, dead-lettered at once", "user-201", ev("ARTIST_RATED", "user-201", TenantProduction, 1, `{"user_id":"user-201","artist_id":"artist-456"}`)},
		{"tenant never migrated: relation ... does not exist (42P01), retried then dead-lettered", "user-202", ev("ARTIST_FOLLOWED", "user-202", TenantLegacy, 1, `{"user_id":"user-202","artist_id":"artist-456"}`)},
		{"derive dividing by zero: permanent, dead-lettered at once", "user-203", ev("ARTIST_FOLLOWED", "user-203", TenantProduction, 1, `{"user_id":"user-203","artist_id":"artist-456","points":10,"games":0}`)},
		{"not JSON: permanent, dead-lettered at once with the raw value in base64", "user-204", `this is not json`},
	}
}

// Produce writes the examples to topic and waits for the acks.
func Produce(ctx context.Context, kopts []kgo.Opt, topic string, examples []Example) error {
	cl, err := kgo.NewClient(append(kopts, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, len(examples))
	for _, e := range examples {
		recs = append(recs, &kgo.Record{Key: []byte(e.Key), Value: []byte(e.Value),
			Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("make-run")}}})
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// CheckKafkaPort reports, before Start, an error when the embedded
// Kafka's port (1-65535; other values take any free port) is taken on
// 127.0.0.1, saying how to take a free one; nil when it is free now.
func CheckKafkaPort(port int) error {
	if port <= 0 {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return kafkaPortError(port, err)
	}
	return ln.Close()
}

// kafkaPortError is the error for the embedded Kafka's port taken.
func kafkaPortError(port int, err error) error {
	return fmt.Errorf("embedded kafka on 127.0.0.1:%d: %w (is another broker or `make run` already listening there? --kafka-port 0 takes any free port)", port, err)
}
