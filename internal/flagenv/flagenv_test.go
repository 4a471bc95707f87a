package flagenv

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type settings struct {
	brokers string
	retries int
	grace   time.Duration
	tenants []string
}

func parse(t *testing.T, args []string, env map[string]string) (settings, error) {
	t.Helper()
	var s settings
	fs := New("test", io.Discard).WithLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	fs.String(&s.brokers, "brokers", "KAFKA_BROKERS", "127.0.0.1:9092", "brokers")
	fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
	fs.Duration(&s.grace, "shutdown-grace", "SHUTDOWN_GRACE", 25*time.Second, "grace")
	fs.Strings(&s.tenants, "tenant-schema", "TENANT_SCHEMAS", "tenants")
	return s, fs.Parse(args)
}

func TestParsePrecedence(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want settings
	}{
		{"defaults", nil, nil, settings{brokers: "127.0.0.1:9092", retries: 5, grace: 25 * time.Second}},
		{"env", nil, map[string]string{"KAFKA_BROKERS": "k:1", "MAX_RETRIES": "2", "TENANT_SCHEMAS": "a, b"},
			settings{brokers: "k:1", retries: 2, grace: 25 * time.Second, tenants: []string{"a", "b"}}},
		{"flag beats env", []string{"--brokers", "f:1", "--tenant-schema", "c", "--tenant-schema", "d"},
			map[string]string{"KAFKA_BROKERS": "k:1", "TENANT_SCHEMAS": "a"},
			settings{brokers: "f:1", retries: 5, grace: 25 * time.Second, tenants: []string{"c", "d"}}},
		{"empty env ignored", nil, map[string]string{"KAFKA_BROKERS": ""}, settings{brokers: "127.0.0.1:9092", retries: 5, grace: 25 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(t, tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(settings{})); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrorsAreUsageErrorsNamingTheSetting(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown flag", []string{"--nope"}, nil, "nope"},
		{"bad flag value", []string{"--max-retries", "x"}, nil, "max-retries"},
		{"bad env value", nil, map[string]string{"SHUTDOWN_GRACE": "soon"}, "SHUTDOWN_GRACE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.args, tt.env)
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("error %v is not a *UsageError", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}
