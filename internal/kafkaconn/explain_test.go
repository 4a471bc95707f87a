package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/testtool"
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
		// Operator trial: SASL to a PLAINTEXT listener read as a mechanism to change.
		{"SASL to a listener without SASL", kerr.IllegalSaslState, []string{"takes no SASL", "--brokers", "--kafka-sasl-mechanism unset"}},
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

// TestExplainNamesTLSForAPlaintextClientOfATLSListener: a client without
// TLS that reaches a TLS listener (SSL or SASL_SSL) reads the TLS alert
// the listener answers with as a response size, and franz-go's error says
// so; Explain turns it into the flag to set (operator trial: only
// franz-go's text, no flag named). The listener answers every connection
// with the alert a Kafka TLS listener sends (fatal, handshake failure).
func TestExplainNamesTLSForAPlaintextClientOfATLSListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testtool.Serve(t, ln, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 512))
		_, _ = c.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28}) // alert record, TLS 1.2: fatal, handshake_failure
	})
	opts, err := Settings{Brokers: ln.Addr().String()}.Opts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = cl.Ping(ctx)
	if got := Explain(err); !strings.Contains(got, "--kafka-tls") || !strings.Contains(got, "speaks TLS") {
		t.Errorf("Explain(%v) = %q, want it to say the listener speaks TLS and name --kafka-tls", err, got)
	}
}
