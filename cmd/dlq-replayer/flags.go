package main

import (
	"flag"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/internal/logdur"
)

// defaultEventsTopic is the default of --topic: the worker's
// projection.DefaultEventsTopic, written out so that the replayer does not
// link the projection package (a test checks they agree).
const defaultEventsTopic = "causet.projection-events.v1"

// settings are the flags of the four commands.
type settings struct {
	kafka       kafkaconn.Settings
	topic       string
	dlqTopic    string
	ledgerTopic string
	envFilters  []string // filters taken from the environment, "VARIABLE=value" (envFilters)
	logLevel    string
	logFormat   string

	forkID, projection, tenantSchema, eventType, errorContains, fingerprint string
	since, until                                                            string
	all                                                                     bool

	output string // list, summary
	wide   bool   // list, summary
	width  int    // list, summary: of the tables, 0 for no limit (set by execute)
	limit  int    // list
	by     string // summary

	failOnEmpty bool // retry, skip

	dryRun          bool    // retry, skip
	includeReplayed bool    // retry
	maxReplays      int     // retry
	force           bool    // retry
	rate            float64 // retry
	actor           string  // retry, skip
	reason          string  // retry, skip
}

// register defines the flags of cmd on fs.
func (s *settings) register(fs *flagenv.Set, cmd string, lookupEnv func(string) (string, bool)) aliasSet {
	s.kafka.Register(fs)
	aliases := aliasSet{fs: fs}
	aliases.add("tls", "kafka-tls")
	aliases.add("tls-ca", "kafka-tls-ca")
	aliases.add("tls-server-name", "kafka-tls-server-name")
	aliases.add("sasl-mechanism", "kafka-sasl-mechanism")
	aliases.add("sasl-user", "kafka-sasl-user")
	aliases.add("sasl-password", "kafka-sasl-password")
	fs.String(&s.topic, "topic", "EVENTS_TOPIC", defaultEventsTopic, "events topic replayed events are written to")
	fs.String(&s.dlqTopic, "dlq-topic", "DLQ_TOPIC", dlq.DefaultTopic, "dead-letter topic")
	fs.String(&s.ledgerTopic, "ledger-topic", "LEDGER_TOPIC", dlq.DefaultLedgerTopic, "replay ledger topic (compacted; created when missing)")
	fs.String(&s.logLevel, "log-level", "LOG_LEVEL", "", "log level: debug, info, warn or error (default: warn when stderr is a terminal, else info)")
	fs.String(&s.logFormat, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text when stderr is a terminal, else json)")

	fs.String(&s.forkID, "fork-id", "DLQ_FORK_ID", "", "select dead letters of this fork")
	fs.String(&s.projection, "projection", "DLQ_PROJECTION", "", "select dead letters of this projection")
	fs.String(&s.tenantSchema, "tenant-schema", "DLQ_TENANT_SCHEMA", "", "select dead letters of this tenant schema")
	fs.String(&s.eventType, "event-type", "DLQ_EVENT_TYPE", "", "select dead letters of this event type")
	fs.String(&s.errorContains, "error-contains", "DLQ_ERROR_CONTAINS", "", "select dead letters whose error contains this text (case ignored)")
	fs.String(&s.fingerprint, "fingerprint", "DLQ_FINGERPRINT", "", "select dead letters of this failure fingerprint (16 hex digits)")
	fs.String(&s.since, "since", "DLQ_SINCE", "", "select dead letters that failed at or after this time: RFC 3339 or a duration before now (24h)")
	fs.String(&s.until, "until", "DLQ_UNTIL", "", "select dead letters that failed before this time: RFC 3339 or a duration before now (1h)")
	fs.Bool(&s.all, "all", "DLQ_ALL", false, "select every dead letter (required when no other filter is given)")

	switch cmd {
	case "list":
		fs.String(&s.output, "output", "DLQ_OUTPUT", "table", "output format: table or json (one dead letter per line)")
		fs.Bool(&s.wide, "wide", "DLQ_WIDE", false, "table: every column, cells up to 160 characters (errors; names 60; --output json for whole values) (default: fit 100 columns, or a narrower terminal)")
		fs.Int(&s.limit, "limit", "DLQ_LIMIT", 0, "list at most this many dead letters (0: all)")
	case "summary":
		fs.String(&s.by, "by", "DLQ_BY", string(dlq.GroupByFingerprint), "group by fingerprint, projection, tenant or error")
		fs.String(&s.output, "output", "DLQ_OUTPUT", "table", "output format: table or json (one group per line)")
		fs.Bool(&s.wide, "wide", "DLQ_WIDE", false, "table: every column, cells up to 160 characters (errors; names 60; --output json for whole values) (default: fit 100 columns, or a narrower terminal)")
	case "retry":
		fs.Bool(&s.dryRun, "dry-run", "DLQ_DRY_RUN", false, "print what would be sent; send and record nothing")
		fs.Bool(&s.includeReplayed, "include-replayed", "DLQ_INCLUDE_REPLAYED", false, "also replay dead letters the ledger marks replayed (never skipped ones)")
		fs.Int(&s.maxReplays, "max-replays", "DLQ_MAX_REPLAYS", dlq.DefaultMaxReplays, "refuse events already replayed this many times")
		fs.Bool(&s.force, "force", "DLQ_FORCE", false, "replay events over --max-replays, events first read from another topic than --topic, and events that fail the worker's validation")
		fs.Float64(&s.rate, "rate", "DLQ_RATE", 0, "at most this many replays per second (0: unlimited)")
		fs.String(&s.actor, "actor", "DLQ_ACTOR", defaultActor(lookupEnv), "who runs the replay ($USER unless set), recorded in the ledger")
		fs.String(&s.reason, "reason", "DLQ_REASON", "", "why, recorded in the ledger (optional)")
	case "skip":
		fs.Bool(&s.dryRun, "dry-run", "DLQ_DRY_RUN", false, "print what would be skipped; record nothing")
		fs.String(&s.actor, "actor", "DLQ_ACTOR", "", "who decides the skip, recorded in the ledger (required)")
		fs.String(&s.reason, "reason", "DLQ_REASON", "", "why the dead letters are skipped, recorded in the ledger (required)")
	}
	if cmd == "retry" || cmd == "skip" {
		fs.Bool(&s.failOnEmpty, "fail-on-empty", "DLQ_FAIL_ON_EMPTY", false, "exit with status 3 when the filters select no dead letter (default: say so and exit 0)")
	}
	return aliases
}

