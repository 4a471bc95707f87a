package projection

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/metrictest"
	"github.com/causet/projection-worker/retry"
)

// TestMetricsBoundTenantSchemas: tenant_schema comes from the events, so
// events for many tenants (issue 14: 300 random tenant names grew /metrics
// from 45 KB to 1.37 MB) must not grow the series without bound: past
// MaxTenantSchemas, pairs are counted under OtherTenantSchemas, and nothing
// is lost from the totals.
func TestMetricsBoundTenantSchemas(t *testing.T) {
	const tenants = 300
	tests := []struct {
		name        string
		max         int // MetricsConfig.MaxTenantSchemas
		wantTenants int // distinct tenant_schema values other than OtherTenantSchemas
		wantOther   bool
	}{
		{name: "default", max: 0, wantTenants: DefaultMaxTenantSchemas, wantOther: true},
		{name: "five", max: 5, wantTenants: 5, wantOther: true},
		{name: "above the tenants seen", max: 1000, wantTenants: tenants},
		{name: "none", max: -1, wantTenants: 0, wantOther: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
			m, err := NewMetrics(provider.Meter("test"), MetricsConfig{MaxTenantSchemas: tt.max})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i := range tenants {
				attrs := pairAttrs("artist_followers", fmt.Sprintf("tenant_%03d", i))
				m.applied(ctx, attrs, Applied)
				m.applied(ctx, attrs, Applied) // a tenant seen again keeps its series
				m.failed(ctx, attrs, retry.Projection)
				m.retried(ctx, attrs)
				m.deadLettered(ctx, attrs, retry.Permanent)
				m.observeApply(ctx, attrs, time.Millisecond)
			}

			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			series := map[string]map[string]int64{} // instrument -> tenant_schema -> count
			for _, sm := range rm.ScopeMetrics {
				for _, md := range sm.Metrics {
					byTenant := map[string]int64{}
					switch d := md.Data.(type) {
					case metricdata.Sum[int64]:
						for _, p := range d.DataPoints {
							v, _ := p.Attributes.Value("tenant_schema")
							byTenant[v.AsString()] += p.Value
						}
					case metricdata.Histogram[float64]:
						for _, p := range d.DataPoints {
							v, _ := p.Attributes.Value("tenant_schema")
							byTenant[v.AsString()] += int64(p.Count)
						}
					}
					if len(byTenant) > 0 && !(len(byTenant) == 1 && byTenant[""] != 0) {
						series[md.Name] = byTenant
					}
				}
			}
			want := map[string]int64{
				"causet.projection.applied":        2 * tenants,
				"causet.projection.failed":         tenants,
				"causet.projection.retried":        tenants,
				"causet.projection.dead_lettered":  tenants,
				"causet.projection.apply.duration": tenants,
			}
			for name, total := range want {
				byTenant, ok := series[name]
				if !ok {
					t.Errorf("%s: no data points with tenant_schema", name)
					continue
				}
				var sum int64
				named := 0
				for tenant, n := range byTenant {
					sum += n
					if tenant != OtherTenantSchemas {
						named++
					}
				}
				if named != tt.wantTenants {
					t.Errorf("%s: %d tenant_schema values besides %q, want %d", name, named, OtherTenantSchemas, tt.wantTenants)
				}
				if _, ok := byTenant[OtherTenantSchemas]; ok != tt.wantOther {
					t.Errorf("%s: tenant_schema %q present = %t, want %t", name, OtherTenantSchemas, ok, tt.wantOther)
				}
				if sum != total {
					t.Errorf("%s: total %d over all tenant_schema values, want %d (nothing lost to the bound)", name, sum, total)
				}
			}
		})
	}
}

// TestCopyAppliedCountsEachPair checks the metrics of a committed COPY
// group, counted at once per group: of its n upserts, the affected rows
// applied and the rest stale, and one apply latency per upsert.
func TestCopyAppliedCountsEachPair(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := NewMetrics(provider.Meter("test"), MetricsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tps := hotProjections(t, hotDefinitions[0].path)
	w := &Worker{cfg: Config{Metrics: m}}
	ctx := context.Background()
	w.copyApplied(ctx, []copyResult{
		{g: newCopyGroup(tps[0], "tenant_a"), n: 5, affected: 3},
		{g: newCopyGroup(tps[1], "tenant_a"), n: 4, affected: 4},
		{g: newCopyGroup(tps[0], "tenant_b"), n: 2, affected: 0},
	}, time.Now())

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{} // instrument/projection/tenant_schema → count
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			add := func(set interface {
				Value(attribute.Key) (attribute.Value, bool)
			}, n int64) {
				p, _ := set.Value("projection")
				ts, ok := set.Value("tenant_schema")
				if ok {
					got[md.Name+"/"+p.AsString()+"/"+ts.AsString()] += n
				}
			}
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(&p.Attributes, p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(&p.Attributes, int64(p.Count))
				}
			}
		}
	}
	a, u := tps[0].Name(), tps[1].Name()
	want := map[string]int64{
		"causet.projection.applied/" + a + "/tenant_a":        3,
		"causet.projection.stale/" + a + "/tenant_a":          2,
		"causet.projection.apply.duration/" + a + "/tenant_a": 5,
		"causet.projection.applied/" + u + "/tenant_a":        4,
		"causet.projection.apply.duration/" + u + "/tenant_a": 4,
		"causet.projection.stale/" + a + "/tenant_b":          2,
		"causet.projection.apply.duration/" + a + "/tenant_b": 2,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// BenchmarkObserveApplyN measures the apply latency of a COPY group of 300
// pairs recorded per pair (observeApplyN): ns/op and allocs/op are per
// group.
//
//	go test ./projection -run '^$' -bench ObserveApplyN -benchmem
func BenchmarkObserveApplyN(b *testing.B) {
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	m, err := NewMetrics(provider.Meter("bench"), MetricsConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	attrs := pairAttrs("artist_followers", "tenant_a")
	b.ReportAllocs()
	for b.Loop() {
		m.observeApplyN(ctx, attrs, 3*time.Millisecond, 300)
	}
}

// TestDeadLettersOfRefusedTenantsTakeNoTenantLabel: a dead letter counts
// under its tenant schema's own label only when the worker accepts the
// name as a tenant schema; the names it refuses (pg_*, public, one outside
// the pattern, one not an identifier) count under "" and leave the
// bounded labels to real tenants (new-user trial: 130 events for pg_x1 ...
// pg_x130 took all 100 labels).
func TestDeadLettersOfRefusedTenantsTakeNoTenantLabel(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := NewMetrics(provider.Meter("test"), MetricsConfig{MaxTenantSchemas: 2})
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := NewTenantSchemas("acme_.*")
	if err != nil {
		t.Fatal(err)
	}
	pc := testPartition(t, Config{Metrics: m, TenantSchemas: tenants})
	ctx := context.Background()
	for _, tenant := range []string{"pg_x1", "public", "other_corp", "Acme", "acme_one", "pg_x2", "acme_two"} {
		pc.w.deadLettered(ctx, dlq.DeadLetter{Source: &kgo.Record{}, Projection: "p", TenantSchema: tenant, Class: retry.Permanent, Err: errors.New("boom")})
	}
	got := metrictest.SumBy(t, reader, "causet.projection.dead_lettered", "tenant_schema")
	if diff := cmp.Diff(map[string]int64{"": 5, "acme_one": 1, "acme_two": 1}, got); diff != "" {
		t.Errorf("dead letters by tenant_schema (-want +got):\n%s", diff)
	}
}
