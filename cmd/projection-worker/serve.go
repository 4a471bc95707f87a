package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/causet/projection-worker/internal/memlimitenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
	"go.opentelemetry.io/otel/metric"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/internal/redact"
	"github.com/causet/projection-worker/projection"
)

func runWorker(ctx context.Context, args []string, stderr io.Writer) (err error) {
	var s settings
	fs := runFlags(&s, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err // names the variable when the value came from it
	}
	defer func() { err = fs.WithEnv(err) }()
	if err := s.requireDatabase(); err != nil {
		return err
	}
	if err := s.requireProjections(); err != nil {
		return err
	}
	log, err := s.logger(stderr)
	if err != nil {
		return err
	}
	warnRepeated(slog.New(s.redactor().Handler(log.Handler())), fs, args)
	return serve(ctx, &s, log, nil)
}

// warnRepeated logs a WARN line for each flag given more than once in
// args, with the value in effect: the last, as the flag package takes it,
// so that a Deployment's arguments can be overridden by appending one
// (the replayer and migrate refuse a repeated filter or grant instead).
// log masks the secrets (settings.redactor): a repeated --database-url.
func warnRepeated(log *slog.Logger, fs *flagenv.Set, args []string) {
	counts := fs.Counts(args) // of the flags fs has
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[name]; n > 1 {
			value := fs.Lookup(name).Value.String()
			if redact.IsPasswordKey(name) {
				// Whatever its length: log masks a password under 8
				// bytes only where it appears as one (second trial:
				// --kafka-sasl-password=5 given twice printed value=5).
				value = redact.Mask
			}
			log.Warn("flag given more than once: the last value is in effect", "flag", "--"+name, "times", n, "value", value)
		}
	}
}

// loadProjections loads and checks the definitions file. Its errors are
// usage errors (exit 2, as every command treats a bad definitions file)
// naming --projections, the file, projection and field.
func loadProjections(path string) (*projection.Definitions, []projection.Handler, error) {
	defs, err := projection.LoadDefinitions(path)
	if err != nil {
		return nil, nil, flagenv.Usagef("--projections (PROJECTIONS_FILE): %v", err)
	}
	tables, err := projection.NewTableProjections(defs)
	if err != nil {
		return nil, nil, flagenv.Usagef("--projections (PROJECTIONS_FILE): %v", err)
	}
	handlers := make([]projection.Handler, len(tables))
	for i, t := range tables {
		handlers[i] = t
	}
	return defs, handlers, nil
}

// poolConfig parses the connection string; a malformed one is a usage
// error naming DATABASE_URL that holds no part of the string's password
// (redact.ParsePostgres).
func poolConfig(url string, maxConns int32) (*pgxpool.Config, error) {
	url = strings.TrimSpace(url) // as ParsePostgres: a Secret's file ends in a newline
	// A URL of another database (mysql://...) would be read as a
	// key=value string and refused as such, which does not say why.
	if scheme, _, ok := strings.Cut(url, "://"); ok && scheme != "postgres" && scheme != "postgresql" && !strings.ContainsAny(scheme, " =") {
		return nil, flagenv.Usagef("--database-url (DATABASE_URL): scheme %q is not PostgreSQL's: want postgres:// or postgresql://, or a key=value string", scheme)
	}
	cfg, err := redact.ParsePostgres(url)
	if err != nil {
		return nil, flagenv.Usagef("--database-url (DATABASE_URL): %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	// Events are JSON, so UTF-8 (RFC 8259 §8.1): PostgreSQL converts each
	// value to the database's encoding and refuses one it cannot hold
	// (22P05, a dead letter). pgx leaves client_encoding to the server,
	// which then takes the database's own: in a LATIN1 database UTF-8
	// bytes were stored as Latin-1 characters (new-user trial).
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	// Named in pg_stat_activity, so that an operator finds the worker's
	// sessions (which one holds a lock, which to terminate) among the
	// others: defaultApplicationName unless the URL (application_name) or
	// PGAPPNAME names them (new-user trial: they showed an empty name).
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = defaultApplicationName
	}
	return cfg, nil
}

// defaultApplicationName is the application_name of the worker's
// PostgreSQL sessions when the connection string gives none.
const defaultApplicationName = "projection-worker"

// newPool returns a pool for url; it does not wait for the database to
// answer.
func newPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(url, maxConns)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	return pool, nil
}

