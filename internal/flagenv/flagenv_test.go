package flagenv

import (
	"errors"
	"flag"
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
	create  bool
}

func parse(t *testing.T, args []string, env map[string]string) (settings, error) {
	t.Helper()
	var s settings
	fs := New("test", io.Discard).WithLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	fs.String(&s.brokers, "brokers", "KAFKA_BROKERS", "127.0.0.1:9092", "brokers")
	fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
	fs.Duration(&s.grace, "shutdown-grace", "SHUTDOWN_GRACE", 25*time.Second, "grace")
	fs.Strings(&s.tenants, "tenant-schema", "TENANT_SCHEMAS", "tenants")
	fs.Bool(&s.create, "create-topics", "CREATE_TOPICS", true, "create")
	return s, fs.Parse(args)
}

func TestParsePrecedence(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want settings
	}{
		{"defaults", nil, nil, settings{brokers: "127.0.0.1:9092", retries: 5, grace: 25 * time.Second, create: true}},
		{"env", nil, map[string]string{"KAFKA_BROKERS": "k:1", "MAX_RETRIES": "2", "TENANT_SCHEMAS": "a, b", "CREATE_TOPICS": "false", "SHUTDOWN_GRACE": "1m"},
			settings{brokers: "k:1", retries: 2, grace: time.Minute, tenants: []string{"a", "b"}}},
		{"flag beats env", []string{"--brokers", "f:1", "--tenant-schema", "c", "--tenant-schema", "d", "--create-topics", "--max-retries", "16"},
			map[string]string{"KAFKA_BROKERS": "k:1", "TENANT_SCHEMAS": "a", "CREATE_TOPICS": "false"},
			settings{brokers: "f:1", retries: 16, grace: 25 * time.Second, tenants: []string{"c", "d"}, create: true}},
		{"bool with =", []string{"--create-topics=false", "--shutdown-grace=0"}, nil,
			settings{brokers: "127.0.0.1:9092", retries: 5}},
		{"empty env ignored", nil, map[string]string{"KAFKA_BROKERS": ""}, settings{brokers: "127.0.0.1:9092", retries: 5, grace: 25 * time.Second, create: true}},
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
		{"misspelt flag, letters swapped", []string{"--max-retires", "3"}, nil, "unknown flag --max-retires (did you mean --max-retries?)"},
		{"misspelt flag, a letter wrong", []string{"--shutdown-grase=5s"}, nil, "unknown flag --shutdown-grase (did you mean --shutdown-grace?)"},
		{"bad flag value", []string{"--max-retries", "x"}, nil, `--max-retries (MAX_RETRIES) "x": not an integer`},
		{"hexadecimal int", []string{"--max-retries", "0x20"}, nil, `--max-retries (MAX_RETRIES) "0x20": not an integer: write it in decimal digits`},
		{"int with underscores", nil, map[string]string{"MAX_RETRIES": "1_000"}, `MAX_RETRIES (flag --max-retries): invalid value "1_000": not an integer: write it in decimal digits`},
		{"int with a leading 0 (octal to Go)", []string{"--max-retries=010"}, nil, `--max-retries (MAX_RETRIES) "010": not an integer: write it in decimal digits without a leading 0`},
		{"negative int with a leading 0", []string{"--max-retries=-07"}, nil, `--max-retries (MAX_RETRIES) "-07": not an integer: write it in decimal digits without a leading 0`},
		{"int out of range", []string{"--max-retries", "99999999999999999999"}, nil, `--max-retries (MAX_RETRIES) "99999999999999999999": out of range`},
		{"bad env value", nil, map[string]string{"SHUTDOWN_GRACE": "soon"}, "SHUTDOWN_GRACE"},
		{"duration without unit", []string{"--shutdown-grace", "5"}, nil, `--shutdown-grace (SHUTDOWN_GRACE) "5": a duration needs a unit, e.g. 5s or 5ms`},
		{"duration without unit in env", nil, map[string]string{"SHUTDOWN_GRACE": "2.5"}, `SHUTDOWN_GRACE (flag --shutdown-grace): invalid value "2.5": a duration needs a unit`},
		{"not a duration", []string{"--shutdown-grace=soon"}, nil, `--shutdown-grace (SHUTDOWN_GRACE) "soon": not a duration`},
		{"bool not a bool", []string{"--create-topics=maybe"}, nil, `--create-topics (CREATE_TOPICS) "maybe": not true or false`},
		{"bool not a bool in env", nil, map[string]string{"CREATE_TOPICS": "maybe"}, `CREATE_TOPICS (flag --create-topics): invalid value "maybe": not true or false`},
		{"bool with a separate value", []string{"--create-topics", "maybe"}, nil, `unexpected argument "maybe" after --create-topics: a bool flag takes its value after =, e.g. --create-topics=false`},
		{"bool with a separate false", []string{"--create-topics", "false"}, nil, `unexpected argument "false" after --create-topics: a bool flag takes its value after =`},
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

// TestUnknownFlagSuggestsOnlyAClose: a flag far from every defined one
// gets no suggestion (a guess would mislead more than it helps).
func TestUnknownFlagSuggestsOnlyAClose(t *testing.T) {
	for _, arg := range []string{"--nope", "--frobnicate", "--max", "--retries"} {
		_, err := parse(t, []string{arg}, nil)
		if err == nil || !strings.Contains(err.Error(), "unknown flag "+arg) || strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%s: error %v, want unknown flag with no suggestion", arg, err)
		}
	}
}

