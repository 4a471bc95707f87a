package projection

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/retry"
)

// InfraMode says what the worker does when the database is unavailable.
type InfraMode string

const (
	// InfraPause (the default) pauses the affected partitions, reports
	// not-ready and retries without limit until the database answers; no
	// event is dead-lettered during an outage.
	InfraPause InfraMode = "pause"
	// InfraDeadLetter treats infrastructure errors like projection errors:
	// retried up to the maximum, then dead-lettered.
	InfraDeadLetter InfraMode = "dlq"
)

// Defaults for Config.
const (
	DefaultGroup           = "causet-projection-worker"
	DefaultMaxPollRecords  = 10000
	DefaultMaxQueuedBytes  = 8 << 20
	DefaultMaxBatchRecords = 2000
	DefaultShutdownGrace   = 25 * time.Second
	DefaultMaxRetrying     = DefaultMaxBatchRecords
	DefaultMaxRetryingByte = 32 << 20
)

// DefaultFetchMaxBytes (16 MiB) and DefaultFetchMaxPartitionBytes (256 KiB)
// are the fetch caps NewWorker gives its client unless its options say
// otherwise (Kafka's fetch.max.bytes and max.partition.fetch.bytes,
// kgo.FetchMaxBytes and kgo.FetchMaxPartitionBytes). They count bytes as
// the broker stores them, compressed: records that compress 100:1 take 100
// times the cap once decompressed.
const (
	DefaultFetchMaxBytes          = 16 << 20
	DefaultFetchMaxPartitionBytes = 256 << 10
)

// Config configures a Worker. Zero values take the documented defaults; call
// Validate (NewWorker does) to fill them in and check the rest.
type Config struct {
	// Topic is the events topic. Default "causet.projection-events.v1".
	Topic string
	// Group is the consumer group. Default "causet-projection-worker".
	Group string
	// Retry is the policy for failing (event, projection) pairs. Default
	// retry.DefaultPolicy(): 200 ms, ×2, 10 s cap, jitter, 5 retries.
	Retry retry.Policy
	// OnInfraError is InfraPause (default) or InfraDeadLetter.
	OnInfraError InfraMode
	// InfraRetry paces the waits while the database is unavailable under
	// InfraPause; its MaxRetries is ignored (no limit). Default
	// DefaultDatabaseWait: 500 ms, ×2, 10 s cap, jitter 0.5, so that a
	// partition resumes within 15 s of the database answering.
	InfraRetry retry.Policy
	// MaxPollRecords bounds the records taken from the client per poll.
	// Default 10000.
	MaxPollRecords int
	// MaxBatchRecords bounds the records of one partition applied in one
	// transaction. Default 2000; 1 applies records one at a time. A larger
	// batch pays a transaction's round trips and its COPY set-up over more
	// records (make bench, alternated rounds: 1000 ran at 1.26× the
	// throughput of 500 with 7.3 against 9.5 µs of worker CPU per event and
	// 210 against 196 MiB peak RSS; at N=1 000 000, 2000 with
	// DefaultFetchMaxPartitionBytes 256 KiB ran at 1.057× and 1.222× of
	// 1000 with 1 MiB in two runs, peak RSS 212 against 248–257 MiB, the
	// smaller fetches holding less decompressed) and holds its row locks
	// longer.
	MaxBatchRecords int
	// CopyMinRows is the smallest group of upserts of one table in one
	// tenant schema, within a batch, that is applied with COPY into a
	// temporary table and one INSERT ... ON CONFLICT instead of one
	// statement per pair; below it the extra round trips cost more than they
	// save. When PostgreSQL refuses a row of a COPY group, the group is
	// undone alone and isolated in PostgreSQL in the same transaction (its
	// good rows applied, each refused row its pair's failure), and the
	// next group of that table and tenant schema is isolated at once until
	// one comes through clean; a group that fails otherwise is left to
	// statements. An upsert that the table itself would
	// refuse (its column types and NOT NULL as the catalog says, read once
	// per table and kept 30 s) is applied as a statement instead, with the
	// other upserts of its row. Default 32; -1 never uses COPY.
	CopyMinRows int
	// MaxQueuedBytes bounds the record bytes (key, value, headers) polled
	// but not yet processed, all partitions together, so that memory does
	// not grow with the backlog: above it the worker stops polling (the
	// client then holds at most one fetch) until the queues drain. A single
	// partition holding three quarters of it, such as one waiting for the
	// database, has its fetching paused instead, so that it does not stall
	// the others; pausing drops what the client had fetched for it, which is
	// fetched again on resume. It also bounds the record bytes of large
	// batches (over an eighth of it and over 64 KiB) being processed (decoded, planned,
	// applied, dead-lettered) at a time, all partitions together: such a
	// batch waits for room, and a single record larger than the bound is
	// processed alone; smaller batches never wait. Processing memory is
	// then at most a few times MaxQueuedBytes plus an eighth of it per
	// partition. Default 8 MiB.
	MaxQueuedBytes int
	// MaxRetrying bounds the pairs of one partition that wait for a retry
	// while its later records go on (non-blocking retries); at the bound the
	// partition takes no new records and its fetching pauses until retries
	// finish (backpressure, never loss). Default DefaultMaxBatchRecords
	// (2000), so that a whole batch of failing records waits without that
	// pause: pausing makes the client drop the fetch it holds for the
	// partition and fetch it again on resume (franz-go strips a paused
	// partition's buffered records at the next poll). With 1000 and 1 % of
	// the events for a tenant not migrated, make bench (N=1 000 000) saw
	// 8–9 such pauses and 13 000–17 600 records fetched twice per run; with
	// 2000, none.
	MaxRetrying int
	// MaxRetryingBytes bounds the record bytes (key, value, headers) held by
	// the pairs waiting for a retry, all partitions together: a partition
	// that holds some takes no new records while they reach it (a partition
	// holding none goes on). Their dead letters, when a breaker opens, are
	// encoded about as many bytes again. Default 32 MiB.
	MaxRetryingBytes int
	// Breaker configures the fingerprint breaker: see BreakerConfig.
	Breaker BreakerConfig
	// FailureLogInterval is the interval over which the WARN lines of
	// failing pairs ("projection failed, retrying", "dead-lettered") are
	// aggregated per failure fingerprint: the first of each is written in
	// full, the repeats as one line with their count when it ends.
	// Default 1 min.
	FailureLogInterval time.Duration
	// CommitInterval is how often marked offsets are committed while
	// running (they are also committed on revoke and at shutdown). Default
	// 5 s (franz-go's default).
	CommitInterval time.Duration
	// ShutdownGrace bounds the time Run takes after its context is done to
	// commit finished offsets and leave the group. Default 25 s.
	ShutdownGrace time.Duration
	// Logger receives the worker's logs. Default: discarded.
	Logger *slog.Logger
	// Metrics records counters and histograms; default: none recorded.
	Metrics *Metrics
	// TracerProvider, when set, receives the worker's spans (tracing.go): a
	// span per record, the child of the W3C trace context in its headers,
	// ending when the record is done; a span per (record, projection) pair;
	// a span per batch transaction, linked to its records. Default nil: no
	// spans.
	TracerProvider trace.TracerProvider
	// TraceEveryPair gives every (record, projection) pair a span of its
	// own. Default false: only a pair whose first attempt failed gets one
	// (its retries and dead letter in it); a pair applied at once is told
	// by its record's span and the linked batch span, at about a third of
	// the spans.
	TraceEveryPair bool
	// TenantSchemas narrows the tenant schemas the worker accepts
	// (NewTenantSchemas, --tenant-schema-pattern). Default nil: every name
	// ValidTenantSchema accepts (SPEC §3's pattern, PostgreSQL's own
	// schemas and public excepted). An event for another tenant schema is
	// dead-lettered at once as permanent, naming tenantSchema.
	TenantSchemas *TenantSchemas
}