// serve runs the worker until ctx is done. started, when non-nil, is called
// once the worker is built (the dev stack uses it to seed events). Its log
// lines, /readyz answers, dead letters and returned error are redacted of
// the database and Kafka passwords (settings.redactor).
func serve(ctx context.Context, s *settings, log *slog.Logger, started func(*projection.Worker)) (err error) {
	red := s.redactor()
	log = slog.New(red.Handler(log.Handler()))
	defer func() { err = red.Error(err) }()
	if err := memlimitenv.Set(log, memlimit.FromCgroup); err != nil {
		return err
	}
	defs, handlers, err := loadProjections(s.projections)
	if err != nil {
		return err
	}
	policy, err := s.retryPolicy()
	if err != nil {
		return err
	}
	dbWait, err := s.databaseWait()
	if err != nil {
		return err
	}
	kopts, err := s.kafka.Opts()
	if err != nil {
		return err
	}
	topics, err := s.topicConfig()
	if err != nil {
		return err
	}
	if err := s.checkRun(); err != nil {
		return err
	}
	tenants, err := s.tenantSchemaSet()
	if err != nil {
		return err
	}
	pcfg, err := poolConfig(s.databaseURL, 0)
	if err != nil {
		return err
	}
	var ln net.Listener
	if err := checkHTTPAddr(s.httpAddr); err != nil {
		return err
	}
	if s.httpAddr != "" {
		if ln, err = net.Listen("tcp", s.httpAddr); err != nil {
			return fmt.Errorf("--http-addr %s: %w", s.httpAddr, err)
		}
		defer ln.Close()
	}
	tel, err := newTelemetry(ctx, telemetryConfig{group: s.group, workerID: s.workerID, spanQueue: s.spanQueue, maxLinks: s.spanLinkLimit(), log: log})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "error", err)
		}
	}()
	var klog kgo.Logger = newFoldingKgo(kslog.New(log.With("component", "kgo")))
	if s.quietKgo {
		klog = quietKgo{klog}
	}
	kopts = append(kopts, kgo.WithLogger(klog), tel.hooks())

	pcfg.ConnConfig.Tracer = tel.dbTracer()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer closePool(pool, poolCloseWait, log)
	canStage, reached, err := checkDatabase(ctx, pool, projection.InfraMode(s.onInfraError), log)
	if err != nil {
		return err
	}
	if !canStage && s.copyMinRows > 0 {
		s.copyMinRows = -1
	}
	if !reached {
		go watchDatabase(ctx, pool, log, databaseWatchEvery, databaseStillEvery)
	}

	admCl, err := kgo.NewClient(kopts...)
	if err != nil {
		return fmt.Errorf("kafka admin client: %w", err)
	}
	defer admCl.Close()
	rep, err := checkTopics(ctx, s, admCl, topics, tel.meter(), log)
	if err != nil {
		return err
	}
	dlqMaxBytes := s.dlqMaxBytes
	if dlqMaxBytes == 0 {
		dlqMaxBytes = dlq.DefaultMaxBytes
		if rep.DLQMaxMessageBytes > 0 {
			dlqMaxBytes = rep.DLQMaxMessageBytes
		}
	}

	prodCl, err := kgo.NewClient(append(kopts,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		// The writer bounds each attempt (--dlq-write-timeout); this lets
		// kgo drop a timed-out dead letter even with its request in flight,
		// rather than keep it and write it after the worker gave up.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProducerBatchMaxBytes(int32(max(dlqMaxBytes+64*1024, 1<<20))),
	)...)
	if err != nil {
		return fmt.Errorf("kafka dead-letter producer: %w", err)
	}
	defer prodCl.Close()
	dlqWriter, err := dlq.NewWriter(prodCl, dlq.WriterConfig{
		RecordConfig: dlq.RecordConfig{
			Topic:      s.dlqTopic,
			Worker:     s.workerID,
			Generation: buildVersion() + "/" + defs.IRVersion,
			MaxBytes:   dlqMaxBytes,
			// Every text of the error's chain (an inner error, a
			// PostgreSQL error's detail), not only the outermost that
			// redactedWriter masks (new-user trial: the stackTrace
			// repeated an inner error with the password in it).
			Redact: red,
		},
		Backoff:        policy,
		Logger:         log,
		AttemptTimeout: s.dlqTimeout,
		TracerProvider: tel.tracerProvider(),
	})
	if err != nil {
		return err
	}

	metrics, err := projection.NewMetrics(tel.meter(), s.metricsConfig())
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	w, err := projection.NewWorker(projection.Config{
		Topic:              s.topic,
		Group:              s.group,
		Retry:              policy,
		InfraRetry:         dbWait,
		OnInfraError:       projection.InfraMode(s.onInfraError),
		MaxPollRecords:     s.maxPollRecords,
		MaxBatchRecords:    s.maxBatch,
		MaxQueuedBytes:     s.maxQueuedBytes,
		CopyMinRows:        s.copyMinRows,
		MaxRetrying:        s.maxRetrying,
		MaxRetryingBytes:   s.maxRetryBytes,
		Breaker:            s.breaker,
		FailureLogInterval: s.failureLogInterval,
		ShutdownGrace:      s.shutdownGrace,
		Logger:             log,
		Metrics:            metrics,
		TracerProvider:     tel.tracerProvider(),
		TraceEveryPair:     s.traceEveryPair,
		TenantSchemas:      tenants,
	}, handlers, pool, redactedWriter{dlqWriter, red}, append(append(kopts, s.fetchOpts()...), s.groupOpts()...)...)
	if err != nil {
		var ue *flagenv.UsageError
		if !errors.As(err, &ue) {
			err = flagenv.Usagef("%v", err)
		}
		return err
	}

	watch := &joinWatch{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		watch.run(watchCtx, w, s.group, log)
	}()

	var srv *http.Server
	if ln != nil {
		srv = newHTTPServer(httpHandler(w, pool, tel, red, watch, s.pprof))
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "error", err)
			}
		}()
		log.Info("http listening", "addr", ln.Addr().String())
	}
	log.Info("projection worker started", "version", buildVersion(), "ir_version", defs.IRVersion,
		"projections", len(handlers), "group", s.group, "group_instance_id", s.groupInstanceID, "session_timeout", s.sessionTimeout, "kafka", describe(s), "database", redact.Describe(&pcfg.ConnConfig.Config), "on_infra_error", s.onInfraError,
		"dlq_max_bytes", dlqMaxBytes, "max_batch_records", s.maxBatch, "max_poll_records", s.maxPollRecords,
		"fetch_max_bytes", s.fetchMaxBytes, "fetch_max_partition_bytes", s.fetchMaxPartBytes)
	if started != nil {
		started(w)
	}
	runErr := w.Run(ctx)
	stopWatch()
	<-watchDone
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	if runErr != nil {
		// In the JSON log too, not only in the exit line main prints
		// (new-user trial: a shutdown that ran out of grace left only
		// plain-text lines in the JSON stream).
		log.Error("projection worker stopped with an error", "error", runErr)
		return runErr
	}
	log.Info("projection worker stopped")
	return nil
}

