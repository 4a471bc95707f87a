package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/internal/logdur"
	"github.com/causet/projection-worker/internal/redact"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// settings are the flags of every command; each command registers the ones
// it uses.
type settings struct {
	kafka       kafkaconn.Settings
	databaseURL string
	projections string
	topic       string
	dlqTopic    string
	ledgerTopic string
	partitions  int
	logFormat   string
	logLevel    string

	// run
	group              string
	groupInstanceID    string
	sessionTimeout     time.Duration
	kafkaStartTimeout  time.Duration
	maxRetries         int
	retryInitial       time.Duration
	retryMax           time.Duration
	dbWaitMax          time.Duration
	onInfraError       string
	shutdownGrace      time.Duration
	httpAddr           string
	pprof              bool
	workerID           string
	dlqMaxBytes        int
	dlqTimeout         time.Duration
	createTopics       bool
	maxPollRecords     int
	maxBatch           int
	maxQueuedBytes     int
	fetchMaxBytes      int
	fetchMaxPartBytes  int
	copyMinRows        int
	maxRetrying        int
	maxRetryBytes      int
	breaker            projection.BreakerConfig
	failureLogInterval time.Duration
	spanQueue          int
	traceEveryPair     bool
	maxTenants         int
	grantRole          string // migrate --grant

	// quietKgo logs kgo's INFO lines at DEBUG (dev; no flag).
	quietKgo bool
	// embedded is set on the embedded stack (dev; no flag), whose topics
	// are new every run.
	embedded bool

	// run and migrate
	tenantSchemaPattern string

	// migrate
	tenantSchemas []string
}

// registerCommon registers --log-format (default json, the format of a
// deployed worker's collectors) and --log-level.
func (s *settings) registerCommon(fs *flagenv.Set) {
	s.registerLog(fs, "json")
}

