package otlptest

import (
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

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
