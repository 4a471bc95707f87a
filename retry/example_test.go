package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/retry"
)

func ExampleClassify() {
	undefinedColumn := &pgconn.PgError{Severity: "ERROR", Code: "42703", Message: `column "followed_at" of relation "artist_followers" does not exist`}
	badNumber := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type bigint: "abc"`}
	fmt.Println(retry.Classify(fmt.Errorf("apply: %w", undefinedColumn)))
	fmt.Println(retry.Classify(badNumber))
	fmt.Println(retry.Classify(retry.MarkPermanent(errors.New("derive score: division by zero"))))
	// Output:
	// projection
	// permanent
	// permanent
}

func ExampleClassifySQLState() {
	for _, code := range []string{"57P01", "57014", "25006", "22P02", "42703"} {
		fmt.Println(code, retry.ClassifySQLState(code))
	}
	// Output:
	// 57P01 infrastructure
	// 57014 projection
	// 25006 infrastructure
	// 22P02 permanent
	// 42703 projection
}

func ExamplePolicy_Do() {
	p := retry.DefaultPolicy()
	p.Initial, p.MaxInterval = time.Millisecond, 5*time.Millisecond
	attempts := 0
	retries, err := p.Do(context.Background(), func(context.Context) error {
		attempts++
		return &pgconn.PgError{Severity: "ERROR", Code: "42P01", Message: `relation "t.x" does not exist`}
	}, nil)
	fmt.Println(attempts, retries, err)
	// Output:
	// 6 5 ERROR: relation "t.x" does not exist (SQLSTATE 42P01)
}
