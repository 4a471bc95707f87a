package otlptest

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

const testUserAgent = "otlptest-client/1"

var testResource = &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
	{Key: "service.instance.id", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "pod-7"}}},
}}

func testSpans() []*tracepb.ResourceSpans {
	return []*tracepb.ResourceSpans{{
		Resource: testResource,
		ScopeSpans: []*tracepb.ScopeSpans{{
			Scope: &commonpb.InstrumentationScope{Name: "otlptest"},
			Spans: []*tracepb.Span{
				{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8), Name: "events process",
					Kind: tracepb.Span_SPAN_KIND_CONSUMER, StartTimeUnixNano: 1e18, EndTimeUnixNano: 1e18 + 5e6,
					Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "dead-lettered"}},
				{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{3}, 8), ParentSpanId: bytes.Repeat([]byte{2}, 8),
					Name: "apply", StartTimeUnixNano: 1e18 + 1e6, EndTimeUnixNano: 1e18 + 4e6,
					// The collector always encodes a status, as the Go SDK does.
					Status: &tracepb.Status{}},
			},
		}},
	}}
}

func testMetrics() []*metricspb.ResourceMetrics {
	return []*metricspb.ResourceMetrics{{
		Resource: testResource,
		ScopeMetrics: []*metricspb.ScopeMetrics{{
			Scope: &commonpb.InstrumentationScope{Name: "otlptest"},
			Metrics: []*metricspb.Metric{{
				Name: "causet.projection.applied", Unit: "{event}",
				Data: &metricspb.Metric_Sum{Sum: &metricspb.Sum{
					AggregationTemporality: metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE,
					IsMonotonic:            true,
					DataPoints: []*metricspb.NumberDataPoint{{
						StartTimeUnixNano: 1e18, TimeUnixNano: 1e18 + 1e9,
						Value: &metricspb.NumberDataPoint_AsInt{AsInt: 3},
					}},
				}},
			}},
		}},
	}}
}

// post sends msg to endpoint+path as an OTLP/HTTP exporter does, gzipped
// when zip is set, and fails t unless the answer is 200.
func post(t *testing.T, endpoint, path string, msg proto.Message, zip bool) {
	t.Helper()
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if zip {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		if _, err := zw.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		b = z.Bytes()
	}
	req, err := http.NewRequest(http.MethodPost, endpoint+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", testUserAgent)
	if zip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", path, resp.Status)
	}
}

// exportAndCompare exports testSpans and testMetrics to r.Endpoint(),
// gzipped when zip is set, and fails t unless r then holds them unchanged.
func exportAndCompare(t *testing.T, r *Receiver, zip bool) {
	t.Helper()
	post(t, r.Endpoint(), "/v1/traces", &coltrace.ExportTraceServiceRequest{ResourceSpans: testSpans()}, zip)
	post(t, r.Endpoint(), "/v1/metrics", &colmetrics.ExportMetricsServiceRequest{ResourceMetrics: testMetrics()}, zip)
	if diff := cmp.Diff(testSpans(), r.ResourceSpans(), protocmp.Transform()); diff != "" {
		t.Errorf("resource spans (-exported +received):\n%s", diff)
	}
	if diff := cmp.Diff(testMetrics(), r.ResourceMetrics(), protocmp.Transform()); diff != "" {
		t.Errorf("resource metrics (-exported +received):\n%s", diff)
	}
}

// TestReceiverKeepsSpansAndMetricsPlainOrGzipped: the in-process receiver
// keeps the resource spans and resource metrics of exports, plain or
// gzip-compressed (the collector's otlphttp exporter compresses by default).
func TestReceiverKeepsSpansAndMetricsPlainOrGzipped(t *testing.T) {
	for _, zip := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[zip], func(t *testing.T) {
			r := NewReceiver(true)
			defer r.Close()
			exportAndCompare(t, r, zip)
			if got := r.SpanCount(); got != 2 {
				t.Errorf("SpanCount = %d, want 2", got)
			}
		})
	}
}

// TestReceiverWithoutKeepOnlyCounts: NewReceiver(false), the benchmarks'
// receiver, counts spans and keeps neither spans nor metrics.
func TestReceiverWithoutKeepOnlyCounts(t *testing.T) {
	r := NewReceiver(false)
	defer r.Close()
	post(t, r.Endpoint(), "/v1/traces", &coltrace.ExportTraceServiceRequest{ResourceSpans: testSpans()}, false)
	post(t, r.Endpoint(), "/v1/metrics", &colmetrics.ExportMetricsServiceRequest{ResourceMetrics: testMetrics()}, false)
	if got := r.SpanCount(); got != 2 {
		t.Errorf("SpanCount = %d, want 2", got)
	}
	if n, m := len(r.ResourceSpans()), len(r.ResourceMetrics()); n != 0 || m != 0 {
		t.Errorf("kept %d resource spans and %d resource metrics, want none", n, m)
	}
}

// TestCollectorReceiverReportsACollectorThatExits: a collector binary that
// exits at once is an error that says so, not a hang.
func TestCollectorReceiverReportsACollectorThatExits(t *testing.T) {
	bin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false command")
	}
	r, err := NewCollectorReceiver(bin, true)
	if err == nil {
		r.Close()
		t.Fatal("NewCollectorReceiver(false) returned no error")
	}
	if !strings.Contains(err.Error(), "collector exited before listening") {
		t.Errorf("error = %v, want one saying the collector exited", err)
	}
}

// TestCollectorForwardsWhatItDecoded (make test-otel): spans and metrics
// exported to the collector that OTELCOL_BIN names reach the receiver
// behind it, sent by the collector (not by this test's client), equal to
// what was exported, by the time the export returns.
func TestCollectorForwardsWhatItDecoded(t *testing.T) {
	if os.Getenv(CollectorEnv) == "" {
		t.Skipf("%s is not set (make test-otel builds a collector and sets it)", CollectorEnv)
	}
	r := Start(t)
	if r.Endpoint() == r.srv.URL {
		t.Fatalf("Endpoint %s is the receiver's own, not the collector's", r.Endpoint())
	}
	exportAndCompare(t, r, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.userAgents) == 0 || r.userAgents[testUserAgent] {
		t.Errorf("exports came from User-Agents %v, want the collector's only", r.userAgents)
	}
}

// TestCountSpansAgreesWithDecoding: the wire-format count equals the
// decoded count, across several resources and scopes.
func TestCountSpansAgreesWithDecoding(t *testing.T) {
	msg := &coltrace.ExportTraceServiceRequest{}
	want := 0
	for r := range 3 {
		rs := &tracepb.ResourceSpans{Resource: &resourcepb.Resource{}, SchemaUrl: "x"}
		for s := range r + 2 {
			ss := &tracepb.ScopeSpans{SchemaUrl: "y"}
			for i := range s + r + 1 {
				ss.Spans = append(ss.Spans, &tracepb.Span{Name: "span", TraceId: make([]byte, 16), SpanId: []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}})
				want++
			}
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		msg.ResourceSpans = append(msg.ResourceSpans, rs)
	}
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := countSpans(b)
	if err != nil || got != want {
		t.Fatalf("countSpans = %d, %v; want %d", got, err, want)
	}
	if _, err := countSpans(b[:len(b)-3]); err == nil {
		t.Errorf("countSpans of a truncated message: no error")
	}
}
