// Command dlq-replayer lists, summarises, skips and republishes the dead
// letters of the Causet projection worker (SPEC §7). It is a one-shot job:
// it reads the dead-letter topic from its start up to the end offsets taken
// when it starts, so it always terminates, and it never commits a
// consumer-group offset.
//
//	dlq-replayer list    [filters] [--output table|json] [--limit N]
//	dlq-replayer summary [filters] [--by fingerprint|projection|tenant|error] [--output table|json]
//	dlq-replayer retry   [filters] [--dry-run] [--include-replayed] [--max-replays N] [--force] [--rate N]
//	dlq-replayer skip    [filters] --reason TEXT --actor NAME
//
// Filters (AND): --fork-id, --projection, --tenant-schema, --event-type,
// --error-contains, --fingerprint, --since, --until; --all is required when
// no filter is given. Data goes to stdout, logs (JSON) and progress to
// stderr. Exit status: 0 when nothing failed, 1 when a produce or ledger
// write failed (or the run could not complete), 2 for a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

const usage = `Usage: dlq-replayer <command> [flags]

Commands:
  list     list dead letters (--output table|json, --limit N)
  summary  count dead letters by group (--by fingerprint|projection|tenant|error)
  retry    republish dead letters to the events topic (--dry-run, --include-replayed,
           --max-replays N, --force, --rate N)
  skip     record dead letters as permanently skipped (--reason TEXT --actor NAME)

Filters (combined with AND): --fork-id, --projection, --tenant-schema, --event-type,
--error-contains, --fingerprint, --since, --until (RFC 3339 or a duration such as 24h);
--all selects every dead letter and is required when no filter is given.

Examples:
  dlq-replayer list --fork-id production --projection artist_followers
  dlq-replayer summary --all --by fingerprint
  dlq-replayer retry --fork-id production --projection artist_followers --dry-run
  dlq-replayer retry --fork-id production --all
  dlq-replayer skip --fingerprint 3f2a9c0d11e4b7a2 --reason "bad upstream data" --actor alice

Run 'dlq-replayer <command> -h' for the flags of a command.
`

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
	logLevel    string
	logFormat   string

	forkID, projection, tenantSchema, eventType, errorContains, fingerprint string
	since, until                                                            string
	all                                                                     bool

	output string // list, summary
	limit  int    // list
	by     string // summary

	dryRun          bool    // retry, skip
	includeReplayed bool    // retry
	maxReplays      int     // retry
	force           bool    // retry
	rate            float64 // retry
	actor           string  // retry, skip
	reason          string  // retry, skip
}

