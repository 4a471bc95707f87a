package kafkatest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SecureBroker is the SASL_SSL listener of make kafka-up's broker
// (scripts/kafka-up.sh): SCRAM-SHA-512 over TLS with a certificate signed
// by a private CA, and a user of its own.
type SecureBroker struct {
	Addr     string // KAFKA_SASL_SSL_BROKERS
	CAFile   string // KAFKA_SASL_SSL_CA: the private CA's certificate, PEM
	User     string
	Password string
}

// Secure returns the real broker's SASL_SSL listener with a SCRAM-SHA-512
// user created for t (random name and password) through the Admin API on
// the PLAINTEXT listener (KAFKA_BROKERS). It skips t without a real broker
// (KAFKA_BROKERS unset: make test runs on kfake); with a real broker but
// without KAFKA_SASL_SSL_BROKERS and KAFKA_SASL_SSL_CA (printed by
// kafka-up.sh; not the commands' KAFKA_TLS_CA, which would turn TLS on for
// every test's command) it
// skips locally and fails under CI=true.
func Secure(t testing.TB) SecureBroker {
	t.Helper()
	if !Real() {
		t.Skip("needs make kafka-up's broker (KAFKA_BROKERS): make test-kafka")
	}
	s := SecureBroker{Addr: os.Getenv("KAFKA_SASL_SSL_BROKERS"), CAFile: os.Getenv("KAFKA_SASL_SSL_CA")}
	if s.Addr == "" || s.CAFile == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KAFKA_SASL_SSL_BROKERS and KAFKA_SASL_SSL_CA are not set: make test-kafka sets them from scripts/kafka-up.sh")
		}
		t.Skip("KAFKA_SASL_SSL_BROKERS and KAFKA_SASL_SSL_CA are not set (see scripts/kafka-up.sh)")
	}
	s.User, s.Password = "causet-"+randomHex(t, 6), randomHex(t, 16)
	cl, err := kgo.NewClient(kgo.SeedBrokers(New(t).Addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{
		User: s.User, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: s.Password,
	}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("create SCRAM-SHA-512 user %s: %v", s.User, err)
	}
	// The credential reaches the listener through the metadata log: wait
	// until it authenticates.
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.ping(ctx)
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("SCRAM user %s does not authenticate on %s: %v", s.User, s.Addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s SecureBroker) ping(ctx context.Context) error {
	opts, err := s.Opts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.Ping(ctx)
}

// Args returns the command-line flags that connect to s.
func (s SecureBroker) Args() []string {
	return []string{"--brokers", s.Addr, "--kafka-tls-ca", s.CAFile,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", s.User, "--kafka-sasl-password", s.Password}
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// Opts returns the franz-go options that connect to s: TLS trusting only
// the private CA, SASL/SCRAM-SHA-512 as s.User.
func (s SecureBroker) Opts() ([]kgo.Opt, error) {
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", s.CAFile)
	}
	return []kgo.Opt{
		kgo.SeedBrokers(s.Addr),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()),
	}, nil
}
