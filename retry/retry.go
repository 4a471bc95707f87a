// Package retry classifies projection failures and retries them with exponential
// backoff.
//
// The classes and the default policy come from the Causet projection worker
// specification (SPEC §5): permanent errors are dead-lettered at once, projection
// errors are retried and then dead-lettered, infrastructure errors wait for the
// database by default.
package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// Class is the kind of a failure. Its string form is the value of the
// causet.dlq.error-class header.
type Class int

const (
	// Projection is a failure that may succeed after a deploy or once other rows
	// change: SQLSTATE classes 23 and 42, statement and lock timeouts (57014,
	// 55P03, context deadlines), handler panics, anything unknown. It is
	// retried, then dead-lettered.
	Projection Class = iota
	// Permanent is a failure of the input itself: validation, value conversion,
	// CEL evaluation, SQLSTATE class 22. It is dead-lettered at once with
	// retryCount 0.
	Permanent
	// Infrastructure is a failure of the database or the network, not of
	// the event: connection refused or reset, a closed pool, SQLSTATE
	// classes 08, 53, 57 (but 57014), 25006 read-only, 40001, 40P01 (see
	// Rules).
	Infrastructure
)

// String returns "projection", "permanent" or "infrastructure".
func (c Class) String() string {
	switch c {
	case Permanent:
		return "permanent"
	case Infrastructure:
		return "infrastructure"
	default:
		return "projection"
	}
}

// PermanentError is implemented by errors that are permanent by nature, such as
// event validation failures; Permanent() reports true.
type PermanentError interface {
	error
	Permanent() bool
}

type permanent struct{ err error }

func (p permanent) Error() string   { return p.err.Error() }
func (p permanent) Unwrap() error   { return p.err }
func (p permanent) Permanent() bool { return true }

// MarkPermanent wraps err so that Classify reports Permanent. It returns nil for
// a nil err.
func MarkPermanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// SQLState returns the SQLSTATE of the first *pgconn.PgError in err's chain, or
// "" when there is none.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Rule maps a SQLSTATE, or a SQLSTATE class, to the Class of a PostgreSQL
// error that carries it. Rules returns the table Classify uses.
type Rule struct {
	// SQLState is a five-character SQLSTATE ("57014") or a two-character
	// SQLSTATE class ("57"), which covers every code that starts with it.
	SQLState string
	// Condition is PostgreSQL's name for the code or the class
	// ("query_canceled", "operator_intervention"), from Appendix A of the
	// PostgreSQL documentation ("PostgreSQL Error Codes").
	Condition string
	// Class is the class of an error with this SQLSTATE.
	Class Class
	// Reason says why, in a few words.
	Reason string
}

