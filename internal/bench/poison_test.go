package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// TestPoisonKinds checks that each poison kind of BenchmarkWorkerThroughput
// is what its scenario claims: the derive is refused by Plan, while the
// 22003, 23502 and 23514 events pass Plan and are refused by PostgreSQL only
// because of benchConstraints (a table without them takes them), and the
// unmigrated tenant's statements fail with 42P01; clean pairs of the same
// datasets apply.
func TestPoisonKinds(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	defs, err := projection.LoadDefinitions(projectionsFile)
	if err != nil {
		t.Fatal(err)
	}
	tps, err := projection.NewTableProjections(defs)
	if err != nil {
		t.Fatal(err)
	}
	strict, loose := pgtest.NewSchemaName(t), pgtest.NewSchemaName(t)
	for _, s := range []string{strict, loose} {
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		})
		if err := projection.Migrate(ctx, pool, defs, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := benchConstraints(ctx, pool, strict); err != nil {
		t.Fatal(err)
	}
	// exec applies st in a transaction it rolls back and returns the
	// SQLSTATE of its error, "" on success.
	exec := func(st projection.Statement) string {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, st.SQL, st.Args...); err != nil {
			if code := retry.SQLState(err); code != "" {
				return code
			}
			t.Fatalf("exec: %v", err)
		}
		return ""
	}
	plan := func(e *event, schema string, proj int) (projection.Statement, error) {
		ev, err := projection.DecodeEvent(appendValue(nil, e, schema))
		if err != nil {
			t.Fatal(err)
		}
		return tps[proj].Plan(ev)
	}

	for _, tt := range []struct {
		name     string
		kind     poisonKind
		sqlstate string // of the poisoned pair in the strict tables; "" refused by Plan
	}{
		{"derive", derivePoison, ""},
		{"22003", rangePoison, "22003"},
		{"23502", nullPoison, "23502"},
		{"23514", checkPoison, "23514"},
		{"23514fn", checkFnPoison, "23514"},
		{"unmigrated", unmigratedPoison, "42P01"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := newDataset(1000, tt.kind)
			poisonedPairs, poisonedEvents := 0, 0
			for i := range d.events {
				e := &d.events[i]
				for j := range tables {
					if e.handles(j) && e.poisonedPair(j) {
						poisonedPairs++
					}
				}
				if e.poison == noPoison {
					continue
				}
				poisonedEvents++
				if poisonedEvents > 3 {
					continue
				}
				schema := strict
				if e.absent {
					schema = pgtest.NewSchemaName(t) // never created
				}
				for j := range tables {
					if !e.handles(j) {
						continue
					}
					st, err := plan(e, schema, j)
					switch {
					case !e.poisonedPair(j):
						if err != nil {
							t.Fatalf("event %d, %s: Plan: %v", i, tableNames[j], err)
						}
						if code := exec(st); code != "" {
							t.Errorf("event %d, %s (not poisoned): SQLSTATE %s", i, tableNames[j], code)
						}
					case tt.sqlstate == "":
						if !retry.IsPermanent(err) {
							t.Errorf("event %d, %s: Plan error %v, want a permanent one", i, tableNames[j], err)
						}
					default:
						if err != nil {
							t.Fatalf("event %d, %s: Plan refused what only PostgreSQL should: %v", i, tableNames[j], err)
						}
						if code := exec(st); code != tt.sqlstate {
							t.Errorf("event %d, %s: SQLSTATE %q, want %s", i, tableNames[j], code, tt.sqlstate)
						}
						if e.absent {
							continue
						}
						// Without benchConstraints, the same pair applies.
						st, err := plan(e, loose, j)
						if err != nil {
							t.Fatal(err)
						}
						if code := exec(st); code != "" {
							t.Errorf("event %d, %s: SQLSTATE %s in the tables the definitions make", i, tableNames[j], code)
						}
					}
				}
			}
			if want := len(d.events) / poisonEvery; poisonedEvents != want {
				t.Errorf("%d poisoned events, want %d (1%%)", poisonedEvents, want)
			}
			if poisonedPairs != d.poisoned {
				t.Errorf("%d poisoned pairs, dataset counts %d", poisonedPairs, d.poisoned)
			}
		})
	}
}

// TestScrapeSpans checks that the dropped and sampled spans are read from
// the series the worker's /metrics serves with OTLP on.
func TestScrapeSpans(t *testing.T) {
	const metrics = `# TYPE otel_sdk_processor_span_queue_capacity gauge
otel_sdk_processor_span_queue_capacity{otel_component_name="batching_span_processor/0"} 65536
# TYPE otel_sdk_processor_span_processed_total counter
otel_sdk_processor_span_processed_total{otel_component_name="batching_span_processor/0"} 9000
otel_sdk_processor_span_processed_total{error_type="queue_full",otel_component_name="batching_span_processor/0"} 12
# TYPE otel_sdk_span_started_total counter
otel_sdk_span_started_total{otel_span_parent_origin="local",otel_span_sampling_result="DROP"} 19788
otel_sdk_span_started_total{otel_span_parent_origin="local",otel_span_sampling_result="RECORD_AND_SAMPLE"} 212
otel_sdk_span_started_total{otel_span_parent_origin="none",otel_span_sampling_result="RECORD_AND_SAMPLE"} 200
`
	for _, tt := range []struct {
		name string
		body string
		want spanStats
	}{
		{"OTLP on", metrics, spanStats{served: true, dropped: 12, sampled: 412}},
		{"OTLP off", "# TYPE causet_projection_applied_total counter\ncauset_projection_applied_total 5\n", spanStats{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(tt.body)) }))
			defer srv.Close()
			if got := scrapeSpans(srv.Client(), srv.Listener.Addr().String()); got != tt.want {
				t.Errorf("scrapeSpans = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestReadmeNamesEveryScenario checks that the README's Performance table
// has a row for every BENCH_SCENARIOS word: "| `word` |" or "(`word`)".
func TestReadmeNamesEveryScenario(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, perf, ok := strings.Cut(string(b), "\n## Performance\n")
	if !ok {
		t.Fatal("README.md has no Performance section")
	}
	perf, _, _ = strings.Cut(perf, "\n## ")
	for _, w := range scenarioWords {
		if !strings.Contains(perf, "| `"+w+"` |") && !strings.Contains(perf, "(`"+w+"`) |") {
			t.Errorf("README's Performance table has no row for scenario word %q", w)
		}
	}
}