// defaultActor is $USER, else "dlq-replayer" (a Kubernetes Job has no
// USER: set --actor there).
func defaultActor(lookupEnv func(string) (string, bool)) string {
	if u, _ := lookupEnv("USER"); u != "" {
		return u
	}
	return "dlq-replayer"
}

var fingerprintRE = regexp.MustCompile(`^[0-9a-fA-F]{16}$`)

// filterFlags are the flags that select dead letters: each takes one
// value, and they all hold together (AND).
var filterFlags = []string{"fork-id", "projection", "tenant-schema", "event-type", "error-contains", "fingerprint", "since", "until"}

// envFilters returns the filters fs took from the environment, not the
// command line, as "VARIABLE=value": a variable left set from an earlier
// run narrows even --all (second new-user trial), so execute says so; and
// DLQ_ALL, which selects every dead letter where the command line gives no
// filter (docs trial: DLQ_ALL=true left in a Job's environment turned a
// retry without filters into a retry of everything, without a word).
func envFilters(fs *flagenv.Set) []string {
	env := fs.Env()
	var out []string
	for _, name := range append(filterFlags[:len(filterFlags):len(filterFlags)], "all") {
		if fs.FromEnv(name) {
			out = append(out, env[name]+"="+fs.Lookup(name).Value.String())
		}
	}
	return out
}

