// Package otlptest is an in-process OTLP/HTTP receiver for tests and
// benchmarks: it keeps the resource spans of every trace export (protobuf,
// as the Go SDK's otlptracehttp exporter sends them) and answers every
// other signal with 200.
package otlptest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver is an OTLP/HTTP receiver on a loopback port. Close it when done.
type Receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.ResourceSpans
	count int
	// Keep, when false, counts spans without keeping them (benchmarks).
	keep bool
}

// NewReceiver starts a receiver. With keep false it only counts the spans
// it receives (SpanCount), for benchmarks that export millions of spans.
func NewReceiver(keep bool) *Receiver {
	r := &Receiver{keep: keep}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.URL.Path == "/v1/traces" {
			var msg coltrace.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &msg); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			n := 0
			for _, rs := range msg.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					n += len(ss.Spans)
				}
			}
			r.mu.Lock()
			r.count += n
			if r.keep {
				r.spans = append(r.spans, msg.ResourceSpans...)
			}
			r.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	return r
}

// Endpoint is the receiver's base URL (http://127.0.0.1:port), the value of
// OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) Endpoint() string { return r.srv.URL }

// Close stops the receiver.
func (r *Receiver) Close() { r.srv.Close() }

// ResourceSpans returns a copy of the resource spans received so far (none
// when the receiver does not keep them).
func (r *Receiver) ResourceSpans() []*tracepb.ResourceSpans {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.ResourceSpans(nil), r.spans...)
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
