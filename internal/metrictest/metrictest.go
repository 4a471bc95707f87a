// Package metrictest reads the metrics a test's manual reader holds.
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// SumBy collects r and returns the int64 sum or gauge metric name's
// values, or the int64 histogram name's counts, added up by the value of
// attribute key of each data point ("" where a point has none). It fails t when the
// collection fails.
func SumBy(t testing.TB, r sdkmetric.Reader, name, key string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != name {
				continue
			}
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(key))
					sums[v.Emit()] += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(key))
					sums[v.Emit()] += p.Value
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(key))
					sums[v.Emit()] += int64(p.Count)
				}
			}
		}
	}
	return sums
}
