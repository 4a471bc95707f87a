package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/jqcheck"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/metrictest"
	"github.com/causet/projection-worker/internal/otlptest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
	"github.com/causet/projection-worker/schemas"
)

// fastRetry keeps the documented shape (×2, jitter, 5 retries) with short
// waits so tests run in seconds.
var fastRetry = retry.Policy{Initial: 5 * time.Millisecond, Multiplier: 2, MaxInterval: 40 * time.Millisecond, Jitter: 0.5, MaxRetries: 5}

// rig is one worker scenario: its own topics, consumer group and tenant
// schema on a shared broker and database.
type rig struct {
	t         *testing.T
	broker    *kafkatest.Broker
	topic     string
	dlqTopic  string
	group     string
	pool      *pgxpool.Pool
	db        projection.DB // the worker's database; nil: pool
	tenant    string
	handlers  []projection.Handler
	validator *schemas.Validator
	producer  *kgo.Client
	batcher   *kgo.Client // produceAll's: one record batch per partition
	produced  int64
	kopts     []kgo.Opt // rigOptions.kopts
}

type rigOptions struct {
	partitions int32
	db         *pgtest.Server // own database server (outage tests); default shared
	fake       bool           // needs kfake fault injection
	brokers    int            // kfake brokers (default 1); the real broker is one
	kopts      []kgo.Opt      // more client options of the worker (fetch caps)
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	if o.partitions == 0 {
		o.partitions = 1
	}
	var b *kafkatest.Broker
	kopts := []kfake.Opt{kfake.NumBrokers(max(o.brokers, 1))}
	if o.fake {
		b = kafkatest.Fake(t, kopts...)
	} else {
		b = kafkatest.New(t, kopts...)
	}
	var pool *pgxpool.Pool
	if o.db != nil {
		p, err := pgxpool.New(context.Background(), o.db.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pool = p
	} else {
		pool = pgtest.Pool(t)
	}
	r := &rig{
		t:        t,
		broker:   b,
		topic:    kafkatest.TopicName(t, "events"),
		dlqTopic: kafkatest.TopicName(t, "dlq"),
		group:    kafkatest.TopicName(t, "group"),
		pool:     pool,
		tenant:   pgtest.NewSchemaName(t),
		kopts:    o.kopts,
	}
	b.CreateTopic(t, r.topic, o.partitions, nil)
	b.CreateTopic(t, r.dlqTopic, o.partitions, nil)
	defs, err := projection.LoadDefinitions("testdata/worker/projections.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tps, err := projection.NewTableProjections(defs)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tps {
		r.handlers = append(r.handlers, p)
	}
	if err := projection.Migrate(context.Background(), pool, defs, r.tenant); err != nil {
		t.Fatal(err)
	}
	if r.validator, err = schemas.NewValidator(); err != nil {
		t.Fatal(err)
	}
	r.producer = b.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.ProducerLinger(0))
	return r
}

type running struct {
	w      *projection.Worker
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned err
	err    error
}

// stop cancels the worker and returns Run's result.
func (rn *running) stop(t *testing.T) error {
	t.Helper()
	rn.cancel()
	select {
	case <-rn.done:
		return rn.err
	case <-time.After(40 * time.Second):
		t.Fatal("worker did not stop within 40s")
		return nil
	}
}

func (r *rig) start(mod func(*projection.Config), handlers ...projection.Handler) *running {
	t := r.t
	t.Helper()
	prod := r.broker.Client(t, kgo.ProducerLinger(0))
	// Every rig traces half the records (spans counted, not kept), so that
	// the worker's spans, sampled or not, go through every scenario, under
	// the race detector too; every
	// pair has a span in half of the tests (by name), only the failed ones
	// in the other half.
	tp := testTracerProvider(t)
	writer, err := dlq.NewWriter(prod, dlq.WriterConfig{
		RecordConfig:   dlq.RecordConfig{Topic: r.dlqTopic, Worker: "test-worker", Generation: "test/v42"},
		Backoff:        retry.Policy{Initial: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 100 * time.Millisecond, Jitter: 0.2},
		Logger:         slog.New(slog.DiscardHandler),
		TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := projection.Config{
		Topic:          r.topic,
		Group:          r.group,
		Retry:          fastRetry,
		InfraRetry:     retry.Policy{Initial: 20 * time.Millisecond, Multiplier: 2, MaxInterval: 200 * time.Millisecond, Jitter: 0.2},
		ShutdownGrace:  20 * time.Second,
		CommitInterval: 100 * time.Millisecond,
		CopyMinRows:    copyMinRows,
		Logger:         slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		TracerProvider: tp,
		TraceEveryPair: len(t.Name())%2 == 0,
	}
	if mod != nil {
		mod(&cfg)
	}
	if len(handlers) == 0 {
		handlers = r.handlers
	}
	var db projection.DB = r.pool
	if r.db != nil {
		db = r.db
	}
	w, err := projection.NewWorker(cfg, handlers, db, writer, append(r.broker.Opts(), r.kopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &running{w: w, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rn.done)
		rn.err = w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-rn.done:
		case <-time.After(40 * time.Second):
		}
	})
	return rn
}

// testTracerProvider returns a tracer provider sampling half the traces
// (records whose spans are not sampled go through every path too) into a
// processor that counts them, shut down when t ends.
func testTracerProvider(t *testing.T) *sdktrace.TracerProvider {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.5))),
		sdktrace.WithSpanProcessor(&otlptest.SpanCounter{}))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// event returns a projection event for the rig's tenant.
func (r *rig) event(typ, entity string, seq int64, payload string) string {
	return fmt.Sprintf(`{"eventType":%q,"entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":1719331200000,"payload":%s}`,
		typ, entity, r.tenant, seq, payload)
}

