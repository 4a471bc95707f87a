package main

import (
	"strings"
	"testing"

	"github.com/causet/projection-worker/internal/kafkatest"
)

// TestReplayerOverSASLAndTLSWithAPrivateCA: against the real broker's
// SASL_SSL listener (SCRAM-SHA-512, a private CA: make kafka-up),
// `list`, `summary` and `retry` connect with the TLS and SASL settings
// (flags or their environment variables), and a wrong password fails with
// exit status 1, a message saying authentication failed, and the password
// in no output.
func TestReplayerOverSASLAndTLSWithAPrivateCA(t *testing.T) {
	sb := kafkatest.Secure(t)
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	secure := env{}
	for k, v := range f.env {
		secure[k] = v
	}
	secure["KAFKA_BROKERS"], secure["KAFKA_TLS_CA"] = sb.Addr, sb.CAFile
	secure["KAFKA_SASL_MECHANISM"], secure["KAFKA_SASL_USER"], secure["KAFKA_SASL_PASSWORD"] = "scram-sha-512", sb.User, sb.Password

	if r := runCmd(t, secure, "list", "--all", "--output", "json"); r.code != 0 || strings.Count(r.stdout, "\n") != 3 {
		t.Fatalf("list over SASL_SSL exited %d with %d lines, want the 3 dead letters:\n%s\nstderr:\n%s", r.code, strings.Count(r.stdout, "\n"), r.stdout[:min(len(r.stdout), 300)], r.stderr)
	}
	if r := runCmd(t, secure, "retry", "--projection", "artist_followers"); r.code != 0 || !strings.Contains(r.stdout, "replayed=2") {
		t.Fatalf("retry over SASL_SSL exited %d:\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	secure["KAFKA_SASL_PASSWORD"] = "not-" + sb.Password
	r := runCmd(t, secure, "summary", "--all")
	if r.code != 1 || !strings.Contains(strings.ToLower(r.stdout+r.stderr), "authentication failed") {
		t.Errorf("summary with a wrong SASL password exited %d, want 1 and a message saying authentication failed:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, sb.Password) {
		t.Error("the SASL password appears in the replayer's output")
	}
}
