package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
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
		{"statement deadline is projection", fmt.Errorf("apply: %w", context.DeadlineExceeded), Projection},
		{"57014 statement timeout is projection", pgErr("57014"), Projection},
		{"25006 read-only transaction is infrastructure", pgErr("25006"), Infrastructure},
		{"closed pool is infrastructure", fmt.Errorf("acquire: %w", puddle.ErrClosedPool), Infrastructure},
		{"55P03 lock timeout is projection", pgErr("55P03"), Projection},
		{"57P02 crash shutdown", pgErr("57P02"), Infrastructure},
		{"57P03 cannot connect now", pgErr("57P03"), Infrastructure},
		{"25P02 failed transaction", pgErr("25P02"), Projection},
		{"28P01 password refused is infrastructure", pgErr("28P01"), Infrastructure},
		{"connect error wins over its SQLSTATE", &pgconn.ConnectError{Config: &pgconn.Config{}}, Infrastructure},
		{"conn closed", fmt.Errorf("exec: %w", pgconn.ErrConnClosed), Infrastructure},
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

// TestClassifySQLState checks the SQLSTATE table row by row: each code
// against the class it must have, the most specific rule winning.
func TestClassifySQLState(t *testing.T) {
	tests := []struct {
		code string
		want Class
	}{
		{"08000", Infrastructure}, {"08006", Infrastructure}, {"08P01", Infrastructure},
		{"22000", Permanent}, {"22P02", Permanent}, {"22003", Permanent}, {"22P05", Permanent}, {"22012", Permanent},
		{"23000", Projection}, {"23505", Projection}, {"23502", Projection},
		{"25000", Projection}, {"25P02", Projection},
		{"25006", Infrastructure},
		{"25P03", Infrastructure},
		{"28000", Infrastructure}, {"28P01", Infrastructure},
		{"3D000", Infrastructure},
		{"40001", Infrastructure}, {"40P01", Infrastructure}, {"40000", Projection}, {"40002", Projection},
		{"42000", Projection}, {"42703", Projection}, {"42P01", Projection}, {"42501", Projection},
		{"54000", Permanent}, {"54001", Projection}, {"54011", Projection},
		{"53000", Infrastructure}, {"53100", Infrastructure}, {"53200", Infrastructure}, {"53300", Infrastructure},
		{"55P03", Projection}, {"55000", Projection},
		{"57000", Infrastructure}, {"57P01", Infrastructure}, {"57P02", Infrastructure}, {"57P03", Infrastructure}, {"57P04", Infrastructure},
		{"57014", Projection},
		{"58000", Infrastructure}, {"58030", Infrastructure},
		{"XX000", Projection}, {"0A000", Projection}, {"P0001", Projection},
		{"", Projection}, {"57", Projection}, {"570140", Projection},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			if got := ClassifySQLState(tt.code); got != tt.want {
				t.Errorf("ClassifySQLState(%q) = %s, want %s", tt.code, got, tt.want)
			}
			if len(tt.code) == 5 {
				if got := Classify(pgErr(tt.code)); got != tt.want {
					t.Errorf("Classify(SQLSTATE %s) = %s, want %s", tt.code, got, tt.want)
				}
			}
		})
	}
}

// TestRules checks the shape of the table: sorted, no rule twice, every
// code a SQLSTATE or a class, named and explained, and each rule applied
// by Classify to a code it covers.
func TestRules(t *testing.T) {
	rules := Rules()
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	for i, r := range rules {
		t.Run(r.SQLState, func(t *testing.T) {
			if len(r.SQLState) != 2 && len(r.SQLState) != 5 || strings.Trim(r.SQLState, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
				t.Errorf("SQLState %q is not a SQLSTATE (5 of [0-9A-Z]) or a class (2)", r.SQLState)
			}
			if i > 0 && rules[i-1].SQLState >= r.SQLState {
				t.Errorf("rule %q follows %q: the table must be sorted, each code once", r.SQLState, rules[i-1].SQLState)
			}
			if r.Condition == "" || r.Reason == "" {
				t.Errorf("rule %q has no condition name or reason", r.SQLState)
			}
			code := r.SQLState
			if len(code) == 2 {
				code += "000"
			}
			if got := Classify(pgErr(code)); got != r.Class {
				t.Errorf("Classify(SQLSTATE %s) = %s, want the rule's %s", code, got, r.Class)
			}
		})
	}
	rules[0].Class = Permanent + 10
	if Rules()[0] == rules[0] {
		t.Error("Rules returned the table itself, not a copy")
	}
}