func (r *rig) follow(user, artist string, seq int64) string {
	return r.event("ARTIST_FOLLOWED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":%q}`, user, artist))
}

// produce writes records synchronously, keyed by key, value nil for a
// tombstone.
func (r *rig) produce(key string, value []byte, headers ...kgo.RecordHeader) {
	r.t.Helper()
	rec := &kgo.Record{Key: []byte(key), Value: value, Headers: headers}
	if err := r.producer.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
	r.produced++
}

// waitCommitted waits until the group has committed every produced record.
func (r *rig) waitCommitted(timeout time.Duration) {
	r.t.Helper()
	adm := kadm.NewClient(r.broker.Client(r.t))
	deadline := time.Now().Add(timeout)
	var got int64
	for time.Now().Before(deadline) {
		offs, err := adm.FetchOffsets(context.Background(), r.group)
		if err == nil {
			got = 0
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == r.topic && o.Err == nil {
					got += o.At
				}
			})
			if got == r.produced {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("group committed %d of %d records within %s", got, r.produced, timeout)
}

// committed returns the group's committed offset of partition 0 (−1 none).
func (r *rig) committed() int64 {
	r.t.Helper()
	adm := kadm.NewClient(r.broker.Client(r.t))
	offs, err := adm.FetchOffsets(context.Background(), r.group)
	if err != nil {
		return -1
	}
	if o, ok := offs.Lookup(r.topic, 0); ok && o.Err == nil {
		return o.At
	}
	return -1
}

// deadLetter is one record read back from the dead-letter topic.
type deadLetter struct {
	key     string
	headers map[string]string
	msg     dlq.Message
	raw     []byte
}

// deadLetters reads the whole dead-letter topic, validates every value
// against schemas/projection-dlq.v1.schema.json and checks that strict JSON
// parsers read it (jq and encoding/json, jqcheck.Check).
func (r *rig) deadLetters() []deadLetter {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(r.broker.Client(r.t))
	ends, err := adm.ListEndOffsets(ctx, r.dlqTopic)
	if err != nil {
		r.t.Fatal(err)
	}
	want := map[int32]int64{}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			total += o.Offset
		}
	})
	if total == 0 {
		return nil
	}
	cl := r.broker.Client(r.t, kgo.ConsumeTopics(r.dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []deadLetter
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			r.t.Fatalf("read %d of %d dead letters: %v", len(out), total, ctx.Err())
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if rec.Offset >= want[rec.Partition] {
				return
			}
			if err := r.validator.ValidateDeadLetter(rec.Value); err != nil {
				r.t.Errorf("dead letter at %d:%d does not validate against the schema: %v\n%s", rec.Partition, rec.Offset, err, rec.Value)
			}
			jqcheck.Check(r.t, rec.Value)
			d := deadLetter{key: string(rec.Key), headers: map[string]string{}, raw: rec.Value}
			for _, h := range rec.Headers {
				d.headers[h.Key] = string(h.Value)
			}
			if err := json.Unmarshal(rec.Value, &d.msg); err != nil {
				r.t.Fatalf("dead letter value: %v", err)
			}
			out = append(out, d)
		})
	}
	return out
}

// count returns the rows of a projection table in the rig's tenant.
func (r *rig) count(table string) int {
	r.t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{r.tenant, table}.Sanitize()
	if err := r.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

const testTimeout = 60 * time.Second

// copyMinRows makes every upsert group of the tests' small batches go
// through COPY (and its fallback to statements on failure); set
// TEST_NO_COPY=1 to test the statement path alone.
var copyMinRows = func() int {
	if os.Getenv("TEST_NO_COPY") == "1" {
		return -1
	}
	return 1
}()

func TestWorkerProjectsTheSpecExample(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil)
	r.produce("user-123", []byte(r.follow("user-123", "artist-456", 1891)))
	r.waitCommitted(testTimeout)

	var followedAt time.Time
	var seq int64
	q := "SELECT followed_at, _causet_seq FROM " + pgx.Identifier{r.tenant, "artist_followers"}.Sanitize() + " WHERE artist_id = 'artist-456' AND user_id = 'user-123'"
	if err := r.pool.QueryRow(context.Background(), q).Scan(&followedAt, &seq); err != nil {
		t.Fatalf("artist_followers row: %v", err)
	}
	if want := time.UnixMilli(1719331200000); !followedAt.Equal(want) || seq != 1891 {
		t.Errorf("row = (%s, %d), want (%s, 1891)", followedAt.UTC(), seq, want.UTC())
	}
	if n := r.count("user_follows"); n != 1 {
		t.Errorf("user_follows rows = %d, want 1", n)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters = %d, want 0: %s", len(dls), dls[0].raw)
	}
}

// TestWorkerDeadLettersEachDocumentedCause covers the four data causes of
// the Causet DLQ guide; the fifth (database unreachable) has its own tests.
func TestWorkerDeadLettersEachDocumentedCause(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(r *rig)
		value func(r *rig) string
		// want is one dead letter; applied lists tables that still get a row.
		wantProjection string
		wantError      string
		wantSQLState   string
		wantClass      retry.Class
		wantRetries    int
		wantStack      string // in stackTrace, when set
		applied        []string
		notMigrated    bool
	}{
		{
			name: "missing column",
			setup: func(r *rig) {
				exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+" DROP COLUMN followed_at")
			},
			value:          func(r *rig) string { return r.follow("user-1", "artist-1", 1) },
			wantProjection: "artist_followers",
			wantError:      `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`,
			wantSQLState:   "42703", wantClass: retry.Projection, wantRetries: 5,
			applied: []string{"user_follows"},
		},
		{
			name: "derive null into not null column",
			value: func(r *rig) string {
				return r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"artist-1"}`)
			},
			wantProjection: "artist_ratings",
			wantError:      `projection "artist_ratings": column stars (derive "has(payload.stars) ? payload.stars : null", JSON null): null value in a notNull column`,
			wantClass:      retry.Permanent, wantRetries: 0,
		},
		{
			name: "value out of range for the column type",
			value: func(r *rig) string {
				return r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"artist-1","stars":99999999999999999999}`)
			},
			wantProjection: "artist_ratings",
			wantError:      `projection "artist_ratings": column stars (derive "has(payload.stars) ? payload.stars : null", JSON number): value "99999999999999999999" is out of range for type integer`, // as the event sent it, not the double 1e+20 (definitions trial)
			wantClass:      retry.Permanent, wantRetries: 0,
		},
		{
			name: "not-null constraint only the table has",
			setup: func(r *rig) {
				exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+" ALTER COLUMN score SET NOT NULL")
			},
			value:          func(r *rig) string { return r.follow("user-1", "artist-1", 1) },
			wantProjection: "artist_followers",
			wantError:      `ERROR: null value in column "score" of relation "artist_followers" violates not-null constraint (SQLSTATE 23502)`,
			wantStack:      `projection "artist_followers": column score (derive "has(payload.games) ? payload.points / payload.games : null", JSON null): ERROR: null value in column "score"`,
			wantSQLState:   "23502", wantClass: retry.Projection, wantRetries: 5,
			applied: []string{"user_follows"},
		},
		{
			name: "check constraint",
			setup: func(r *rig) {
				exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range CHECK (stars BETWEEN 0 AND 10)")
			},
			value: func(r *rig) string {
				return r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"artist-1","stars":11}`)
			},
			wantProjection: "artist_ratings",
			wantError:      `ERROR: new row for relation "artist_ratings" violates check constraint "stars_range" (SQLSTATE 23514)`,
			wantSQLState:   "23514", wantClass: retry.Projection, wantRetries: 5,
		},
		{
			name: "derive divides by zero",
			value: func(r *rig) string {
				return r.event("ARTIST_FOLLOWED", "user-3", 1, `{"user_id":"user-3","artist_id":"artist-1","points":10,"games":0}`)
			},
			wantProjection: "artist_followers",
			wantError:      "division by zero",
			wantClass:      retry.Permanent, wantRetries: 0,
			applied: []string{"user_follows"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{})
			if tt.setup != nil {
				tt.setup(r)
			}
			r.start(nil)
			before := time.Now().UnixMilli()
			r.produce("k1", []byte(tt.value(r)), kgo.RecordHeader{Key: "traceparent-ish", Value: []byte("carried")})
			r.waitCommitted(testTimeout)
			after := time.Now().UnixMilli()
			dls := r.deadLetters()
			if len(dls) != 1 {
				t.Fatalf("dead letters = %d, want 1", len(dls))
			}
			d := dls[0]
			checkDeadLetter(t, d, r.tenant, tt.wantProjection, tt.wantClass, tt.wantSQLState, tt.wantRetries, before, after)
			if !strings.Contains(d.msg.Error, tt.wantError) {
				t.Errorf("error = %q, want it to contain %q", d.msg.Error, tt.wantError)
			}
			if tt.wantStack != "" && !strings.Contains(d.msg.StackTrace, tt.wantStack) {
				t.Errorf("stackTrace = %q, want it to contain %q", d.msg.StackTrace, tt.wantStack)
			}
			if d.headers["traceparent-ish"] != "carried" || d.key != "k1" {
				t.Errorf("original key/header not carried: key %q headers %v", d.key, d.headers)
			}
			for _, table := range tt.applied {
				if n := r.count(table); n != 1 {
					t.Errorf("%s rows = %d, want 1: one projection's failure must not stop another", table, n)
				}
			}
		})
	}
	t.Run("tenant never migrated", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{})
		r.start(nil)
		other := pgtest.NewSchemaName(t)
		before := time.Now().UnixMilli()
		v := strings.Replace(r.follow("user-4", "artist-1", 1), r.tenant, other, 1)
		r.produce("user-4", []byte(v))
		r.waitCommitted(testTimeout)
		dls := r.deadLetters()
		if len(dls) != 2 {
			t.Fatalf("dead letters = %d, want 2 (one per projection of ARTIST_FOLLOWED)", len(dls))
		}
		for _, d := range dls {
			checkDeadLetter(t, d, other, d.msg.ProjectionName, retry.Projection, "42P01", 5, before, time.Now().UnixMilli())
			want := fmt.Sprintf(`ERROR: relation "%s.%s" does not exist (SQLSTATE 42P01)`, other, d.msg.ProjectionName)
			if d.msg.Error != want {
				t.Errorf("error = %q, want %q", d.msg.Error, want)
			}
		}
	})
}

