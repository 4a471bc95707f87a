package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

type validationErr struct{}

func (validationErr) Error() string   { return "invalid event: sequenceNumber: must be an integer" }
func (validationErr) Permanent() bool { return true }

func pgErr(code string) error {
	return fmt.Errorf("apply ARTIST_FOLLOWED to artist_followers: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "boom"})
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
	}{
		{"validation error", fmt.Errorf("decode: %w", validationErr{}), Permanent},
		{"marked permanent", MarkPermanent(errors.New("derive score: division by zero")), Permanent},
		{"22P02 invalid text representation", pgErr("22P02"), Permanent},
		{"22003 numeric out of range", pgErr("22003"), Permanent},
		{"22P05 NUL in text", pgErr("22P05"), Permanent},
		{"42703 undefined column", pgErr("42703"), Projection},
		{"42P01 undefined table", pgErr("42P01"), Projection},
		{"23505 unique violation", pgErr("23505"), Projection},
		{"23502 not null violation", pgErr("23502"), Projection},
		{"08006 connection failure", pgErr("08006"), Infrastructure},
		{"53300 too many connections", pgErr("53300"), Infrastructure},
		{"57P01 admin shutdown", pgErr("57P01"), Infrastructure},
		{"40001 serialization failure", pgErr("40001"), Infrastructure},
		{"40P01 deadlock", pgErr("40P01"), Infrastructure},
		{"40002 other class 40", pgErr("40002"), Projection},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, Infrastructure},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), Infrastructure},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), Infrastructure},
		{"pool acquire deadline", fmt.Errorf("acquire: %w", context.DeadlineExceeded), Infrastructure},
		{"unknown error", errors.New("something odd"), Projection},
		{"marked permanent wins over SQLSTATE", MarkPermanent(pgErr("08006")), Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err); got != tt.want {
				t.Errorf("Classify(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

func TestSQLState(t *testing.T) {
	if got := SQLState(pgErr("42703")); got != "42703" {
		t.Errorf("SQLState = %q, want 42703", got)
	}
	if got := SQLState(errors.New("x")); got != "" {
		t.Errorf("SQLState of a non-PostgreSQL error = %q, want empty", got)
	}
}

func fast(retries int) Policy {
	return Policy{Initial: time.Millisecond, Multiplier: 2, MaxInterval: 4 * time.Millisecond, Jitter: 0, MaxRetries: retries}
}

func TestDoRetriesThenGivesUp(t *testing.T) {
	calls := 0
	var notified []int
	retries, err := fast(5).Do(context.Background(), func(context.Context) error {
		calls++
		return pgErr("42703")
	}, func(_ error, n int, _ time.Duration) { notified = append(notified, n) })
	if calls != 6 || retries != 5 || SQLState(err) != "42703" {
		t.Errorf("calls=%d retries=%d err=%v, want 6 calls, 5 retries, the 42703 error", calls, retries, err)
	}
	if len(notified) != 5 || notified[4] != 5 {
		t.Errorf("notified retries %v, want 1..5", notified)
	}
}

func TestDoStopsAtPermanentError(t *testing.T) {
	calls := 0
	retries, err := fast(5).Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 2 {
			return pgErr("22P02")
		}
		return pgErr("42703")
	}, nil)
	if calls != 2 || retries != 1 || SQLState(err) != "22P02" {
		t.Errorf("calls=%d retries=%d err=%v, want 2 calls, 1 retry, the 22P02 error", calls, retries, err)
	}
}

func TestDoSucceedsAfterRetry(t *testing.T) {
	calls := 0
	retries, err := fast(5).Do(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return pgErr("40001")
		}
		return nil
	}, nil)
	if err != nil || retries != 2 {
		t.Errorf("retries=%d err=%v, want 2 retries and success", retries, err)
	}
}

func TestDoCancelledDuringWaitReturnsContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := Policy{Initial: time.Hour, Multiplier: 2, MaxInterval: time.Hour, MaxRetries: 5}
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	start := time.Now()
	_, err := p.Do(ctx, func(context.Context) error { return pgErr("42703") }, nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("Do waited %s after cancel", time.Since(start))
	}
}

func TestUntilAvailable(t *testing.T) {
	calls := 0
	err := fast(0).UntilAvailable(context.Background(), func(context.Context) error {
		calls++
		switch {
		case calls < 4:
			return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
		default:
			return pgErr("42703")
		}
	}, nil)
	if calls != 4 || SQLState(err) != "42703" {
		t.Errorf("calls=%d err=%v, want 4 calls ending in the 42703 error", calls, err)
	}
	if err := fast(0).UntilAvailable(context.Background(), func(context.Context) error { return nil }, nil); err != nil {
		t.Errorf("success: err = %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := []Policy{
		{Initial: 0, Multiplier: 2, MaxInterval: time.Second},
		{Initial: time.Second, Multiplier: 0.5, MaxInterval: time.Second},
		{Initial: time.Second, Multiplier: 2, MaxInterval: time.Millisecond},
		{Initial: time.Second, Multiplier: 2, MaxInterval: time.Second, Jitter: 1},
		{Initial: time.Second, Multiplier: 2, MaxInterval: time.Second, MaxRetries: -1},
	}
	for i, p := range bad {
		if err := p.Validate(); err == nil {
			t.Errorf("policy %d %+v: Validate() = nil, want an error", i, p)
		}
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Errorf("DefaultPolicy().Validate() = %v", err)
	}
}
