package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/otlptranslator"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"

	"github.com/causet/projection-worker/internal/otlptest"
)

// otlpMetric returns the README's view of a metric exported over OTLP: its
// Prometheus name as the worker's Prometheus exporter spells it (the same
// otlptranslator rules: counters end in _total, the unit is a suffix), its
// type as /metrics serves it (a non-monotonic sum is a gauge) and the
// attribute keys of its data points.
func otlpMetric(t *testing.T, m *metricspb.Metric) (string, documentedMetric) {
	t.Helper()
	var (
		kind   otlptranslator.MetricType
		typ    string
		points [][]string
	)
	switch d := m.Data.(type) {
	case *metricspb.Metric_Sum:
		kind, typ = otlptranslator.MetricTypeNonMonotonicCounter, "gauge"
		if d.Sum.IsMonotonic {
			kind, typ = otlptranslator.MetricTypeMonotonicCounter, "counter"
		}
		for _, p := range d.Sum.DataPoints {
			points = append(points, attrKeys(p.Attributes))
		}
	case *metricspb.Metric_Gauge:
		kind, typ = otlptranslator.MetricTypeGauge, "gauge"
		for _, p := range d.Gauge.DataPoints {
			points = append(points, attrKeys(p.Attributes))
		}
	case *metricspb.Metric_Histogram:
		kind, typ = otlptranslator.MetricTypeHistogram, "histogram"
		for _, p := range d.Histogram.DataPoints {
			points = append(points, attrKeys(p.Attributes))
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	namer := otlptranslator.NewMetricNamer("", otlptranslator.UnderscoreEscapingWithSuffixes)
	name, err := namer.Build(otlptranslator.Metric{Name: m.Name, Unit: m.Unit, Type: kind})
	if err != nil {
		t.Fatalf("metric %s: %v", m.Name, err)
	}
	d := documentedMetric{Type: typ, Labels: []string{}}
	for _, keys := range points {
		for _, k := range keys {
			if !slices.Contains(d.Labels, k) {
				d.Labels = append(d.Labels, k)
			}
		}
	}
	slices.Sort(d.Labels)
	return name, d
}

func attrKeys(attrs []*commonpb.KeyValue) []string {
	keys := make([]string, 0, len(attrs))
	for _, a := range attrs {
		keys = append(keys, a.Key)
	}
	return keys
}

// TestRunExportsTheDocumentedMetricsOverOTLP: with an OTLP endpoint set,
// the worker's metrics reach the OTLP receiver (through the collector under
// make test-otel) under the resource whose service.instance.id is
// --worker-id, and its causet.* metrics, named as the Prometheus exporter
// names them, are exactly the README's metric table, with its types and
// labels, once the worker has applied, retried and dead-lettered records.
func TestRunExportsTheDocumentedMetricsOverOTLP(t *testing.T) {
	documented := readmeMetrics(t)
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	w := startBusyWorker(t, "--worker-id", "pod-9")
	var exported map[string]documentedMetric
	var instances []string
	w.waitFor(t, "every metric of the README's table exported over OTLP", 60*time.Second, func() bool {
		exported, instances = map[string]documentedMetric{}, nil
		for _, rm := range rcv.ResourceMetrics() {
			causet := false
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					name, d := otlpMetric(t, m)
					if !strings.HasPrefix(name, "causet_") {
						continue
					}
					causet = true
					// Cumulative exports: the newest one names every label seen.
					exported[name] = d
				}
			}
			if causet {
				id := otlptest.Attr(rm.Resource.GetAttributes(), "service.instance.id")
				if !slices.Contains(instances, id) {
					instances = append(instances, id)
				}
			}
		}
		for name, d := range documented {
			if !cmp.Equal(exported[name], d) {
				return false
			}
		}
		return true
	})
	if diff := cmp.Diff(documented, exported); diff != "" {
		t.Errorf("README metric table (-) vs metrics exported over OTLP (+):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"pod-9"}, instances); diff != "" {
		t.Errorf("service.instance.id of the resources exporting causet metrics (-want +got):\n%s", diff)
	}
}