func checkDeadLetter(t *testing.T, d deadLetter, tenant, projectionName string, class retry.Class, sqlstate string, retries int, before, after int64) {
	t.Helper()
	m := d.msg
	if m.ProjectionName != projectionName || m.TenantSchema != tenant || m.RetryCount != retries {
		t.Errorf("dead letter (projection, tenant, retries) = (%q, %q, %d), want (%q, %q, %d)",
			m.ProjectionName, m.TenantSchema, m.RetryCount, projectionName, tenant, retries)
	}
	if !(before <= m.FirstFailedAt && m.FirstFailedAt <= m.FailedAt && m.FailedAt <= after) {
		t.Errorf("timestamps: want %d <= firstFailedAt %d <= failedAt %d <= %d", before, m.FirstFailedAt, m.FailedAt, after)
	}
	h := d.headers
	if h[dlq.HeaderErrorClass] != class.String() || h[dlq.HeaderSQLState] != sqlstate || h[dlq.HeaderProjection] != projectionName {
		t.Errorf("headers class/sqlstate/projection = %q/%q/%q, want %q/%q/%q",
			h[dlq.HeaderErrorClass], h[dlq.HeaderSQLState], h[dlq.HeaderProjection], class, sqlstate, projectionName)
	}
	if len(h[dlq.HeaderFingerprint]) != 16 || h[dlq.HeaderGeneration] != "test/v42" || h[dlq.HeaderWorker] != "test-worker" {
		t.Errorf("headers fingerprint/generation/worker = %q/%q/%q", h[dlq.HeaderFingerprint], h[dlq.HeaderGeneration], h[dlq.HeaderWorker])
	}
	if !strings.Contains(m.StackTrace, "goroutine") {
		t.Errorf("stackTrace has no Go stack: %q", m.StackTrace)
	}
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestWorkerPermanentInputsBetweenGoodEvents puts every kind of invalid
// record between good ones on one partition: each invalid record becomes
// exactly one dead letter at once, and every good one is applied.
func TestWorkerPermanentInputsBetweenGoodEvents(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	// An event for one of PostgreSQL's own schemas passes the SPEC pattern
	// but names no tenant: it must never reach SQL (where it was retried as
	// a 42P01 projection error), and its dead letter keeps the name.
	notTenant := func(schema string) string { return strings.Replace(r.follow("u", "a", 1), r.tenant, schema, 1) }
	const tombstone = "tombstone" // produced with a null value; "" is an empty one
	poison := []struct {
		name, value string
		field       string // in the error: the field, or what the value is
		tenant      string // the dead letter's tenantSchema, when checked
	}{
		{"not JSON", "this is not json", "", ""},
		{"truncated JSON", `{"eventType":"ARTIST_FOLLOWED","entityId":`, "", ""},
		{tombstone, "", "record value is a Kafka tombstone (null)", ""},
		{"empty value", "", "record value is empty (0 bytes, not a tombstone)", ""},
		{"JSON null", "null", "", ""},
		{"duplicate key", strings.Replace(r.follow("u", "a", 1), `"forkId":"production"`, `"forkId":"production","forkId":"staging"`, 1), "forkId", ""},
		{"sequenceNumber as string", strings.Replace(r.follow("u", "a", 1), `"sequenceNumber":1`, `"sequenceNumber":"7"`, 1), "sequenceNumber", ""},
		{"sequenceNumber 7.5", strings.Replace(r.follow("u", "a", 1), `"sequenceNumber":1`, `"sequenceNumber":7.5`, 1), "sequenceNumber", ""},
		{"sequenceNumber beyond int64", strings.Replace(r.follow("u", "a", 1), `"sequenceNumber":1`, `"sequenceNumber":9223372036854775808`, 1), "sequenceNumber", ""},
		{"hostile tenantSchema", strings.Replace(r.follow("u", "a", 1), r.tenant, `tenant_a\"; DROP TABLE x; --`, 1), "tenantSchema", ""},
		{"tenantSchema public is not a tenant", notTenant("public"), "tenantSchema", "public"},
		{"tenantSchema pg_catalog is not a tenant", notTenant("pg_catalog"), "tenantSchema", "pg_catalog"},
		{"tenantSchema information_schema is not a tenant", notTenant("information_schema"), "tenantSchema", "information_schema"},
		// jq 1.6 refuses an unpaired surrogate escape: the value goes to
		// originalValueBase64, and what is readable stays findable.
		{"unpaired surrogate escape", r.event("ARTIST_FOLLOWED", "u", 1, `{"user_id":"u\ud800","artist_id":"a"}`), "payload.user_id", r.tenant},
		{"nesting deeper than a dead letter embeds", r.event("ARTIST_FOLLOWED", "u", 1, `{"deep":`+strings.Repeat("[", 130)+strings.Repeat("]", 130)+`}`), "payload", r.tenant},
	}
	r.start(nil)
	r.produce("good-1", []byte(r.follow("good-1", "artist-1", 1)))
	for _, p := range poison {
		v := []byte(p.value)
		if p.name == tombstone {
			v = nil
		}
		r.produce("poison", v)
	}
	r.produce("good-2", []byte(r.follow("good-2", "artist-1", 1)))
	r.waitCommitted(testTimeout)

	if n := r.count("artist_followers"); n != 2 {
		t.Errorf("artist_followers rows = %d, want 2 (both good events)", n)
	}
	dls := r.deadLetters()
	if len(dls) != len(poison) {
		t.Fatalf("dead letters = %d, want %d", len(dls), len(poison))
	}
	for i, p := range poison {
		d := dls[i]
		t.Run(p.name, func(t *testing.T) {
			if d.msg.ProjectionName != "" || d.msg.RetryCount != 0 || d.headers[dlq.HeaderErrorClass] != "permanent" {
				t.Errorf("dead letter = projection %q retries %d class %q, want \"\", 0, permanent", d.msg.ProjectionName, d.msg.RetryCount, d.headers[dlq.HeaderErrorClass])
			}
			if p.field != "" && !strings.Contains(d.msg.Error, p.field) {
				t.Errorf("error %q does not name the field %q", d.msg.Error, p.field)
			}
			// What is readable of an object that fails validation stays
			// findable by tenant and fork (SPEC §6: tenantSchema "" only
			// when unreadable).
			if p.field == "sequenceNumber" {
				if d.msg.TenantSchema != r.tenant || d.headers[dlq.HeaderForkID] != "production" || d.headers[dlq.HeaderEventType] != "ARTIST_FOLLOWED" {
					t.Errorf("tenant %q fork-id %q event-type %q, want %q production ARTIST_FOLLOWED",
						d.msg.TenantSchema, d.headers[dlq.HeaderForkID], d.headers[dlq.HeaderEventType], r.tenant)
				}
			}
			if (p.field == "tenantSchema" || p.tenant != "") && d.msg.TenantSchema != p.tenant {
				t.Errorf("dead letter tenantSchema %q, want %q", d.msg.TenantSchema, p.tenant)
			}
			if string(d.msg.OriginalEvent) != "null" {
				if string(d.msg.OriginalEvent) != p.value {
					t.Errorf("originalEvent not verbatim:\n got %s\nwant %s", d.msg.OriginalEvent, p.value)
				}
			} else if d.msg.OriginalValueBase64 == "" && p.value != "" {
				t.Errorf("originalEvent null but originalValueBase64 empty")
			}
		})
	}
}

func TestWorkerRedeliveryOfOlderSequenceIsNoop(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil)
	withScore := func(seq, points int64) []byte {
		return []byte(r.event("ARTIST_FOLLOWED", "user-1", seq, fmt.Sprintf(`{"user_id":"user-1","artist_id":"artist-1","points":%d,"games":1}`, points)))
	}
	// Each in a batch of its own, so that the sequence guard, not the
	// deduplication within a batch, has to keep the newest state.
	check := func(when string) {
		t.Helper()
		var score, seq int64
		q := "SELECT score, _causet_seq FROM " + pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()
		if err := r.pool.QueryRow(context.Background(), q).Scan(&score, &seq); err != nil {
			t.Fatal(err)
		}
		if score != 50 || seq != 5 {
			t.Errorf("%s: row (score, seq) = (%d, %d), want (50, 5)", when, score, seq)
		}
	}
	r.produce("user-1", withScore(5, 50))
	r.waitCommitted(testTimeout)
	r.produce("user-1", withScore(3, 30)) // older: no-op
	r.waitCommitted(testTimeout)
	check("after an older event")
	r.produce("user-1", withScore(5, 50)) // re-delivery: same state
	r.waitCommitted(testTimeout)
	check("after a re-delivery")
	// A delete at 6 leaves a tombstone; a late upsert at 4 must not bring
	// the row back.
	r.produce("user-1", []byte(r.event("ARTIST_UNFOLLOWED", "user-1", 6, `{"user_id":"user-1","artist_id":"artist-1"}`)))
	r.waitCommitted(testTimeout)
	r.produce("user-1", withScore(4, 40))
	r.waitCommitted(testTimeout)
	if n := r.count("artist_followers"); n != 0 {
		t.Errorf("rows after delete and late upsert = %d, want 0", n)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters = %d, want 0", len(dls))
	}
}

