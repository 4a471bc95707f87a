package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/otlptest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
)

// newOTLPReceiver starts an in-process OTLP receiver that keeps the
// spans and metrics it receives, closed when t ends; behind the
// OpenTelemetry Collector that OTELCOL_BIN names, when set (make test-otel).
func newOTLPReceiver(t *testing.T) *otlptest.Receiver {
	t.Helper()
	return otlptest.Start(t)
}

var attr = otlptest.Attr

// TestRunExportsTracesWithTheStandardResourceAndLogsTheirIDs: with an OTLP
// endpoint set, the worker's spans reach an OTLP receiver with
// service.name from OTEL_SERVICE_NAME (not the built-in default) and
// service.instance.id = --worker-id, and a log line written for a record
// (its dead letter) carries the trace_id of a span that was exported.
func TestRunExportsTracesWithTheStandardResourceAndLogsTheirIDs(t *testing.T) {
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_SERVICE_NAME", "billing-projections")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	b, events, w := startOnKfake(t, 3, "--worker-id", "pod-7")
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("poison-1"), Value: poison}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var traceIDs map[string]bool
	w.waitFor(t, "a span exported and the dead letter logged", 30*time.Second, func() bool {
		traceIDs = map[string]bool{}
		for _, rs := range rcv.ResourceSpans() {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					traceIDs[hexID(sp.TraceId)] = true
				}
			}
		}
		return len(traceIDs) > 0 && w.logged("dead-lettered")
	})
	for _, rs := range rcv.ResourceSpans() {
		attrs := rs.Resource.GetAttributes()
		if got := attr(attrs, "service.name"); got != "billing-projections" {
			t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's billing-projections", got)
		}
		if got := attr(attrs, "service.instance.id"); got != "pod-7" {
			t.Errorf("service.instance.id = %q, want the worker id pod-7", got)
		}
	}
	// The SDK's own count of processed (and dropped: error_type
	// queue_full) spans is served.
	m := w.get(t, "/metrics")
	if !strings.Contains(m, "otel_sdk_processor_span_processed") {
		t.Errorf("/metrics lacks otel_sdk_processor_span_processed (the batch processor's processed and dropped spans)")
	}
	// ... and not its gauge of live spans, which costs every span (telemetry.go).
	if !strings.Contains(m, "otel_sdk_span_started_total") || strings.Contains(m, "otel_sdk_span_live") {
		t.Errorf("/metrics: want otel_sdk_span_started_total and no otel_sdk_span_live")
	}
	// kotel's byte counters in bytes, not in an unknown unit "by".
	if strings.Contains(m, "_by_total") || strings.Contains(m, "_by{") || !strings.Contains(m, "messaging_kafka_fetch_bytes_count_total") {
		var kafka []string
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, "# TYPE messaging_kafka") {
				kafka = append(kafka, l)
			}
		}
		t.Errorf("kotel's byte counters are not in bytes: %v", kafka)
	}
	var logged string
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if strings.Contains(line, "dead-lettered") {
			logged = line
		}
	}
	found := false
	for id := range traceIDs {
		found = found || strings.Contains(logged, "trace_id="+id)
	}
	if !found || !strings.Contains(logged, "span_id=") {
		t.Errorf("dead-lettered log line %q carries no trace_id of the exported spans %v", logged, traceIDs)
	}
	w.shutdown(t)
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestRunLogsExporterErrorsThroughItsLogger: an OTLP endpoint that refuses
// exports is reported in the worker's own log format (a line msg=opentelemetry),
// not as plain text from the OpenTelemetry SDK.
func TestRunLogsExporterErrorsThroughItsLogger(t *testing.T) {
	exportToRefusingCollector(t)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	_, _, w := startOnKfake(t, 1)
	w.waitFor(t, "the refused export logged", 30*time.Second, func() bool {
		return strings.Contains(w.stderr.String(), "level=ERROR msg=opentelemetry")
	})
	w.shutdown(t)
}

