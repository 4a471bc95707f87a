package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// TestRunExitsClearlyWhenKafkaStaysUnreachable: with no broker at
// --brokers, run retries for --kafka-start-timeout with a WARN line per
// attempt, then exits with status 4 and a message naming the brokers and
// the flag (new-user trial: exit 1 at once with kgo's dial error).
func TestRunExitsClearlyWhenKafkaStaysUnreachable(t *testing.T) {
	clearSettingsEnv(t)
	db := pgtest.URL(t)
	noKafka := closedAddr(t)
	tests := []struct {
		timeout  string
		minTime  time.Duration
		warnings bool
	}{
		{"0s", 0, false},
		{"3s", 3 * time.Second, true}, // the last attempt when the time is up, not a wait early
	}
	for _, tt := range tests {
		t.Run(tt.timeout, func(t *testing.T) {
			r := runCmd(t, 30*time.Second, "run", "--brokers", noKafka, "--database-url", db, "--projections", exampleProjections,
				"--http-addr", "", "--log-format", "text", "--kafka-start-timeout", tt.timeout)
			want := "Kafka unreachable at start: no broker of --brokers " + noKafka + " answered"
			if r.code != exitKafkaUnreachable || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "--kafka-start-timeout "+tt.timeout) {
				t.Errorf("want exit %d with %q and the flag\n%s", exitKafkaUnreachable, want, r)
			}
			if strings.Contains(r.stderr, "topics: Kafka unreachable") || (tt.timeout == "0s" && !strings.Contains(r.stderr, "answered in 1 attempt over")) {
				t.Errorf("want the message alone, with 1 attempt when the timeout is 0 (new-user trial: \"topics: ...\", \"1 attempts\")\n%s", r)
			}
			if got := strings.Contains(r.stderr, `msg="Kafka unreachable at start, retrying"`); got != tt.warnings {
				t.Errorf("retry WARN lines logged: %v, want %v\n%s", got, tt.warnings, r)
			}
			if r.took < tt.minTime {
				t.Errorf("exited after %s, want at least the %s of retries", r.took, tt.minTime)
			}
		})
	}
}

// TestRunStartTimeoutBoundsAnAttempt: a listener that takes the connection
// and never answers (the embedded broker's plaintext listener to a TLS
// client, a port of another service) holds run for --kafka-start-timeout
// and a last attempt of at most minStartAttempt, not for an attempt's own
// 30 s; the message says what can cause it (new-user trial: 30 s with
// --kafka-start-timeout 5s, and a bare "context deadline exceeded").
func TestRunStartTimeoutBoundsAnAttempt(t *testing.T) {
	clearSettingsEnv(t)
	ln := takenPort(t)
	go func() {
		var held []net.Conn // never answered, closed when the test ends
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	r := runCmd(t, 60*time.Second, "run", "--brokers", ln.Addr().String(), "--database-url", pgtest.URL(t), "--projections", exampleProjections,
		"--http-addr", "", "--log-format", "text", "--kafka-start-timeout", "3s")
	if r.code != exitKafkaUnreachable || !strings.Contains(r.stderr, "no answer in time") || !strings.Contains(r.stderr, "--kafka-tls") {
		t.Errorf("want exit %d, saying there was no answer in time and naming --kafka-tls\n%s", exitKafkaUnreachable, r)
	}
	if limit := 3*time.Second + minStartAttempt + 10*time.Second; r.took > limit {
		t.Errorf("exited after %s, want within --kafka-start-timeout 3s and a last attempt (%s; an attempt's own bound is 30 s)", r.took, limit)
	}
}

// TestRunStartsWhenKafkaComesUp: a broker that comes up while run retries
// at start is used, and the worker starts.
func TestRunStartsWhenKafkaComesUp(t *testing.T) {
	clearSettingsEnv(t)
	addr := closedAddr(t)
	_, portText, _ := net.SplitHostPort(addr)
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	w := startRun(t, "--brokers", addr, "--database-url", pgtest.URL(t), "--projections", exampleProjections,
		"--topic", kafkatest.TopicName(t, "events"), "--dlq-topic", kafkatest.TopicName(t, "dlq"),
		"--ledger-topic", kafkatest.TopicName(t, "ledger"), "--group", kafkatest.TopicName(t, "group"), "--partitions", "1",
		"--kafka-start-timeout", "30s")
	w.waitFor(t, "a retry WARN line", 20*time.Second, func() bool { return w.logged("Kafka unreachable at start, retrying") })
	kafkatest.Fake(t, kfake.Ports(port))
	w.waitFor(t, "the worker is up", 30*time.Second, func() bool { return w.logged("projection worker started") })
	w.shutdown(t)
}

// TestKafkaStartBackOffDoubles: the waits between attempts to reach Kafka
// at start are 1 s, then twice as long each time up to 10 s, each ±50 %, as
// the README says (the backoff library's own multiplier is 1.5).
func TestKafkaStartBackOffDoubles(t *testing.T) {
	for range 20 {
		b := kafkaStartBackOff()
		for i, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
			if got := b.NextBackOff(); got < base/2 || got > base*3/2 {
				t.Fatalf("wait %d = %s, want %s ±50 %%", i+1, got, base)
			}
		}
	}
}

// TestTopicsErrorSaysWhatNoAnswerCanBe: the topic requests' deadline with
// no answer (a TLS client on a plaintext listener, which takes the
// connection and never answers) names what can cause it and the flags
// (fresh-user trial: `topics --kafka-tls` said "context deadline exceeded"
// alone after 30 s); a refused dial names --brokers and its value
// (fresh-user trial: "unable to dial: ... connection refused" alone).
func TestTopicsErrorSaysWhatNoAnswerCanBe(t *testing.T) {
	err := topicsError(fmt.Errorf("ensure topics: list topics: %w", context.DeadlineExceeded), "k1:9092")
	if !strings.Contains(err.Error(), "no answer in time") || !strings.Contains(err.Error(), "--kafka-tls") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("topicsError = %v, want the no-answer hint naming --kafka-tls, wrapping the deadline", err)
	}
	refused := topicsError(fmt.Errorf("list topics: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), "k1:9092")
	if strings.Contains(refused.Error(), "no answer in time") || !strings.Contains(refused.Error(), "no broker of --brokers (KAFKA_BROKERS) k1:9092 answers") {
		t.Errorf("topicsError of a refused dial = %v, want --brokers and its value named, no no-answer hint", refused)
	}
}
