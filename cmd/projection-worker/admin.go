package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/projection"
)

// runMigrate creates the schema, tables and missing columns of the loaded
// definitions in every --tenant-schema. Its error is redacted of the
// database password.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var s settings
	fs := migrateFlags(&s, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// --grant takes one role: a second one used to drop the first without
	// a word, the role then failing on privileges at run (new-user trial);
	// so does every flag of one value (fresh-user trial: a second
	// --database-url or --projections was taken without a word).
	if err := fs.Repeated(args, fs.Singles()...); err != nil {
		return err
	}
	// PostgreSQL reserves pg_ role names for its built-in roles, which are
	// not a worker's login role (new-user trial: --grant pg_read_all_data
	// gave every member of that read-only role INSERT and DELETE).
	if strings.HasPrefix(strings.ToLower(s.grantRole), "pg_") {
		return flagenv.Usagef("--grant %q: a built-in PostgreSQL role (pg_ names are reserved for them); name the role that run connects as", s.grantRole)
	}
	if _, err := s.logger(io.Discard); err != nil {
		return err // checked as run checks it (second new-user trial: "verbose" taken)
	}
	defer func() { err = s.redactor().Error(err) }()
	if err := s.requireDatabase(); err != nil {
		return err
	}
	if err := s.requireProjections(); err != nil {
		return err
	}
	if len(s.tenantSchemas) == 0 {
		return flagenv.Usagef("--tenant-schema (TENANT_SCHEMAS) is required (repeat the flag for several tenants; the variable is comma-separated)")
	}
	// A tenant schema given twice is migrated once (new-user trial: twice,
	// with its line printed twice).
	s.tenantSchemas = uniqueInOrder(s.tenantSchemas)
	tenants, err := s.tenantSchemaSet()
	if err != nil {
		return err
	}
	for _, t := range s.tenantSchemas {
		var ve *projection.ValidationError
		if err := tenants.Check(t); errors.As(err, &ve) {
			reason := ve.Reason
			if projection.ValidTenantSchema(t) { // valid, so the pattern refused it
				reason += " (--tenant-schema-pattern, TENANT_SCHEMA_PATTERN)"
			}
			if strings.Contains(t, ",") { // new-user trial: --tenant-schema t1,t2
				reason += "; one tenant schema per --tenant-schema: repeat the flag for several (TENANT_SCHEMAS is comma-separated)"
			}
			if strings.Contains(reason, `, got "`) { // the reason quotes the value
				return flagenv.Usagef("--tenant-schema: %s", reason)
			}
			return flagenv.Usagef("--tenant-schema %q: %s", t, reason)
		}
	}
	defs, _, err := loadProjections(s.projections)
	if err != nil {
		return err
	}
	pool, err := newPool(ctx, s.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		// As run says it (fresh-user trial: migrate gave the driver's
		// error alone, run named --database-url).
		if refused := refusedConnection(err); refused != nil {
			return refused
		}
		return fmt.Errorf("the database does not answer: check --database-url (DATABASE_URL) and the database; the driver's error: %w", err)
	}
	if s.grantRole != "" {
		// Before any schema is migrated: a role that does not exist would
		// leave them migrated and not granted.
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)", s.grantRole).Scan(&exists); err != nil {
			return fmt.Errorf("look up role %s: %w", s.grantRole, err)
		}
		if !exists {
			return flagenv.Usagef("--grant %q: no such role in the database (create it first: CREATE ROLE ... LOGIN); nothing was migrated", s.grantRole)
		}
	}
	var blocked []string // tenant schemas whose tables the worker cannot write
	for i, t := range s.tenantSchemas {
		if err := migrateTenant(ctx, pool, defs, t, s.grantRole, stdout); err != nil {
			if rest := s.tenantSchemas[i+1:]; len(rest) > 0 {
				// Say what was not reached (second new-user trial: the
				// later tenants were left out silently).
				err = fmt.Errorf("%w; not migrated, after it: %s", err, strings.Join(rest, ", "))
			}
			return err
		}
		if blocks, err := reportDrift(ctx, pool, defs, t, stdout); err != nil {
			return err
		} else if blocks {
			blocked = append(blocked, t)
		}
	}
	if len(blocked) > 0 {
		return fmt.Errorf("the worker cannot write some tables of tenant schema %s (the error lines above say which and what to do); migrate changes no primary key, column or view", strings.Join(blocked, ", "))
	}
	return nil
}

