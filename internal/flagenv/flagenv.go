// Package flagenv builds command-line flag sets in which every flag may also
// be set by an environment variable: the command line wins, then the
// environment, then the flag's default.
package flagenv

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agnivade/levenshtein"
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
	env     map[string]string // flag name -> environment variable
	fromEnv map[string]bool   // the flags Parse set from their variable
	lookup  func(string) (string, bool)
	// invalid is the last value an Int, Bool or Duration flag refused, in
	// the form Parse returns it: `--name "value": reason`.
	invalid error
	// failed is what the flag package printed of a parse error.
	failed bytes.Buffer
	// Unknown is the flag Parse last refused as not defined (its name,
	// without dashes); "" after a Parse that met none.
	Unknown string
}

// New returns an empty Set named name that writes its usage to out on
// -h/--help (and nothing else: Parse returns its errors) and reads the
// environment with os.LookupEnv.
func New(name string, out io.Writer) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	s := &Set{FlagSet: fs, env: map[string]string{}, fromEnv: map[string]bool{}, lookup: os.LookupEnv}
	// The flag package prints a parse error, then the whole usage, before
	// it returns the error: the error goes to s.failed instead, and the
	// usage is printed only when there is none (-h).
	fs.SetOutput(&s.failed)
	fs.Usage = func() {
		if s.failed.Len() > 0 {
			return
		}
		fmt.Fprintf(out, "Usage of %s:\n", name)
		s.printFlags(out)
	}
	return s
}

// printFlags writes the usage of each flag, in name order, as the flag
// package's PrintDefaults does but with the two dashes the README and the
// errors write (`--brokers string`; new-user trial: -h printed
// `-brokers`): the name and its value's kind, then the usage and the
// default when it is not the zero value.
func (s *Set) printFlags(out io.Writer) {
	s.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			if kind == "string" {
				line += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				line += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintln(out, line)
	})
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

// WithEnv returns err naming the environment variable of the flag it is
// about: when err is a *UsageError whose message begins with "--name"
// (then a space or ':'), name a flag of s with an environment variable
// ENV, and the message does not name ENV already, "--name" becomes
// "--name (ENV)". A value set in the environment (a Kubernetes ConfigMap)
// is then found by the name its owner wrote. Any other error is returned
// as it is.
func (s *Set) WithEnv(err error) error {
	var ue *UsageError
	if !errors.As(err, &ue) {
		return err
	}
	msg := ue.Error()
	if !strings.HasPrefix(msg, "--") {
		return err
	}
	end := strings.IndexAny(msg, " :=")
	if end < 0 {
		end = len(msg)
	}
	env := s.env[msg[2:end]]
	if env == "" || strings.Contains(msg, env) {
		return err
	}
	return &UsageError{fmt.Errorf("%s (%s)%s", msg[:end], env, msg[end:])}
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

// Int defines an int flag with an environment variable. A value that is
// not a decimal integer (or 0x hex) is refused naming the flag.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	*p = def
	s.Var(&checkedValue[int]{set: s, name: name, p: p, parse: parseInt}, name, usage)
	s.bind(name, env)
}

// Float64 defines a float64 flag with an environment variable. A value
// that is not a decimal number, or is not finite, is refused naming the
// flag and the form expected (fresh-user trial: --rate abc said "parse
// error" and named -rate alone).
func (s *Set) Float64(p *float64, name, env string, def float64, usage string) {
	*p = def
	s.Var(&checkedValue[float64]{set: s, name: name, p: p, parse: parseFloat}, name, usage)
	s.bind(name, env)
}

// parseFloat reads a finite decimal number (2, 0.5, 1e3).
func parseFloat(in string) (float64, error) {
	f, err := strconv.ParseFloat(in, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0):
		return 0, errors.New("out of range for a number") // 1e400
	case err != nil || math.IsInf(f, 0) || math.IsNaN(f) || strings.HasPrefix(strings.ToLower(strings.TrimLeft(in, "+-")), "0x"):
		return 0, errors.New("not a number: write it in decimal, e.g. 50 or 0.5")
	}
	return f, nil
}

// Bool defines a bool flag with an environment variable. On the command
// line it is given as --name (true) or --name=false; Parse refuses
// "--name false", which the flag package would read as --name and an
// argument.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	*p = def
	s.Var(&checkedValue[bool]{set: s, name: name, p: p, parse: parseBool, boolFlag: true}, name, usage)
	s.bind(name, env)
}

// Duration defines a time.Duration flag (Go syntax: 200ms, 10s, 1m) with an
// environment variable. A number without a unit ("5") is refused with a
// message saying a unit is needed.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	*p = def
	s.Var(&checkedValue[time.Duration]{set: s, name: name, p: p, parse: parseDuration}, name, usage)
	s.bind(name, env)
}

// checkedValue is a flag.Value of type T whose parse errors say what is
// expected; the flag package reports them as "parse error" otherwise.
type checkedValue[T any] struct {
	set      *Set
	name     string
	p        *T
	parse    func(string) (T, error)
	boolFlag bool
}