// checkDatabase pings the database once at start (bounded by the pool's
// 5 s connect timeout) and logs a warning with the reason when it does not
// answer (reached false), so that a database that is down shows before the
// first record. The worker starts anyway: what happens to records then is
// --on-infra-error's, and /readyz reports the database. A server that
// answers and refuses the connection for what --database-url says
// (refusedConnection) ends the start instead, with the error returned, as
// a Kafka broker that refuses does. canStage is false when the role may
// not create the temporary tables COPY stages batches in.
func checkDatabase(ctx context.Context, pool *pgxpool.Pool, mode projection.InfraMode, log *slog.Logger) (canStage, reached bool, refused error) {
	if err := pool.Ping(ctx); err != nil && ctx.Err() == nil {
		if refused = refusedConnection(err); refused != nil {
			return false, false, refused
		}
		then := "partitions pause until it answers, and /readyz fails"
		if mode == projection.InfraDeadLetter {
			then = "records are retried, then dead-lettered, until it answers"
		}
		log.Warn("database unreachable at start: check --database-url (DATABASE_URL) and the database; the worker starts, and "+then,
			"on_infra_error", string(mode), "error", err)
		return true, false, nil // not known: COPY stays on, and falls back to statements if refused
	}
	var temp bool
	var db, role string
	err := pool.QueryRow(ctx, "SELECT has_database_privilege(current_database(), 'TEMPORARY'), current_database(), current_user").Scan(&temp, &db, &role)
	if err != nil || temp {
		return true, true, nil
	}
	log.Warn("the database role may not create temporary tables, which the COPY path stages batches in: COPY is off and upserts go as pipelined statements (slower); to turn it on, GRANT TEMPORARY ON DATABASE "+
		pgx.Identifier{db}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize(), "database", db, "role", role)
	return false, true, nil
}