// migrateTenant migrates tenant schema t and, with role, grants it what
// run needs, printing a line for each.
func migrateTenant(ctx context.Context, pool *pgxpool.Pool, defs *projection.Definitions, t, role string, stdout io.Writer) error {
	changes, err := projection.MigrateChanges(ctx, pool, defs, t)
	if err != nil {
		return err // its error names the tenant schema
	}
	if len(changes) == 0 {
		// Said apart (new-user trial: "migrated" when nothing was).
		fmt.Fprintf(stdout, "tenant schema %s: no table or column to add for IR %s (%s)\n", t, defs.IRVersion, plural(len(defs.Projections), "projection"))
	} else {
		fmt.Fprintf(stdout, "migrated tenant schema %s to IR %s (%s): %s\n", t, defs.IRVersion, plural(len(defs.Projections), "projection"), strings.Join(changes, "; "))
	}
	if role == "" {
		return nil
	}
	stmts, err := projection.GrantSQL(defs, t, role)
	if err != nil {
		return err
	}
	for _, stmt := range stmts {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("grant %s on tenant schema %s: %w", role, t, err)
		}
	}
	fmt.Fprintf(stdout, "granted %s what run needs in tenant schema %s\n", role, t)
	return nil
}

// reportDrift prints what migrate left as it is in tenant schema t
// (projection.Drift), said rather than left silent (new-user trials: a
// type or a primary key changed in the file, "migrated", the table
// unchanged): a warning line for what the worker copes with, an error line
// for what it cannot write at all, which it reports (blocks).
func reportDrift(ctx context.Context, pool *pgxpool.Pool, defs *projection.Definitions, t string, stdout io.Writer) (blocks bool, err error) {
	drift, err := projection.Drift(ctx, pool, defs, t)
	if err != nil {
		return false, err
	}
	for _, d := range drift {
		level := "warning"
		if d.Blocks {
			level, blocks = "error", true
		}
		fmt.Fprintf(stdout, "%s: tenant schema %s: %s\n", level, t, d)
	}
	return blocks, nil
}

// runTopics creates the events, dead-letter and ledger topics.
func runTopics(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := topicsFlags(&s, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := fs.Repeated(args, fs.Singles()...); err != nil {
		return err // as migrate: a command that changes things takes no guess
	}
	if _, err := s.logger(io.Discard); err != nil {
		return err // checked as run checks it (second new-user trial: "verbose" taken)
	}
	partitionsGiven := fs.Given("partitions")
	cfg, err := s.topicConfig()
	if err != nil {
		return err
	}
	kopts, err := s.kafka.Opts()
	if err != nil {
		return fs.WithEnv(err) // named as run names it (final fresh-user check)
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafkaconn.Closed(tctx, cl); err != nil {
		return topicsError(err, s.kafka.Brokers)
	}
	rep, err := dlq.EnsureTopics(tctx, kadm.NewClient(cl), cfg)
	if err != nil {
		return topicsError(err, s.kafka.Brokers)
	}
	for _, t := range rep.Created {
		fmt.Fprintf(stdout, "created %s\n", t)
	}
	fmt.Fprintf(stdout, "%s: %d partitions; %s: %d partitions, retention %s, max.message.bytes %d; %s: compacted ledger\n",
		cfg.EventsTopic, rep.EventsPartitions, cfg.DLQTopic, rep.DLQPartitions, retentionText(rep.DLQRetention), rep.DLQMaxMessageBytes, cfg.LedgerTopic)
	if rep.DLQRetentionTooShort {
		fmt.Fprintf(stdout, "WARNING: %s keeps less than 30 days; set retention.ms >= %d\n", cfg.DLQTopic, dlq.MinRetention.Milliseconds())
	}
	if partitionsGiven && !slices.Contains(rep.Created, cfg.EventsTopic) && rep.EventsPartitions != int(cfg.Partitions) {
		// --partitions makes topics; it changes none that exists
		// (new-user trial: said nothing).
		fmt.Fprintf(stdout, "NOTE: %s existed with %d partitions and is left so; --partitions %d applies to topics this command creates (add partitions with your Kafka tooling; records of a key then go to another partition)\n",
			cfg.EventsTopic, rep.EventsPartitions, cfg.Partitions)
	}
	return nil
}

func retentionText(d time.Duration) string {
	if d < 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%s (%d ms)", d, d.Milliseconds())
}

// runValidate checks a definitions file: exit 0 when it loads, 2 with the
// problem named otherwise (a definitions file is configuration: see
// exitCode).
func runValidate(args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := flagenv.New("projection-worker validate", stderr)
	s.registerProjections(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if n := fs.Counts(args)["projections"]; n > 1 {
		// The last would be checked alone, and its "ok" read as every
		// file's (new-user trial: an invalid first file went unsaid).
		return flagenv.Usagef("--projections given %d times: validate checks one definitions file; run it once for each", n)
	}
	if err := s.requireProjections(); err != nil {
		return err
	}
	defs, handlers, err := loadProjections(s.projections)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: IR %s, %s: ok\n", s.projections, defs.IRVersion, plural(len(handlers), "projection"))
	return nil
}

// uniqueInOrder returns ss without its repeats, in the order of their
// first appearance.
func uniqueInOrder(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, v := range ss {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
