// Command dlq-replayer lists, summarises, skips and republishes the dead
// letters of the Causet projection worker (SPEC §7). It is a one-shot job:
// it reads the dead-letter topic from its start up to the end offsets taken
// when it starts, so it always terminates, and it never commits a
// consumer-group offset.
//
//	dlq-replayer list    [filters] [--output table|json] [--wide] [--limit N]
//	dlq-replayer summary [filters] [--by fingerprint|projection|tenant|error] [--output table|json] [--wide]
//	dlq-replayer retry   [filters] [--dry-run] [--include-replayed] [--max-replays N] [--force] [--rate N] [--fail-on-empty]
//	dlq-replayer skip    [filters] --reason TEXT --actor NAME [--dry-run] [--fail-on-empty]
//	dlq-replayer version
//
// Filters (AND): --fork-id, --projection, --tenant-schema, --event-type,
// --error-contains, --fingerprint, --since, --until; --all is required when
// no filter is given. Data goes to stdout, logs and progress to stderr:
// on a terminal a progress bar and text logs of warnings and errors, else
// JSON logs from info up (--log-format, --log-level). Tables fit 100
// columns (or a narrower terminal) unless --wide. Exit status: 0 when
// nothing failed, 1 for a failure while working (Kafka unreachable or
// refusing, a topic that does not exist, a produce or ledger write
// failed), 2 for a usage error, 3 when retry or skip with
// --fail-on-empty selected no dead letter.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/causet/projection-worker/internal/buildinfo"
	"github.com/causet/projection-worker/internal/flagenv"
)

// version is set at build time with -ldflags "-X main.version=..." (make
// build, the Dockerfile).
var version = ""

// buildVersion is version, else the module version of the build, else
// "dev".
func buildVersion() string {
	return buildinfo.Version(version)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

const usage = `Usage: dlq-replayer <command> [flags]

Commands:
  list     list dead letters (--output table|json, --wide, --limit N)
  summary  count dead letters by group, with how many were replayed or skipped
           (--by fingerprint|projection|tenant|error, --wide)
  retry    republish dead letters to the events topic (--dry-run, --include-replayed,
           --max-replays N, --force, --rate N, --fail-on-empty)
  skip     record dead letters as permanently skipped (--reason TEXT --actor NAME,
           --dry-run, --fail-on-empty)
  version  print the build version

Filters (combined with AND): --fork-id, --projection, --tenant-schema, --event-type,
--error-contains, --fingerprint, --since, --until (RFC 3339 or a duration such as 24h);
--all selects every dead letter and is required when no filter is given.

Exit status: 0 done, 1 a failure while working (Kafka unreachable or
refusing, a topic that does not exist, a produce or ledger write failed),
2 usage error, 3 retry or skip --fail-on-empty selected nothing.

Examples:
  dlq-replayer list --fork-id production --projection artist_followers
  dlq-replayer summary --all --by fingerprint      # copy a FINGERPRINT from here
  dlq-replayer retry --fork-id production --projection artist_followers --dry-run
  dlq-replayer retry --fork-id production --all
  dlq-replayer skip --fingerprint FINGERPRINT --reason "bad upstream data" --actor alice

Run 'dlq-replayer <command> -h' for the flags of a command.
`

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
	case "-h", "-help", "--help", "help", "version", "--version":
		if len(args) == 2 && flagenv.IsHelp(args[1]) {
			// `version -h` asks for help, as every command's -h does
			// (exit 0; docs trial: it was refused as an argument).
			fmt.Fprint(stdout, usage)
			return 0
		}
		if len(args) > 1 {
			// Takes no flag or argument, as projection-worker's (new-user
			// trial: "version extra --json" printed the version).
			fmt.Fprintf(stderr, "dlq-replayer: %s takes no arguments, got %q\n", cmd, args[1:])
			return 2
		}
		if cmd == "version" || cmd == "--version" {
			fmt.Fprintln(stdout, buildVersion())
		} else {
			fmt.Fprint(stdout, usage)
		}
		return 0
	default:
		fmt.Fprintf(stderr, "%s\n\n%s", flagenv.UnknownCommand("dlq-replayer", cmd, append(commands[:len(commands):len(commands)], "version", "help")), usage)
		return 2
	}

	var s settings
	fs := flagenv.New("dlq-replayer "+cmd, stderr).WithLookup(lookupEnv)
	aliases := s.register(fs, cmd, lookupEnv)
	err := fs.Parse(args[1:])
	if err == nil {
		err = aliases.apply()
	}
	if err == nil {
		err = fs.NoArguments()
	}
	if err == nil {
		// A filter given twice would keep its last value only, where "this
		// or that" may have been meant (second new-user trial); any flag
		// given twice would (fresh-user trial: a second --dlq-topic or
		// --topic was taken without a word).
		err = fs.Repeated(args[1:], fs.Singles()...)
	}
	if err == nil {
		s.envFilters = envFilters(fs)
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil && fs.Unknown != "" {
		if owners := commandsWithFlag(fs.Unknown, lookupEnv); len(owners) > 0 {
			// A flag of another command (new-user trial: list --dry-run
			// said "unknown flag" alone).
			err = flagenv.Usagef("--%s is a flag of %s, not of %s (dlq-replayer %s -h lists the flags)", fs.Unknown, strings.Join(owners, " and "), cmd, cmd)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlq-replayer %s: %v\n", cmd, err)
		return 2
	}
	err = fs.WithEnv(s.execute(ctx, cmd, stdout, stderr))
	var ue *flagenv.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "dlq-replayer %s: %v\n", cmd, err)
		return 2
	case errors.Is(err, errNothingMatched):
		return 3 // said on stdout
	default:
		return 1 // logged by execute
	}
}

// commands are the replayer's commands that take flags.
var commands = []string{"list", "summary", "retry", "skip"}

// commandsWithFlag returns the commands that have the flag name.
func commandsWithFlag(name string, lookupEnv func(string) (string, bool)) []string {
	var owners []string
	for _, c := range commands {
		var s settings
		fs := flagenv.New("dlq-replayer "+c, io.Discard).WithLookup(lookupEnv)
		s.register(fs, c, lookupEnv)
		if fs.Lookup(name) != nil {
			owners = append(owners, c)
		}
	}
	return owners
}