// refusedConnection returns the error to end the start with when err, the
// start's ping, is PostgreSQL refusing the connection for what
// --database-url says, which waiting does not change: a session parameter
// it does not know (42704: a misspelt one, since the driver sends the
// parameters it does not know to the server as session settings) or a
// value it refuses (22023), a password or role refused (class 28), a
// database that does not exist (3D000), or no CONNECT privilege (42501).
// It returns nil for any other error: a database down, starting or full
// (57P03, 53300) is waited for.
func refusedConnection(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	hint := ""
	switch {
	case pe.Code == "42704" || pe.Code == "22023":
		hint = ": the driver sends the parameters of the URL it does not know to the server as session settings, so a misspelt one (sslmod for sslmode) or a value the server refuses ends here"
	case strings.HasPrefix(pe.Code, "28"), pe.Code == "3D000", pe.Code == "42501":
	default:
		return nil
	}
	// PostgreSQL's reason first: with sslmode=prefer (the default, and what
	// a misspelt sslmode leaves) the driver's error starts with the TLS
	// attempt the server refused (new-user trial).
	return fmt.Errorf("the database refuses the connection: %s (SQLSTATE %s); check --database-url (DATABASE_URL)%s; the driver's error: %w", pe.Message, pe.Code, hint, err)
}

// How often watchDatabase pings, and logs that the database still does
// not answer.
const (
	databaseWatchEvery = 5 * time.Second
	databaseStillEvery = time.Minute
)

// sleep waits d, and reports false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// watchDatabase follows a database that did not answer at start: it pings
// it every `every` until it answers, then logs so at INFO and returns; in
// the meantime it logs a WARN every `still` with how long and why. With no
// record to apply nothing else would say either (new-user trial: a worker
// started before its database logged nothing after its first warning).
// It returns when ctx is done.
func watchDatabase(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, every, still time.Duration) {
	start, warned := time.Now(), time.Now()
	for sleep(ctx, every) {
		pctx, cancel := context.WithTimeout(ctx, max(every, 5*time.Second)) // the pool's connect timeout
		err := pool.Ping(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			log.Info("database answers now", "unreachable_for", time.Since(start).Round(time.Second))
			return
		case time.Since(warned) >= still:
			warned = time.Now()
			log.Warn("database still unreachable: check --database-url (DATABASE_URL) and the database", "for", time.Since(start).Round(time.Second), "error", err)
		}
	}
}

// topicsError is err, an error of the first requests about the topics,
// with the cause Kafka's answer gives in terms of the flags, when it gives
// one (kafkaconn.Explain, kafkaconn.ClosedHint), or, when no broker of
// brokers took a connection, that (kafkaconn.NoBrokerAnswers), or, when no
// answer came in time, what can cause that (kafkaconn.NoAnswerHint;
// fresh-user trial: `topics --kafka-tls` against a plaintext listener said
// "context deadline exceeded" alone after 30 s): "topics: <cause>: <err>".
func topicsError(err error, brokers string) error {
	reason := cmp.Or(kafkaconn.Explain(err), kafkaconn.ClosedHint(err))
	switch {
	case reason != "":
	case kafkaconn.DialError(err):
		// Named as run and dlq-replayer name it (fresh-user trial:
		// "unable to dial: ... connection refused" named no flag).
		reason = kafkaconn.NoBrokerAnswers(brokers)
	case errors.Is(err, context.DeadlineExceeded):
		reason = kafkaconn.NoAnswerHint
	}
	if reason != "" {
		return fmt.Errorf("topics: %s: %w", reason, err)
	}
	return fmt.Errorf("topics: %w", err)
}

