// Package otlptest is an in-process OTLP/HTTP receiver for tests and
// benchmarks: it keeps the resource spans of every trace export (protobuf,
// as the Go SDK's otlptracehttp exporter sends them) and answers every
// other signal with 200.
package otlptest

import (
	"context"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
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
			var n int
			if r.keep {
				err = proto.Unmarshal(body, &msg)
				for _, rs := range msg.ResourceSpans {
					for _, ss := range rs.ScopeSpans {
						n += len(ss.Spans)
					}
				}
			} else {
				// Counted without decoding: a benchmark's receiver should
				// cost little next to the worker it measures.
				n, err = countSpans(body)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.mu.Lock()
			r.count += n
			r.spans = append(r.spans, msg.ResourceSpans...)
			r.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	return r
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