func TestWorkerRestartResumesFromCommittedOffset(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 3})
	rn := r.start(nil)
	for i := range 10 {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	r.waitCommitted(testTimeout)
	if err := rn.stop(t); err != nil {
		t.Fatalf("Run returned %v, want nil after a clean shutdown", err)
	}
	for i := 10; i < 20; i++ {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	r.start(nil)
	r.waitCommitted(testTimeout)
	if n := r.count("artist_followers"); n != 20 {
		t.Errorf("rows = %d, want 20", n)
	}
}

func TestWorkerReplayedEventAppliesOnlyToNamedProjection(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)),
		kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte("artist_followers")})
	// Replayed again and failing again: the dead letter keeps the original
	// firstFailedAt and carries the replay count.
	r.produce("user-2", []byte(r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"artist-1"}`)),
		kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte("artist_ratings")},
		kgo.RecordHeader{Key: dlq.HeaderReplayCountOut, Value: []byte("2")},
		kgo.RecordHeader{Key: dlq.HeaderReplayFirstFailedAt, Value: []byte("1700000000000")})
	r.waitCommitted(testTimeout)
	if a, u := r.count("artist_followers"), r.count("user_follows"); a != 1 || u != 0 {
		t.Errorf("rows artist_followers=%d user_follows=%d, want 1 and 0", a, u)
	}
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	if d := dls[0]; d.msg.FirstFailedAt != 1700000000000 || d.headers[dlq.HeaderReplayCount] != "2" {
		t.Errorf("firstFailedAt %d replay-count %q, want 1700000000000 and 2", d.msg.FirstFailedAt, d.headers[dlq.HeaderReplayCount])
	}
}

// TestWorkerCountsReplaysToProjectionsItDoesNotHaveUnderOneLabel: the
// causet.replay.projection header is written by whoever produces, so the
// dead letters of replays to projections the worker does not have count
// under projection="(other)", not a series per name (operator trial:
// x1, x2, x3 and a 300-character name each made one), while each dead
// letter keeps the name it was given, cut at 256 bytes as its other labels
// from the wire are (security trial: a name of 600 KB made a dead letter
// that no DLQ topic of 1 MB takes, and stuck its partition).
func TestWorkerCountsReplaysToProjectionsItDoesNotHaveUnderOneLabel(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 3})
	metrics, reader := testMetrics(t)
	r.start(func(c *projection.Config) { c.Metrics = metrics })
	names := []string{"x1", "x2", "x3", strings.Repeat("z", 256), strings.Repeat("y", 600_000)}
	for i, name := range names {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.follow(user, "artist-1", 1)),
			kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte(name)})
	}
	r.produce("user-ok", []byte(r.event("ARTIST_RATED", "user-ok", 1, `{"user_id":"user-ok","artist_id":"a"}`)),
		kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte("artist_ratings")}) // no stars: refused, its own label
	r.waitCommitted(testTimeout)
	got := map[string]bool{}
	for _, d := range r.deadLetters() {
		got[d.msg.ProjectionName] = true
		if len(d.headers[dlq.HeaderProjection]) > 256 || len(d.msg.Error) > 1024 {
			t.Errorf("dead letter of projection %.20q: header of %d bytes, error of %d; want the name cut at 256 bytes",
				d.msg.ProjectionName, len(d.headers[dlq.HeaderProjection]), len(d.msg.Error))
		}
	}
	cut := strings.Repeat("y", 225) + "…[truncated 599775 bytes]" // dlq.CapLabel's
	for _, name := range append(names[:len(names)-1:len(names)-1], cut, "artist_ratings") {
		if !got[name] {
			t.Errorf("no dead letter names projection %.20q…%q (got %d names)", name, name[max(0, len(name)-30):], len(got))
		}
	}
	byProjection := metrictest.SumBy(t, reader, "causet.projection.dead_lettered", "projection")
	if want := map[string]int64{projection.OtherProjections: int64(len(names)), "artist_ratings": 1}; !maps.Equal(byProjection, want) {
		t.Errorf("causet.projection.dead_lettered by projection = %v, want %v", byProjection, want)
	}
}

// TestWorkerReadsUnreadableReplayHeadersAsAFirstFailure: a replay count
// that is not a decimal from 1 to dlq.MaxReplayCount (negative, zero,
// beyond int64, with a sign or a leading zero) is read as no replay, as
// docs/events.md says; the event is dead-lettered with replay count 0
// and its partition goes on. Given twice, a header's last value counts.
// Before, a negative count (or one that overflowed on replay) made a dead
// letter that NewRecord refused, and the partition waited forever
// (new-user trial).
func TestWorkerReadsUnreadableReplayHeadersAsAFirstFailure(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil)
	start := time.Now().UnixMilli()
	counts := [][]string{{"-1"}, {"0"}, {"+2"}, {"007"}, {"abc"}, {"99999999999999999999999"}, {"1000001"}, {"3", "-1"}}
	for i, cs := range counts {
		user := fmt.Sprintf("user-%d", i)
		var hs []kgo.RecordHeader
		for _, c := range cs {
			hs = append(hs, kgo.RecordHeader{Key: dlq.HeaderReplayCountOut, Value: []byte(c)})
		}
		hs = append(hs, kgo.RecordHeader{Key: dlq.HeaderReplayFirstFailedAt, Value: []byte("-5")})
		// No stars: refused by the planner (a permanent error), dead-lettered at once.
		r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a"}`, user))), hs...)
		r.produce(user, []byte(r.follow(user, "artist-1", 2))) // after it, on its partition
	}
	// The projection header twice: the last one counts.
	r.produce("user-x", []byte(r.follow("user-x", "artist-1", 1)),
		kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte("user_follows")},
		kgo.RecordHeader{Key: dlq.HeaderReplayProjection, Value: []byte("artist_followers")})
	r.waitCommitted(testTimeout)
	if a, u := r.count("artist_followers"), r.count("user_follows"); a != len(counts)+1 || u != len(counts) {
		t.Errorf("rows artist_followers=%d user_follows=%d, want %d and %d", a, u, len(counts)+1, len(counts))
	}
	dls := r.deadLetters()
	if len(dls) != len(counts) {
		t.Fatalf("dead letters = %d, want %d", len(dls), len(counts))
	}
	for _, d := range dls {
		if got := d.headers[dlq.HeaderReplayCount]; got != "0" || d.msg.FirstFailedAt < start {
			t.Errorf("%s: replay-count %q, firstFailedAt %d, want 0 and a first failure in this test (from %d)",
				deadLetterUser(t, d), got, d.msg.FirstFailedAt, start)
		}
	}
}

// TestWorkerDatabaseOutagePausesWithoutDeadLetters stops PostgreSQL while
// events arrive: by default nothing is dead-lettered, the worker reports
// not-ready, and every event is applied once the database is back.
func TestWorkerDatabaseOutagePausesWithoutDeadLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.StartOwn(t)
	r := newRig(t, rigOptions{db: db})
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	rn := r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	r.produce("user-0", []byte(r.follow("user-0", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	if err := db.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	deadline := time.Now().Add(testTimeout)
	for rn.w.Ready() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := rn.w.Ready(); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Errorf("Ready() during the outage = %v, want a paused error", err)
	}
	time.Sleep(500 * time.Millisecond) // well past 5 retries of fastRetry
	if got := r.committed(); got != 1 {
		t.Errorf("committed offset during the outage = %d, want 1", got)
	}
	// One line in full per answer of the database (a refused connection,
	// 57P01 as it shut down), the other attempts folded
	// (--failure-log-interval, 1 min), not a line per attempt.
	perAnswer := map[string]int{}
	for _, rec := range logs.records("database unavailable, waiting") {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "fingerprint" {
				perAnswer[a.Value.String()]++
			}
			return true
		})
	}
	for fp, n := range perAnswer {
		if n != 1 {
			t.Errorf("%d lines 'database unavailable, waiting' of fingerprint %s in the outage's first interval, want 1", n, fp)
		}
	}
	if len(perAnswer) == 0 {
		t.Error("no line 'database unavailable, waiting' during the outage")
	}
	if err := db.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.waitAppliedWithoutDeadLetters(rn, 4)
}

// TestWorkerOutageCountsNoRolledBackTransactions: attempts that cannot
// begin a transaction (the database down) are not batch transactions:
// causet_projection_batch_size and _duration count none rolled back, only
// the one committed after the outage (metrics trial: 67 "rolled_back"
// during a 40 s outage in which no transaction began).
func TestWorkerOutageCountsNoRolledBackTransactions(t *testing.T) {
	t.Parallel()
	db := pgtest.StartOwn(t)
	r := newRig(t, rigOptions{db: db})
	metrics, reader := testMetrics(t)
	rn := r.start(func(c *projection.Config) { c.Metrics = metrics })
	if err := db.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	deadline := time.Now().Add(testTimeout)
	for rn.w.Ready() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // several attempts to begin
	if err := db.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.waitAppliedWithoutDeadLetters(rn, 3)
	batches := metrictest.SumBy(t, reader, "causet.projection.batch.size", "outcome")
	if batches["rolled_back"] != 0 || batches["committed"] == 0 {
		t.Errorf("batch transactions %v; want none rolled back (none began during the outage), and the committed ones", batches)
	}
}

