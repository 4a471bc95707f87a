package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/internal/memlimitenv"
	"github.com/causet/projection-worker/projection"
)

// execute validates the remaining settings and runs cmd.
// Everything written to stdout and stderr while it runs goes through the
// progress bar's writers, which clear the bar first when it is on the same
// terminal.
func (s *settings) execute(ctx context.Context, cmd string, stdout, stderr io.Writer) error {
	progress := newProgress(stderr, cmd)
	defer progress.done()
	log, kgoLog, err := s.logger(progress.writer(stderr), progress.tty)
	if err != nil {
		return err
	}
	progress.log = log
	// As run does: a Job's container limit (256 MiB in deploy/) makes the
	// GC work harder before the OOM killer comes (deployment trial: the
	// replayer took no limit from its container).
	if err := memlimitenv.Set(log, memlimit.FromCgroup); err != nil {
		return err
	}
	if !s.wide {
		s.width = tableWidth(stdout)
	}
	stdout = progress.writer(stdout)
	filters, err := s.filters(time.Now())
	if err != nil {
		return err
	}
	if len(s.envFilters) > 0 {
		log.Warn("filters set in the environment apply", "variables", strings.Join(s.envFilters, " "))
	}
	opts, err := s.kafka.Opts()
	if err != nil {
		return err
	}
	opts = append(opts, kgo.WithLogger(kslog.New(kgoLog)), kgo.ClientID("dlq-replayer"))

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
	if runErr != nil && !errors.As(runErr, &ue) && !errors.Is(runErr, errNothingMatched) {
		if ctx.Err() != nil {
			log.Error("interrupted", "err", runErr)
		} else if cause := kafkaCause(runErr, s.kafka.Brokers); cause != "" {
			log.Error(cmd+" failed", "cause", cause, "err", runErr)
		} else if setting := s.missingTopicSetting(runErr); setting != "" {
			log.Error(cmd+" failed", "cause", "the topic does not exist: check "+setting, "err", runErr)
		} else {
			log.Error(cmd+" failed", "err", runErr)
		}
	}
	return runErr
}

// kafkaCause names, in terms of the flags, why Kafka refused or did not
// answer err's request: kafkaconn.Explain's cause, or, when no broker of
// brokers answered at all, that (new-user trial: "read ledger: list
// offsets of ...: unable to dial" blamed the ledger); "" otherwise.
func kafkaCause(err error, brokers string) string {
	// The replayer's requests are all its first: a closed connection is
	// ClosedHint's.
	if cause := cmp.Or(kafkaconn.Explain(err), kafkaconn.ClosedHint(err)); cause != "" {
		return cause
	}
	if kafkaconn.DialError(err) {
		return kafkaconn.NoBrokerAnswers(brokers)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// New-user trial: --tls against a plaintext listener waited, then
		// said only "unable to dial: context deadline exceeded".
		return "no broker of --brokers (KAFKA_BROKERS) " + brokers + " answered: " + kafkaconn.NoAnswerHint
	}
	return ""
}