// sqlStateRules is the table behind Rules and ClassifySQLState. It is
// never modified: Rules hands out copies.
var sqlStateRules = [...]Rule{
	{"08", "connection_exception", Infrastructure, "the connection failed; no event is at fault"},
	{"22", "data_exception", Permanent, "PostgreSQL refuses the value itself (22P02, 22003, 22P05 NUL in text or a character the database's encoding lacks: the worker always speaks UTF-8, `client_encoding=UTF8`, and PostgreSQL converts); a retry sends the same value"},
	{"23", "integrity_constraint_violation", Projection, "23505, 23502: may pass once other rows or the definitions change"},
	{"25", "invalid_transaction_state", Projection, "an earlier statement of the transaction failed (25P02); the pair is retried on its own"},
	{"25006", "read_only_sql_transaction", Infrastructure, "the database is read-only, as during a failover: wait for a writable primary instead of dead-lettering every event; each read-only answer closes the pool's connections, so the next attempt opens a new one (a session opened read-only stays so)"},
	{"25P03", "idle_in_transaction_session_timeout", Infrastructure, "the server closed the session; no event is at fault"},
	{"28", "invalid_authorization_specification", Infrastructure, "the worker's credentials are refused; no event can pass"},
	{"3D", "invalid_catalog_name", Infrastructure, "the database does not exist; no event can pass"},
	{"40001", "serialization_failure", Infrastructure, "contention; the same statement passes when run again"},
	{"40P01", "deadlock_detected", Infrastructure, "contention; the same statement passes when run again"},
	{"42", "syntax_error_or_access_rule_violation", Projection, "42703 undefined column, 42P01 undefined table: passes once the tenant is migrated; 42501 insufficient privilege (a GRANT missing or revoked): passes once granted (migrate --grant); until then every pair of the table is dead-lettered (the breaker cuts the retries short), to replay after the fix, while /readyz stays ready"},
	{"53", "insufficient_resources", Infrastructure, "disk full, out of memory, too many connections"},
	{"54000", "program_limit_exceeded", Permanent, "a value too large for PostgreSQL's limits (`index row size 3016 exceeds btree version 4 maximum 2704`, `index row requires 10328 bytes, maximum size is 8191`: a key over about 2.7 KB; in a projection with a delete, an upsert or delete whose key's tombstone would be over the limit is refused before any SQL, as permanent: docs/events.md, *Key length*); a retry sends the same value"},
	{"55P03", "lock_not_available", Projection, "a lock wait timed out (lock_timeout): usually passes on retry, but a lock held for good must end in the dead-letter topic, not pause the partition forever"},
	{"57", "operator_intervention", Infrastructure, "57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now: wait for the database"},
	{"57014", "query_canceled", Projection, "statement_timeout or a cancel request: a statement that always times out must end in the dead-letter topic, not pause the partition forever"},
	{"58", "system_error", Infrastructure, "an I/O or system error on the server"},
}

// Rules returns the SQLSTATE table that Classify applies to PostgreSQL
// errors, ordered by SQLState, as a new slice the caller may keep. The
// most specific rule wins: a five-character SQLState over the class of its
// first two characters. A SQLSTATE that matches no rule is Projection. The
// classes come from SPEC §5, with the exceptions that issue 8 (finding 5)
// settled: 57014 and 55P03 are Projection, 25006 is Infrastructure; and
// 54000 (a value over PostgreSQL's limits, such as a key too long for its
// index) is Permanent, like class 22 (new-user trial: a 900 000-character
// key was retried five times).
func Rules() []Rule {
	return append([]Rule(nil), sqlStateRules[:]...)
}

// ClassifySQLState returns the class of a PostgreSQL error with SQLSTATE
// code under Rules: the rule for code, else the rule for its class (first
// two characters), else Projection. A code that is not five characters
// long is Projection.
func ClassifySQLState(code string) Class {
	if len(code) != 5 {
		return Projection
	}
	class := Projection
	for _, r := range sqlStateRules {
		switch r.SQLState {
		case code:
			return r.Class
		case code[:2]:
			class = r.Class
		}
	}
	return class
}

// Classify returns the class of err. The rules, first match wins (SPEC §5
// and issue 8):
//
//  1. an error marked permanent (PermanentError, MarkPermanent) is
//     Permanent;
//  2. a failed connection attempt (*pgconn.ConnectError, whatever
//     SQLSTATE it carries, such as 28P01 or 57P03) and an acquire from a
//     closed pool (puddle.ErrClosedPool, which pgxpool returns) are
//     Infrastructure;
//  3. an error with a *pgconn.PgError in its chain is classified by its
//     SQLSTATE with ClassifySQLState (the table of Rules);
//  4. context.DeadlineExceeded (a statement or an acquire that outlived
//     its caller's deadline) is Projection, so that a statement that
//     always times out is retried and dead-lettered, not waited on forever;
//  5. connection-level failures (refused, reset, broken pipe, EOF,
//     pgconn.ErrConnClosed, a net.Error, pgconn's network timeouts and
//     safe-to-retry errors) are Infrastructure;
//  6. anything else, and a nil err, is Projection.
func Classify(err error) Class {
	var pe PermanentError
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &pe) && pe.Permanent():
		return Permanent
	case errors.As(err, &connectErr), errors.Is(err, puddle.ErrClosedPool):
		return Infrastructure
	}
	if code := SQLState(err); code != "" {
		return ClassifySQLState(code)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Projection
	}
	if isConnectionError(err) {
		return Infrastructure
	}
	return Projection
}