// run runs the command line args (without the program name) and returns
// the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd := args[0]
	switch cmd {
	case "list", "summary", "retry", "skip":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "dlq-replayer: unknown command %q\n\n%s", cmd, usage)
		return 2
	}

	var s settings
	fs := flagenv.New("dlq-replayer "+cmd, stderr).WithLookup(lookupEnv)
	aliases := s.register(fs, cmd, lookupEnv)
	err := fs.Parse(args[1:])
	if err == nil {
		err = aliases.apply()
	}
	if err == nil && fs.NArg() > 0 {
		err = flagenv.Usagef("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlq-replayer %s: %v\n", cmd, err)
		return 2
	}
	err = s.execute(ctx, cmd, stdout, stderr)
	var ue *flagenv.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "dlq-replayer %s: %v\n", cmd, err)
		return 2
	default:
		return 1 // logged by execute
	}
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
	fs.String(&s.logLevel, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn or error")
	fs.String(&s.logFormat, "log-format", "LOG_FORMAT", "json", "log format: json or text")

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
		fs.Int(&s.limit, "limit", "DLQ_LIMIT", 0, "list at most this many dead letters (0: all)")
	case "summary":
		fs.String(&s.by, "by", "DLQ_BY", string(dlq.GroupByFingerprint), "group by fingerprint, projection, tenant or error")
		fs.String(&s.output, "output", "DLQ_OUTPUT", "table", "output format: table or json (one group per line)")
	case "retry":
		fs.Bool(&s.dryRun, "dry-run", "DLQ_DRY_RUN", false, "print what would be sent; send and record nothing")
		fs.Bool(&s.includeReplayed, "include-replayed", "DLQ_INCLUDE_REPLAYED", false, "also replay dead letters the ledger marks replayed (never skipped ones)")
		fs.Int(&s.maxReplays, "max-replays", "DLQ_MAX_REPLAYS", dlq.DefaultMaxReplays, "refuse events already replayed this many times")
		fs.Bool(&s.force, "force", "DLQ_FORCE", false, "replay events over --max-replays")
		fs.Float64(&s.rate, "rate", "DLQ_RATE", 0, "at most this many replays per second (0: unlimited)")
		fs.String(&s.actor, "actor", "DLQ_ACTOR", defaultActor(lookupEnv), "who runs the replay ($USER unless set), recorded in the ledger")
		fs.String(&s.reason, "reason", "DLQ_REASON", "", "why, recorded in the ledger (optional)")
	case "skip":
		fs.Bool(&s.dryRun, "dry-run", "DLQ_DRY_RUN", false, "print what would be skipped; record nothing")
		fs.String(&s.actor, "actor", "DLQ_ACTOR", "", "who decides the skip, recorded in the ledger (required)")
		fs.String(&s.reason, "reason", "DLQ_REASON", "", "why the dead letters are skipped, recorded in the ledger (required)")
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
func (s *settings) logger(w io.Writer) (*slog.Logger, *slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return nil, nil, flagenv.Usagef("--log-level: %q is not debug, info, warn or error", s.logLevel)
	}
	newHandler := func(l slog.Level) (slog.Handler, error) {
		opts := &slog.HandlerOptions{Level: l}
		switch strings.ToLower(s.logFormat) {
		case "json":
			return slog.NewJSONHandler(w, opts), nil
		case "text":
			return slog.NewTextHandler(w, opts), nil
		}
		return nil, flagenv.Usagef("--log-format: %q is not json or text", s.logFormat)
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

// execute validates the remaining settings and runs cmd.
func (s *settings) execute(ctx context.Context, cmd string, stdout, stderr io.Writer) error {
	log, kgoLog, err := s.logger(stderr)
	if err != nil {
		return err
	}
	filters, err := s.filters(time.Now())
	if err != nil {
		return err
	}
	opts, err := s.kafka.Opts()
	if err != nil {
		return err
	}
	opts = append(opts, kgo.WithLogger(kslog.New(kgoLog)), kgo.ClientID("dlq-replayer"))
	progress := newProgress(stderr, log, cmd)

	var runErr error
	switch cmd {
	case "list":
		runErr = s.list(ctx, opts, filters, progress, log, stdout)
	case "summary":
		runErr = s.summary(ctx, opts, filters, progress, log, stdout)
	case "retry", "skip":
		runErr = s.replay(ctx, cmd, opts, filters, progress, log, stdout)
	}
	progress.done()
	var ue *flagenv.UsageError
	if runErr != nil && !errors.As(runErr, &ue) {
		if ctx.Err() != nil {
			log.Error("interrupted", "err", runErr)
		} else {
			log.Error(cmd+" failed", "err", runErr)
		}
	}
	return runErr
}

func (s *settings) list(ctx context.Context, opts []kgo.Opt, filters dlq.Filters, progress *progress, log *slog.Logger, stdout io.Writer) error {
	if s.limit < 0 {
		return flagenv.Usagef("--limit must be >= 0, got %d", s.limit)
	}
	lw, err := newListWriter(stdout, s.output)
	if err != nil {
		return flagenv.Usagef("--output: %q is not table or json", s.output)
	}
	ledger, err := dlq.OpenLedger(ctx, opts, dlq.LedgerConfig{Topic: s.ledgerTopic, ReadOnly: true, Logger: log})
	if err != nil {
		return err
	}
	defer ledger.Close()
	n := 0
	st, err := dlq.Scan(ctx, opts, dlq.ScanConfig{Topic: s.dlqTopic, Filters: filters, Progress: progress.update, Logger: log}, func(e *dlq.Entry) error {
		var d *dlq.Decision
		if dec, ok := ledger.Lookup(e.Coordinates()); ok {
			d = &dec
		}
		if err := lw.write(e, d); err != nil {
			return err
		}
		if n++; s.limit > 0 && n >= s.limit {
			return dlq.ErrStopScan
		}
		return nil
	})
	if ferr := lw.flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	log.Info("listed", "topic", s.dlqTopic, "scanned", st.Scanned, "matched", st.Matched, "listed", n, "filters", filters)
	return nil
}

func (s *settings) summary(ctx context.Context, opts []kgo.Opt, filters dlq.Filters, progress *progress, log *slog.Logger, stdout io.Writer) error {
	by, err := dlq.ParseGroupBy(s.by)
	if err != nil {
		return flagenv.Usagef("--by: %v", err)
	}
	if s.output != "table" && s.output != "json" {
		return flagenv.Usagef("--output: %q is not table or json", s.output)
	}
	sum := dlq.NewSummary(by)
	st, err := dlq.Scan(ctx, opts, dlq.ScanConfig{Topic: s.dlqTopic, Filters: filters, Progress: progress.update, Logger: log}, func(e *dlq.Entry) error {
		sum.Add(e)
		return nil
	})
	if err != nil {
		return err
	}
	if s.output == "json" {
		err = writeSummaryJSON(stdout, sum)
	} else {
		err = writeSummaryTable(stdout, sum)
	}
	if err != nil {
		return err
	}
	log.Info("summarised", "topic", s.dlqTopic, "scanned", st.Scanned, "matched", st.Matched, "groups", len(sum.Groups()), "filters", filters)
	return nil
}

// replay runs retry or skip; a failed produce or ledger write makes it
// return an error (exit status 1) after the summary line is printed.
func (s *settings) replay(ctx context.Context, cmd string, opts []kgo.Opt, filters dlq.Filters, progress *progress, log *slog.Logger, stdout io.Writer) error {
	switch {
	case cmd == "retry" && s.maxReplays < 1:
		return flagenv.Usagef("--max-replays must be >= 1, got %d", s.maxReplays)
	case cmd == "retry" && s.rate < 0:
		return flagenv.Usagef("--rate must be >= 0 replays per second, got %g", s.rate)
	case cmd == "skip" && strings.TrimSpace(s.reason) == "":
		return flagenv.Usagef("--reason is required: say why the dead letters are skipped")
	case cmd == "skip" && strings.TrimSpace(s.actor) == "":
		return flagenv.Usagef("--actor is required: say who decides the skip")
	}
	ledger, err := dlq.OpenLedger(ctx, opts, dlq.LedgerConfig{Topic: s.ledgerTopic, ReadOnly: s.dryRun, Logger: log})
	if err != nil {
		return err
	}
	defer ledger.Close()
	cfg := dlq.ReplayConfig{
		EventsTopic: s.topic, DLQTopic: s.dlqTopic, Filters: filters, DryRun: s.dryRun,
		IncludeReplayed: s.includeReplayed, MaxReplays: s.maxReplays, Force: s.force, Rate: s.rate,
		Actor: s.actor, Reason: s.reason, Progress: progress.update, Logger: log,
	}
	if s.dryRun {
		cfg.OnOutcome = func(o dlq.Outcome) { progress.println(stdout, outcomeLine(o)) }
	}
	r, err := dlq.NewReplayer(opts, ledger, cfg)
	if err != nil {
		return err
	}
	log.Info(cmd+" started", "run_id", r.RunID(), "topic", s.dlqTopic, "events_topic", s.topic,
		"ledger_topic", s.ledgerTopic, "ledger_decisions", ledger.Len(), "dry_run", s.dryRun, "filters", filters)
	var res dlq.Result
	if cmd == "retry" {
		res, err = r.Retry(ctx)
	} else {
		res, err = r.Skip(ctx)
	}
	progress.done()
	line := res.String()
	if res.DryRun {
		line += " (dry run: nothing sent or recorded)"
	}
	fmt.Fprintln(stdout, line)
	if err != nil {
		return err
	}
	log.Info(cmd+" finished", "run_id", r.RunID(), "matched", res.Matched, "replayed", res.Replayed, "skipped", res.Skipped,
		"already_replayed", res.AlreadyReplayed, "refused", res.Refused, "failed", res.Failed, "scanned", res.Scan.Scanned,
		"elapsed", res.Scan.Elapsed.String())
	if res.Failed > 0 {
		return fmt.Errorf("%d of %d dead letters failed (see the errors above); run again to retry them", res.Failed, res.Matched)
	}
	return nil
}

// progress shows how far the scan of the dead-letter topic is: a progress
// bar when stderr is a terminal, else a log line at most every 5 s.
type progress struct {
	log   *slog.Logger
	w     io.Writer
	tty   bool
	what  string
	bar   *progressbar.ProgressBar
	last  time.Time
	total int64
}

func newProgress(stderr io.Writer, log *slog.Logger, cmd string) *progress {
	p := &progress{log: log, w: stderr, what: cmd}
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// update is the dlq.ScanConfig.Progress callback.
func (p *progress) update(scanned, total int64) {
	p.total = total
	if p.tty {
		if p.bar == nil {
			p.bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(p.w),
				progressbar.OptionSetDescription(p.what+": scanning dead letters"),
				progressbar.OptionShowCount(),
				progressbar.OptionShowIts(),
				progressbar.OptionSetItsString("dead letters"),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
		}
		_ = p.bar.Set64(scanned)
		return
	}
	if now := time.Now(); now.Sub(p.last) >= 5*time.Second || scanned == total {
		p.last = now
		pct := 100.0
		if total > 0 {
			pct = float64(scanned) * 100 / float64(total)
		}
		p.log.Info("progress", "scanned", scanned, "total", total, "percent", fmt.Sprintf("%.1f", pct))
	}
}

// println writes a data line without breaking the progress bar.
func (p *progress) println(w io.Writer, line string) {
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	fmt.Fprintln(w, line)
}

// done removes the progress bar.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
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
	a := &aliasValue{Value: f.Value, target: target}
	as.fs.Var(a, name, "same as --"+target)
	as.list = append(as.list, a)
}

// apply re-sets each target given through its alias after the environment
// was read.
func (as *aliasSet) apply() error {
	for _, a := range as.list {
		if a.given {
			if err := as.fs.Set(a.target, a.last); err != nil {
				return flagenv.Usagef("--%s: %v", a.target, err)
			}
		}
	}
	return nil
}