// registerLog registers --log-format with its default and --log-level.
func (s *settings) registerLog(fs *flagenv.Set, format string) {
	fs.String(&s.logFormat, "log-format", "LOG_FORMAT", format, "log format: json or text")
	fs.String(&s.logLevel, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn or error")
}

func (s *settings) registerKafka(fs *flagenv.Set) {
	s.kafka.Register(fs)
	fs.String(&s.topic, "topic", "EVENTS_TOPIC", projection.DefaultEventsTopic, "events topic")
	fs.String(&s.dlqTopic, "dlq-topic", "DLQ_TOPIC", dlq.DefaultTopic, "dead-letter topic")
	fs.String(&s.ledgerTopic, "ledger-topic", "LEDGER_TOPIC", dlq.DefaultLedgerTopic, "replay ledger topic (compacted)")
	fs.Int(&s.partitions, "partitions", "EVENTS_PARTITIONS", 8, "partitions of the events topic when it has to be created")
}

func (s *settings) registerDatabase(fs *flagenv.Set) {
	fs.String(&s.databaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL connection string (postgres://user:pass@host:5432/db?sslmode=verify-full); TLS is set here")
}

func (s *settings) registerProjections(fs *flagenv.Set) {
	fs.String(&s.projections, "projections", "PROJECTIONS_FILE", "", "projection definitions file (YAML or JSON)")
}

func (s *settings) registerRun(fs *flagenv.Set) {
	def := retry.DefaultPolicy()
	host, _ := os.Hostname()
	fs.String(&s.group, "group", "CONSUMER_GROUP", projection.DefaultGroup, "consumer group")
	fs.Duration(&s.kafkaStartTimeout, "kafka-start-timeout", "KAFKA_START_TIMEOUT", defaultKafkaStartTimeout,
		"how long run retries, at start, to reach a broker of --brokers (1s, doubling up to 10s) before it exits with status 4 (0: try once); keep it under the startup probe's window")
	fs.String(&s.groupInstanceID, "group-instance-id", "GROUP_INSTANCE_ID", "",
		"static membership (Kafka's group.instance.id): a name that stays this worker's across restarts, such as a StatefulSet pod's; a restart within --session-timeout keeps its partitions without a rebalance. Not a Deployment's pod name, which changes on each rollout (default: none, dynamic membership)")
	fs.Duration(&s.sessionTimeout, "session-timeout", "SESSION_TIMEOUT", defaultSessionTimeout,
		"time without heartbeats after which Kafka removes this worker from the group and rebalances ("+minSessionTimeout.String()+" to "+maxSessionTimeout.String()+", the broker's default bounds)")
	fs.Int(&s.maxRetries, "max-retries", "MAX_RETRIES", def.MaxRetries, "retries of a failing (event, projection) pair before it is dead-lettered")
	fs.Duration(&s.retryInitial, "retry-initial", "RETRY_INITIAL", def.Initial, "first retry wait (doubles each retry, with jitter); at least "+minRetryWait.String())
	fs.Duration(&s.retryMax, "retry-max-interval", "RETRY_MAX_INTERVAL", def.MaxInterval, "longest retry wait before jitter (a wait is at most 1.5× it); at most 24h")
	fs.Duration(&s.dbWaitMax, "database-wait-max-interval", "DATABASE_WAIT_MAX_INTERVAL", projection.DefaultDatabaseWait().MaxInterval,
		"longest wait between a paused partition's attempts while the database is unavailable (--on-infra-error pause): it resumes within 1.5× this of the database answering; at least "+minDatabaseWait.String())
	fs.String(&s.onInfraError, "on-infra-error", "ON_INFRA_ERROR", string(projection.InfraPause), "when the database is unavailable: pause (wait, not ready) or dlq (retry, then dead-letter)")
	fs.Duration(&s.shutdownGrace, "shutdown-grace", "SHUTDOWN_GRACE", projection.DefaultShutdownGrace, "time allowed after SIGTERM to commit and leave the group; at least "+minShutdownGrace.String())
	fs.String(&s.httpAddr, "http-addr", "HTTP_ADDR", ":8080", "address of /healthz, /readyz and /metrics (empty: no HTTP server)")
	fs.Bool(&s.pprof, "pprof", "PPROF", false, "also serve Go's profiles (net/http/pprof) under /debug/pprof/ on --http-addr: CPU, heap, goroutines; they show the process's internals, so keep that address private")
	fs.String(&s.workerID, "worker-id", "POD_NAME", host, "this worker's name in dead-letter headers")
	fs.Int(&s.dlqMaxBytes, "dlq-max-bytes", "DLQ_MAX_BYTES", 0, "largest dead-letter record in bytes; larger ones truncate stackTrace, then error (default: the dead-letter topic's max.message.bytes, read at start, else 1000000)")
	fs.Duration(&s.dlqTimeout, "dlq-write-timeout", "DLQ_WRITE_TIMEOUT", dlq.DefaultAttemptTimeout, "longest wait for Kafka to acknowledge one dead-letter write attempt; after 5 failed attempts (about 5x this) the partition is reported stuck in /readyz; at least "+minDLQWriteTimeout.String())
	fs.Bool(&s.createTopics, "create-topics", "CREATE_TOPICS", true, "create missing topics at start (false: only check them; a missing events or dead-letter topic is an error)")
	fs.Int(&s.maxPollRecords, "max-poll-records", "MAX_POLL_RECORDS", projection.DefaultMaxPollRecords, "records taken per poll")
	fs.Int(&s.maxQueuedBytes, "max-queued-bytes", "MAX_QUEUED_BYTES", projection.DefaultMaxQueuedBytes, "record bytes polled but not yet applied, all partitions together; bounds memory")
	fs.Int(&s.fetchMaxBytes, "fetch-max-bytes", "FETCH_MAX_BYTES", projection.DefaultFetchMaxBytes,
		"most record bytes one fetch from one broker returns (Kafka's fetch.max.bytes), as the broker stores them, compressed; the client holds about one fetch per broker, decompressed")
	fs.Int(&s.fetchMaxPartBytes, "fetch-max-partition-bytes", "FETCH_MAX_PARTITION_BYTES", projection.DefaultFetchMaxPartitionBytes,
		"most record bytes one fetch returns for one partition (Kafka's max.partition.fetch.bytes), compressed; lower it for records that compress well (a batch larger than it still comes whole)")
	fs.Int(&s.copyMinRows, "copy-min-rows", "COPY_MIN_ROWS", 32, "apply a batch's upserts of one table and tenant with COPY when there are at least this many (-1: never)")
	fs.Int(&s.maxBatch, "max-batch-records", "MAX_BATCH_RECORDS", projection.DefaultMaxBatchRecords, "records of one partition applied in one transaction (1: one at a time)")
	fs.Int(&s.maxRetrying, "max-retrying", "MAX_RETRYING", projection.DefaultMaxRetrying, "failed pairs of one partition that wait for a retry while later records go on; at the bound the partition pauses")
	fs.Int(&s.maxRetryBytes, "max-retrying-bytes", "MAX_RETRYING_BYTES", projection.DefaultMaxRetryingByte, "record bytes held by the pairs waiting for a retry, all partitions together; at the bound a partition holding some pauses")
	fs.Int(&s.breaker.Threshold, "breaker-threshold", "BREAKER_THRESHOLD", projection.DefaultBreakerThreshold, "pairs of one failure fingerprint that exhaust their retries within --breaker-window before later ones are dead-lettered at once (-1: no breaker, and no retry slots)")
	fs.Duration(&s.breaker.Window, "breaker-window", "BREAKER_WINDOW", projection.DefaultBreakerWindow, "window in which --breaker-threshold exhausted pairs open a fingerprint's breaker; at least "+minBreakerWindow.String())
	fs.Duration(&s.breaker.ProbeInterval, "breaker-probe-interval", "BREAKER_PROBE_INTERVAL", projection.DefaultBreakerProbeInterval, "how often an open breaker still retries one pair in full; its success closes the breaker; at least "+minBreakerWindow.String())
	fs.Int(&s.spanQueue, "trace-queue-size", "OTEL_BSP_MAX_QUEUE_SIZE", DefaultSpanQueueSize, "spans waiting for OTLP export, at most 1048576; when full, new spans are dropped (and counted)")
	fs.Bool(&s.traceEveryPair, "trace-every-pair", "TRACE_EVERY_PAIR", false, "a span for every (event, projection) pair, not only for the pairs that failed an attempt (about 3x the spans)")
	fs.Duration(&s.failureLogInterval, "failure-log-interval", "FAILURE_LOG_INTERVAL", projection.DefaultFailureLogInterval, "interval over which the WARN lines of failing pairs are aggregated per failure fingerprint: the first in full, the repeats as one line with their count")
	fs.Int(&s.maxTenants, "metrics-max-tenants", "METRICS_MAX_TENANTS", projection.DefaultMaxTenantSchemas,
		"tenant schemas that get their own tenant_schema label in /metrics (the first ones seen); later ones are counted under \""+projection.OtherTenantSchemas+"\" (0: every tenant under it)")
	s.registerTenantSchemaPattern(fs)
}

// metricsConfig returns the bounds of the worker's metrics.
// spanLinkLimit is the most links a span keeps: a batch transaction's span
// links each record of its batch (--max-batch-records), a retry round
// trip's each record of its pairs, up to a partition's waiting pairs
// (--max-retrying).
func (s *settings) spanLinkLimit() int { return max(s.maxBatch, s.maxRetrying) }

func (s *settings) metricsConfig() projection.MetricsConfig {
	if s.maxTenants == 0 {
		return projection.MetricsConfig{MaxTenantSchemas: -1}
	}
	return projection.MetricsConfig{MaxTenantSchemas: s.maxTenants}
}

func (s *settings) registerTenantSchemaPattern(fs *flagenv.Set) {
	fs.String(&s.tenantSchemaPattern, "tenant-schema-pattern", "TENANT_SCHEMA_PATTERN", "",
		"Go RE2 regexp a tenant schema must match as a whole, besides ^[a-z_][a-z0-9_]{0,62}$ and not being public, information_schema or pg_* (default: none)")
}

// tenantSchemaSet returns the tenant schemas --tenant-schema-pattern
// accepts (nil: no narrowing), or a usage error when it does not compile
// or matches no valid tenant schema (projection.ErrNoTenantSchema).
func (s *settings) tenantSchemaSet() (*projection.TenantSchemas, error) {
	t, err := projection.NewTenantSchemas(s.tenantSchemaPattern)
	switch {
	case errors.Is(err, projection.ErrNoTenantSchema):
		return nil, flagenv.Usagef("--tenant-schema-pattern (TENANT_SCHEMA_PATTERN) %q: %v", s.tenantSchemaPattern, err)
	case err != nil:
		return nil, flagenv.Usagef("--tenant-schema-pattern (TENANT_SCHEMA_PATTERN) %q does not compile: %v", s.tenantSchemaPattern, err)
	}
	return t, nil
}

// runFlags returns the flag set of `run`, bound to s.
func runFlags(s *settings, stderr io.Writer) *flagenv.Set {
	fs := flagenv.New("projection-worker run", stderr)
	s.registerCommon(fs)
	s.registerKafka(fs)
	s.registerDatabase(fs)
	s.registerProjections(fs)
	s.registerRun(fs)
	return fs
}

// migrateFlags returns the flag set of `migrate`, bound to s.
func migrateFlags(s *settings, stderr io.Writer) *flagenv.Set {
	fs := flagenv.New("projection-worker migrate", stderr)
	s.registerCommon(fs)
	s.registerDatabase(fs)
	s.registerProjections(fs)
	fs.Strings(&s.tenantSchemas, "tenant-schema", "TENANT_SCHEMAS", "tenant schema to migrate (repeatable; env: comma-separated)")
	fs.String(&s.grantRole, "grant", "MIGRATE_GRANT", "", "role to grant what run needs in each tenant schema: USAGE on the schema, SELECT, INSERT, UPDATE, DELETE on its projection tables and _causet_tombstones (default: grant nothing)")
	s.registerTenantSchemaPattern(fs)
	return fs
}

// topicsFlags returns the flag set of `topics`, bound to s.
func topicsFlags(s *settings, stderr io.Writer) *flagenv.Set {
	fs := flagenv.New("projection-worker topics", stderr)
	s.registerCommon(fs)
	s.registerKafka(fs)
	return fs
}

// logger returns the slog logger the flags ask for.
func (s *settings) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return nil, flagenv.Usagef("--log-level (LOG_LEVEL): %q is not debug, info, warn or error", s.logLevel)
	}
	opts := logdur.Options(level)
	switch strings.ToLower(s.logFormat) {
	case "json":
		return slog.New(traceContextHandler{slog.NewJSONHandler(w, opts)}), nil
	case "text":
		return slog.New(traceContextHandler{slog.NewTextHandler(w, opts)}), nil
	default:
		return nil, flagenv.Usagef("--log-format (LOG_FORMAT): %q is not json or text", s.logFormat)
	}
}

// maxRetryWait is the largest --retry-max-interval: 24 h.
const maxRetryWait = 24 * time.Hour

// The smallest durations the flags take. Below them the setting does not
// do what its flag says (new-user trial: 1ns was accepted for each):
//   - minRetryWait, --retry-initial: 1 ms; shorter, a pair's retries are
//     spent at once, with no backoff;
//   - minDLQWriteTimeout, --dlq-write-timeout: 100 ms; a produce with
//     acks=all takes a round trip to the leader and its in-sync replicas
//     (a bound near that fails attempts that would succeed), and the
//     committed offset does not move past a dead letter until a write of
//     it is acknowledged;
//   - minShutdownGrace, --shutdown-grace: 1 s, to commit and leave the
//     group (Kubernetes gives 30 s by default);
//   - minBreakerWindow, --breaker-window and --breaker-probe-interval: 1 s;
//     --breaker-threshold pairs exhausting their retries within less
//     hardly ever happens, so the breaker would hardly ever open
//     (--breaker-threshold -1 turns it off), and a probe is a pair retried
//     in full, which takes longer than that with the default policy;
//   - minDatabaseWait, --database-wait-max-interval: 100 ms (second
//     trial: 1ns kept a core busy for as long as the database was down).
const (
	minRetryWait       = time.Millisecond
	minDLQWriteTimeout = 100 * time.Millisecond
	minShutdownGrace   = time.Second
	minBreakerWindow   = time.Second
	minDatabaseWait    = 100 * time.Millisecond
)

// atLeast returns nil when d, the value of flag ("--name (ENV)"), is at
// least floor, else the usage error that says so and why.
func atLeast(flag string, d, floor time.Duration, why string) error {
	if d >= floor {
		return nil
	}
	return flagenv.Usagef("%s must be at least %s (%s), got %s", flag, floor, why, d)
}

// maxSpanQueue is the largest --trace-queue-size: 1 048 576 spans (the
// SDK allocates the queue whole at start; a span waiting in it takes
// about 1 KiB).
const maxSpanQueue = 1 << 20

// retryPolicy returns the retry policy of the flags, or a usage error.
func (s *settings) retryPolicy() (retry.Policy, error) {
	p := retry.DefaultPolicy()
	p.MaxRetries = s.maxRetries
	p.Initial = s.retryInitial
	p.MaxInterval = s.retryMax
	// Before Validate, whose "> 0" is not the limit (trial).
	if err := atLeast("--retry-initial (RETRY_INITIAL)", p.Initial, minRetryWait, "shorter, the retries are spent at once, with no backoff"); err != nil {
		return p, err
	}
	if err := p.Validate(); err != nil {
		// The flag of the field Validate refused, in its order; an initial
		// wait above the maximum is the initial flag's fault when the
		// maximum is the default (trial: --retry-initial 1h alone blamed
		// --retry-max-interval).
		flag := "--max-retries (MAX_RETRIES)"
		switch {
		case p.Initial <= 0:
			flag = "--retry-initial (RETRY_INITIAL)"
		case p.MaxInterval < p.Initial && p.MaxInterval == retry.DefaultPolicy().MaxInterval:
			flag = "--retry-initial (RETRY_INITIAL)"
		case p.MaxInterval < p.Initial:
			flag = "--retry-max-interval (RETRY_MAX_INTERVAL)"
		}
		return p, flagenv.Usagef("%s: %v", flag, err)
	}
	if p.MaxInterval > maxRetryWait {
		// Jitter multiplies the wait: far beyond this it overflows to a
		// negative wait, which retries at once.
		return p, flagenv.Usagef("--retry-max-interval (RETRY_MAX_INTERVAL) must be at most %s, got %s", maxRetryWait, p.MaxInterval)
	}
	return p, nil
}

// databaseWait returns the policy of a paused partition's attempts
// (projection.DefaultDatabaseWait with --database-wait-max-interval), or a
// usage error.
func (s *settings) databaseWait() (retry.Policy, error) {
	if err := atLeast("--database-wait-max-interval (DATABASE_WAIT_MAX_INTERVAL)", s.dbWaitMax, minDatabaseWait, "the longest wait between attempts while the database is down"); err != nil {
		return retry.Policy{}, err
	}
	p := projection.DefaultDatabaseWait()
	p.MaxInterval = s.dbWaitMax
	p.Initial = min(p.Initial, p.MaxInterval)
	if err := p.Validate(); err != nil {
		return p, flagenv.Usagef("--database-wait-max-interval (DATABASE_WAIT_MAX_INTERVAL): %v", err)
	}
	return p, nil
}

// redactor returns the Redactor of every secret of s: what may be a
// password in --database-url (redact.PostgresSecrets, which also reads
// PGPASSWORD and the passfile) and --kafka-sasl-password.
func (s *settings) redactor() *redact.Redactor {
	return redact.New(append(redact.PostgresSecrets(s.databaseURL), s.kafka.SASLPassword)...)
}

// requireDatabase returns a usage error when --database-url is empty or
// only white space, which is ignored around it (fresh-user trial: " " and
// a Secret's lone newline were taken, and pgx connected to its defaults).
func (s *settings) requireDatabase() error {
	if s.databaseURL == "" {
		return flagenv.Usagef("--database-url (DATABASE_URL) is required: set it to a PostgreSQL connection string")
	}
	if strings.TrimSpace(s.databaseURL) == "" {
		// Said as given (final fresh-user check: "required" read oddly
		// of a value given).
		return flagenv.Usagef("--database-url (DATABASE_URL) is required, and is only white space: set it to a PostgreSQL connection string")
	}
	return nil
}

func (s *settings) requireProjections() error {
	if s.projections == "" {
		return flagenv.Usagef("--projections (PROJECTIONS_FILE) is required: set it to a projection definitions file")
	}
	return nil
}

func parseFlags(fs *flagenv.Set, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	return fs.NoArguments()
}

// topicConfig returns the topic settings, or a usage error naming the flag.
func (s *settings) topicConfig() (dlq.TopicConfig, error) {
	if s.partitions < 1 || s.partitions > 10000 {
		return dlq.TopicConfig{}, flagenv.Usagef("--partitions (EVENTS_PARTITIONS) must be in 1..10000, got %d", s.partitions)
	}
	for _, t := range []struct{ flag, name string }{{"--topic", s.topic}, {"--dlq-topic", s.dlqTopic}, {"--ledger-topic", s.ledgerTopic}} {
		if t.name == "" {
			return dlq.TopicConfig{}, flagenv.Usagef("%s is empty", t.flag)
		}
		one := dlq.TopicConfig{EventsTopic: t.name, DLQTopic: t.name + ".a", LedgerTopic: t.name + ".b"}
		if err := one.Validate(); err != nil {
			return dlq.TopicConfig{}, flagenv.Usagef("%s %q: %v", t.flag, t.name, errors.Unwrap(err))
		}
	}
	cfg := dlq.TopicConfig{
		EventsTopic: s.topic,
		DLQTopic:    s.dlqTopic,
		LedgerTopic: s.ledgerTopic,
		Partitions:  int32(s.partitions),
	}
	if err := cfg.Validate(); err != nil {
		return cfg, flagenv.Usagef("--topic, --dlq-topic, --ledger-topic: %v", err)
	}
	return cfg, nil
}

// maxFetchBytes is the largest --fetch-max-bytes and
// --fetch-max-partition-bytes: 1 GiB (Kafka's fields are int32).
const maxFetchBytes = 1 << 30

// minDLQBytes is the smallest --dlq-max-bytes: room for a dead letter's
// own headers and fields (about 1 KB, with forkId and eventType cut to
// 256 bytes) once the event's key, value and headers are left out, so
// that no record is too large to dead-letter.
const minDLQBytes = 4096

// maxDLQBytes is the largest --dlq-max-bytes: 1 GiB, under Kafka's int32
// message size limit with room for the record batch around it.
const maxDLQBytes = 1 << 30

// The bounds and default of --session-timeout: Kafka's default
// group.min.session.timeout.ms and group.max.session.timeout.ms (a broker
// refuses a join outside its bounds), and kgo's default session timeout.
const (
	minSessionTimeout     = 6 * time.Second
	maxSessionTimeout     = 30 * time.Minute
	defaultSessionTimeout = 45 * time.Second
)

// defaultKafkaStartTimeout is the default of --kafka-start-timeout: under
// the 90 s window of the manifests' startup probe, which /healthz answers
// only once Kafka has.
const defaultKafkaStartTimeout = 60 * time.Second

// maxInstanceIDLen is the longest group.instance.id Kafka accepts (its
// JoinGroupRequest.validateGroupInstanceId, as for topic names).
const maxInstanceIDLen = 249

// groupOpts returns the consumer group options of --group-instance-id and
// --session-timeout (checkRun has checked them).
func (s *settings) groupOpts() []kgo.Opt {
	opts := []kgo.Opt{kgo.SessionTimeout(s.sessionTimeout)}
	if s.groupInstanceID != "" {
		opts = append(opts, kgo.InstanceID(s.groupInstanceID))
	}
	return opts
}

// fetchOpts returns the worker's fetch caps, --fetch-max-bytes and
// --fetch-max-partition-bytes (checked by validate to fit an int32).
func (s *settings) fetchOpts() []kgo.Opt {
	return []kgo.Opt{kgo.FetchMaxBytes(int32(s.fetchMaxBytes)), kgo.FetchMaxPartitionBytes(int32(s.fetchMaxPartBytes))}
}

// checkGroupMembership returns a usage error naming --group-instance-id or
// --session-timeout when Kafka would refuse its value.
func (s *settings) checkGroupMembership() error {
	if s.sessionTimeout < minSessionTimeout || s.sessionTimeout > maxSessionTimeout {
		return flagenv.Usagef("--session-timeout (SESSION_TIMEOUT) must be in %s..%s (Kafka's default group.min/max.session.timeout.ms), got %s",
			minSessionTimeout, maxSessionTimeout, s.sessionTimeout)
	}
	id := s.groupInstanceID
	if id == "" {
		return nil
	}
	if len(id) > maxInstanceIDLen || id == "." || id == ".." || strings.IndexFunc(id, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}) >= 0 {
		return flagenv.Usagef("--group-instance-id (GROUP_INSTANCE_ID) %q: want 1 to %d of a-z, A-Z, 0-9, '.', '_', '-' (not . or ..), as Kafka accepts", id, maxInstanceIDLen)
	}
	return nil
}

