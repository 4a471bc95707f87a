package projection

import (
	"context"
	"log/slog"
	"time"

	"github.com/causet/projection-worker/retry"
)

// Resetter closes a pool's connections (*pgxpool.Pool's Reset): the next
// attempt opens a new one. A DB that implements it is reset when the
// database answers that it is read-only (SQLSTATE 25006).
type Resetter interface {
	Reset()
}

// waitForDatabase is the InfraPause middleware: while the next step fails
// with an infrastructure error (SPEC §5: the database is unreachable, read
// only, out of connections), the partition pauses its fetching, reports
// not-ready, and the attempt is made again with the worker's InfraRetry
// intervals and no limit, so that an outage costs no dead letter. It
// returns the first result that is not an infrastructure error, or ctx's
// error.
func (pc *partition) waitForDatabase(next applyFunc) applyFunc {
	return func(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
		var out Outcome
		err := pc.untilAvailable(ctx, func(ctx context.Context) error {
			var err error
			out, err = next(ctx, h, ev)
			return err
		}, "projection", h.Name(), "tenant_schema", ev.TenantSchema)
		return out, err
	}
}

// untilAvailable runs op until it returns something other than an
// infrastructure error (or ctx ends), with the partition paused and
// not-ready while it waits; logArgs are added to the log lines.
func (pc *partition) untilAvailable(ctx context.Context, op func(context.Context) error, logArgs ...any) error {
	err := pc.w.cfg.InfraRetry.UntilAvailable(ctx, op, func(err error, n int, wait time.Duration) {
		pc.setDBWait(err)
		code := retry.SQLState(err)
		if pc.w.reset != nil && code == "25006" {
			// A read-only answer holds for the session, not only for the
			// server: a connection opened while the database was read-only
			// (ALTER DATABASE ... SET default_transaction_read_only, a
			// demoted primary) stays so after it is writable again, or
			// after a failover moved the address to the new primary. The
			// next attempt gets a new connection (ops trial: paused for
			// over 10 minutes after the database was writable again).
			pc.w.reset.Reset()
		}
		// Folded by --failure-log-interval as failing pairs are, by the
		// database's answer (ops trial: a 10-minute outage wrote over 70
		// lines per partition): the first in full, the rest counted.
		fp := "database"
		if code != "" {
			fp += "/" + code
		}
		pc.w.failures.write(ctx, slog.LevelWarn, waitWords(err).waiting, fp,
			append([]any{"topic", pc.w.cfg.Topic, "partition", pc.partition, "attempt", n, "wait", wait, "error", err}, logArgs...)...)
	})
	pc.setDBWait(nil)
	return err
}

// dbWaitWords are the words of the log lines (and of Ready) of a partition
// waiting for the database, by the kind of its last answer.
type dbWaitWords struct {
	cause   string // why it waits: Ready's "partitions [..] paused: <cause>: <error>"
	waiting string // each attempt's WARN (folded by fingerprint)
	paused  string // once, when it starts waiting
	resumed string // once, when it no longer waits
}

var (
	unavailableWords = dbWaitWords{
		cause:   "database unavailable",
		waiting: "database unavailable, waiting",
		paused:  "database unavailable: partition paused",
		resumed: "database available again: partition resumed",
	}
	// A deadlock or serialization failure (retry.IsConflict) is not an
	// outage: the database answered, and another transaction was in the way
	// (new-user trial: partitions deadlocking on one row were reported as
	// "database unavailable").
	conflictWords = dbWaitWords{
		cause:   "transaction conflict",
		waiting: "transaction conflict, applying again",
		paused:  "transaction conflict: partition paused",
		resumed: "transaction conflict over: partition resumed",
	}
)

// waitWords returns the words for a partition whose last answer from the
// database was err.
func waitWords(err error) dbWaitWords {
	if retry.IsConflict(err) {
		return conflictWords
	}
	return unavailableWords
}

// setDBWait marks the partition waiting for the database, cause being the
// last infrastructure error its attempt returned (Ready names it), or
// (cause nil) no longer waiting.
func (pc *partition) setDBWait(cause error) {
	waiting := cause != nil
	pc.mu.Lock()
	changed := (pc.dbWait != nil) != waiting
	last := pc.dbWait
	pc.dbWait = cause
	pc.mu.Unlock()
	if !changed {
		return
	}
	switch {
	case waiting:
		pc.pauseFetch(pauseDBWait)
		pc.w.cfg.Metrics.addPaused(pc.ctx, 1)
		pc.w.log.Warn(waitWords(cause).paused, "topic", pc.w.cfg.Topic, "partition", pc.partition)
	case pc.ctx.Err() != nil:
		// Revoked or shutting down while waiting: the database may well
		// still be down.
		pc.w.cfg.Metrics.addPaused(context.Background(), -1)
		pc.w.log.Info("partition stopped while waiting for the database", "topic", pc.w.cfg.Topic, "partition", pc.partition)
	default:
		pc.w.cfg.Metrics.addPaused(pc.ctx, -1)
		pc.w.log.Info(waitWords(last).resumed, "topic", pc.w.cfg.Topic, "partition", pc.partition)
		pc.maybeResume()
	}
}
