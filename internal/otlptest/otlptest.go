// Package otlptest is an in-process OTLP/HTTP receiver for tests and
// benchmarks: it keeps the resource spans of every trace export and the
// resource metrics of every metric export (protobuf, as the Go SDK's
// otlptracehttp and otlpmetrichttp exporters and the collector's otlphttp
// exporter send them, gzip-compressed or not) and answers every other signal
// with 200. Put behind a real OpenTelemetry Collector (NewCollectorReceiver,
// or Start with OTELCOL_BIN set), it receives what that collector decoded and
// re-encoded.
package otlptest

import (
	"compress/gzip"
	"context"
	"sync/atomic"

	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/encoding/protowire"

	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver is an OTLP/HTTP receiver on a loopback port, alone or behind a
// collector process (NewCollectorReceiver). Close it when done.
type Receiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	spans   []*tracepb.ResourceSpans
	metrics []*metricspb.ResourceMetrics
	count   int
	// userAgents are the User-Agent headers of the exports received.
	userAgents map[string]bool
	// Keep, when false, counts spans without keeping spans or metrics
	// (benchmarks).
	keep bool
	// col is the collector in front of srv; nil when the exporters send to
	// srv directly.
	col *collector
}

// NewReceiver starts a receiver. With keep false it only counts the spans
// it receives (SpanCount), for benchmarks that export millions of spans.
func NewReceiver(keep bool) *Receiver {
	r := &Receiver{keep: keep, userAgents: map[string]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, "gzip body: "+err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch req.URL.Path {
	case "/v1/traces":
		var msg coltrace.ExportTraceServiceRequest
		var n int
		if r.keep {
			err = proto.Unmarshal(b, &msg)
			for _, rs := range msg.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					n += len(ss.Spans)
				}
			}
		} else {
			// Counted without decoding: a benchmark's receiver should cost
			// little next to the worker it measures.
			n, err = countSpans(b)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.count += n
		if r.keep {
			r.spans = append(r.spans, msg.ResourceSpans...)
		}
		r.userAgents[req.UserAgent()] = true
		r.mu.Unlock()
	case "/v1/metrics":
		var msg colmetrics.ExportMetricsServiceRequest
		if err := proto.Unmarshal(b, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		if r.keep {
			r.metrics = append(r.metrics, msg.ResourceMetrics...)
		}
		r.userAgents[req.UserAgent()] = true
		r.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// Field numbers of the OTLP trace messages (opentelemetry-proto): the
// request's resource_spans, ResourceSpans' scope_spans, ScopeSpans' spans.
const (
	fieldResourceSpans = 1
	fieldScopeSpans    = 2
	fieldSpans         = 2
)

// countSpans counts the spans of an encoded ExportTraceServiceRequest by
// walking its wire format, without decoding them.
func countSpans(b []byte) (int, error) {
	n := 0
	err := eachField(b, fieldResourceSpans, func(rs []byte) error {
		return eachField(rs, fieldScopeSpans, func(ss []byte) error {
			return eachField(ss, fieldSpans, func([]byte) error { n++; return nil })
		})
	})
	return n, err
}

// eachField calls fn with the bytes of each length-delimited field num of
// the message b.
func eachField(b []byte, num protowire.Number, fn func([]byte) error) error {
	for len(b) > 0 {
		f, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		if f == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return protowire.ParseError(l)
			}
			if err := fn(v); err != nil {
				return err
			}
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(f, typ, b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
	}
	return nil
}

// Endpoint is the base URL (http://127.0.0.1:port) that exporters send to,
// the value of OTEL_EXPORTER_OTLP_ENDPOINT: the collector's OTLP/HTTP
// receiver when there is one in front, else the receiver's own.
func (r *Receiver) Endpoint() string {
	if r.col != nil {
		return r.col.endpoint
	}
	return r.srv.URL
}

// Close stops the collector in front, if any (it forwards what it holds
// first), then the receiver.
func (r *Receiver) Close() {
	if r.col != nil {
		r.col.stop()
	}
	r.srv.Close()
}

// ResourceSpans returns a copy of the resource spans received so far (none
// when the receiver does not keep them).
func (r *Receiver) ResourceSpans() []*tracepb.ResourceSpans {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.ResourceSpans(nil), r.spans...)
}

// ResourceMetrics returns a copy of the resource metrics received so far,
// one element per resource of each export, oldest first (none when the
// receiver does not keep them). The Go SDK's periodic reader exports every
// OTEL_METRIC_EXPORT_INTERVAL milliseconds (default 60000), cumulative sums
// and histograms by default: the newest export holds the totals.
func (r *Receiver) ResourceMetrics() []*metricspb.ResourceMetrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*metricspb.ResourceMetrics(nil), r.metrics...)
}

// SpanCount is the number of spans received so far.
func (r *Receiver) SpanCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Attr returns the string value of attribute key, "" when absent.
func Attr(attrs []*commonpb.KeyValue, key string) string {
	for _, a := range attrs {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// SpanCounter is an OpenTelemetry span processor that counts the spans
// that end (sampled or not), keeping none: for tests and benchmarks that
// trace everything without holding the spans.
type SpanCounter struct{ ended, sampled atomic.Int64 }

// Ended is the number of spans that ended.
func (c *SpanCounter) Ended() int64 { return c.ended.Load() }

// Sampled is the number of sampled spans that ended (those an exporter
// would receive).
func (c *SpanCounter) Sampled() int64 { return c.sampled.Load() }

func (c *SpanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (c *SpanCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	c.ended.Add(1)
	if s.SpanContext().IsSampled() {
		c.sampled.Add(1)
	}
}

func (c *SpanCounter) Shutdown(context.Context) error   { return nil }
func (c *SpanCounter) ForceFlush(context.Context) error { return nil }
