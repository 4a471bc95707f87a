package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/causet/projection-worker/internal/kafkatest"
)

// TestSASLPasswordNeverPrinted: with a SASL password the broker refuses,
// given as a flag or in KAFKA_SASL_PASSWORD, every command fails (exit 1)
// without printing the password, debug logs included (issue 14).
func TestSASLPasswordNeverPrinted(t *testing.T) {
	const password = "Replayer-Sasl-pw-8080"
	dlqTopic := kafkatest.TopicName(t, "dlq")
	b := kafkatest.Fake(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "replayer", password), kfake.SeedTopics(1, dlqTopic))
	b.RefuseSASL(nil)
	e := env{"KAFKA_BROKERS": strings.Join(b.Addrs, ","), "KAFKA_SASL_MECHANISM": "scram-sha-512", "KAFKA_SASL_USER": "replayer"}
	for _, cmd := range []string{"list", "summary", "retry", "skip"} {
		for _, how := range []string{"flag", "env"} {
			t.Run(cmd+" "+how, func(t *testing.T) {
				args := []string{cmd, "--all", "--dlq-topic", dlqTopic, "--log-level", "debug"}
				ce := env{}
				for k, v := range e {
					ce[k] = v
				}
				if how == "flag" {
					args = append(args, "--kafka-sasl-password", password)
				} else {
					ce["KAFKA_SASL_PASSWORD"] = password
				}
				if cmd == "skip" {
					args = append(args, "--reason", "test", "--actor", "test")
				}
				r := runCmd(t, ce, args...)
				if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "SASL_AUTHENTICATION_FAILED") {
					t.Errorf("%s: exit %d, want a failure that names SASL_AUTHENTICATION_FAILED\nstdout:\n%s\nstderr:\n%s", cmd, r.code, r.stdout, r.stderr)
				}
				if strings.Contains(r.stdout+r.stderr, password) {
					t.Errorf("%s printed the SASL password\nstdout:\n%s\nstderr:\n%s", cmd, r.stdout, r.stderr)
				}
			})
		}
	}
}
