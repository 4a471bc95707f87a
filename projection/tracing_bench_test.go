package projection

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkHotRecordSpan measures what tracing every record costs the
// worker per record: its span started (trace context read from the
// headers) and ended with its attributes, then exported over OTLP/HTTP by
// the SDK's batch processor to a server that discards the requests, as the
// worker's telemetry.go sets it up. Run it with
//
//	go test ./projection -run '^$' -bench 'HotRecordSpan' -benchmem
func BenchmarkHotRecordSpan(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(1<<20)))
	tr := newTracing(Config{TracerProvider: tp, Topic: "causet.projection-events.v1", Group: "projection-worker"})
	ev := hotEvent(b, hotFollowed)
	rec := &kgo.Record{Topic: "causet.projection-events.v1", Partition: 3, Key: []byte("user-0012345"), Value: ev.Raw,
		Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}}
	base := tr.partitionAttrs(rec.Partition)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rec.Offset = int64(i)
		d := &decoded{rec: rec, ev: ev}
		d.span = tr.startRecord(d, base)
		endRecord(d.span, outcomeApplied, "")
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	_ = tp.Shutdown(context.Background())
}

// BenchmarkHotRecordSpanSampledOut measures what tracing costs a record
// that the sampler leaves out, as 99 % of them at the production setting
// (parentbased_traceidratio 0.01): a record without trace headers, a
// sampler that samples none.
//
//	go test ./projection -run '^$' -bench 'HotRecordSpanSampledOut' -benchmem
func BenchmarkHotRecordSpanSampledOut(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := newTracing(Config{TracerProvider: tp, Topic: "causet.projection-events.v1", Group: "projection-worker"})
	ev := hotEvent(b, hotFollowed)
	rec := &kgo.Record{Topic: "causet.projection-events.v1", Partition: 3, Key: []byte("user-0012345"), Value: ev.Raw}
	base := tr.partitionAttrs(rec.Partition)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rec.Offset = int64(i)
		d := &decoded{rec: rec, ev: ev}
		if d.span = tr.startRecord(d, base); d.span.IsRecording() {
			b.Fatal("a span was sampled")
		}
		endRecord(d.span, outcomeApplied, "")
	}
}
