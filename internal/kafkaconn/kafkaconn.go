// Package kafkaconn holds the Kafka connection settings shared by the
// commands (brokers, TLS, SASL) and turns them into franz-go options.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/causet/projection-worker/internal/flagenv"
)

// DefaultBrokers is the broker list when neither --brokers nor KAFKA_BROKERS
// is set: the embedded broker of `make run`.
const DefaultBrokers = "127.0.0.1:9092"

// Settings are the connection flags.
type Settings struct {
	// Brokers is a comma-separated host:port list. Default 127.0.0.1:9092.
	Brokers string
	// TLS enables TLS; TLSCA is a PEM bundle of CAs (default: system roots),
	// and setting it enables TLS too; TLSServerName overrides the name
	// checked in the broker's certificate.
	TLS           bool
	TLSCA         string
	TLSServerName string
	// SASLMechanism is "", "plain", "scram-sha-256" or "scram-sha-512".
	SASLMechanism string
	SASLUser      string
	SASLPassword  string
	// flags are the flags Register defined, to tell --kafka-tls=false
	// given from left at its default; nil for Settings made otherwise.
	flags *flagenv.Set
}

// Register defines the connection flags on fs, each with its environment
// variable (KAFKA_BROKERS, KAFKA_TLS, KAFKA_TLS_CA, KAFKA_TLS_SERVER_NAME,
// KAFKA_SASL_MECHANISM, KAFKA_SASL_USER, KAFKA_SASL_PASSWORD).
func (s *Settings) Register(fs *flagenv.Set) {
	s.flags = fs
	fs.String(&s.Brokers, "brokers", "KAFKA_BROKERS", DefaultBrokers, "Kafka seed brokers, comma-separated host:port")
	fs.Bool(&s.TLS, "kafka-tls", "KAFKA_TLS", false, "connect to Kafka with TLS")
	fs.String(&s.TLSCA, "kafka-tls-ca", "KAFKA_TLS_CA", "", "PEM file of CA certificates for Kafka TLS (default: system roots); setting it turns TLS on, as --kafka-tls does")
	fs.String(&s.TLSServerName, "kafka-tls-server-name", "KAFKA_TLS_SERVER_NAME", "", "server name to verify in the brokers' certificates; setting it turns TLS on, as --kafka-tls does")
	fs.String(&s.SASLMechanism, "kafka-sasl-mechanism", "KAFKA_SASL_MECHANISM", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (default: none)")
	fs.String(&s.SASLUser, "kafka-sasl-user", "KAFKA_SASL_USER", "", "SASL user name")
	fs.String(&s.SASLPassword, "kafka-sasl-password", "KAFKA_SASL_PASSWORD", "", "SASL password (prefer the environment variable)")
}

// notShown says why an entry of --brokers is quoted only up to its first
// ':': what follows may be a password (user:password, fresh-user trial:
// `alice:S3cret` was echoed whole, as "not host:port").
const notShown = " (what follows the first ':' is not shown: it may be a password)"

// shownUpToColon quotes b up to and with its first ':', then "…".
func shownUpToColon(b string) string {
	return strconv.Quote(b[:strings.IndexByte(b, ':')+1] + "…")
}

// Opts validates the settings and returns the franz-go options for them:
// seed brokers, TLS dialer and SASL mechanism. Errors are *flagenv.UsageError
// naming the flag to fix.
func (s Settings) Opts() ([]kgo.Opt, error) {
	var brokers []string
	for i, b := range strings.Split(s.Brokers, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
		if strings.Contains(b, "@") {
			// Not echoed: user:password@host (replayer trial: a Job's log
			// kept the password).
			return nil, flagenv.Usagef("--brokers (KAFKA_BROKERS): entry %d holds \"@\", so it is not host:port (it is not shown: it may hold a password); a user and password go in --kafka-sasl-user and KAFKA_SASL_PASSWORD", i+1)
		}
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			if !strings.Contains(b, ":") {
				return nil, flagenv.Usagef("--brokers: %q is not host:port (it has no port)", b)
			}
			if i := strings.LastIndexByte(b, ':'); !strings.Contains(b, "[") && net.ParseIP(b[:i]) != nil {
				// An address hides nothing (fresh-user trial: ::1:9092
				// was refused with no hint).
				return nil, flagenv.Usagef("--brokers: %q is an IPv6 address and a port: write the address in brackets, [%s]:%s", b, b[:i], b[i+1:])
			}
			return nil, flagenv.Usagef("--brokers: entry %d (%s) is not host:port%s", i+1, shownUpToColon(b), notShown)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			if _, err := strconv.ParseUint(port, 10, 64); err == nil {
				// A number out of range hides nothing.
				return nil, flagenv.Usagef("--brokers: %q: the port must be a number from 1 to 65535", b)
			}
			return nil, flagenv.Usagef("--brokers: entry %d (%q): the port must be a number from 1 to 65535%s", i+1, host+":…", notShown)
		}
		brokers = append(brokers, b)
	}
	if len(brokers) == 0 {
		return nil, flagenv.Usagef("--brokers (KAFKA_BROKERS) is empty: set it to host:port[,host:port...]")
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if !s.TLS && s.tlsOn() && s.flags != nil && s.flags.Given("kafka-tls") {
		// Said, not overridden (fourth new-user trial: --kafka-tls=false
		// with a server name took TLS, and failed after the timeout).
		return nil, flagenv.Usagef("--kafka-tls=false (KAFKA_TLS) with --kafka-tls-ca or --kafka-tls-server-name, which turn TLS on: unset one or the other")
	}
	if s.tlsOn() {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.TLSServerName}
		if s.TLSCA != "" {
			pem, err := os.ReadFile(s.TLSCA)
			if err != nil {
				return nil, flagenv.Usagef("--kafka-tls-ca: %v", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, flagenv.Usagef("--kafka-tls-ca: %s holds no PEM certificate", s.TLSCA)
			}
			cfg.RootCAs = pool
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	switch strings.ToLower(s.SASLMechanism) {
	case "":
	case "plain":
		opts = append(opts, kgo.SASL(plain.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsMechanism()))
	case "scram-sha-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha256Mechanism()))
	case "scram-sha-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha512Mechanism()))
	default:
		return nil, flagenv.Usagef("--kafka-sasl-mechanism: %q is not one of plain, scram-sha-256, scram-sha-512", s.SASLMechanism)
	}
	if s.SASLMechanism != "" && s.SASLUser == "" {
		return nil, flagenv.Usagef("--kafka-sasl-user (KAFKA_SASL_USER) is required with --kafka-sasl-mechanism")
	}
	if s.SASLMechanism == "" && (s.SASLUser != "" || s.SASLPassword != "") {
		// Credentials without a mechanism would be dropped, and the
		// client would connect without authenticating (new-user trial:
		// exit 0, no SASL).
		return nil, flagenv.Usagef("--kafka-sasl-user or --kafka-sasl-password is set without --kafka-sasl-mechanism (KAFKA_SASL_MECHANISM): set the mechanism (plain, scram-sha-256 or scram-sha-512), or unset them")
	}
	opts = append(opts, kgo.DialTimeout(10*time.Second))
	return opts, nil
}

// String describes the connection for logs without the password.
func (s Settings) String() string {
	return fmt.Sprintf("brokers=%s tls=%t sasl=%s", s.Brokers, s.tlsOn(), s.SASLMechanism)
}

// SameConnection reports whether s and o connect alike: the same
// settings, whichever flags they were read from.
func (s Settings) SameConnection(o Settings) bool {
	s.flags, o.flags = nil, nil
	return s == o
}

// tlsOn reports whether the settings connect with TLS: --kafka-tls, or a
// CA or a server name to verify, which only make sense with TLS (new-user
// trial: a server name alone connected in plaintext, silently).
func (s Settings) tlsOn() bool { return s.TLS || s.TLSCA != "" || s.TLSServerName != "" }

// Explain names, in terms of the connection flags, the likely cause of err
// from a Kafka client: SASL authentication refused, an operation not
// authorized by the broker's ACLs, a SASL mechanism the broker does not
// enable, a TLS handshake that failed, or a static member fenced by
// another with the same group instance id (FENCED_INSTANCE_ID). It returns
// "" for any other error (err's own text then says enough).
func Explain(err error) string {
	var (
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		invalid    x509.CertificateInvalidError
		recordHdr  tls.RecordHeaderError
		tlsAlert   tls.AlertError
		verifyFail *tls.CertificateVerificationError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return "Kafka authentication failed: the broker refused the SASL user or password (check --kafka-sasl-user, --kafka-sasl-password and --kafka-sasl-mechanism)"
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return "Kafka authentication failed: the broker does not enable this SASL mechanism (check --kafka-sasl-mechanism)"
	case errors.Is(err, kerr.IllegalSaslState):
		// Operator trial: a listener without SASL (PLAINTEXT) answers
		// this, which read as a mechanism to change.
		return "Kafka authentication failed: this listener takes no SASL (a PLAINTEXT or SSL listener?): point --brokers at the broker's SASL listener, or leave --kafka-sasl-mechanism unset"
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
		errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return "Kafka authorization failed: the broker's ACLs do not allow this SASL user the operation"
	case errors.Is(err, kerr.FencedInstanceID):
		return "another member of the consumer group has joined with this worker's --group-instance-id (GROUP_INSTANCE_ID), so the broker keeps this one out: give each worker its own (a StatefulSet pod's name, never a value shared by a Deployment's replicas), or none"
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verifyFail):
		return "Kafka TLS handshake failed: the broker's certificate is not trusted (check --kafka-tls-ca and --kafka-tls-server-name)"
	case err != nil && strings.Contains(err.Error(), "plaintext connection speaking to a tls endpoint"):
		// franz-go's text when a TLS listener answers a plaintext
		// request with an alert (operator trial: no flag named).
		return "the broker's listener speaks TLS (SSL or SASL_SSL) and the connection was made without it: set --kafka-tls (with --kafka-tls-ca for a private CA), and the SASL flags for a SASL_SSL listener"
	case errors.As(err, &recordHdr):
		return "Kafka TLS handshake failed: the broker does not speak TLS on this port (check --brokers and --kafka-tls)"
	case errors.As(err, &tlsAlert):
		return "Kafka TLS handshake failed: the broker refused the handshake (check --kafka-tls-ca and --kafka-tls-server-name)"
	}
	return ""
}

// ClosedHint names the likely cause of err when a broker closed the
// connection (EOF) during a command's first requests: security settings
// its listener does not expect, or no Kafka listener; "" for any other
// error. Later, a closed connection is more likely a broker restarting,
// so Explain does not say it.
func ClosedHint(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		// New-user trial: SASL against a listener without it read "list
		// topics: EOF", 28 s later.
		return "the broker closed the connection: its listener expects other security settings (SASL to a listener without SASL, none to one that requires it, TLS: check --kafka-sasl-mechanism and --kafka-tls), or it is not a Kafka listener"
	}
	return ""
}

// Closed asks the brokers of cl for metadata once each (kgo's Ping: no
// retries) and returns the error when every broker closed the connection
// (ClosedHint says something of it), else nil, whatever else failed: what
// a command's first request then meets again. A broker whose listener
// expects other security settings closes every connection, and kgo retries
// a request over closed connections for about 28 s before it gives up
// (new-user trial: SASL against a listener without it, 28 s of silence
// before the hint), so a command's first request is told so at once.
func Closed(ctx context.Context, cl *kgo.Client) error {
	if err := cl.Ping(ctx); ClosedHint(err) != "" {
		return fmt.Errorf("first metadata request: %w", err)
	}
	return nil
}

// NoAnswerHint says why a broker that takes connections may not answer
// in time: the causes to check, in terms of the connection flags.
const NoAnswerHint = "no answer in time: a host that drops connection attempts, something other than a Kafka listener at that port, or TLS or SASL settings (--kafka-tls, --kafka-sasl-mechanism) its listener does not expect"

// NoBrokerAnswers says that no broker of brokers (--brokers) took a
// connection, and what to check.
func NoBrokerAnswers(brokers string) string {
	return "no broker of --brokers (KAFKA_BROKERS) " + brokers + " answers: check the addresses and that Kafka is running"
}

// DialError reports whether err is a dial's: connection refused, no route,
// a name that does not resolve (no broker answered at all).
func DialError(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr)
}