func (v *checkedValue[T]) String() string {
	var x T
	if v != nil && v.p != nil { // nil: the flag package's zero value, for PrintDefaults
		x = *v.p
	}
	return fmt.Sprint(x)
}

func (v *checkedValue[T]) Set(in string) error {
	x, err := v.parse(in)
	if err != nil {
		v.set.invalid = fmt.Errorf("--%s %q: %w", v.name, in, err)
		return err
	}
	*v.p = x
	return nil
}

func (v *checkedValue[T]) IsBoolFlag() bool { return v.boolFlag }

// parseInt reads a decimal integer, with an optional sign: "0x20",
// "1_000" and "010" (which Go's base prefixes would read as 32, 1000 and
// 8) are refused, not read otherwise than an operator means them.
func parseInt(in string) (int, error) {
	n, err := strconv.ParseInt(in, 10, strconv.IntSize)
	if errors.Is(err, strconv.ErrRange) {
		return 0, errors.New("out of range for an integer")
	}
	if err != nil {
		return 0, errors.New("not an integer: write it in decimal digits, e.g. 500")
	}
	if len(in) > 1 && (in[0] == '0' || len(in) > 2 && (in[0] == '+' || in[0] == '-') && in[1] == '0') {
		return 0, errors.New("not an integer: write it in decimal digits without a leading 0, e.g. 500")
	}
	return int(n), nil
}

func parseDuration(in string) (time.Duration, error) {
	d, err := time.ParseDuration(in)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(in, 64); nerr == nil {
		return 0, fmt.Errorf("a duration needs a unit, e.g. %ss or %sms", in, in)
	}
	return 0, errors.New("not a duration: write e.g. 5s, 200ms or 1m30s")
}

func parseBool(in string) (bool, error) {
	b, err := strconv.ParseBool(in)
	if err != nil {
		return false, errors.New("not true or false")
	}
	return b, nil
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

// didYouMean is DidYouMean of the unknown flag name among s's flags
// (new-user trial: `--max-retires` got "unknown flag" alone).
func (s *Set) didYouMean(name string) string {
	var flags []string
	s.VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) })
	return DidYouMean(name, flags, "--")
}

// DidYouMean returns " (did you mean <prefix><k>?)" for the one k of known
// closest to name, when it is close enough to be a misspelling of it: at
// most 2 edits (Levenshtein distance; a transposition counts 2), and
// fewer than name has characters; "" when none is, or two are equally
// close. It ends an "unknown flag" or "unknown command" message.
func DidYouMean(name string, known []string, prefix string) string {
	if best := closest(name, known); best != "" {
		return " (did you mean " + prefix + best + "?)"
	}
	return ""
}

// UnknownCommand returns the message of an unknown command word of program
// (its commands known): a suggestion of the closest (DidYouMean), or, for
// a word that is a flag (`projection-worker --max-retries 3`), that the
// command comes first (new-user trial: "unknown command" alone).
func UnknownCommand(program, word string, known []string) string {
	msg := fmt.Sprintf("%s: unknown command %q", program, word)
	if strings.HasPrefix(word, "-") {
		return msg + ": the command comes first, then its flags (" + program + " " + known[0] + " " + word + " ...)"
	}
	return msg + DidYouMean(word, known, "")
}

// closest is DidYouMean's choice: the k of known, or "".
func closest(name string, known []string) string {
	best, bestDist, tie := "", 3, false
	for _, k := range known {
		switch d := levenshtein.ComputeDistance(name, k); {
		case d < bestDist:
			best, bestDist, tie = k, d, false
		case d == bestDist:
			tie = true
		}
	}
	if best == "" || tie || bestDist >= len(name) {
		return ""
	}
	return best
}