// TestWorkerTenantsNotMigratedShareOneFingerprint: the dead letters of
// tenants never migrated (PostgreSQL's relation "<tenant>.<table>" does not
// exist) share one fingerprint per projection, whatever the tenant, so one
// breaker opens for them (pathological-stream trial: 100 tenants made 200
// fingerprints and 200 breakers, each after a full retry schedule).
func TestWorkerTenantsNotMigratedShareOneFingerprint(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil)
	for i := range 4 {
		tenant := fmt.Sprintf("gone_%d_%d", i, time.Now().UnixNano()%1e9) // never migrated
		user := fmt.Sprintf("user-%d", i)
		v := strings.Replace(r.follow(user, "artist-1", 1), `"tenantSchema":"`+r.tenant+`"`, `"tenantSchema":"`+tenant+`"`, 1)
		r.produce(user, []byte(v))
	}
	r.waitCommitted(testTimeout)
	byProjection := map[string]map[string]bool{} // projection → fingerprints
	tenants := map[string]bool{}
	for _, d := range r.deadLetters() {
		p := d.headers["causet.dlq.projection"]
		if byProjection[p] == nil {
			byProjection[p] = map[string]bool{}
		}
		byProjection[p][d.headers["causet.dlq.fingerprint"]] = true
		tenants[d.headers["causet.dlq.tenant-schema"]] = true
	}
	if len(tenants) != 4 || len(byProjection) == 0 {
		t.Fatalf("dead letters of tenants %v, projections %v; want the 4 tenants' dead letters", tenants, byProjection)
	}
	for p, fps := range byProjection {
		if len(fps) != 1 {
			t.Errorf("projection %s: %d fingerprints for 4 tenants not migrated, want 1: %v", p, len(fps), fps)
		}
	}
}

// TestWorkerServesTheLagOfPartitionsItHasNotRead: every assigned partition
// has a consumer-lag series once the broker's end offsets are read, also
// one that has taken no record yet: its records are counted from the
// group's committed offset, or the log start without one (metrics trial:
// with small fetch caps and the database down, the worker stopped polling
// with 2 of 8 partitions fetched, the others had no series, and the lag
// alert summed a quarter of the backlog). Here the broker leaves one
// partition out of every fetch, as a worker that stopped polling never
// gets its records.
func TestWorkerServesTheLagOfPartitionsItHasNotRead(t *testing.T) {
	t.Parallel()
	restore := projection.SetHighWatermarkEvery(100 * time.Millisecond)
	defer restore()
	const partitions, perPartition, unread = 4, 50, int32(3)
	r := newRig(t, rigOptions{fake: true, partitions: partitions})
	metrics, reader := testMetrics(t)
	prod := r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	var recs []*kgo.Record
	for p := range int32(partitions) {
		for i := range perPartition {
			user := fmt.Sprintf("user-%d-%d", p, i)
			recs = append(recs, &kgo.Record{Partition: p, Key: []byte(user), Value: []byte(r.follow(user, "artist-1", 1))})
		}
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r.produced += int64(len(recs))
	r.broker.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r.broker.Fake.KeepControl()
		for i := range req.(*kmsg.FetchRequest).Topics {
			ft := &req.(*kmsg.FetchRequest).Topics[i]
			ft.Partitions = slices.DeleteFunc(ft.Partitions, func(p kmsg.FetchRequestTopicPartition) bool { return p.Partition == unread })
		}
		return nil, nil, false // served without it
	})
	r.start(func(c *projection.Config) { c.Metrics = metrics })
	want := map[string]int64{"0": 0, "1": 0, "2": 0, "3": perPartition}
	var lag map[string]int64
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		if lag = metrictest.SumBy(t, reader, "causet.projection.consumer.lag", "partition"); maps.Equal(lag, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("consumer lag by partition %v, want %v", lag, want)
}