// TestREADMEPrintsRules checks that README.md's SQLSTATE table is the
// table Classify applies, row for row.
func TestREADMEPrintsRules(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := rulesMarkdown(Rules())
	lines := strings.Split(string(readme), "\n")
	header := strings.SplitN(want, "\n", 2)[0]
	start := slices.Index(lines, header)
	if start < 0 {
		t.Fatalf("README.md has no line %q; put this table in its Failure handling section:\n%s", header, want)
	}
	end := start
	for end < len(lines) && strings.HasPrefix(lines[end], "|") {
		end++
	}
	if got := strings.Join(lines[start:end], "\n") + "\n"; got != want {
		t.Errorf("README.md's SQLSTATE table differs from retry.Rules (-README +code):\n%s", cmp.Diff(got, want))
	}
}

// rulesMarkdown renders rules as README.md prints them.
func rulesMarkdown(rules []Rule) string {
	var b strings.Builder
	b.WriteString("| SQLSTATE | condition | class | why |\n|---|---|---|---|\n")
	for _, r := range rules {
		code := "`" + r.SQLState + "`"
		if len(r.SQLState) == 2 {
			code = "class " + code
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", code, r.Condition, r.Class, r.Reason)
	}
	return b.String()
}

// TestPolicyLongest: the sum of MaxRetries waits at their longest, cap
// and jitter included, and no overflow for a policy of huge waits.
func TestPolicyLongest(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    Policy
		want time.Duration
	}{
		{"defaults", DefaultPolicy(), 9300 * time.Millisecond}, // (200+400+800+1600+3200) ms × 1.5
		{"capped, no jitter", Policy{Initial: time.Second, Multiplier: 10, MaxInterval: 5 * time.Second, MaxRetries: 3}, 11 * time.Second},
		{"no retries", Policy{Initial: time.Second, Multiplier: 2, MaxInterval: time.Minute}, 0},
		{"multiplier 1", Policy{Initial: 200 * time.Millisecond, Multiplier: 1, MaxInterval: time.Second, MaxRetries: 300}, time.Minute},
	} {
		if got := tt.p.Longest(); got != tt.want {
			t.Errorf("%s: Longest = %s, want %s", tt.name, got, tt.want)
		}
	}
	huge := Policy{Initial: 1000 * time.Hour, Multiplier: 2, MaxInterval: 1000 * time.Hour, Jitter: 0.5, MaxRetries: 10000}
	if got := huge.Longest(); got <= 0 {
		t.Errorf("huge waits: Longest = %s, want a positive bound", got)
	}
	// --max-retries 9223372036854775807 (a new user's "retry forever"):
	// Longest ran a step per retry, on every partition turn, and the
	// worker spun on every core (new-user trial). Now it returns at once.
	forever := DefaultPolicy()
	forever.MaxRetries = math.MaxInt
	done := make(chan time.Duration, 1)
	go func() { done <- forever.Longest() }()
	select {
	case got := <-done:
		if got < time.Duration(math.MaxInt64/4) {
			t.Errorf("MaxRetries MaxInt: Longest = %s, want about the cap, MaxInt64/2 ns", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("MaxRetries MaxInt: Longest did not return within 10 s (a step per retry)")
	}
}

// TestNewBackOffAfterGoesOnWithTheSchedule: the next wait of
// NewBackOffAfter(k) is the (k+1)-th wait of NewBackOff, at most
// MaxInterval (no jitter here, so the waits are exact).
func TestNewBackOffAfterGoesOnWithTheSchedule(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Multiplier: 2, MaxInterval: 3 * time.Second, Jitter: 0, MaxRetries: 20}
	fresh := p.NewBackOff()
	for k := range 8 {
		want := fresh.NextBackOff()
		if got := p.NewBackOffAfter(k).NextBackOff(); got != want {
			t.Errorf("NewBackOffAfter(%d): next wait %v, want %v (wait %d of NewBackOff)", k, got, want, k+1)
		}
	}
	if got := p.NewBackOffAfter(-1).NextBackOff(); got != p.Initial {
		t.Errorf("NewBackOffAfter(-1): next wait %v, want Initial %v", got, p.Initial)
	}
	if got := p.NewBackOffAfter(1 << 30).NextBackOff(); got != p.MaxInterval {
		t.Errorf("NewBackOffAfter(2^30): next wait %v, want MaxInterval %v", got, p.MaxInterval)
	}
}

// TestIsConflict: a deadlock or serialization failure, wrapped or not, is a
// conflict with another transaction (and Infrastructure); other
// infrastructure errors and other class-40 codes are not.
func TestIsConflict(t *testing.T) {
	for code, want := range map[string]bool{"40001": true, "40P01": true, "40000": false, "40002": false, "08006": false, "25006": false, "57P01": false, "23505": false} {
		if got := IsConflict(pgErr(code)); got != want {
			t.Errorf("IsConflict(%s) = %v, want %v", code, got, want)
		}
		if want && !IsInfrastructure(pgErr(code)) {
			t.Errorf("%s is a conflict but not Infrastructure", code)
		}
	}
	if IsConflict(nil) || IsConflict(errors.New("deadlock detected")) {
		t.Error("IsConflict of nil or of an error without a SQLSTATE = true")
	}
}