func (s *settings) list(ctx context.Context, opts []kgo.Opt, filters dlq.Filters, progress *progress, log *slog.Logger, stdout io.Writer) error {
	if s.limit < 0 {
		return flagenv.Usagef("--limit must be >= 0, got %d", s.limit)
	}
	lw, err := newListWriter(stdout, s.output, s.width, s.wide)
	if err != nil {
		return flagenv.Usagef("--output: %q is not table or json", s.output)
	}
	if err := s.wideTableOnly(); err != nil {
		return err
	}
	ledger, err := s.openLedger(ctx, opts, dlq.LedgerConfig{ReadOnly: true, Logger: log})
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
	progress.done()
	if err != nil && n == 0 {
		return err // nothing listed: no table header before the error
	}
	if ferr := lw.flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	if n == 0 && s.output == "table" {
		noMatchLine(stdout, st)
	}
	if s.limit > 0 && n >= s.limit && s.output == "table" {
		// Said (new-user trial: the cut list looked whole).
		fmt.Fprintf(stdout, "the first %d listed (--limit %d): more may match; summary counts them all\n", n, s.limit)
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
	if err := s.wideTableOnly(); err != nil {
		return err
	}
	ledger, err := s.openLedger(ctx, opts, dlq.LedgerConfig{ReadOnly: true, Logger: log})
	if err != nil {
		return err
	}
	defer ledger.Close()
	sum := dlq.NewSummary(by)
	st, err := dlq.Scan(ctx, opts, dlq.ScanConfig{Topic: s.dlqTopic, Filters: filters, Progress: progress.update, Logger: log}, func(e *dlq.Entry) error {
		sum.Add(e, ledger.Status(e.Coordinates()))
		return nil
	})
	progress.done()
	if err != nil {
		return err
	}
	if s.output == "json" {
		err = writeSummaryJSON(stdout, sum)
	} else {
		err = writeSummaryTable(stdout, sum, s.width, s.wide)
	}
	if err != nil {
		return err
	}
	if st.Matched == 0 && s.output != "json" {
		noMatchLine(stdout, st)
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
	case cmd == "retry" && !(s.rate >= 0): // NaN too (new-user trial: it meant no limit)
		return flagenv.Usagef("--rate must be >= 0 replays per second, got %g", s.rate)
	case cmd == "skip" && strings.TrimSpace(s.reason) == "":
		return flagenv.Usagef("--reason is required: say why the dead letters are skipped")
	case cmd == "skip" && strings.TrimSpace(s.actor) == "":
		return flagenv.Usagef("--actor is required: say who decides the skip")
	}
	// One writing run at a time per ledger topic, from before its
	// decisions are read: two at once would both send an entry (day-2
	// trial). A lock lost mid-run stops it.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	lock := func(ctx context.Context) (func(), error) {
		l, err := dlq.LockReplays(ctx, opts, s.ledgerTopic, func() {
			log.Warn("waiting for the replay lock: another dlq-replayer retry or skip runs on this ledger topic; this run starts when it ends",
				"ledger_topic", s.ledgerTopic, "lock_group", dlq.ReplayLockGroup(s.ledgerTopic))
		})
		if err != nil {
			return nil, err
		}
		context.AfterFunc(l.Context(), func() {
			if cause := context.Cause(l.Context()); !errors.Is(cause, dlq.ErrReplayLockReleased) {
				log.Error("stopping: "+cause.Error()+"; another run may take over, and the ledger keeps it from sending what this one recorded", "ledger_topic", s.ledgerTopic)
			}
			stop()
		})
		return l.Release, nil
	}
	ledger, err := s.openLedger(ctx, opts, dlq.LedgerConfig{ReadOnly: s.dryRun, Logger: log, BeforeRead: lock})
	if err != nil {
		return err
	}
	defer ledger.Close()
	cfg := dlq.ReplayConfig{
		EventsTopic: s.topic, DLQTopic: s.dlqTopic, Filters: filters, DryRun: s.dryRun,
		IncludeReplayed: s.includeReplayed, MaxReplays: s.maxReplays, Force: s.force, Rate: s.rate,
		Actor: s.actor, Reason: s.reason, Progress: progress.update, Logger: log,
		// The worker's own validation (without its --tenant-schema-pattern,
		// which the replayer does not know): an event it refuses whatever
		// was fixed is not sent round again.
		Unreplayable: func(v []byte) error {
			_, err := projection.DecodeEvent(v)
			return err
		},
	}
	if s.dryRun {
		cfg.OnOutcome = func(o dlq.Outcome) { fmt.Fprintln(stdout, outcomeLine(o)) }
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
	if err == nil && res.Matched == 0 {
		if res.Scan.Undecodable == 0 {
			fmt.Fprintln(stdout, noMatch)
		} else {
			fmt.Fprintln(stdout, noMatchText(res.Scan))
		}
	}
	line := res.String()
	if res.DryRun {
		line += " (dry run: nothing sent or recorded)"
	}
	if err != nil {
		// What was done before the failure, said to be incomplete: the
		// counters alone read like a finished run ("matched=0").
		// How far it read: matched counts only what it had read (operator
		// trial: matched=5 read as if only 5 matched).
		if res.Scan.Offsets > 0 {
			line = fmt.Sprintf(" (%d of %d records of the dead-letter topic read): %s", res.Scan.Scanned, res.Scan.Offsets, line)
		} else {
			line = ": " + line // it stopped before it read
		}
		line = "stopped before the end" + line
	}
	fmt.Fprintln(stdout, line)
	if err != nil {
		return err
	}
	replayedKey, skippedKey := res.CounterNames()
	log.Info(cmd+" finished", "run_id", r.RunID(), "matched", res.Matched,
		strings.ReplaceAll(replayedKey, "-", "_"), res.Replayed, strings.ReplaceAll(skippedKey, "-", "_"), res.Skipped,
		"already_replayed", res.AlreadyReplayed, "already_skipped", res.AlreadySkipped, "refused", res.Refused, "failed", res.Failed, "scanned", res.Scan.Scanned,
		"elapsed", res.Scan.Elapsed)
	if res.Failed > 0 {
		return fmt.Errorf("%d of %d dead letters failed (see the errors above); run again to retry them", res.Failed, res.Matched)
	}
	if res.Matched == 0 && s.failOnEmpty {
		return errNothingMatched
	}
	return nil
}

// noMatch is the line retry and skip print when the filters select no
// dead letter.
const noMatch = "no dead letter matched the filter"

// noMatchLine ends a table that has no row (list, summary) with why: the
// header alone read as a failed run (new-user trial).
func noMatchLine(stdout io.Writer, st dlq.ScanStats) {
	fmt.Fprintln(stdout, noMatchText(st))
}

// noMatchText says that no dead letter matched, with the records scanned:
// the dead letters, and apart the records that are not dead letters (a
// --dlq-topic naming another topic read as "30660 dead letters scanned":
// new-user trial).
func noMatchText(st dlq.ScanStats) string {
	switch letters := st.Scanned - st.Undecodable; {
	case st.Undecodable == 0:
		return fmt.Sprintf("%s (%d dead letters scanned)", noMatch, st.Scanned)
	case letters == 0:
		return fmt.Sprintf("no dead letter: %d records scanned, none of them a dead letter (is --dlq-topic the dead-letter topic?)", st.Scanned)
	default:
		records := "records that are not dead letters"
		if st.Undecodable == 1 {
			records = "record that is not a dead letter" // replayer trial: "1 records"
		}
		return fmt.Sprintf("%s (%d dead letters scanned, and %d %s)", noMatch, letters, st.Undecodable, records)
	}
}

// errNothingMatched is returned by retry and skip with --fail-on-empty when
// the filters select no dead letter: exit status 3.
var errNothingMatched = errors.New(noMatch)

// missingTopicSetting names the flag and variable of the topic that err
// says does not exist (dlq.ErrTopicNotFound, wrapped by "<what> <topic>:"),
// "" when err says no such thing (new-user trial: a mistyped --dlq-topic
// gave "list offsets of nosuch.dlq: topic does not exist", naming no flag,
// while a mistyped --ledger-topic is named).
func (s *settings) missingTopicSetting(err error) string {
	if !errors.Is(err, dlq.ErrTopicNotFound) {
		return ""
	}
	for _, t := range []struct{ topic, setting string }{
		{s.dlqTopic, "--dlq-topic (DLQ_TOPIC)"},
		{s.topic, "--topic (EVENTS_TOPIC)"},
		{s.ledgerTopic, ledgerTopicSetting},
	} {
		if strings.Contains(err.Error(), " "+t.topic+": "+dlq.ErrTopicNotFound.Error()) {
			return t.setting
		}
	}
	return ""
}

// wideTableOnly returns a usage error for --wide with --output json, which
// writes every field whatever the width (operator trial: taken without a
// word).
func (s *settings) wideTableOnly() error {
	if s.wide && s.output == "json" {
		return flagenv.Usagef("--wide widens the table; --output json writes every field already: give one of them")
	}
	return nil
}

// openLedger opens the ledger of cfg with the topics of s: a ledger topic
// that keeps another dead-letter topic's decisions is a usage error.
func (s *settings) openLedger(ctx context.Context, opts []kgo.Opt, cfg dlq.LedgerConfig) (*dlq.Ledger, error) {
	cfg.Topic, cfg.TopicSetting = s.ledgerTopic, ledgerTopicSetting
	cfg.DLQTopic, cfg.DLQTopicSetting = s.dlqTopic, dlqTopicSetting
	l, err := dlq.OpenLedger(ctx, opts, cfg)
	if errors.Is(err, dlq.ErrLedgerOfAnotherTopic) {
		return nil, flagenv.Usagef("%v", err)
	}
	return l, err
}

// ledgerTopicSetting and dlqTopicSetting name the topics' flags and
// variables in the warning of a ledger topic that does not exist and in
// the error of one that keeps another dead-letter topic's decisions.
const (
	ledgerTopicSetting = "--ledger-topic (LEDGER_TOPIC)"
	dlqTopicSetting    = "--dlq-topic (DLQ_TOPIC)"
)