// TestParseErrorPrintsNothingAndHelpPrintsTheUsage: a bad command line is
// one error naming the flag as the README writes it (--name, where the
// flag package writes -name), returned with a hint, with nothing printed
// before it (the flag package prints its error and every flag's usage);
// -h prints the usage, also after other flags.
func TestParseErrorPrintsNothingAndHelpPrintsTheUsage(t *testing.T) {
	for _, args := range [][]string{{"--nope"}, {"--max-retries", "x"}, {"--brokers"}} {
		var out strings.Builder
		fs := New("test run", &out)
		var brokers string
		var retries int
		fs.String(&brokers, "brokers", "", "b", "seed brokers")
		fs.Int(&retries, "max-retries", "", 5, "retries")
		err := fs.Parse(args)
		if err == nil || !strings.HasSuffix(err.Error(), " (test run -h lists the flags)") || strings.Contains(err.Error(), " -nope") || strings.Contains(err.Error(), " -brokers") {
			t.Errorf("Parse(%q) = %v, want an error ending with the hint", args, err)
		}
		if out.Len() != 0 {
			t.Errorf("Parse(%q) printed %q, want nothing", args, out.String())
		}
	}
	for _, args := range [][]string{{"-h"}, {"--brokers", "x", "--help"}} {
		var out strings.Builder
		fs := New("test run", &out)
		var brokers string
		fs.String(&brokers, "brokers", "", "b", "seed brokers")
		if err := fs.Parse(args); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("Parse(%q) = %v, want flag.ErrHelp", args, err)
		}
		if got := out.String(); !strings.HasPrefix(got, "Usage of test run:\n") || !strings.Contains(got, "seed brokers") {
			t.Errorf("Parse(%q) printed %q, want the usage", args, got)
		}
		// Flags with the two dashes the README and the errors write.
		if got := out.String(); !strings.Contains(got, "\n  --brokers string\n") || strings.Contains(got, "\n  -brokers") {
			t.Errorf("Parse(%q) printed %q, want --brokers", args, got)
		}
	}
}

// TestWithEnvNamesTheVariable: a usage error about a flag with an
// environment variable gets the variable after the flag, once; other
// errors and flags without a variable are left as they are.
func TestWithEnvNamesTheVariable(t *testing.T) {
	var s settings
	fs := New("test", io.Discard)
	fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
	fs.Int(&s.retries, "no-env", "", 5, "retries")
	plain := errors.New("--max-retries must be >= 0")
	for _, tt := range []struct {
		err  error
		want string
	}{
		{Usagef("--max-retries must be >= 0, got -1"), "--max-retries (MAX_RETRIES) must be >= 0, got -1"},
		{Usagef("--max-retries: not an integer"), "--max-retries (MAX_RETRIES): not an integer"},
		{Usagef("--max-retries (MAX_RETRIES) must be >= 0"), "--max-retries (MAX_RETRIES) must be >= 0"},
		{Usagef("--no-env must be >= 0"), "--no-env must be >= 0"},
		{Usagef("--unknown must be >= 0"), "--unknown must be >= 0"},
		{Usagef("an error about --max-retries"), "an error about --max-retries"},
		{plain, plain.Error()},
	} {
		got := fs.WithEnv(tt.err)
		if got.Error() != tt.want {
			t.Errorf("WithEnv(%q) = %q, want %q", tt.err, got, tt.want)
		}
		var ue *UsageError
		if errors.As(tt.err, &ue) != errors.As(got, &ue) {
			t.Errorf("WithEnv(%q) changed whether it is a usage error", tt.err)
		}
	}
}

