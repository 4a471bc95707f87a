package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// startBusyWorker runs `projection-worker run` in-process (kfake, a real
// PostgreSQL) on records that exercise every counter: the SPEC example
// (applied), an older sequence number of it (stale), the SPEC example for a
// tenant never migrated (failed, retried, dead-lettered) and a record that is
// not JSON (dead-lettered at once). Retries are fast (5ms..20ms). extra are
// more arguments of run.
func startBusyWorker(t *testing.T, extra ...string) *running {
	t.Helper()
	b := kafkatest.New(t)
	dbURL := pgtest.URL(t)
	pool := pgtest.Pool(t)
	clearSettingsEnv(t) // after the two above, which read KAFKA_BROKERS and DATABASE_URL
	tenant, unmigrated := pgtest.NewSchemaName(t), pgtest.NewSchemaName(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{tenant}.Sanitize()+" CASCADE")
	})
	if r := runCmd(t, time.Minute, "migrate", "--database-url", dbURL, "--projections", exampleProjections, "--tenant-schema", tenant); r.code != 0 {
		t.Fatalf("migrate: %s", r)
	}
	events := kafkatest.TopicName(t, "events")
	b.CreateTopic(t, events, 2, nil)
	args := []string{"--brokers", strings.Join(b.Addrs, ","), "--database-url", dbURL, "--projections", exampleProjections,
		"--topic", events, "--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
		"--group", kafkatest.TopicName(t, "group"), "--shutdown-grace", "10s",
		"--retry-initial", "5ms", "--retry-max-interval", "20ms"}
	w := startRun(t, append(args, extra...)...)
	t.Cleanup(func() { w.shutdown(t) })

	older := strings.Replace(fmt.Sprintf(specExample, tenant), `"sequenceNumber":1891`, `"sequenceNumber":1000`, 1)
	// A row beside a newer tombstone, as an older upsert running beside a
	// newer delete of its key leaves it: an upsert of its key (stale)
	// sweeps it (causet_projection_swept_total).
	for _, sql := range []string{
		"INSERT INTO " + pgx.Identifier{tenant, "artist_followers"}.Sanitize() + " (artist_id, user_id, _causet_seq) VALUES ('artist-swept', 'user-swept', 1)",
		"INSERT INTO " + pgx.Identifier{tenant, "_causet_tombstones"}.Sanitize() + " (table_name, pk, _causet_seq) VALUES ('artist_followers', ARRAY['artist-swept', 'user-swept'], 5)",
	} {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	swept := strings.NewReplacer(`"sequenceNumber":1891`, `"sequenceNumber":1`, `"user-123"`, `"user-swept"`, `"artist-456"`, `"artist-swept"`).Replace(fmt.Sprintf(specExample, tenant))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := []*kgo.Record{
		{Topic: events, Key: []byte("user-123"), Value: []byte(fmt.Sprintf(specExample, tenant))},
		{Topic: events, Key: []byte("user-123"), Value: []byte(older)},
		{Topic: events, Key: []byte("user-123"), Value: []byte(fmt.Sprintf(specExample, unmigrated))},
		{Topic: events, Key: []byte("poison-1"), Value: poison},
		{Topic: events, Key: []byte("user-124"), Value: []byte(strings.Replace(fmt.Sprintf(specExample, tenant), `"ARTIST_FOLLOWED"`, `"NO_SUCH_TYPE"`, 1))},
		{Topic: events, Key: []byte("user-swept"), Value: []byte(swept)},
	}
	if err := b.Client(t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return w
}

// scrapeUntil scrapes r's /metrics until done holds for the parsed
// families or limit passes, and returns the last scrape (the caller's
// checks say what is missing). It fails t when the worker exits or never
// serves /metrics.
func (r *running) scrapeUntil(t *testing.T, limit time.Duration, done func(map[string]*dto.MetricFamily) bool) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	var scrape []byte
	var families map[string]*dto.MetricFamily
	deadline := time.Now().Add(limit)
	r.waitFor(t, "/metrics answers", limit+10*time.Second, func() bool {
		if !strings.Contains(r.get(t, "/healthz"), "200 OK") {
			return false
		}
		scrape, families = scrapeMetrics(t, r.addr)
		return done(families) || time.Now().After(deadline)
	})
	return scrape, families
}

// documentedMetric is a row of the README's metric table.
type documentedMetric struct {
	Type   string
	Labels []string
}

var (
	readmeMetricRow = regexp.MustCompile("^\\| `(causet_[a-z0-9_]+)` \\| (\\w+) \\|([^|]*)\\|")
	backquoted      = regexp.MustCompile("`([^`]+)`")
)

// readmeMetrics returns the rows of the table under "### Metrics" in the
// README, by metric name.
func readmeMetrics(t *testing.T) map[string]documentedMetric {
	t.Helper()
	section, _, _ := strings.Cut(readmeAfter(t, "\n### Metrics\n"), "\n#")
	metrics := map[string]documentedMetric{}
	for _, line := range strings.Split(section, "\n") {
		m := readmeMetricRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		d := documentedMetric{Type: m[2], Labels: []string{}}
		for _, l := range backquoted.FindAllStringSubmatch(m[3], -1) {
			d.Labels = append(d.Labels, l[1])
		}
		slices.Sort(d.Labels)
		metrics[m[1]] = d
	}
	if len(metrics) == 0 {
		t.Fatal("README.md's ### Metrics section has no metric rows")
	}
	return metrics
}

// servedMetric returns the README's view of a served family: its type and
// labels, without the OpenTelemetry scope labels every series has.
func servedMetric(f *dto.MetricFamily) documentedMetric {
	d := documentedMetric{Type: strings.ToLower(f.GetType().String()), Labels: []string{}}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if !strings.HasPrefix(l.GetName(), "otel_scope_") && !slices.Contains(d.Labels, l.GetName()) {
				d.Labels = append(d.Labels, l.GetName())
			}
		}
	}
	slices.Sort(d.Labels)
	return d
}

// TestReadmeMetricTableIsWhatTheWorkerServes (issue 12): the README's
// metric table lists exactly the causet_* metrics a running worker serves
// once it has applied, found stale, retried and dead-lettered records, with
// their Prometheus names (counters end in _total, units are suffixes), types
// and labels.
func TestReadmeMetricTableIsWhatTheWorkerServes(t *testing.T) {
	documented := readmeMetrics(t)
	w := startBusyWorker(t)
	_, families := w.scrapeUntil(t, 60*time.Second, func(fs map[string]*dto.MetricFamily) bool {
		for name := range documented {
			if fs[name] == nil {
				return false
			}
		}
		return true
	})
	served := map[string]documentedMetric{}
	for name, f := range families {
		if strings.HasPrefix(name, "causet_") {
			served[name] = servedMetric(f)
		}
	}
	if diff := cmp.Diff(documented, served); diff != "" {
		t.Errorf("README metric table (-) vs /metrics (+):\n%s", diff)
	}
}