// TestWorkerSaysWhenItStartsShuttingDown: a shutdown is logged when it
// starts, with its grace, not only by what fails at its end (new-user
// trial: nothing for 25 s after a SIGTERM during a group join).
func TestWorkerSaysWhenItStartsShuttingDown(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	rn := r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	r.produce("user-0", []byte(r.follow("user-0", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	if err := rn.stop(t); err != nil {
		t.Fatal(err)
	}
	recs := logs.records("shutting down: finishing the partitions' batches, committing and leaving the group")
	if len(recs) != 1 {
		t.Fatalf("%d shutdown lines, want 1", len(recs))
	}
	var grace time.Duration
	recs[0].Attrs(func(a slog.Attr) bool {
		if a.Key == "grace" {
			grace = a.Value.Duration()
		}
		return true
	})
	if grace <= 0 {
		t.Errorf("shutdown line without its grace: %v", recs[0])
	}
}

// TestWorkerTransactionConflictIsNotReportedAsAnOutage: a deadlock
// (40P01) makes the partition wait and apply the pair again, as any
// infrastructure error does, but its lines and Ready say "transaction
// conflict", not "database unavailable": the database answered (new-user
// trial: partitions deadlocking on one row were reported as an outage).
// A trigger raises 40P01 while a flag row exists.
func TestWorkerTransactionConflictIsNotReportedAsAnOutage(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	flag := pgx.Identifier{r.tenant, "conflict_flag"}.Sanitize()
	fn := pgx.Identifier{r.tenant, "raise_conflict"}.Sanitize()
	exec(t, r.pool, "CREATE TABLE "+flag+" (on_ boolean)")
	exec(t, r.pool, "INSERT INTO "+flag+" VALUES (true)")
	exec(t, r.pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF EXISTS (SELECT FROM "+flag+
		") THEN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END IF; RETURN NEW; END $$")
	exec(t, r.pool, "CREATE TRIGGER raise_conflict BEFORE INSERT OR UPDATE ON "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+
		" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	rn := r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	r.produce("user-0", []byte(r.follow("user-0", "artist-1", 1)))
	paused := func() bool { err := rn.w.Ready(); return err != nil && strings.Contains(err.Error(), "paused") }
	for deadline := time.Now().Add(testTimeout); !paused() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := rn.w.Ready(); err == nil || !strings.Contains(err.Error(), "paused: transaction conflict: ") || !strings.Contains(err.Error(), "40P01") {
		t.Errorf("Ready() during the conflict = %v, want `partitions [..] paused: transaction conflict: ...40P01...`", err)
	}
	for deadline := time.Now().Add(testTimeout); len(logs.records("transaction conflict, applying again")) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	exec(t, r.pool, "DELETE FROM "+flag)
	r.waitAppliedWithoutDeadLetters(rn, 1)
	for msg, want := range map[string]bool{
		"transaction conflict, applying again":         true,
		"transaction conflict: partition paused":       true,
		"transaction conflict over: partition resumed": true,
		"database unavailable, waiting":                false,
		"database unavailable: partition paused":       false,
		"database available again: partition resumed":  false,
	} {
		if got := len(logs.records(msg)) > 0; got != want {
			t.Errorf("a line %q: %v, want %v", msg, got, want)
		}
	}
}

// TestWorkerReadOnlyDatabaseResumesOnNewConnections: while the database
// answers read-only (25006: here its default_transaction_read_only, which
// holds for a session from its start) the partition waits; once it is
// writable, the worker resumes, although the connections it opened in
// between are read-only for good: it closes them at each read-only answer
// (ops trial: paused for over 10 minutes after the database was writable
// again, until its sessions were terminated by hand).
func TestWorkerReadOnlyDatabaseResumesOnNewConnections(t *testing.T) {
	t.Parallel()
	db := pgtest.StartOwn(t)
	r := newRig(t, rigOptions{db: db})
	rn := r.start(nil)
	r.produce("user-0", []byte(r.follow("user-0", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	// From a connection of its own, so that no session of the pool
	// outlives the change.
	admin, err := pgx.Connect(context.Background(), db.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	name := pgx.Identifier{admin.Config().Database}.Sanitize()
	for _, sql := range []string{"ALTER DATABASE " + name + " SET default_transaction_read_only = on",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"} {
		if _, err := admin.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		r.produce(fmt.Sprintf("user-%d", i), []byte(r.follow(fmt.Sprintf("user-%d", i), "artist-1", 1)))
	}
	// Ready says why: the database's last answer, 25006 once the
	// terminated sessions' 57P01 is past (SRE trial: "paused: database
	// unavailable" alone during a read-only outage).
	var paused error
	waitFor(t, "the partition to wait for a writable database, Ready naming the read-only answer (25006)", func() bool {
		paused = rn.w.Ready()
		return paused != nil && strings.Contains(paused.Error(), "paused") && retry.SQLState(paused) == "25006" &&
			strings.Contains(paused.Error(), "read-only transaction")
	})
	t.Logf("Ready() while the database is read-only: %v", paused)
	time.Sleep(300 * time.Millisecond) // attempts on read-only connections
	if _, err := admin.Exec(context.Background(), "ALTER DATABASE "+name+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	r.waitAppliedWithoutDeadLetters(rn, 4)
}

// waitAppliedWithoutDeadLetters waits until every record is committed,
// then checks that artist_followers has rows rows, that nothing was
// dead-lettered (the database was unavailable, not refusing) and that rn
// is ready.
func (r *rig) waitAppliedWithoutDeadLetters(rn *running, rows int) {
	t := r.t
	t.Helper()
	r.waitCommitted(testTimeout)
	if n := r.count("artist_followers"); n != rows {
		t.Errorf("rows = %d, want %d", n, rows)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters = %d, want 0 while the database was unavailable", len(dls))
	}
	if err := rn.w.Ready(); err != nil {
		t.Errorf("Ready() once the database is available = %v", err)
	}
}

func TestWorkerDatabaseOutageDeadLettersWithOnInfraErrorDLQ(t *testing.T) {
	t.Parallel()
	db := pgtest.StartOwn(t)
	r := newRig(t, rigOptions{db: db})
	if err := db.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.start(func(c *projection.Config) { c.OnInfraError = projection.InfraDeadLetter })
	before := time.Now().UnixMilli()
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 2 {
		t.Fatalf("dead letters = %d, want 2 (both projections of ARTIST_FOLLOWED)", len(dls))
	}
	for _, d := range dls {
		checkDeadLetter(t, d, r.tenant, d.msg.ProjectionName, retry.Infrastructure, "", 5, before, time.Now().UnixMilli())
	}
}

// TestWorkerDeadLetterProduceFailureKeepsOffset fails every produce to the
// dead-letter topic for a while: the poison record's offset must not be
// committed, and once produce works again it is dead-lettered exactly once.
func TestWorkerDeadLetterProduceFailureKeepsOffset(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{fake: true})
	var failing atomic.Bool
	failing.Store(true)
	refused := r.broker.RefuseProduce(t, r.dlqTopic, kerr.TopicAuthorizationFailed.Code, func(int64) bool { return failing.Load() })
	rn := r.start(nil)
	r.produce("good-1", []byte(r.follow("good-1", "artist-1", 1)))
	r.produce("poison", []byte("not json"))
	r.produce("good-2", []byte(r.follow("good-2", "artist-1", 1)))
	deadline := time.Now().Add(testTimeout)
	for refused.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if refused.Load() < 3 {
		t.Fatalf("dead-letter produce attempts = %d, want >= 3", refused.Load())
	}
	time.Sleep(300 * time.Millisecond) // give a wrong commit time to happen
	if got := r.committed(); got > 1 {
		t.Fatalf("committed offset %d while the dead letter of offset 1 was not acknowledged", got)
	}
	// Not a silent stall: once the writer gives up a round of attempts, the
	// worker reports the partition stuck.
	for time.Now().Before(deadline) && !strings.Contains(fmt.Sprint(rn.w.Ready()), "stuck") {
		time.Sleep(20 * time.Millisecond)
	}
	if err := rn.w.Ready(); err == nil || !strings.Contains(err.Error(), "partition 0 stuck") {
		t.Errorf("Ready() while the dead-letter topic refuses writes = %v, want partition 0 stuck", err)
	}
	failing.Store(false)
	r.waitCommitted(testTimeout)
	if dls := r.deadLetters(); len(dls) != 1 {
		t.Errorf("dead letters = %d, want exactly 1", len(dls))
	}
	if n := r.count("artist_followers"); n != 2 {
		t.Errorf("rows = %d, want 2", n)
	}
}

// TestWorkerStuckDeadLetterSaysWhyOnceAMinute: a dead-letter topic that
// refuses a dead letter as too large (its max.message.bytes lowered after
// the start) gets one ERROR line naming that limit, then one a minute, not
// one per try (pathological-stream trial: a line every 6 s per stuck
// partition without end, and a fix that said only "refuses writes").
func TestWorkerStuckDeadLetterSaysWhyOnceAMinute(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{fake: true})
	var failing atomic.Bool
	failing.Store(true)
	refused := r.broker.RefuseProduce(t, r.dlqTopic, kerr.MessageTooLarge.Code, func(int64) bool { return failing.Load() })
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) { c.Logger = slog.New(logs) })
	r.produce("poison", []byte("not json"))
	deadline := time.Now().Add(testTimeout)
	const msg = "dead letter not written; the partition waits and tries again"
	for (refused.Load() < 15 || len(logs.records(msg)) == 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	failing.Store(false)
	r.waitCommitted(testTimeout)
	recs := logs.records(msg)
	if refused.Load() < 15 || len(recs) != 1 {
		t.Fatalf("%d ERROR lines %q over %d refused writes, want 1 (folded): %s", len(recs), msg, refused.Load(), logs.describe(msg))
	}
	var fix string
	recs[0].Attrs(func(a slog.Attr) bool {
		if a.Key == "fix" {
			fix = a.Value.String()
		}
		return true
	})
	if !strings.Contains(fix, "max.message.bytes is below this dead letter") {
		t.Errorf("fix %q, want it to name the topic's max.message.bytes", fix)
	}
}

// panicky is a Go projection that panics: a projection error, retried and
// dead-lettered with the panic's stack.
type panicky struct{}

func (panicky) Name() string          { return "panicky" }
func (panicky) Handles(t string) bool { return t == "ARTIST_FOLLOWED" }
func (panicky) Apply(context.Context, projection.DB, *projection.Event) (projection.Outcome, error) {
	panic("boom")
}

func TestWorkerHandlerPanicIsDeadLetteredWithStack(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start(nil, append([]projection.Handler{panicky{}}, r.handlers...)...)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	d := dls[0]
	if d.msg.ProjectionName != "panicky" || d.msg.RetryCount != 5 || !strings.Contains(d.msg.Error, "boom") || !strings.Contains(d.msg.StackTrace, "panicky.Apply") {
		t.Errorf("dead letter = %+v", d.msg)
	}
	if n := r.count("artist_followers"); n != 1 {
		t.Errorf("artist_followers rows = %d, want 1", n)
	}
}

// TestWorkerBatchIsolatesFailingPairs produces whole batches before the
// worker starts, so that they are applied in one transaction, and checks
// that exactly the failing pairs are dead-lettered and every other row is
// applied once.
func TestWorkerBatchIsolatesFailingPairs(t *testing.T) {
	t.Parallel()
	// A row-level failure that only PostgreSQL sees: stars beyond the
	// table's CHECK constraint (23514, retried).
	const good, dbPoison, planPoison = "good", "db-poison", "plan-poison"
	tests := []struct {
		name   string
		events []string
	}{
		{"poison first", []string{dbPoison, good, good, good, good}},
		{"poison in the middle", []string{good, good, dbPoison, good, good}},
		{"poison last", []string{good, good, good, good, dbPoison}},
		{"two poison pairs", []string{good, dbPoison, good, dbPoison, good}},
		{"plan-time and database poison", []string{planPoison, good, dbPoison, good, planPoison, good}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{})
			exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range CHECK (stars BETWEEN 0 AND 10)")
			wantRows, wantDead := 0, 0
			for i, kind := range tt.events {
				user := fmt.Sprintf("user-%d", i)
				switch kind {
				case good:
					r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, i))))
					wantRows++
				case dbPoison:
					r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":99}`, user))))
					wantDead++
				case planPoison:
					r.produce(user, []byte(r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":"many"}`, user))))
					wantDead++
				}
			}
			r.start(nil)
			r.waitCommitted(testTimeout)
			if n := r.count("artist_ratings"); n != wantRows {
				t.Errorf("rows = %d, want %d", n, wantRows)
			}
			dls := r.deadLetters()
			if len(dls) != wantDead {
				t.Fatalf("dead letters = %d, want %d", len(dls), wantDead)
			}
			for _, d := range dls {
				var ev struct {
					Payload struct {
						Stars any `json:"stars"`
					} `json:"payload"`
				}
				if err := json.Unmarshal(d.msg.OriginalEvent, &ev); err != nil {
					t.Fatal(err)
				}
				if ev.Payload.Stars != 99.0 && ev.Payload.Stars != "many" {
					t.Errorf("a good event was dead-lettered: %s", d.msg.OriginalEvent)
				}
			}
		})
	}
}

func TestWorkerBatchRepeatedKeyLastSequenceWins(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	for _, seq := range []int64{3, 7, 5, 7, 1} {
		r.produce("user-1", []byte(r.event("ARTIST_RATED", "user-1", seq, fmt.Sprintf(`{"user_id":"user-1","artist_id":"a","stars":%d}`, seq))))
	}
	r.start(nil)
	r.waitCommitted(testTimeout)
	var stars, seq int64
	q := "SELECT stars, _causet_seq FROM " + pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()
	if err := r.pool.QueryRow(context.Background(), q).Scan(&stars, &seq); err != nil {
		t.Fatal(err)
	}
	if stars != 7 || seq != 7 {
		t.Errorf("row (stars, seq) = (%d, %d), want (7, 7)", stars, seq)
	}
}

func TestWorkerBatchSpanningTwoTenantsOneWithoutTable(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	other := pgtest.NewSchemaName(t)
	exec(t, r.pool, "CREATE SCHEMA "+pgx.Identifier{other}.Sanitize())
	t.Cleanup(func() {
		_, _ = r.pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{other}.Sanitize()+" CASCADE")
	})
	for i := range 6 {
		user := fmt.Sprintf("user-%d", i)
		v := r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":1}`, user))
		if i%2 == 1 {
			v = strings.Replace(v, r.tenant, other, 1)
		}
		r.produce(user, []byte(v))
	}
	r.start(nil)
	r.waitCommitted(testTimeout)
	if n := r.count("artist_ratings"); n != 3 {
		t.Errorf("rows in the migrated tenant = %d, want 3", n)
	}
	dls := r.deadLetters()
	if len(dls) != 3 {
		t.Fatalf("dead letters = %d, want 3", len(dls))
	}
	for _, d := range dls {
		if d.msg.TenantSchema != other || d.headers[dlq.HeaderSQLState] != "42P01" {
			t.Errorf("dead letter tenant %q sqlstate %q, want %q 42P01", d.msg.TenantSchema, d.headers[dlq.HeaderSQLState], other)
		}
	}
}

// TestWorkerShutdownCancelsBackoffWithoutDeadLetter stops the worker while a
// failing pair waits between retries: Run returns at once, nothing is
// dead-lettered, and the record's offset stays uncommitted for the next
// owner.
func TestWorkerShutdownCancelsBackoffWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	rn := r.start(func(c *projection.Config) {
		c.Retry = retry.Policy{Initial: time.Minute, Multiplier: 2, MaxInterval: time.Minute, MaxRetries: 5}
	})
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	r.produce("user-2", []byte(r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"a","stars":3}`)))
	deadline := time.Now().Add(testTimeout)
	for r.count("artist_followers") == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the rating's pair is now in its first one-minute wait
	start := time.Now()
	if err := rn.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("shutdown took %s while a retry waited; want the wait cancelled at once", took)
	}
	if got := r.committed(); got != 1 {
		t.Errorf("committed offset = %d, want 1 (the follow done, the rating not)", got)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters = %d, want 0: a cancelled retry is not a failure", len(dls))
	}
}

// TestWorkerRebalanceLosesNothing runs two workers of one group over four
// partitions while events arrive, stops one of them half way, and checks that
// every event is applied and none is dead-lettered.
func TestWorkerRebalanceLosesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 4})
	a := r.start(nil)
	const n = 200
	for i := range n {
		if i == n/4 {
			r.start(nil) // second member joins: cooperative rebalance
		}
		if i == n/2 {
			if err := a.stop(t); err != nil { // first member leaves: its partitions move
				t.Errorf("first worker Run = %v", err)
			}
		}
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.follow(user, "artist-1", 1)))
	}
	r.waitCommitted(testTimeout)
	if got := r.count("artist_followers"); got != n {
		t.Errorf("rows = %d, want %d", got, n)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters = %d, want 0", len(dls))
	}
}

// TestWorkerBatchPrepareFailureBlamesItsOwnPairs: a statement that fails to
// prepare (42703, a column the tenant lacks) fails before any statement of
// the batch runs; only the pairs of that statement may be dead-lettered.
func TestWorkerBatchPrepareFailureBlamesItsOwnPairs(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DROP COLUMN stars")
	for i := range 4 {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.follow(user, "artist-1", 1)))
		r.produce(user, []byte(r.event("ARTIST_RATED", user, 2, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":3}`, user))))
	}
	r.start(nil)
	r.waitCommitted(testTimeout)
	if a, u := r.count("artist_followers"), r.count("user_follows"); a != 4 || u != 4 {
		t.Errorf("rows artist_followers=%d user_follows=%d, want 4 and 4", a, u)
	}
	dls := r.deadLetters()
	if len(dls) != 4 {
		t.Fatalf("dead letters = %d, want 4 (the ratings)", len(dls))
	}
	for _, d := range dls {
		if d.msg.ProjectionName != "artist_ratings" || d.headers[dlq.HeaderSQLState] != "42703" {
			t.Errorf("dead letter projection %q sqlstate %q, want artist_ratings 42703", d.msg.ProjectionName, d.headers[dlq.HeaderSQLState])
		}
	}
}

