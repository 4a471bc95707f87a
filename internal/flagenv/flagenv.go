// Package flagenv builds command-line flag sets in which every flag may also
// be set by an environment variable: the command line wins, then the
// environment, then the flag's default.
package flagenv

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// UsageError is a bad command line or setting; commands exit with status 2
// on it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// Set is a flag.FlagSet whose flags may have environment variables.
type Set struct {
	*flag.FlagSet
	env    map[string]string // flag name -> environment variable
	lookup func(string) (string, bool)
}

// New returns an empty Set named name that writes usage to out and reads the
// environment with os.LookupEnv.
func New(name string, out io.Writer) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	s := &Set{FlagSet: fs, env: map[string]string{}, lookup: os.LookupEnv}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage of %s:\n", name)
		fs.PrintDefaults()
	}
	return s
}

// WithLookup replaces the environment lookup (for tests) and returns s.
func (s *Set) WithLookup(lookup func(string) (string, bool)) *Set {
	s.lookup = lookup
	return s
}

func (s *Set) bind(name, env string) {
	if env == "" {
		return
	}
	s.env[name] = env
	f := s.Lookup(name)
	f.Usage += " (env " + env + ")"
}

// Env returns the environment variable of every flag that has one, by flag
// name (a copy). The deployment tests check the manifests' variables
// against it.
func (s *Set) Env() map[string]string {
	env := make(map[string]string, len(s.env))
	for name, v := range s.env {
		env[name] = v
	}
	return env
}

// String defines a string flag with an environment variable ("" for none).
func (s *Set) String(p *string, name, env, def, usage string) {
	s.StringVar(p, name, def, usage)
	s.bind(name, env)
}

// Int defines an int flag with an environment variable.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	s.IntVar(p, name, def, usage)
	s.bind(name, env)
}

// Float64 defines a float64 flag with an environment variable.
func (s *Set) Float64(p *float64, name, env string, def float64, usage string) {
	s.Float64Var(p, name, def, usage)
	s.bind(name, env)
}

// Bool defines a bool flag with an environment variable.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	s.BoolVar(p, name, def, usage)
	s.bind(name, env)
}

// Duration defines a time.Duration flag (Go syntax: 200ms, 10s, 1m) with an
// environment variable.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	s.DurationVar(p, name, def, usage)
	s.bind(name, env)
}

// Strings defines a repeatable string flag; the environment variable holds a
// comma-separated list.
func (s *Set) Strings(p *[]string, name, env, usage string) {
	s.Var((*stringList)(p), name, usage)
	s.bind(name, env)
}

type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// Parse parses args, then sets every flag not given on the command line from
// its environment variable when that is set and non-empty. Errors are
// *UsageError naming the flag or variable; -h/--help gives flag.ErrHelp.
func (s *Set) Parse(args []string) error {
	if err := s.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{err}
	}
	given := map[string]bool{}
	s.Visit(func(f *flag.Flag) { given[f.Name] = true })
	names := make([]string, 0, len(s.env))
	for name := range s.env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if given[name] {
			continue
		}
		env := s.env[name]
		v, ok := s.lookup(env)
		if !ok || v == "" {
			continue
		}
		f := s.Lookup(name)
		if sl, ok := f.Value.(*stringList); ok {
			*sl = nil
			for _, part := range strings.Split(v, ",") {
				if part = strings.TrimSpace(part); part != "" {
					*sl = append(*sl, part)
				}
			}
			continue
		}
		if err := f.Value.Set(v); err != nil {
			return Usagef("environment variable %s (flag --%s): invalid value %q: %v", env, name, v, err)
		}
	}
	return nil
}
