//go:build dev

// The dev command links the embedded broker (kfake) and the throwaway
// PostgreSQL (internal/pgserver), so it is built only with -tags dev
// (make run); the production binary gets nodev.go instead.

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/devstack"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/redact"
	"github.com/causet/projection-worker/projection"
)

// runDev is `make run`: the worker on an embedded Kafka and a throwaway
// PostgreSQL, seeded with example events, until Ctrl-C.
func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	s, kafkaPort, err := parseDev(args, stderr)
	if err != nil {
		return err
	}
	log, err := s.logger(stderr)
	if err != nil {
		return err
	}
	defs, _, err := loadProjections(s.projections)
	if err != nil {
		return err
	}
	// Ctrl-C while the stack starts is a stop, not a failure: no initdb
	// log and exit 1 (new-user trial).
	interrupted := func(err error) error {
		if ctx.Err() != nil {
			fmt.Fprintln(stdout, "dev: interrupted before the worker started; stopped")
			return nil
		}
		return err
	}
	if err := checkHTTPAddr(s.httpAddr); err != nil {
		return err
	}
	// Both ports before the stack, which takes seconds to start (new-user
	// trial: a taken port was said after initdb and the migrations), and
	// both said at once (second trial: only the HTTP one was).
	// A suggestion for one port is never the other's (third new-user
	// trial: both were told the same free port, and the second to bind it
	// failed after the stack had started).
	httpPort := portOf(s.httpAddr)
	if kafkaPort > 0 && kafkaPort == httpPort {
		return flagenv.Usagef("--kafka-port %d and --http-addr %s are the same port: give each its own (--kafka-port 0 takes any free port)", kafkaPort, s.httpAddr)
	}
	var taken []error
	avoid := []int{httpPort} // for the Kafka port's suggestion
	if s.httpAddr != "" {
		ln, err := net.Listen("tcp", s.httpAddr)
		if err != nil {
			a := otherAddr(s.httpAddr, kafkaPort)
			avoid = append(avoid, portOf(a))
			taken = append(taken, fmt.Errorf("--http-addr %s: %w (%s is free now: pass --http-addr %s, with make run in ARGS)", s.httpAddr, err, a, a))
		} else {
			ln.Close()
		}
	}
	if err := devstack.CheckKafkaPort(kafkaPort); err != nil {
		free := portOf(otherAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(kafkaPort)), avoid...))
		taken = append(taken, fmt.Errorf("%w (127.0.0.1:%d is free now: pass --kafka-port %d)", err, free, free))
	}
	switch len(taken) {
	case 1:
		return taken[0]
	case 2: // one line, as main prints it after "projection-worker: "
		return fmt.Errorf("%w; and %w", taken[0], taken[1])
	}
	stack, err := devstack.Start(ctx, devstack.Options{
		KafkaPort:   kafkaPort,
		DatabaseURL: s.databaseURL,
		Logf:        func(f string, a ...any) { fmt.Fprintf(stdout, "dev: "+f+"\n", a...) },
	})
	if err != nil {
		return interrupted(err)
	}
	defer stack.Close()
	s.kafka.Brokers = stack.Brokers
	s.databaseURL = stack.DatabaseURL
	s.topic, s.dlqTopic, s.ledgerTopic, s.partitions = projection.DefaultEventsTopic, dlq.DefaultTopic, dlq.DefaultLedgerTopic, 3
	s.quietKgo = true // the client's group-join steps at --log-level debug only
	s.embedded = true

	pool, err := newPool(ctx, s.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := devstack.PrepareTenants(ctx, pool, defs, stack.Throwaway()); err != nil {
		return interrupted(err)
	}
	example := devstack.ExampleDefinitions(defs)
	if example {
		fmt.Fprintf(stdout, "dev: migrated %s and %s (staging without followed_at); %s left unmigrated\n",
			devstack.TenantProduction, devstack.TenantStaging, devstack.TenantLegacy)
	} else {
		// The user's own definitions (new-user trial: --projections F
		// stopped dev on the staging example's table).
		fmt.Fprintf(stdout, "dev: migrated %s and %s with %s (every column); %s left unmigrated; the example events are made for examples/projections.yaml, and yours applies what it handles of them: produce your own events to the topic %s\n",
			devstack.TenantProduction, devstack.TenantStaging, s.projections, devstack.TenantLegacy, projection.DefaultEventsTopic)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	statusCtx, stopStatus := context.WithCancel(ctx)
	defer stopStatus()
	started := func(*projection.Worker) {
		kopts, _ := s.kafka.Opts()
		examples := devstack.Examples(time.Now())
		if err := devstack.Produce(ctx, kopts, s.topic, examples); err != nil {
			log.Error("producing the example events failed", "error", err)
			return
		}
		if example {
			fmt.Fprintf(stdout, "dev: produced %d example events:\n", len(examples))
			for _, line := range exampleLines(examples) {
				fmt.Fprintf(stdout, "dev:   - %s\n", line)
			}
		} else { // what each shows holds with the example definitions only (second trial)
			fmt.Fprintf(stdout, "dev: produced the %d example events (docs/events.md's example and friends) to %s\n", len(examples), s.topic)
		}
		fmt.Fprintf(stdout, "dev: read the dead letters with:\n  kcat -b %s -t %s -C -o beginning -e -f '%%k %%h %%s\\n'\n", stack.Brokers, s.dlqTopic)
		// DATABASE_URL's password is not printed (psql reads it from
		// PGPASSWORD or asks); the throwaway server's URL has none.
		dbURL := s.databaseURL
		if !stack.Throwaway() {
			dbURL = redact.WithoutPassword(dbURL)
		}
		// Quoted for a POSIX shell: a ' in the string would end it.
		table := devstack.TenantProduction + ".artist_followers"
		if !example {
			table = pgx.Identifier{devstack.TenantProduction, defs.Projections[0].Table}.Sanitize()
		}
		fmt.Fprintf(stdout, "dev: query the rows with:\n  psql '%s' -c 'table %s'\n",
			strings.ReplaceAll(dbURL, "'", `'\''`), strings.ReplaceAll(table, "'", `'\''`))
		wg.Add(1)
		go func() {
			defer wg.Done()
			printStatus(statusCtx, stdout, pool, kopts, s.dlqTopic, defs, log)
		}()
	}
	return serve(ctx, &s, log, started)
}

// exampleLines says what the examples show, one line per case; a case of
// several events (an example with no Shows continues the one before) says
// how many, so that the lines account for every event produced.
func exampleLines(examples []devstack.Example) []string {
	var lines []string
	var events []int
	for _, e := range examples {
		if e.Shows == "" && len(lines) > 0 {
			events[len(events)-1]++
			continue
		}
		lines = append(lines, e.Shows)
		events = append(events, 1)
	}
	for i, n := range events {
		if n > 1 {
			lines[i] += fmt.Sprintf(" (%d events)", n)
		}
	}
	return lines
}

// parseDev returns the settings and the embedded Kafka port of the dev
// command's args. Its logs are text by default (a newcomer reads them on a
// terminal); --log-format or LOG_FORMAT choose json, as for run.
func parseDev(args []string, stderr io.Writer) (settings, int, error) {
	var s settings
	var kafkaPort int
	fs := flagenv.New("projection-worker dev", stderr)
	s.registerLog(fs, "text")
	s.registerRun(fs)
	fs.String(&s.projections, "projections", "PROJECTIONS_FILE", "examples/projections.yaml", "projection definitions file")
	fs.String(&s.databaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL to use instead of a throwaway cluster")
	fs.Int(&kafkaPort, "kafka-port", "DEV_KAFKA_PORT", 9092, "port of the embedded Kafka on 127.0.0.1 (0 or -1: any free port, printed)")
	if err := parseFlags(fs, args); err != nil {
		return s, 0, err
	}
	if kafkaPort < -1 || kafkaPort > 65535 {
		return s, 0, fs.WithEnv(flagenv.Usagef("--kafka-port must be a port (1-65535, or 0 or -1 for any free port), got %d", kafkaPort))
	}
	if err := s.checkRun(); err != nil { // before Kafka and PostgreSQL start (exit status 2)
		return s, 0, fs.WithEnv(err)
	}
	if kafkaPort == 0 { // any free port, as for a listener (new-user trial: 0 meant 9092)
		kafkaPort = -1
	}
	return s, kafkaPort, nil
}

// printStatus prints the projected row counts of the production tenant and
// the number of dead letters whenever they change, until ctx is done.
func printStatus(ctx context.Context, out io.Writer, pool *pgxpool.Pool, kopts []kgo.Opt, dlqTopic string, defs *projection.Definitions, log *slog.Logger) {
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		log.Error("status client", "error", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	last := ""
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var parts []string
		total := 0
		var dbErr error
		failed := "" // the first table whose count failed
		for _, p := range defs.Projections {
			var n int
			q := "SELECT count(*) FROM " + pgx.Identifier{devstack.TenantProduction, p.Table}.Sanitize()
			if err := pool.QueryRow(ctx, q).Scan(&n); err == nil {
				parts = append(parts, fmt.Sprintf("%s=%d", p.Table, n))
				total += n
			} else if dbErr == nil {
				dbErr, failed = err, p.Table
			}
		}
		dead := int64(0)
		if ends, err := adm.ListEndOffsets(ctx, dlqTopic); err == nil {
			ends.Each(func(o kadm.ListedOffset) { dead += o.Offset })
		}
		line := fmt.Sprintf("dev: projected rows in %s: %d (%s); dead letters: %d", devstack.TenantProduction, total, strings.Join(parts, " "), dead)
		switch {
		case len(parts) == 0 && dbErr != nil:
			// Not "0 rows" (new-user trial: the line read so while the
			// throwaway PostgreSQL was stopped).
			line = fmt.Sprintf("dev: projected rows in %s: not counted, the database does not answer (%v); dead letters: %d", devstack.TenantProduction, dbErr, dead)
		case dbErr != nil:
			// Not a total of the other tables (new-user trial: with a
			// session terminated, the line went from 5 rows to 3 and back,
			// as if rows had vanished).
			line = fmt.Sprintf("dev: projected rows in %s: not counted, counting %s failed (%v); dead letters: %d", devstack.TenantProduction, failed, dbErr, dead)
		}
		if line != last && ctx.Err() == nil {
			fmt.Fprintln(out, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// portOf returns the port number of host:port addr, 0 when it has none.
func portOf(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// otherAddr suggests an address to try when addr is taken: the first of
// the next 100 ports on the same host that is free now (new-user trials:
// the hint named the taken address itself, then a port that was taken
// too); "127.0.0.1:18080" when addr has no port or none of them is free.
func otherAddr(addr string, avoid ...int) string {
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n <= 0 {
		return "127.0.0.1:18080"
	}
	for p := n + 1; p <= min(n+100, 65535); p++ {
		if slices.Contains(avoid, p) {
			continue // the other port of make run
		}
		a := net.JoinHostPort(host, strconv.Itoa(p))
		if ln, err := net.Listen("tcp", a); err == nil {
			ln.Close()
			return a
		}
	}
	return "127.0.0.1:18080"
}
