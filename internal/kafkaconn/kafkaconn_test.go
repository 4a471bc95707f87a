package kafkaconn

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/flagenv"
)

// TestOptsRefusesSASLCredentialsWithoutAMechanism: a SASL user or password
// without a mechanism is a usage error naming the flags, not dropped (the
// client would connect without authenticating: new-user trial); a
// mechanism without a user is one too; a complete setting is taken.
func TestOptsRefusesSASLCredentialsWithoutAMechanism(t *testing.T) {
	for _, tt := range []struct {
		s    Settings
		want string // in the error; "" none
	}{
		{Settings{Brokers: "k:9092", SASLUser: "bob"}, "without --kafka-sasl-mechanism"},
		{Settings{Brokers: "k:9092", SASLPassword: "pw"}, "without --kafka-sasl-mechanism"},
		{Settings{Brokers: "k:9092", SASLMechanism: "plain"}, "--kafka-sasl-user (KAFKA_SASL_USER) is required"},
		{Settings{Brokers: "k:9092", SASLMechanism: "plain", SASLUser: "bob", SASLPassword: "pw"}, ""},
		{Settings{Brokers: "k:9092"}, ""},
	} {
		_, err := tt.s.Opts()
		var ue *flagenv.UsageError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: Opts error %v, want none", tt.s, err)
		case tt.want != "" && (err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: Opts error %v, want a usage error with %q", tt.s, err, tt.want)
		}
	}
}

// TestTLSServerNameTurnsTLSOn: --kafka-tls-server-name alone connects with
// TLS, as --kafka-tls-ca alone does (new-user trial: it connected in
// plaintext, silently); without any TLS setting the client speaks
// plaintext. What the client sends first to a listener tells: a TLS
// handshake record starts with 0x16.
func TestTLSServerNameTurnsTLSOn(t *testing.T) {
	for _, tt := range []struct {
		s       Settings
		wantTLS bool
	}{
		{Settings{TLSServerName: "kafka.example"}, true},
		{Settings{}, false},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan byte, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err == nil {
				first <- b[0]
			}
		}()
		tt.s.Brokers = ln.Addr().String()
		opts, err := tt.s.Opts()
		if err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = cl.Ping(ctx)
		cancel()
		cl.Close()
		ln.Close()
		select {
		case b := <-first:
			if gotTLS := b == 0x16; gotTLS != tt.wantTLS || strings.Contains(tt.s.String(), "tls=true") != tt.wantTLS {
				t.Errorf("%+v: first byte %#x (TLS %v), String %q; want TLS %v", tt.s, b, gotTLS, tt.s.String(), tt.wantTLS)
			}
		default:
			t.Errorf("%+v: the client sent nothing", tt.s)
		}
	}
}

// TestTLSFalseWithAServerNameIsRefused: --kafka-tls=false given with a CA
// or a server name, which turn TLS on, is a usage error naming them, not
// TLS taken silently (fourth new-user trial); either alone is taken.
func TestTLSFalseWithAServerNameIsRefused(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // in the error; "" none
	}{
		{[]string{"--kafka-tls=false", "--kafka-tls-server-name", "foo"}, "--kafka-tls=false (KAFKA_TLS) with --kafka-tls-ca or --kafka-tls-server-name"},
		{[]string{"--kafka-tls-server-name", "foo"}, ""},
		{[]string{"--kafka-tls=false"}, ""},
	} {
		var s Settings
		fs := flagenv.New("test", io.Discard)
		s.Register(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		_, err := s.Opts()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%v: Opts error %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestBrokersWithAPasswordAreNotEchoed: a --brokers entry with "@"
// (user:password@host:port, a URL) is refused without being shown, naming
// its place and the SASL settings (replayer trial: the error quoted
// alice:S3cretX@127.0.0.1:48192, and a Job's log kept it).
func TestBrokersWithAPasswordAreNotEchoed(t *testing.T) {
	for _, tt := range []struct{ brokers, says string }{
		{"alice:S3cretX@127.0.0.1:9092", "entry 1 holds"},
		{"kafka://alice:S3cretX@127.0.0.1:9092", "entry 1 holds"},
		{"S3cretX@broker:9092", "entry 1 holds"},
		{"k1:9092, alice:S3cretX@k2:9092", "entry 2 holds"},
	} {
		_, err := Settings{Brokers: tt.brokers}.Opts()
		var ue *flagenv.UsageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), "--kafka-sasl-user") {
			t.Errorf("%s: Opts error %v, want a usage error with %q naming --kafka-sasl-user", tt.brokers, err, tt.says)
		}
		if err != nil && strings.Contains(err.Error(), "S3cretX") {
			t.Errorf("%s: the error shows the password: %v", tt.brokers, err)
		}
	}
}

// TestBrokersNotHostPortShowNothingAfterAColon: an entry that is not
// host:port is quoted up to its first ':' only, since what follows may be
// a password (fresh-user trial: `alice:S3cretX` was echoed whole as "not
// host:port"); an entry with no ':' and a port number out of range hide
// nothing and are quoted whole.
func TestBrokersNotHostPortShowNothingAfterAColon(t *testing.T) {
	for _, tt := range []struct{ brokers, says string }{
		{"alice:S3cretX", `entry 1 ("alice:…"): the port must be a number from 1 to 65535`},
		{"k1:9092,alice:S3cretX:k2:9092", `entry 2 ("alice:…") is not host:port`},
		{"kafka:S3cretX1", `entry 1 ("kafka:…"): the port`},
		{"kafka-1", `"kafka-1" is not host:port (it has no port)`},
		{"kafka-1:99999", `"kafka-1:99999": the port must be a number from 1 to 65535`},
		{"kafka-1:0", `"kafka-1:0": the port must be a number from 1 to 65535`},
		// An IPv6 address without brackets hides nothing, and gets the
		// hint; a password with colons does not parse as one.
		{"::1:9092", `"::1:9092" is an IPv6 address and a port: write the address in brackets, [::1]:9092`},
		{"fd00::5:19092", `write the address in brackets, [fd00::5]:19092`},
		{"alice:S3cretX:9092", `entry 1 ("alice:…") is not host:port`},
	} {
		_, err := Settings{Brokers: tt.brokers}.Opts()
		var ue *flagenv.UsageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: Opts error %v, want a usage error with %q", tt.brokers, err, tt.says)
		}
		if err != nil && strings.Contains(err.Error(), "S3cretX") {
			t.Errorf("%s: the error shows the password: %v", tt.brokers, err)
		}
	}
}