// checkRun returns a usage error naming the first run flag out of range;
// it runs before anything is dialled.
func (s *settings) checkRun() error {
	if strings.TrimSpace(s.group) == "" {
		return flagenv.Usagef("--group (CONSUMER_GROUP) is empty: set a consumer group name")
	}
	if err := s.checkGroupMembership(); err != nil {
		return err
	}
	// Any case, as --log-format and --kafka-sasl-mechanism take theirs
	// (new-user trial: ON_INFRA_ERROR=DLQ was refused, LOG_FORMAT=JSON not).
	given := s.onInfraError
	s.onInfraError = strings.ToLower(given)
	switch projection.InfraMode(s.onInfraError) {
	case projection.InfraPause, projection.InfraDeadLetter:
	default:
		return flagenv.Usagef("--on-infra-error must be %q or %q, got %q", projection.InfraPause, projection.InfraDeadLetter, given)
	}
	for _, f := range []struct {
		flag string
		v    int
	}{{"--max-poll-records", s.maxPollRecords}, {"--max-batch-records", s.maxBatch}, {"--max-queued-bytes", s.maxQueuedBytes},
		{"--max-retrying", s.maxRetrying}, {"--max-retrying-bytes", s.maxRetryBytes}} {
		if f.v < 1 {
			return flagenv.Usagef("%s must be >= 1, got %d", f.flag, f.v)
		}
	}
	for _, f := range []struct {
		flag, env string
		v         int
	}{{"--fetch-max-bytes", "FETCH_MAX_BYTES", s.fetchMaxBytes}, {"--fetch-max-partition-bytes", "FETCH_MAX_PARTITION_BYTES", s.fetchMaxPartBytes}} {
		if f.v < 1 || f.v > maxFetchBytes {
			return flagenv.Usagef("%s (%s) must be in 1..%d bytes, got %d", f.flag, f.env, maxFetchBytes, f.v)
		}
	}
	if s.pprof && s.httpAddr == "" { // new-user trial: the profiles were silently absent
		return flagenv.Usagef("--pprof (PPROF) serves the profiles on --http-addr (HTTP_ADDR), which is empty: set an address or drop --pprof")
	}
	if s.kafkaStartTimeout < 0 {
		return flagenv.Usagef("--kafka-start-timeout must be >= 0 (0: try once), got %s", s.kafkaStartTimeout)
	}
	if s.breaker.Threshold == 0 || s.breaker.Threshold < -1 {
		return flagenv.Usagef("--breaker-threshold must be >= 1, or -1 for no breaker, got %d", s.breaker.Threshold)
	}
	for _, f := range []struct {
		flag     string
		v, floor time.Duration
		why      string
	}{
		{"--shutdown-grace (SHUTDOWN_GRACE)", s.shutdownGrace, minShutdownGrace, "time to commit and leave the group"},
		{"--breaker-window (BREAKER_WINDOW)", s.breaker.Window, minBreakerWindow, "shorter, the breaker would hardly ever open; --breaker-threshold -1 turns it off"},
		{"--breaker-probe-interval (BREAKER_PROBE_INTERVAL)", s.breaker.ProbeInterval, minBreakerWindow, "a probe is a pair retried in full"},
		{"--dlq-write-timeout (DLQ_WRITE_TIMEOUT)", s.dlqTimeout, minDLQWriteTimeout, "a write with acks=all takes a round trip to the partition leader and its in-sync replicas, and the committed offset does not move past a dead letter until a write is acknowledged"},
	} {
		if err := atLeast(f.flag, f.v, f.floor, f.why); err != nil {
			return err
		}
	}
	if s.spanQueue < 1 || s.spanQueue > maxSpanQueue {
		return flagenv.Usagef("--trace-queue-size (OTEL_BSP_MAX_QUEUE_SIZE) must be in [1, %d], got %d", maxSpanQueue, s.spanQueue)
	}
	if err := checkOTelEnv(); err != nil {
		return err
	}
	if s.failureLogInterval <= 0 {
		return flagenv.Usagef("--failure-log-interval must be > 0, got %s", s.failureLogInterval)
	}
	if s.maxTenants < 0 {
		return flagenv.Usagef("--metrics-max-tenants must be >= 0, got %d", s.maxTenants)
	}
	// The retry and database-wait flags too (new-user trial: make run
	// started its Kafka and PostgreSQL, and migrated, before refusing
	// --retry-initial 1h).
	if _, err := s.retryPolicy(); err != nil {
		return err
	}
	if _, err := s.databaseWait(); err != nil {
		return err
	}
	if s.dlqMaxBytes != 0 && (s.dlqMaxBytes < minDLQBytes || s.dlqMaxBytes > maxDLQBytes) {
		return flagenv.Usagef("--dlq-max-bytes (DLQ_MAX_BYTES) must be in %d..%d (or 0: the dead-letter topic's max.message.bytes), got %d", minDLQBytes, maxDLQBytes, s.dlqMaxBytes)
	}
	if s.copyMinRows == 0 || s.copyMinRows < -1 {
		return flagenv.Usagef("--copy-min-rows must be >= 1, or -1 for never, got %d", s.copyMinRows)
	}
	if strings.TrimSpace(s.workerID) == "" {
		return flagenv.Usagef("--worker-id (POD_NAME) is empty: set this worker's name for the dead-letter headers")
	}
	return nil
}

func describe(s *settings) string {
	return fmt.Sprintf("%s topic=%s dlq-topic=%s", s.kafka, s.topic, s.dlqTopic)
}