// exportToRefusingCollector points the worker's OTLP exports at a server
// that refuses every one (400), exporting spans every 100 ms.
func exportToRefusingCollector(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(refusing.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", refusing.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
}

// startOnKfake starts `projection-worker run` with extra args on a kfake
// broker of its own, with an events topic of the given partitions and the
// example projections.
func startOnKfake(t *testing.T, partitions int32, extra ...string) (*kafkatest.Broker, string, *running) {
	t.Helper()
	b := kafkatest.Fake(t)
	events := kafkatest.TopicName(t, "events")
	b.CreateTopic(t, events, partitions, nil)
	w := startRun(t, append([]string{
		"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
		"--projections", exampleProjections, "--topic", events,
		"--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
		"--group", kafkatest.TopicName(t, "group")}, extra...)...)
	return b, events, w
}

// TestRunLogsDroppedSpansOnce: when the span export queue is full (a
// collector slower than the worker, --trace-queue-size 1), the dropped
// spans are counted on /metrics and said once in the log, with the fix.
func TestRunLogsDroppedSpansOnce(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			time.Sleep(time.Second)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(slow.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", slow.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	b, events, w := startOnKfake(t, 1, "--trace-queue-size", "1")
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 20 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "poison-%d", i), Value: poison}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const said = "spans dropped: the OTLP export queue was full"
	w.waitFor(t, "the dropped spans logged", 30*time.Second, func() bool { return w.logged(said) })
	m := w.get(t, "/metrics")
	if !strings.Contains(m, `otel_sdk_processor_span_processed_total{error_type="queue_full"`) {
		t.Errorf("/metrics does not count the dropped spans (error_type=queue_full)")
	}
	for i := range 20 { // more drops: still one line
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "more-%d", i), Value: poison}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * droppedSpansCheck)
	if n := strings.Count(w.stderr.String(), said); n != 1 {
		t.Errorf("the dropped spans were logged %d times, want once", n)
	}
	w.shutdown(t)
}

// TestRunSaysOnceThatSpansWereLost: spans an export failed to deliver (a
// collector that refuses the requests) are counted on /metrics and said
// once in the log at WARN, as dropped ones are (tracing trial: 4 671 spans
// lost to an unreachable endpoint while the documented drop counter stayed
// at 0 and no WARN line came).
func TestRunSaysOnceThatSpansWereLost(t *testing.T) {
	exportToRefusingCollector(t)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	b, events, w := startOnKfake(t, 1)
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	produce := func(prefix string) {
		for i := range 20 {
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "%s-%d", prefix, i), Value: poison}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce("poison")
	const said = "spans lost: an OTLP export failed"
	w.waitFor(t, "the lost spans logged", 30*time.Second, func() bool { return w.logged(said) })
	if m := w.get(t, "/metrics"); !regexp.MustCompile(`otel_sdk_exporter_span_exported_total\{[^}]*error_type="[^"]+"`).MatchString(m) {
		t.Errorf("/metrics does not count the spans not exported (otel_sdk_exporter_span_exported_total with an error_type)")
	}
	produce("more")
	time.Sleep(3 * droppedSpansCheck)
	if n := strings.Count(w.stderr.String(), said); n != 1 {
		t.Errorf("the lost spans were logged %d times, want once", n)
	}
	w.shutdown(t)
}

// TestRunTracesEndpointAloneExportsNoMetrics: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// alone exports traces there and no metrics (tracing trial: the metric
// exporter, made too, sent to its default localhost:4318 and logged an
// ERROR line every minute).
func TestRunTracesEndpointAloneExportsNoMetrics(t *testing.T) {
	var traces, metrics atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/traces":
			traces.Add(1)
		default:
			metrics.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rcv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.URL+"/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
	b, events, w := startOnKfake(t, 1)
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("poison"), Value: poison}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "a trace export", 30*time.Second, func() bool { return traces.Load() > 0 })
	time.Sleep(time.Second) // ten metric export intervals
	if strings.Contains(w.stderr.String(), "metrics") && strings.Contains(w.stderr.String(), "msg=opentelemetry") {
		t.Errorf("a metric export was attempted with only a traces endpoint set:\n%s", w.stderr.String())
	}
	if n := metrics.Load(); n != 0 {
		t.Errorf("%d requests other than /v1/traces reached the traces endpoint", n)
	}
	w.shutdown(t)
}

// TestSpanLinkLimitCoversRetryRoundTrips: a span keeps as many links as
// the records its work can hold: a batch (--max-batch-records) or a retry
// round trip of a partition's waiting pairs (--max-retrying). Tracing
// trial: with --max-batch-records 100 a "retry statements" span of 224
// pairs dropped 23 links.
func TestSpanLinkLimitCoversRetryRoundTrips(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, max(projection.DefaultMaxBatchRecords, projection.DefaultMaxRetrying)},
		{[]string{"--max-batch-records", "100"}, projection.DefaultMaxRetrying},
		{[]string{"--max-batch-records", "100", "--max-retrying", "50"}, 100},
		{[]string{"--max-batch-records", "100", "--max-retrying", "5000"}, 5000},
	} {
		var s settings
		if err := parseFlags(runFlags(&s, io.Discard), c.args); err != nil {
			t.Fatal(err)
		}
		if got := s.spanLinkLimit(); got != c.want {
			t.Errorf("%v: span link limit %d, want %d", c.args, got, c.want)
		}
	}
}