// filters returns the filters of the flags, or a usage error naming the flag.
// It checks the topic flags too, which every command uses.
func (s *settings) filters(now time.Time) (dlq.Filters, error) {
	topics := dlq.TopicConfig{EventsTopic: s.topic, DLQTopic: s.dlqTopic, LedgerTopic: s.ledgerTopic}
	if err := topics.Validate(); err != nil {
		return dlq.Filters{}, flagenv.Usagef("--topic, --dlq-topic, --ledger-topic: %v", err)
	}
	f := dlq.Filters{
		ForkID: s.forkID, Projection: s.projection, TenantSchema: s.tenantSchema, EventType: s.eventType,
		ErrorContains: s.errorContains, Fingerprint: strings.ToLower(s.fingerprint),
	}
	if s.tenantSchema != "" && !dlq.ValidSchemaName(s.tenantSchema) {
		// Refused, not matched against nothing (operator trial:
		// ACME_PROD selected no dead letter, without a word).
		return f, flagenv.Usagef("--tenant-schema: %q is not a tenant schema name (a lowercase letter or _, then lowercase letters, digits or _, at most 63 bytes): no dead letter holds it", s.tenantSchema)
	}
	if s.fingerprint != "" && !fingerprintRE.MatchString(s.fingerprint) {
		return f, flagenv.Usagef("--fingerprint: %q is not 16 hex digits", s.fingerprint)
	}
	var err error
	if s.since != "" {
		if f.Since, err = dlq.ParseTimeBound(s.since, now); err != nil {
			return f, flagenv.Usagef("--since: %v", err)
		}
	}
	if s.until != "" {
		if f.Until, err = dlq.ParseTimeBound(s.until, now); err != nil {
			return f, flagenv.Usagef("--until: %v", err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, flagenv.Usagef("--since (%s) must be before --until (%s)", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	if f.IsZero() && !s.all {
		return f, flagenv.Usagef("no filter given: pass --all to select every dead letter, or filter with --fork-id, --projection, --tenant-schema, --event-type, --error-contains, --fingerprint, --since or --until")
	}
	return f, nil
}

// logger returns the slog logger of --log-level and --log-format, and the
// one given to kgo (warnings and errors only, unless --log-level debug).
// When they are not set, a terminal (tty) gets text logs of warnings and
// errors only, so that they do not bury the tables; anything else gets
// JSON from info up.
func (s *settings) logger(w io.Writer, tty bool) (*slog.Logger, *slog.Logger, error) {
	levelName, format := s.logLevel, s.logFormat
	if levelName == "" {
		levelName = "info"
		if tty {
			levelName = "warn"
		}
	}
	if format == "" {
		format = "json"
		if tty {
			format = "text"
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, nil, flagenv.Usagef("--log-level (LOG_LEVEL): %q is not debug, info, warn or error", s.logLevel)
	}
	newHandler := func(l slog.Level) (slog.Handler, error) {
		opts := logdur.Options(l)
		switch strings.ToLower(format) {
		case "json":
			return slog.NewJSONHandler(w, opts), nil
		case "text":
			return slog.NewTextHandler(w, opts), nil
		}
		return nil, flagenv.Usagef("--log-format (LOG_FORMAT): %q is not json or text", s.logFormat)
	}
	h, err := newHandler(level)
	if err != nil {
		return nil, nil, err
	}
	kh, _ := newHandler(max(level, slog.LevelWarn))
	if level <= slog.LevelDebug {
		kh = h
	}
	return slog.New(h), slog.New(kh).With("component", "kgo"), nil
}

// aliasSet defines other spellings of flags (--tls for --kafka-tls). A value
// given through an alias on the command line wins over the target's
// environment variable, as if the target itself had been given.
type aliasSet struct {
	fs   *flagenv.Set
	list []*aliasValue
}

type aliasValue struct {
	flag.Value
	name   string
	target string
	given  bool
	last   string
}

func (a *aliasValue) Set(v string) error {
	if err := a.Value.Set(v); err != nil {
		return err
	}
	a.given, a.last = true, v
	return nil
}

func (a *aliasValue) String() string {
	if a == nil || a.Value == nil { // the zero value flag.PrintDefaults makes
		return ""
	}
	return a.Value.String()
}

func (a *aliasValue) IsBoolFlag() bool {
	if a == nil || a.Value == nil {
		return false
	}
	b, ok := a.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (as *aliasSet) add(name, target string) {
	f := as.fs.Lookup(target)
	a := &aliasValue{Value: f.Value, name: name, target: target}
	as.fs.Var(a, name, "same as --"+target)
	as.list = append(as.list, a)
}

// apply re-sets each target given through its alias after the environment
// was read. An alias and its target both on the command line are a usage
// error (new-user trial: --tls --kafka-tls=false took TLS, silently).
func (as *aliasSet) apply() error {
	onCommandLine := map[string]bool{}
	as.fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = !as.fs.FromEnv(f.Name) })
	for _, a := range as.list {
		if a.given && onCommandLine[a.target] {
			return flagenv.Usagef("--%s and --%s are one setting, given twice: give one", a.name, a.target)
		}
		if a.given {
			if err := as.fs.Set(a.target, a.last); err != nil {
				return flagenv.Usagef("--%s: %v", a.target, err)
			}
		}
	}
	return nil
}