// Parse parses args, then sets every flag not given on the command line from
// its environment variable when that is set and non-empty. Errors are
// *UsageError naming the flag or variable and what it expects
// (`--retry-initial "5": a duration needs a unit, e.g. 5s or 5ms`), also for
// a bool flag given its value as a separate argument; -h/--help gives
// flag.ErrHelp.
func (s *Set) Parse(args []string) error {
	s.failed.Reset()
	s.Unknown = ""
	if err := s.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		// A number or duration flag given another flag as its value
		// fails here ("--max-retries "--retry-initial": not an
		// integer"): said as for a text flag (fresh-user trial).
		if ferr := s.checkValueIsFlag(args); ferr != nil {
			return ferr
		}
		if s.invalid != nil {
			err = s.invalid
		} else if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			name = strings.TrimPrefix(name, "-")
			s.Unknown = name
			err = fmt.Errorf("unknown flag --%s%s", name, s.didYouMean(name))
		} else if name, ok := strings.CutPrefix(err.Error(), "flag needs an argument: -"); ok {
			err = fmt.Errorf("flag --%s needs a value", strings.TrimPrefix(name, "-"))
		}
		// The variable too (new-user trial: `--fetch-max-bytes "16MiB": not
		// an integer` named no FETCH_MAX_BYTES, where range errors did).
		return s.WithEnv(Usagef("%v (%s -h lists the flags)", err, s.Name()))
	}
	if err := s.checkBoolValue(args); err != nil {
		return err
	}
	if err := s.checkValueIsFlag(args[:len(args)-s.NArg()]); err != nil {
		return err
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
		s.fromEnv[name] = true
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

// FromEnv reports whether Parse set the flag name from its environment
// variable (set and non-empty, and the flag not on the command line).
func (s *Set) FromEnv(name string) bool { return s.fromEnv[name] }

// Given reports whether the flag name was given, on the command line or
// in its environment variable, rather than left at its default.
func (s *Set) Given(name string) bool {
	given := s.fromEnv[name]
	s.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// Repeated returns a usage error for the first of names given more than
// once in args, which Parse has parsed (the flag package keeps the last
// value): for flags where a second value reads as "this or that" and would
// be dropped silently, such as a filter.
func (s *Set) Repeated(args []string, names ...string) error {
	count := s.Counts(args)
	for _, name := range names {
		if count[name] > 1 {
			return Usagef("--%s is given %d times: it takes one value (give it once; run again for another value)", name, count[name])
		}
	}
	return nil
}

// Singles returns the names of s's flags that take one value (every flag
// but those registered with Strings, which a repeat adds to), for
// Repeated.
func (s *Set) Singles() []string {
	var names []string
	s.VisitAll(func(f *flag.Flag) {
		if _, list := f.Value.(*stringList); !list {
			names = append(names, f.Name)
		}
	})
	return names
}

// Counts returns how many times each flag of s is given in args, which
// Parse has parsed. It reads args as the flag package did: up to the first
// argument that is not a flag, a value of a non-bool flag in the next
// argument unless given with "=".
func (s *Set) Counts(args []string) map[string]int {
	count := map[string]int{}
	s.eachFlag(args[:len(args)-s.NArg()], func(name string, _ int) bool { count[name]++; return true })
	return count
}

// eachFlag calls f for each flag of s in flags (the arguments that Parse
// read as flags), read as the flag package does: a value of a non-bool
// flag in the next argument unless given with "=". f gets the flag's name
// and the index in flags of its value in the next argument (-1: given
// with "=", or a bool flag), and returns false to stop.
func (s *Set) eachFlag(flags []string, f func(name string, value int) bool) {
	for i := 0; i < len(flags); i++ {
		a := flags[i]
		if a == "--" {
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		fl := s.Lookup(name)
		if fl == nil {
			continue
		}
		value := -1
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			i++ // its value
			value = i
		}
		if !f(name, value) {
			return
		}
	}
}

// checkBoolValue refuses "--name value" for a bool flag, which the flag
// package reads as --name (true) followed by the argument value.
func (s *Set) checkBoolValue(args []string) error {
	i := len(args) - s.NArg() // the first argument after the flags
	if s.NArg() == 0 || i == 0 || args[i-1] == "--" {
		return nil
	}
	name := strings.TrimLeft(args[i-1], "-")
	f := s.Lookup(name)
	if f == nil {
		return nil // --name=value, or not a flag
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
		return nil
	}
	return Usagef("unexpected argument %s after --%s: a bool flag takes its value after =, e.g. --%s=false", shownArgument(args[i]), name, name)
}

// checkValueIsFlag refuses "--name --other" for a flag that takes a value,
// where --other is a flag of s: the flag package reads --other as --name's
// value, and what was meant as --other's value as an argument, which
// could be a password (security trial: `--group --database-url URL`
// printed the URL as an unexpected argument, and `--kafka-sasl-user
// --kafka-sasl-password P` the password). Only the other flag's name is
// shown, not a value given with it after '='.
func (s *Set) checkValueIsFlag(args []string) error {
	var err error
	s.eachFlag(args, func(name string, value int) bool {
		if value < 0 || value >= len(args) || !strings.HasPrefix(args[value], "-") {
			return true
		}
		other, _, _ := strings.Cut(strings.TrimLeft(args[value], "-"), "=")
		if other != "" && s.Lookup(other) != nil {
			err = Usagef("--%s needs a value, and was given the flag --%s as one: give --%s its value before --%s (--%s=VALUE for a value that starts with -)", name, other, name, other, name)
			return false
		}
		return true
	})
	return err
}

// IsHelp reports whether arg asks for help as the flag package reads it:
// -h, -help or --help (so `version -h` prints the usage, exit 0).
func IsHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// NoArguments returns a usage error when Parse left arguments that are
// not flags, quoting the first one unless it may hold a password (a URL
// with a user, a "password" key: an unquoted key=value connection
// string's words; security trial); nil when there is none.
func (s *Set) NoArguments() error {
	if s.NArg() == 0 {
		return nil
	}
	return Usagef("unexpected argument %s (flags start with --)", shownArgument(s.Arg(0)))
}

// shownArgument quotes an argument for an error, or says it is not shown
// when it may hold a password.
func shownArgument(a string) string {
	if l := strings.ToLower(a); strings.Contains(l, "password") || strings.Contains(l, "://") && strings.Contains(l, "@") {
		return "(not shown: it may hold a password)"
	}
	return strconv.Quote(a)
}