// refusingWriter fails its first n writes with an error the dlq.Writer
// does not retry (as for a dead letter too large for the topic), then
// writes through.
type refusingWriter struct {
	projection.DeadLetterWriter
	n atomic.Int64
}

func (w *refusingWriter) Write(ctx context.Context, dl dlq.DeadLetter) error {
	if w.n.Add(-1) >= 0 {
		return dlq.ErrTooLarge
	}
	return w.DeadLetterWriter.Write(ctx, dl)
}

// WriteBatch refuses every dead letter while Write would, so that they all
// take the one-by-one path.
func (w *refusingWriter) WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error {
	if w.n.Load() > 0 {
		errs := make([]error, len(dls))
		for i := range errs {
			errs[i] = dlq.ErrTooLarge
		}
		return errs
	}
	return w.DeadLetterWriter.WriteBatch(ctx, dls)
}

// startRefusing runs a worker whose dead-letter writer refuses every write
// until the test sets refusing.n to 0.
func (r *rig) startRefusing() (w *projection.Worker, refusing *refusingWriter) {
	w = r.startWrapped(func(real projection.DeadLetterWriter) projection.DeadLetterWriter {
		refusing = &refusingWriter{DeadLetterWriter: real}
		refusing.n.Store(1 << 40)
		return refusing
	})
	return w, refusing
}

