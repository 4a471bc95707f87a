package projection_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// TestPairSpanSaysWhatItsAttemptsDid: a pair's span tells its failed
// attempts by exception events, each with its error.type and SQLSTATE,
// and its retries by one "retry" event per retry made, as many as its
// causet.retry.count (tracing trial):
//   - a rating that fails (a CHECK, 23514) and then applies ends applied,
//     without error.type or db.response.status_code of its own, which
//     would mark it failed;
//   - a rating still failing when the worker stops ends released, with no
//     event for the retry that was scheduled and never made.
func TestPairSpanSaysWhatItsAttemptsDid(t *testing.T) {
	t.Parallel()
	r, ratings := ratingsRig(t, 2)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var failures atomic.Int64
	rn := r.start(func(c *projection.Config) {
		c.TracerProvider = tp
		c.Retry = retry.Policy{Initial: 300 * time.Millisecond, Multiplier: 1, MaxInterval: 300 * time.Millisecond, MaxRetries: 1000}
		c.Breaker.Threshold = -1
		c.Logger = slog.New(onMessage(c.Logger.Handler(), "projection failed, retrying", func() { failures.Add(1) }))
	})
	r.produce("recovers", []byte(r.event("ARTIST_RATED", "recovers", 1, `{"user_id":"recovers","artist_id":"a","stars":0}`)))
	waitFor(t, "the first rating to fail", func() bool { return failures.Load() > 0 })
	exec(t, r.pool, "ALTER TABLE "+ratings+" DROP CONSTRAINT stars_positive, ADD CONSTRAINT stars_not_negative CHECK (stars >= 0)")
	r.produce("released", []byte(r.event("ARTIST_RATED", "released", 1, `{"user_id":"released","artist_id":"a","stars":-1}`)))
	waitFor(t, "the first rating to apply", func() bool { return r.count("artist_ratings") == 1 })
	seen := failures.Load()
	waitFor(t, "the second rating to fail 3 times more", func() bool { return failures.Load() >= seen+3 })
	if err := rn.stop(t); err != nil {
		t.Fatal(err)
	}

	recordOf := map[string]string{} // record span id → its key
	for _, s := range rec.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "messaging.kafka.message.key" {
				recordOf[s.SpanContext().SpanID().String()] = a.Value.AsString()
			}
		}
	}
	checked := map[string]bool{}
	for _, s := range rec.Ended() {
		key := recordOf[s.Parent().SpanID().String()]
		if s.Name() != "apply artist_ratings" || key == "" {
			continue
		}
		checked[key] = true
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		retries, exceptions := 0, 0
		for _, e := range s.Events() {
			switch e.Name {
			case "retry":
				retries++
			case "exception":
				exceptions++
				ev := map[attribute.Key]string{}
				for _, a := range e.Attributes {
					ev[a.Key] = a.Value.Emit()
				}
				if ev["error.type"] != "projection" || ev["db.response.status_code"] != "23514" || ev["exception.type"] != "*pgconn.PgError" {
					t.Errorf("%s: exception event %v, want error.type projection, db.response.status_code 23514 and exception.type *pgconn.PgError", key, ev)
				}
			}
		}
		want := map[string]string{"recovers": "applied", "released": "released"}[key]
		if got := attrs["causet.outcome"].Emit(); got != want {
			t.Errorf("%s: outcome %q, want %q", key, got, want)
		}
		for _, k := range []attribute.Key{"error.type", "db.response.status_code"} {
			if v, ok := attrs[k]; ok {
				t.Errorf("%s (%s): span attribute %s=%s, which marks it failed", key, want, k, v.Emit())
			}
		}
		if n := attrs["causet.retry.count"].AsInt64(); int64(retries) != n || n == 0 || exceptions < int(n) {
			t.Errorf("%s: %d retry events, %d exception events, causet.retry.count %d; want one retry event per retry made, at least one, and a failed attempt before each", key, retries, exceptions, n)
		}
	}
	if !checked["recovers"] || !checked["released"] {
		t.Errorf("pair spans found for %v, want recovers and released", checked)
	}
}

// TestCopyBatchSpanSaysWhatItApplied: a committed COPY transaction's span
// gives the pairs it applied (causet.batch.pairs, as the batch_size metric
// counts them) and the ones it tried and left, its refused rows
// (causet.batch.pairs_left), where it said every pair it tried (tracing
// trial: 40 pairs where it had applied 37 and the 3 refused were
// dead-lettered). 40 ratings in one partition, 3 refused by a CHECK.
func TestCopyBatchSpanSaysWhatItApplied(t *testing.T) {
	t.Parallel()
	if copyMinRows < 0 {
		t.Skip("TEST_NO_COPY=1: no COPY transaction")
	}
	r, ratings := ratingsRig(t, 2)
	// The same rule written with a function, which the worker does not
	// evaluate in Go (checkExpr): the refused rows fail inside the COPY
	// batch, whose span this test is about.
	exec(t, r.pool, "ALTER TABLE "+ratings+" DROP CONSTRAINT stars_positive, ADD CONSTRAINT stars_positive CHECK (sign(stars) = 1)")
	const n, refused = 40, 3
	var keys, values []string
	for i := range n {
		user := fmt.Sprintf("rater-%d", i)
		stars := 1 + i%5
		if i%10 == 5 && i < 10*refused {
			stars = 0
		}
		keys = append(keys, "one-partition")
		values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	rn := r.start(func(c *projection.Config) {
		c.TracerProvider = tp
		c.Retry = retry.Policy{Initial: 10 * time.Millisecond, Multiplier: 1, MaxInterval: 10 * time.Millisecond, MaxRetries: 1}
		c.Breaker.Threshold = -1
	})
	r.waitCommitted(testTimeout)
	if err := rn.stop(t); err != nil {
		t.Fatal(err)
	}
	var copies, applied, left int64
	for _, s := range rec.Ended() {
		if s.Name() != "copy batch" || s.Status().Code == codes.Error {
			continue
		}
		copies++
		var pairs, l int64
		for _, a := range s.Attributes() {
			switch a.Key {
			case "causet.batch.pairs":
				pairs = a.Value.AsInt64()
			case "causet.batch.pairs_left":
				l = a.Value.AsInt64()
			}
		}
		if pairs+l != int64(len(s.Links())) {
			t.Errorf("copy batch span: %d pairs applied and %d left, %d links; want a link per pair tried (one pair a record here)", pairs, l, len(s.Links()))
		}
		applied, left = applied+pairs, left+l
	}
	if copies == 0 || applied != n-refused || left != refused {
		t.Errorf("%d committed copy batch spans: %d pairs applied, %d left; want %d applied and the %d refused left", copies, applied, left, n-refused, refused)
	}
	if got := r.count("artist_ratings"); got != n-refused {
		t.Errorf("rows = %d, want %d", got, n-refused)
	}
}