// checkTopics creates missing topics (with --create-topics=false it only
// looks them up, and a missing events or dead-letter topic is an error),
// warns about a dead-letter topic that keeps less than 30 days and exports
// its retention and depth as metrics. It returns what it found of the
// dead-letter topic.
func checkTopics(ctx context.Context, s *settings, cl *kgo.Client, cfg dlq.TopicConfig, meter metric.Meter, log *slog.Logger) (dlq.TopicReport, error) {
	adm := kadm.NewClient(cl)
	check := dlq.EnsureTopics
	if !s.createTopics {
		check = dlq.CheckTopics
	}
	rep, err := untilKafkaAnswers(ctx, s, log, func(ctx context.Context) (dlq.TopicReport, error) {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := kafkaconn.Closed(tctx, cl); err != nil {
			return dlq.TopicReport{}, err
		}
		return check(tctx, adm, cfg)
	})
	var unreachable *kafkaUnreachableError
	switch {
	case errors.As(err, &unreachable):
		return rep, err // says what it is: no "topics:" in front
	case err != nil:
		return rep, topicsError(err, s.kafka.Brokers)
	}
	for _, t := range rep.Created {
		if t == cfg.EventsTopic && !s.embedded {
			// Operator trial: a typo in --topic made a new, empty topic
			// with an INFO line, and a ready worker reading nothing.
			log.Warn("events topic created: it did not exist, so nothing was produced to it yet; if the producers write to another topic, fix --topic (EVENTS_TOPIC)", "topic", t)
			continue
		}
		log.Info("topic created", "topic", t)
	}
	var needed []string
	for _, t := range rep.Missing {
		if t == cfg.LedgerTopic {
			log.Warn("replay ledger topic does not exist and --create-topics=false does not create it: dlq-replayer needs it; create it with `projection-worker topics`",
				"topic", t)
			continue
		}
		needed = append(needed, t)
	}
	if len(needed) > 0 {
		return rep, fmt.Errorf("topics: %s not found, and --create-topics=false (CREATE_TOPICS) creates none: create them with `projection-worker topics`, or drop --create-topics=false",
			strings.Join(needed, " and "))
	}
	if rep.DLQRetentionTooShort {
		log.Warn("dead-letter topic keeps less than 30 days: dead letters may expire before anyone replays them",
			"topic", cfg.DLQTopic, "retention", rep.DLQRetention.String(), "want_at_least", dlq.MinRetention.String())
	}
	retention := -1.0 // unlimited
	if rep.DLQRetention >= 0 {
		retention = rep.DLQRetention.Seconds()
	}
	_, err = meter.Float64ObservableGauge("causet.dlq.retention",
		metric.WithUnit("s"),
		metric.WithDescription("Retention of the dead-letter topic (its retention.ms) read at start, in seconds (-1 = unlimited); should be >= 2592000 (30 days)."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			o.Observe(retention)
			return nil
		}))
	if err != nil {
		return rep, err
	}
	_, err = meter.Int64ObservableGauge("causet.dlq.depth",
		metric.WithUnit("{record}"),
		metric.WithDescription("Records in the dead-letter topic (end offset minus start offset, all partitions)."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			ends, err := adm.ListEndOffsets(ctx, cfg.DLQTopic)
			if err != nil {
				return nil // not observed this time
			}
			starts, err := adm.ListStartOffsets(ctx, cfg.DLQTopic)
			if err != nil {
				return nil
			}
			if depth, ok := dlqDepth(ends, starts); ok {
				o.Observe(depth)
			}
			return nil
		}))
	return rep, err
}

// dlqDepth returns the records between the start and end offsets of
// every partition listed, and false unless both are known for every one:
// a deleted topic is listed as one error, which summed to a depth of 0
// (operator trial).
func dlqDepth(ends, starts kadm.ListedOffsets) (int64, bool) {
	var depth int64
	known := len(ends) > 0
	ends.Each(func(e kadm.ListedOffset) {
		st, ok := starts.Lookup(e.Topic, e.Partition)
		if !ok || e.Err != nil || st.Err != nil {
			known = false
			return
		}
		depth += e.Offset - st.Offset
	})
	return depth, known
}

// redactedWriter writes dead letters whose error and stack are redacted.
type redactedWriter struct {
	w   *dlq.Writer
	red *redact.Redactor
}

func (r redactedWriter) redacted(dl dlq.DeadLetter) dlq.DeadLetter {
	dl.Err = r.red.Error(dl.Err)
	dl.Stack = r.red.String(dl.Stack)
	return dl
}

// Topic returns the dead-letter topic (projection.DeadLetterWriter: the
// worker names it when it is missing).
func (r redactedWriter) Topic() string { return r.w.Topic() }