// isConnectionError reports whether err is a failure of the connection
// rather than of a statement. Call it only after ruling out
// context.DeadlineExceeded, which is a net.Error too.
func isConnectionError(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.As(err, &netErr):
		return true
	}
	// pgconn reports a connection that broke mid-query as a safe-to-retry or
	// timeout error without a PgError.
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}

// IsPermanent reports whether err is classified Permanent.
func IsPermanent(err error) bool { return err != nil && Classify(err) == Permanent }

// IsInfrastructure reports whether err is classified Infrastructure.
func IsInfrastructure(err error) bool { return err != nil && Classify(err) == Infrastructure }

// IsConflict reports whether err is PostgreSQL ending a transaction because
// of another one: SQLSTATE 40001 (serialization_failure) or 40P01
// (deadlock_detected). Both are Infrastructure (Rules): the database is
// up, and the same statement passes when run again once the other
// transaction is done (or a trigger stops raising the code).
func IsConflict(err error) bool {
	switch SQLState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// Policy is an exponential backoff policy. The zero value is not usable; start
// from DefaultPolicy.
type Policy struct {
	// Initial is the first wait. Default 200 ms.
	Initial time.Duration
	// Multiplier grows the wait after each retry. Default 2.
	Multiplier float64
	// MaxInterval caps a single wait. Default 10 s.
	MaxInterval time.Duration
	// Jitter is the randomization factor: each wait is drawn from
	// [wait×(1−Jitter), wait×(1+Jitter)]. Default 0.5; 0 disables jitter.
	Jitter float64
	// MaxRetries is how many times a failed attempt is retried before Do gives
	// up (so at most MaxRetries+1 attempts). Default 5; 0 means no retries.
	MaxRetries int
}

// DefaultPolicy returns the SPEC §5 defaults: 200 ms initial, ×2, 10 s cap,
// jitter 0.5, 5 retries.
func DefaultPolicy() Policy {
	return Policy{Initial: 200 * time.Millisecond, Multiplier: 2, MaxInterval: 10 * time.Second, Jitter: 0.5, MaxRetries: 5}
}

// Validate returns an error naming the first field that is out of range.
func (p Policy) Validate() error {
	switch {
	case p.Initial <= 0:
		return fmt.Errorf("retry initial interval must be > 0, got %s", p.Initial)
	case p.Multiplier < 1:
		return fmt.Errorf("retry multiplier must be >= 1, got %g", p.Multiplier)
	case p.MaxInterval < p.Initial:
		return fmt.Errorf("retry max interval (%s) must be >= initial interval (%s)", p.MaxInterval, p.Initial)
	case p.Jitter < 0 || p.Jitter >= 1:
		return fmt.Errorf("retry jitter must be in [0, 1), got %g", p.Jitter)
	case p.MaxRetries < 0:
		return fmt.Errorf("max retries must be >= 0, got %d", p.MaxRetries)
	}
	return nil
}

// Longest returns the longest that MaxRetries waits can take in all, each
// at its longest (MaxInterval and Jitter included): 200+400+800+1600+3200
// ms × 1.5 = 9.3 s with the defaults. It takes a step per wait only until
// the waits reach MaxInterval (the rest are MaxInterval each), so a huge
// MaxRetries costs nothing; the result is capped at MaxInt64/2.
func (p Policy) Longest() time.Duration {
	var sum float64
	wait, capped := float64(p.Initial), float64(p.MaxInterval)
	n := p.MaxRetries
	for ; n > 0 && wait < capped; n-- {
		sum += wait * (1 + p.Jitter)
		wait *= p.Multiplier
	}
	sum += float64(n) * capped * (1 + p.Jitter)
	return time.Duration(min(sum, float64(math.MaxInt64/2)))
}

// NewBackOff returns a fresh exponential backoff for one sequence of attempts
// with no elapsed-time limit (the retry count bounds it). A backoff is not safe
// for concurrent use: take a new one per record.
func (p Policy) NewBackOff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.Initial),
		backoff.WithMultiplier(p.Multiplier),
		backoff.WithMaxInterval(p.MaxInterval),
		backoff.WithRandomizationFactor(p.Jitter),
		backoff.WithMaxElapsedTime(0),
	)
}