// TestRepeatedFindsAFlagGivenTwice: Repeated counts a flag given as
// --name v, --name=v and -name v, a bool flag without a value, and not a
// value that looks like a flag nor anything after the flags.
func TestRepeatedFindsAFlagGivenTwice(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // in the error; "" none
	}{
		{[]string{"--brokers", "a:1", "--brokers=b:1"}, "--brokers is given 2 times"},
		{[]string{"-brokers", "a:1", "--create-topics", "--brokers", "b:1"}, "--brokers is given 2 times"},
		{[]string{"--brokers", "a:1", "--max-retries", "3"}, ""},
		{[]string{"--brokers", "a:1", "--", "--brokers", "b:1"}, ""},
		{[]string{"--tenant-schema", "a", "--tenant-schema", "b", "--brokers", "a:1"}, ""}, // not asked about
	} {
		var s settings
		fs := New("test", io.Discard).WithLookup(func(string) (string, bool) { return "", false })
		fs.String(&s.brokers, "brokers", "KAFKA_BROKERS", "127.0.0.1:9092", "brokers")
		fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
		fs.Strings(&s.tenants, "tenant-schema", "TENANT_SCHEMAS", "tenants")
		fs.Bool(&s.create, "create-topics", "CREATE_TOPICS", true, "create")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		err := fs.Repeated(tt.args, "brokers", "max-retries")
		var ue *UsageError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: Repeated = %v, want none", tt.args, err)
		case tt.want != "" && (err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: Repeated = %v, want a usage error with %q", tt.args, err, tt.want)
		}
	}
}

// TestAFlagGivenAFlagAsItsValueIsRefused: "--name --other" (a flag that
// lacks its value) is refused naming both flags, and shows no value given
// with --other; an argument that is not a flag is quoted unless it may
// hold a password (security trial: `--group --database-url URL` and
// `--kafka-sasl-user --kafka-sasl-password P` printed the URL and P as
// unexpected arguments, `--database-url $DSN` unquoted a DSN's
// password=... word).
func TestAFlagGivenAFlagAsItsValueIsRefused(t *testing.T) {
	for _, tt := range []struct {
		args        []string
		want, never string
	}{
		{[]string{"--brokers", "--max-retries", "S3cretPw"}, "--brokers needs a value, and was given the flag --max-retries as one", "S3cretPw"},
		{[]string{"--brokers", "--max-retries=S3cretPw"}, "given the flag --max-retries as one", "S3cretPw"},
		{[]string{"-brokers", "-shutdown-grace", "5s"}, "--brokers needs a value", ""},
		// A number or a duration fails to parse first (fresh-user trial:
		// `--max-retries "--shutdown-grace": not an integer`).
		{[]string{"--max-retries", "--shutdown-grace", "5s"}, "--max-retries needs a value, and was given the flag --shutdown-grace as one", ""},
		{[]string{"--shutdown-grace", "--max-retries", "3"}, "--shutdown-grace needs a value, and was given the flag --max-retries as one", ""},
		{[]string{"--brokers", "a:1", "user=wk", "password=S3cretPw"}, "unexpected argument \"user=wk\"", ""},
		{[]string{"--brokers", "a:1", "password=S3cretPw"}, "unexpected argument (not shown: it may hold a password)", "S3cretPw"},
		{[]string{"--brokers", "a:1", "postgres://u:S3cretPw@h/db"}, "unexpected argument (not shown: it may hold a password)", "S3cretPw"},
		{[]string{"--create-topics", "password=S3cretPw"}, "unexpected argument (not shown: it may hold a password) after --create-topics", "S3cretPw"},
	} {
		var s settings
		fs := New("test", io.Discard).WithLookup(func(string) (string, bool) { return "", false })
		fs.String(&s.brokers, "brokers", "KAFKA_BROKERS", "127.0.0.1:9092", "brokers")
		fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
		fs.Duration(&s.grace, "shutdown-grace", "SHUTDOWN_GRACE", 25*time.Second, "grace")
		fs.Bool(&s.create, "create-topics", "CREATE_TOPICS", true, "create")
		err := fs.Parse(tt.args)
		if err == nil {
			err = fs.NoArguments()
		}
		var ue *UsageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want a usage error with %q", tt.args, err, tt.want)
		}
		if err != nil && tt.never != "" && strings.Contains(err.Error(), tt.never) {
			t.Errorf("%q: error %v shows %q", tt.args, err, tt.never)
		}
	}
	// A value that starts with '-' but is no flag is a value.
	var s settings
	fs := New("test", io.Discard).WithLookup(func(string) (string, bool) { return "", false })
	fs.Int(&s.retries, "max-retries", "MAX_RETRIES", 5, "retries")
	if err := fs.Parse([]string{"--max-retries", "-1"}); err != nil || s.retries != -1 || fs.NoArguments() != nil {
		t.Errorf("--max-retries -1: %v, retries %d; want -1", err, s.retries)
	}
}
