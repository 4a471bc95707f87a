// Command projection-worker consumes projection events from Kafka and applies
// them to PostgreSQL projections, retrying failures and dead-lettering what
// cannot be applied (see README.md and SPEC.md).
//
// Usage:
//
//	projection-worker run      [flags]   consume and project until SIGTERM/SIGINT
//	projection-worker migrate  --tenant-schema S [--tenant-schema S2 ...] [flags]
//	projection-worker topics   [flags]   create the events, dead-letter and ledger topics
//	projection-worker validate --projections F
//	projection-worker dev      [flags]   the embedded default behind `make run` (-tags dev builds only)
//	projection-worker version
//
// Exit status, the same rule for every command: 0 on success; 2 when the
// command line, the environment or a file they name (the definitions file)
// is wrong, found before the command connects to anything; 1 when the
// command fails while it works (a service refuses or fails, an address is
// taken); 4 when run reached no broker at start within --kafka-start-timeout.
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

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func buildVersion() string {
	return buildinfo.Version(version)
}

const usage = `projection-worker applies Causet projection events from Kafka to PostgreSQL.

Commands:
  run        consume and project until SIGTERM/SIGINT
  migrate    create tenant schemas, tables and missing columns (--tenant-schema, repeatable)
  topics     create the events, dead-letter and ledger topics
  validate   check a projection definitions file (--projections)
  dev        run on an embedded Kafka and a throwaway PostgreSQL with example events
             (make run; only in a build with -tags dev)
  version    print the build version

Run 'projection-worker COMMAND -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command and returns the process exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		err = runWorker(ctx, rest, stderr)
	case "migrate":
		err = runMigrate(ctx, rest, stdout, stderr)
	case "topics":
		err = runTopics(ctx, rest, stdout, stderr)
	case "validate":
		err = runValidate(rest, stdout, stderr)
	case "dev":
		err = runDev(ctx, rest, stdout, stderr)
	case "version", "--version", "help", "-h", "--help":
		if len(rest) == 1 && flagenv.IsHelp(rest[0]) {
			// `version -h` asks for help, as every command's -h does
			// (exit 0; docs trial: it was refused as an argument).
			fmt.Fprint(stdout, usage)
			break
		}
		if len(rest) > 0 {
			// Takes no flag or argument (new-user trial: "version extra
			// --json" printed the version as if they were read).
			err = flagenv.Usagef("%s takes no arguments, got %q", cmd, rest)
			break
		}
		if cmd == "version" || cmd == "--version" {
			fmt.Fprintln(stdout, buildVersion())
		} else {
			fmt.Fprint(stdout, usage)
		}
	default:
		fmt.Fprintf(stderr, "%s\n\n%s", flagenv.UnknownCommand("projection-worker", cmd, []string{"run", "migrate", "topics", "validate", "dev", "version", "help"}), usage)
		return 2
	}
	return exitCode(err, stderr)
}

// exitCode prints err and returns the exit status of the package doc's
// rule: 2 for a *flagenv.UsageError, exitKafkaUnreachable (4) for a
// *kafkaUnreachableError, 1 for any other error, printed with each of its
// lines after "projection-worker: " (an errors.Join of a shutdown, a
// commit and leaving the group, printed its second line bare: new-user
// trial).
func exitCode(err error, stderr io.Writer) int {
	var ue *flagenv.UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "projection-worker: %v\n", err)
		return 2
	case errors.As(err, new(*kafkaUnreachableError)):
		fmt.Fprintf(stderr, "projection-worker: %v\n", err)
		return exitKafkaUnreachable
	default:
		fmt.Fprintf(stderr, "projection-worker: %s\n", strings.ReplaceAll(err.Error(), "\n", "\nprojection-worker: "))
		return 1
	}
}