// Validate fills in defaults and returns an error naming the first invalid
// field.
func (c *Config) Validate() error {
	if c.Topic == "" {
		c.Topic = DefaultEventsTopic
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Retry == (retry.Policy{}) {
		c.Retry = retry.DefaultPolicy()
	}
	if err := c.Retry.Validate(); err != nil {
		return err
	}
	if c.InfraRetry == (retry.Policy{}) {
		c.InfraRetry = DefaultDatabaseWait()
	}
	if err := c.InfraRetry.Validate(); err != nil {
		return fmt.Errorf("infra retry: %w", err)
	}
	switch c.OnInfraError {
	case "":
		c.OnInfraError = InfraPause
	case InfraPause, InfraDeadLetter:
	default:
		return fmt.Errorf("on-infra-error must be %q or %q, got %q", InfraPause, InfraDeadLetter, c.OnInfraError)
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = DefaultMaxPollRecords
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.CopyMinRows == 0 {
		c.CopyMinRows = 32
	}
	if c.MaxQueuedBytes == 0 {
		c.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if c.MaxRetrying == 0 {
		c.MaxRetrying = DefaultMaxRetrying
	}
	if c.MaxRetryingBytes == 0 {
		c.MaxRetryingBytes = DefaultMaxRetryingByte
	}
	if c.MaxPollRecords < 0 || c.MaxQueuedBytes < 0 || c.MaxBatchRecords < 0 || c.MaxRetrying < 0 || c.MaxRetryingBytes < 0 {
		return errors.New("max poll, queued, batch records and max retrying pairs and bytes must be > 0")
	}
	if err := c.Breaker.Validate(); err != nil {
		return err
	}
	if c.FailureLogInterval == 0 {
		c.FailureLogInterval = DefaultFailureLogInterval
	}
	if c.FailureLogInterval < 0 {
		return fmt.Errorf("failure log interval must be > 0, got %s", c.FailureLogInterval)
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = 5 * time.Second
	}
	if c.CommitInterval < 0 {
		return fmt.Errorf("commit interval must be > 0, got %s", c.CommitInterval)
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown grace must be > 0, got %s", c.ShutdownGrace)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = &Metrics{}
	}
	return nil
}

// DefaultDatabaseWait is Config.InfraRetry's default: while the database
// is unavailable a paused partition tries again after 500 ms, doubling up
// to 10 s, each wait ±50 % (jitter), with no limit on the attempts.
// The cap bounds how long a partition stays paused after the database
// answers again: at most 1.5 × 10 s (it was 30 s, and partitions resumed
// up to 45 s late; new-user trial).
func DefaultDatabaseWait() retry.Policy {
	return retry.Policy{Initial: 500 * time.Millisecond, Multiplier: 2, MaxInterval: 10 * time.Second, Jitter: 0.5}
}
