package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/causet/projection-worker/internal/kafkaconn"
)

// exitKafkaUnreachable is run's exit status when no broker answered within
// --kafka-start-timeout (README "Exit status"); 3 is the replayer's
// --fail-on-empty, so the worker's is 4.
const exitKafkaUnreachable = 4

// kafkaUnreachableError is run's error when no broker of --brokers answered
// at start within --kafka-start-timeout.
type kafkaUnreachableError struct {
	brokers  string
	attempts int
	waited   time.Duration
	timeout  time.Duration // --kafka-start-timeout
	err      error         // the last attempt's
}

func (e *kafkaUnreachableError) Error() string {
	msg := fmt.Sprintf("Kafka unreachable at start: no broker of --brokers %s answered in %s over %s (--kafka-start-timeout %s, KAFKA_START_TIMEOUT): %v",
		e.brokers, plural(e.attempts, "attempt"), e.waited.Round(time.Millisecond), e.timeout, e.err)
	if !kafkaconn.DialError(e.err) {
		// Not a dial error refused at once: no answer in time (new-user
		// trial: --kafka-tls against the embedded broker's plaintext
		// listener, which takes the connection and never answers).
		msg += " (" + kafkaconn.NoAnswerHint + ")"
	}
	return msg
}

// plural returns "1 <noun>" or "<n> <noun>s".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func (e *kafkaUnreachableError) Unwrap() error { return e.err }

// kafkaUnreachable reports whether err says that no broker could be reached:
// a dial error (connection refused, no route, a name that does not resolve)
// or an attempt's deadline. A broker that answers and refuses (SASL, ACLs,
// TLS: kafkaconn.Explain) is not unreachable: waiting cannot change it.
func kafkaUnreachable(err error) bool {
	if kafkaconn.Explain(err) != "" {
		return false
	}
	return kafkaconn.DialError(err) || errors.Is(err, context.DeadlineExceeded)
}

// untilDeadline is b with its waits cut to end at deadline, and Stop from
// then on: the last attempt is made when the time is up, not as soon as
// b's next wait would pass it (backoff's MaxElapsedTime gives up then,
// up to a whole wait early).
type untilDeadline struct {
	b        backoff.BackOff
	deadline time.Time
}

func (u *untilDeadline) NextBackOff() time.Duration {
	left := time.Until(u.deadline)
	if left <= 0 {
		return backoff.Stop
	}
	next := u.b.NextBackOff()
	if next == backoff.Stop {
		return backoff.Stop
	}
	return min(next, left)
}

func (u *untilDeadline) Reset() { u.b.Reset() }

// kafkaStartBackOff is untilKafkaAnswers' waits: 1 s, ×2, at most 10 s,
// each ±50 %, with no limit of its own (untilDeadline ends it).
func kafkaStartBackOff() *backoff.ExponentialBackOff {
	eb := backoff.NewExponentialBackOff()
	eb.InitialInterval = time.Second
	eb.Multiplier = 2 // the library's default is 1.5
	eb.MaxInterval = 10 * time.Second
	eb.MaxElapsedTime = 0
	eb.Reset()
	return eb
}

// minStartAttempt is the least time an attempt of untilKafkaAnswers gets,
// the last one included (made when --kafka-start-timeout is up).
const minStartAttempt = 2 * time.Second

// untilKafkaAnswers runs attempt, Kafka's first request at start, until it
// returns anything but kafkaUnreachable, for at most --kafka-start-timeout
// (0: once; an attempt's ctx ends when the time is up, or minStartAttempt
// after it started when less was left, so that a broker that takes the
// connection and never answers holds run no longer), waiting 1 s, then
// twice as long each time up to 10 s, each wait ±50 % (the backoff library's jitter; the last wait cut to end when
// the time is up, for a last attempt then), with a
// WARN line per failed attempt. It returns a *kafkaUnreachableError when
// the time is up, and ctx's error when ctx ends first.
func untilKafkaAnswers[T any](ctx context.Context, s *settings, log *slog.Logger, attempt func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	var b backoff.BackOff = &backoff.StopBackOff{}
	if s.kafkaStartTimeout > 0 {
		b = &untilDeadline{b: kafkaStartBackOff(), deadline: start.Add(s.kafkaStartTimeout)}
	}
	var v T
	n := 0
	err := backoff.RetryNotify(func() error {
		n++
		actx, cancel := ctx, context.CancelFunc(func() {})
		if s.kafkaStartTimeout > 0 {
			actx, cancel = context.WithDeadline(ctx, later(start.Add(s.kafkaStartTimeout), time.Now().Add(minStartAttempt)))
		}
		var err error
		v, err = attempt(actx)
		cancel()
		if err != nil && (!kafkaUnreachable(err) || ctx.Err() != nil) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx), func(err error, wait time.Duration) {
		log.Warn("Kafka unreachable at start, retrying", "brokers", s.kafka.Brokers, "attempt", n, "wait", wait,
			"elapsed", time.Since(start), "start_timeout", s.kafkaStartTimeout, "error", err)
	})
	if err != nil && ctx.Err() == nil && kafkaUnreachable(err) {
		return v, &kafkaUnreachableError{brokers: s.kafka.Brokers, attempts: n, waited: time.Since(start), timeout: s.kafkaStartTimeout, err: err}
	}
	return v, err
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
