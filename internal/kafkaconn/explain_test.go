package kafkaconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestExplainNamesTheCause: a Kafka error that comes from the connection
// settings is explained with the flags to check (issue 14: a wrong SASL
// password left /readyz saying only "consumer group not joined").
func TestExplainNamesTheCause(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want []string // each in Explain's text; none: ""
	}{
		{"SASL authentication failed, as kgo wraps it", fmt.Errorf("list topics: %w",
			fmt.Errorf("Authentication failed due to invalid credentials: %w", kerr.SaslAuthenticationFailed)),
			[]string{"authentication failed", "--kafka-sasl-password"}},
		{"SASL mechanism not enabled", kerr.UnsupportedSaslMechanism, []string{"authentication failed", "--kafka-sasl-mechanism"}},
		{"group not authorized", fmt.Errorf("join: %w", kerr.GroupAuthorizationFailed), []string{"authorization failed", "ACLs"}},
		{"unknown CA", fmt.Errorf("dial: %w", x509.UnknownAuthorityError{}), []string{"TLS", "--kafka-tls-ca"}},
		{"plaintext port", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, []string{"TLS", "--kafka-tls"}},
		{"static member fenced, as kgo wraps it", &kgo.ErrGroupSession{Err: kerr.FencedInstanceID}, []string{"--group-instance-id", "GROUP_INSTANCE_ID", "its own"}},
		{"other", errors.New("boom"), nil},
		{"connection closed: not said here (a broker restarting)", io.EOF, nil},
		{"nil", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Explain(tt.err)
			if len(tt.want) == 0 && got != "" {
				t.Errorf("Explain(%v) = %q, want \"\"", tt.err, got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("Explain(%v) = %q, want it to name %q", tt.err, got, w)
				}
			}
		})
	}
}

// TestClosedHintNamesTheSecuritySettings: a connection the broker closed
// during a command's first requests (EOF, as kadm wraps it) is explained
// by the security flags (new-user trial: SASL to a listener without SASL
// read "list topics: EOF"); any other error is not.
func TestClosedHintNamesTheSecuritySettings(t *testing.T) {
	for _, err := range []error{fmt.Errorf("list topics: %w", io.EOF), io.ErrUnexpectedEOF} {
		if got := ClosedHint(err); !strings.Contains(got, "--kafka-sasl-mechanism") || !strings.Contains(got, "--kafka-tls") {
			t.Errorf("ClosedHint(%v) = %q, want the SASL and TLS flags named", err, got)
		}
	}
	if got := ClosedHint(errors.New("boom")); got != "" {
		t.Errorf("ClosedHint(boom) = %q, want \"\"", got)
	}
}
