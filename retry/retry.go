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
	"net"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"
)

// Class is the kind of a failure. Its string form is the value of the
// causet.dlq.error-class header.
type Class int

const (
	// Projection is a failure that may succeed after a deploy or once other rows
	// change: SQLSTATE classes 23 and 42, handler panics, anything unknown. It is
	// retried, then dead-lettered.
	Projection Class = iota
	// Permanent is a failure of the input itself: validation, value conversion,
	// CEL evaluation, SQLSTATE class 22. It is dead-lettered at once with
	// retryCount 0.
	Permanent
	// Infrastructure is a failure of the database or the network: connection
	// refused or reset, SQLSTATE classes 08, 53, 57, 40001, 40P01, pool timeouts.
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

// Classify returns the class of err. Rules (SPEC §5), first match wins:
// errors marked permanent (PermanentError) are Permanent; a PostgreSQL error is
// classified by SQLSTATE (22 Permanent; 08, 53, 57, 58, 40001, 40P01
// Infrastructure; everything else Projection); connection-level failures
// (refused, reset, timeouts, EOF, pool acquire and statement deadlines, pgconn
// connect errors)
// are Infrastructure; anything else is Projection. A nil err is Projection.
func Classify(err error) Class {
	var pe PermanentError
	if errors.As(err, &pe) && pe.Permanent() {
		return Permanent
	}
	if code := SQLState(err); code != "" {
		return classifySQLState(code)
	}
	if isConnectionError(err) {
		return Infrastructure
	}
	return Projection
}

func classifySQLState(code string) Class {
	if len(code) != 5 {
		return Projection
	}
	switch code[:2] {
	case "22":
		return Permanent
	case "08", "53", "57", "58":
		return Infrastructure
	}
	switch code {
	case "40001", "40P01":
		return Infrastructure
	}
	return Projection
}

func isConnectionError(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded),
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