func (r redactedWriter) Write(ctx context.Context, dl dlq.DeadLetter) error {
	return r.w.Write(ctx, r.redacted(dl))
}

func (r redactedWriter) WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error {
	red := make([]dlq.DeadLetter, len(dls))
	for i, dl := range dls {
		red[i] = r.redacted(dl)
	}
	return r.w.WriteBatch(ctx, red)
}

// httpHandler serves /healthz (the process is up), /readyz (group joined,
// database reachable, no partition paused; else the reason, with
// kafkaconn.Explain's cause first and why the brokers refuse the worker's
// connection from watch, redacted by red) and /metrics; with profiles
// (--pprof), Go's profiles under /debug/pprof/ (net/http/pprof) but not
// /debug/pprof/cmdline, which would show --database-url's password.
func httpHandler(w *projection.Worker, pool *pgxpool.Pool, tel *telemetry, red *redact.Redactor, watch *joinWatch, profiles bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		// Every reason at once: a worker that has not joined its group
		// because Kafka refuses it may also not reach its database.
		err := w.Ready()
		if perr := pool.Ping(ctx); perr != nil {
			err = errors.Join(err, pingError(perr, pool.Stat()))
		}
		if err != nil {
			msg := err.Error()
			if reason := kafkaconn.Explain(err); reason != "" {
				msg = reason + ": " + msg
			}
			if reason := watch.reason(); reason != "" {
				msg += ": " + reason
			}
			http.Error(rw, "not ready: "+red.String(msg), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(rw, "ready\n")
	})
	mux.Handle("GET /metrics", tel.metricsHandler())
	if profiles {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Timeouts of the HTTP server (variables for the tests): a request's
// headers must come within httpReadHeaderTimeout and the whole request
// within httpReadTimeout (every request here is a GET); a kept-alive
// connection idle for httpIdleTimeout is closed (security trial: 3 000
// connections that each sent one GET were all still open 32 s later,
// holding the descriptors Kafka and PostgreSQL need).
var (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpIdleTimeout       = 30 * time.Second
)

// newHTTPServer returns the server of /healthz, /readyz, /metrics (and
// pprof) with h, and its timeouts. It sets no write timeout: a pprof
// profile is written for as long as it was asked to run.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout, IdleTimeout: httpIdleTimeout}
}

// poolCloseWait is how long run waits at exit for the database pool's
// connections to be given back (closePool).
const poolCloseWait = 5 * time.Second

// closePool closes pool, waiting at most wait for the connections still
// in use: statements of batches a shutdown abandoned (a lock another
// session holds, a database that does not answer) give theirs back only
// when PostgreSQL answers their cancellation, and pgxpool.Close waits
// for every one (deployment trial: 5-8 s after "projection worker
// stopped", unbounded in principle). Those left are closed by the
// process's exit: PostgreSQL then rolls their transactions back, and
// their records, never committed, are processed again by the next owner.
func closePool(pool *pgxpool.Pool, wait time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		log.Warn("database connections still in use at exit, left to the process's exit (statements of abandoned batches waiting for a lock or for the database)",
			"connections", pool.Stat().AcquiredConns(), "waited", wait)
	}
}

// pingError is /readyz's reason for a failed ping of the pool: the
// database unreachable, or, when the ping found every connection of the
// pool in use (it waited for one until its deadline), busy: statements
// that wait for a lock or run long (ops trial: a locked table read
// "database unreachable: context deadline exceeded").
func pingError(err error, st *pgxpool.Stat) error {
	if errors.Is(err, context.DeadlineExceeded) && st.MaxConns() > 0 && st.AcquiredConns() >= st.MaxConns() {
		return fmt.Errorf("database busy: all %d connections of the pool in use (statements waiting for a lock another session holds, or running long; lock_timeout and statement_timeout make them fail: README, Failure handling): %w", st.MaxConns(), err)
	}
	return fmt.Errorf("database unreachable: %w", err)
}

// checkHTTPAddr returns a usage error (exit 2) when addr, not empty, is not
// a host:port whose port is a number or service name in range: the command
// line's fault, not the machine's (exit 1, as for an address in use). A
// malformed address is not answered with a free port to try (new-user
// trial: dev said "127.0.0.1:18080 is free now" for 127.0.0.1:99999).
func checkHTTPAddr(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return flagenv.Usagef("--http-addr %q: %v", addr, err)
	}
	return nil
}