// NewBackOffAfter returns NewBackOff advanced past the waits of retries
// retries already made, so that its next wait is that of retry retries+1
// (Initial × Multiplier^retries, at most MaxInterval, with the jitter):
// for a pair another owner retried before it was handed off, whose waits
// go on rather than start again at Initial (new-user trial: after a
// restart a pair's fourth wait was about 1 s where the schedule gives 4 to
// 12 s, and pairs were dead-lettered before their time). retries ≤ 0 is
// NewBackOff.
func (p Policy) NewBackOffAfter(retries int) *backoff.ExponentialBackOff {
	b := p.NewBackOff()
	// Past 1 000 steps every schedule whose multiplier grows it has
	// reached MaxInterval long before.
	for range min(retries, 1000) {
		b.NextBackOff()
	}
	return b
}

// Notify is called before each wait with the failed attempt's error, the
// number of the retry about to be made (1-based) and the wait.
type Notify func(err error, retry int, wait time.Duration)

// Do runs op until it succeeds, fails with a Permanent error, has been retried
// MaxRetries times, or ctx is done. It returns the number of retries made and
// the last error of op (nil on success). When ctx is done during a wait or an
// attempt, it returns ctx's error joined with the last failure, so callers can
// test errors.Is(err, context.Canceled) and must not treat it as a failure of
// the input.
func (p Policy) Do(ctx context.Context, op func(context.Context) error, notify Notify) (retries int, err error) {
	b := backoff.WithContext(backoff.WithMaxRetries(p.NewBackOff(), uint64(p.MaxRetries)), ctx)
	var last error
	err = backoff.RetryNotify(func() error {
		last = op(ctx)
		if last != nil && ctx.Err() == nil && IsPermanent(last) {
			return backoff.Permanent(last)
		}
		return last
	}, b, func(err error, wait time.Duration) {
		retries++
		if notify != nil {
			notify(err, retries, wait)
		}
	})
	if err != nil && ctx.Err() != nil {
		return retries, errors.Join(ctx.Err(), last)
	}
	return retries, err
}

// UntilAvailable runs op and, while it fails with an Infrastructure error,
// waits and runs it again with the policy's intervals and no retry limit. It
// returns op's first non-infrastructure result, or ctx's error joined with the
// last failure when ctx is done. notify (may be nil) is called before each
// wait; retries counted here are not failures of the input.
func (p Policy) UntilAvailable(ctx context.Context, op func(context.Context) error, notify Notify) error {
	b := backoff.WithContext(p.NewBackOff(), ctx)
	var last error
	n := 0
	err := backoff.RetryNotify(func() error {
		last = op(ctx)
		if last == nil || !IsInfrastructure(last) || ctx.Err() != nil {
			return backoff.Permanent(withNil(last))
		}
		return last
	}, b, func(err error, wait time.Duration) {
		n++
		if notify != nil {
			notify(err, n, wait)
		}
	})
	if errors.Is(err, errNil) {
		err = nil
	}
	if err != nil && ctx.Err() != nil {
		return errors.Join(ctx.Err(), last)
	}
	return err
}

// errNil stands in for a nil result inside backoff.Permanent, which needs a
// non-nil error to stop the loop.
var errNil = errors.New("retry: success")

func withNil(err error) error {
	if err == nil {
		return errNil
	}
	return err
}