// startWrapped runs a worker whose dead letters go through wrap's writer,
// wrapping the rig's real one.
func (r *rig) startWrapped(wrap func(projection.DeadLetterWriter) projection.DeadLetterWriter) *projection.Worker {
	t := r.t
	t.Helper()
	prod := r.broker.Client(t, kgo.ProducerLinger(0))
	real, err := dlq.NewWriter(prod, dlq.WriterConfig{RecordConfig: dlq.RecordConfig{Topic: r.dlqTopic, Worker: "test-worker", Generation: "test/v42"}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := projection.NewWorker(projection.Config{
		Topic: r.topic, Group: r.group, Retry: fastRetry, CommitInterval: 100 * time.Millisecond,
		InfraRetry: retry.Policy{Initial: 50 * time.Millisecond, Multiplier: 1, MaxInterval: 50 * time.Millisecond},
	}, r.handlers, r.pool, wrap(real), r.broker.Opts()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// gatedWriter holds every dead-letter write until open is closed.
type gatedWriter struct {
	projection.DeadLetterWriter
	open chan struct{}
}

func (w *gatedWriter) Write(ctx context.Context, dl dlq.DeadLetter) error {
	<-w.open
	return w.DeadLetterWriter.Write(ctx, dl)
}

func (w *gatedWriter) WriteBatch(ctx context.Context, dls []dlq.DeadLetter) []error {
	<-w.open
	return w.DeadLetterWriter.WriteBatch(ctx, dls)
}

// TestWorkerGoesOnWhileADeadLetterIsBeingWritten: the partition applies the
// records after a dead-lettered one while Kafka has not acknowledged the
// dead letter, and the committed offset stays at that record until it has.
func TestWorkerGoesOnWhileADeadLetterIsBeingWritten(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	gate := &gatedWriter{open: make(chan struct{})}
	r.startWrapped(func(real projection.DeadLetterWriter) projection.DeadLetterWriter {
		gate.DeadLetterWriter = real
		return gate
	})
	r.produce("poison", []byte("not json"))
	const n = 20
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.follow(user, "artist-1", 1)))
	}
	waitFor(t, "the records after the dead-lettered one to be applied", func() bool { return r.count("artist_followers") == n })
	time.Sleep(300 * time.Millisecond) // a wrong commit past the unacknowledged dead letter would happen now
	if got := r.committed(); got > 0 {
		t.Errorf("committed offset = %d before the dead letter of offset 0 was acknowledged, want at most 0", got)
	}
	close(gate.open)
	r.waitCommitted(testTimeout)
	if dls := r.deadLetters(); len(dls) != 1 {
		t.Errorf("dead letters = %d, want 1", len(dls))
	}
}

// TestWorkerDeadLetterThatCannotBeWrittenHoldsThePartitionVisibly: a dead
// letter the writer cannot write (not a produce failure it retries) once
// ended the partition's goroutine silently, stalling it with /readyz still
// ready. Now the record is never skipped, the worker reports not-ready
// naming the partition, and the write is tried again.
func TestWorkerDeadLetterThatCannotBeWrittenHoldsThePartitionVisibly(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	w, refusing := r.startRefusing()
	r.produce("poison", []byte("not json"))
	r.produce("good", []byte(r.follow("good", "artist-1", 1)))
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		if err := w.Ready(); err != nil && strings.Contains(err.Error(), "stuck") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "partition 0 stuck") {
		t.Fatalf("Ready() = %v, want partition 0 stuck", err)
	}
	if got := r.committed(); got > 0 {
		t.Errorf("committed offset %d past the record whose dead letter was not written", got)
	}
	refusing.n.Store(0) // the operator fixed the topic
	r.waitCommitted(testTimeout)
	if dls := r.deadLetters(); len(dls) != 1 {
		t.Errorf("dead letters = %d, want 1", len(dls))
	}
	if err := w.Ready(); err != nil {
		t.Errorf("Ready() after the fix = %v", err)
	}
}

// TestWorkerBatchWithDeletesKeepsOrder: upserts of a key that the same batch
// deletes must not be folded into a COPY group; applied in order, the newest
// event decides.
func TestWorkerBatchWithDeletesKeepsOrder(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	follow := func(user string, seq int64) []byte {
		return []byte(r.event("ARTIST_FOLLOWED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a"}`, user)))
	}
	unfollow := func(user string, seq int64) []byte {
		return []byte(r.event("ARTIST_UNFOLLOWED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a"}`, user)))
	}
	r.produce("back", follow("back", 1))
	r.produce("back", unfollow("back", 2))
	r.produce("back", follow("back", 3)) // followed again: the row exists
	r.produce("gone", follow("gone", 1))
	r.produce("gone", unfollow("gone", 2)) // unfollowed last: no row
	r.produce("gone", follow("gone", 1))   // a late re-delivery: stays gone
	r.produce("kept", follow("kept", 1))
	r.start(nil)
	r.waitCommitted(testTimeout)
	var users []string
	rows, err := r.pool.Query(context.Background(), "SELECT user_id FROM "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+" ORDER BY user_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	if diff := cmp.Diff([]string{"back", "kept"}, users); diff != "" {
		t.Errorf("followers (-want +got):\n%s", diff)
	}
}

// TestWorkerRefusesTenantOutsideThePattern: with Config.TenantSchemas (the
// operator's --tenant-schema-pattern), an event for a valid tenant schema
// that does not match is dead-lettered at once as permanent, naming
// tenantSchema and the pattern; a matching one is applied.
func TestWorkerRefusesTenantOutsideThePattern(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	tenants, err := projection.NewTenantSchemas(regexp.QuoteMeta(r.tenant))
	if err != nil {
		t.Fatal(err)
	}
	r.start(func(c *projection.Config) { c.TenantSchemas = tenants })
	r.produce("u", []byte(strings.Replace(r.follow("u", "a", 1), r.tenant, "other_tenant", 1)))
	r.produce("good", []byte(r.follow("good", "a", 1)))
	r.waitCommitted(testTimeout)
	if n := r.count("artist_followers"); n != 1 {
		t.Errorf("artist_followers rows = %d, want 1 (the matching event)", n)
	}
	dls := r.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	d := dls[0]
	if d.msg.RetryCount != 0 || d.headers[dlq.HeaderErrorClass] != "permanent" || d.msg.TenantSchema != "other_tenant" {
		t.Errorf("dead letter = retries %d class %q tenant %q, want 0, permanent, other_tenant", d.msg.RetryCount, d.headers[dlq.HeaderErrorClass], d.msg.TenantSchema)
	}
	if want := `invalid event: tenantSchema: must match the tenant schema pattern`; !strings.HasPrefix(d.msg.Error, want) {
		t.Errorf("error %q, want it to start with %q", d.msg.Error, want)
	}
}

// TestWorkerRecordsApplyLatencyOnTheBatchPath: a healthy worker applies
// its pairs in batches (COPY, or pipelined statements under TEST_NO_COPY),
// and each applied pair is in causet.projection.apply.duration (once only
// the one-by-one retry path recorded it: a healthy worker reported no apply
// latency).
func TestWorkerRecordsApplyLatencyOnTheBatchPath(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	metrics, reader := testMetrics(t)
	r.start(func(c *projection.Config) { c.Metrics = metrics })
	const n = 40 // one batch, 40 upserts of each table: COPY by default
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		r.produce(user, []byte(r.follow(user, "artist-1", 1)))
	}
	r.waitCommitted(testTimeout)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					counts[md.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					counts[md.Name] += int64(p.Count)
				}
			}
		}
	}
	applied := counts["causet.projection.applied"]
	if applied != 2*n || counts["causet.projection.apply.duration"] != applied {
		t.Errorf("applied %d pairs (want %d), apply.duration observed %d times (want one per applied pair)",
			applied, 2*n, counts["causet.projection.apply.duration"])
	}
}

// testMetrics returns the worker's metrics on a meter provider of its own,
// read with the returned reader.
func testMetrics(t *testing.T) (*projection.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	metrics, err := projection.NewMetrics(provider.Meter("test"), projection.MetricsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return metrics, reader
}

// TestWorkerOlderUpsertsBesideNewerDeletesOfOneKeyLeaveNoRow: two entities
// on two partitions write the same primary keys, one partition deleting
// them (sequence number 1000) while the other upserts them (500), on the
// batch path (COPY groups and statement batches). No row is left beside
// its newer tombstone, whichever transaction commits last (sweep.go): a
// new-user trial brought back 491 of 500 rows so. Beside them, keys whose
// upserts (1500) are newer than their deletes (1000) keep their rows: the
// sweep deletes only what a tombstone at least as new covers.
func TestWorkerOlderUpsertsBesideNewerDeletesOfOneKeyLeaveNoRow(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 4, brokers: 3})
	prod := r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	const keys = 500
	var recs []*kgo.Record
	add := func(partition int32, typ, entity, user string, seq int64) {
		v := r.event(typ, entity, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a"}`, user))
		recs = append(recs, &kgo.Record{Partition: partition, Key: []byte(entity), Value: []byte(v)})
	}
	for i := range keys {
		gone, kept := fmt.Sprintf("gone-%d", i), fmt.Sprintf("kept-%d", i)
		add(0, "ARTIST_UNFOLLOWED", "deleter", gone, 1000)
		add(1, "ARTIST_FOLLOWED", "follower", gone, 500)
		add(2, "ARTIST_FOLLOWED", "late-follower", kept, 1500)
		add(3, "ARTIST_UNFOLLOWED", "early-deleter", kept, 1000)
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r.produced += int64(len(recs))
	r.start(nil)
	r.waitCommitted(testTimeout)
	for _, table := range []string{"artist_followers", "user_follows"} {
		var gone, kept int
		err := r.pool.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE user_id LIKE 'gone-%'), count(*) FILTER (WHERE user_id LIKE 'kept-%' AND _causet_seq = 1500) FROM "+
			pgx.Identifier{r.tenant, table}.Sanitize()).Scan(&gone, &kept)
		if err != nil {
			t.Fatal(err)
		}
		if gone != 0 || kept != keys {
			t.Errorf("%s: %d of %d rows deleted at 1000 are back from their upsert at 500 (want 0); %d of %d rows upserted at 1500 after a delete at 1000 are there (want all)",
				table, gone, keys, kept, keys)
		}
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
}
