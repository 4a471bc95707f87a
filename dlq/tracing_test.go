package dlq

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestWriterSendSpanContinuesThePairsTrace: with a TracerProvider, each
// dead letter (Write and WriteBatch) gets a "send <topic>" producer span,
// the child of the span in its Context, ended once Kafka acknowledged it
// with its partition and offset; the dead letter's traceparent is that
// span's and the source's is kept as causet.dlq.original-traceparent.
func TestWriterSendSpanContinuesThePairsTrace(t *testing.T) {
	b, topic := newBroker(t, false)
	cl := newClient(t, b)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	w, err := NewWriter(cl, WriterConfig{
		RecordConfig:   RecordConfig{Topic: topic, Worker: "worker-1", Generation: "test/v42"},
		Backoff:        testBackoff,
		TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	pairCtx, pair := tp.Tracer("test").Start(context.Background(), "apply artist_followers")
	dl := testDeadLetter([]byte(testEvent))
	source := testDeadLetter([]byte(testEvent)).Source
	original := string(headerOf(source.Headers, "traceparent"))
	if original == "" {
		t.Fatal("the test dead letter's source has no traceparent")
	}
	// A second traceparent header: the propagator follows the first
	// (kotel's carrier), so the first is the one kept (tracing trial: the
	// last was kept, not the one the trace continued).
	dl.Source.Headers = append(dl.Source.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte("00-22222222222222222222222222222222-2222222222222222-01")})
	dl.Context = pairCtx
	if err := w.Write(context.Background(), dl); err != nil {
		t.Fatal(err)
	}
	if errs := w.WriteBatch(context.Background(), []DeadLetter{dl, dl}); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	pair.End()

	got := consume(t, b, topic, 3)
	var sends []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "send "+topic {
			sends = append(sends, s)
		}
	}
	if len(sends) != 3 {
		t.Fatalf("%d send spans, want 3", len(sends))
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range sends {
		byID[s.SpanContext().SpanID()] = s
		if s.Parent().SpanID() != pair.SpanContext().SpanID() || s.SpanContext().TraceID() != pair.SpanContext().TraceID() {
			t.Errorf("send span's parent %s/%s, want the pair's %s/%s", s.Parent().TraceID(), s.Parent().SpanID(),
				pair.SpanContext().TraceID(), pair.SpanContext().SpanID())
		}
		if s.SpanKind() != trace.SpanKindProducer || s.Status().Code == codes.Error {
			t.Errorf("send span kind %v status %v", s.SpanKind(), s.Status())
		}
	}
	for _, r := range got {
		tp := string(headerOf(r.Headers, "traceparent"))
		var tid, sid string
		if _, err := fmt.Sscanf(tp, "00-%32s-%16s-01", &tid, &sid); err != nil {
			t.Fatalf("dead letter's traceparent %q: %v", tp, err)
		}
		s, ok := byID[mustSpanID(t, sid)]
		if !ok || tid != pair.SpanContext().TraceID().String() {
			t.Errorf("dead letter at offset %d: traceparent %q is not one of the send spans of the pair's trace", r.Offset, tp)
			continue
		}
		if n := countHeaders(r.Headers, "traceparent"); n != 1 {
			t.Errorf("dead letter at offset %d has %d traceparent headers, want 1", r.Offset, n)
		}
		if o := string(headerOf(r.Headers, HeaderOriginalTraceparent)); o != original {
			t.Errorf("%s = %q, want the source's %q", HeaderOriginalTraceparent, o, original)
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if attrs["messaging.kafka.offset"] != fmt.Sprint(r.Offset) || attrs["messaging.destination.partition.id"] != fmt.Sprint(r.Partition) ||
			attrs["messaging.operation.type"] != "send" || attrs["messaging.destination.name"] != topic {
			t.Errorf("send span attributes %v, want the dead letter's partition %d and offset %d", attrs, r.Partition, r.Offset)
		}
	}
}

func headerOf(hs []kgo.RecordHeader, key string) []byte {
	for _, h := range hs {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

func countHeaders(hs []kgo.RecordHeader, key string) int {
	n := 0
	for _, h := range hs {
		if h.Key == key {
			n++
		}
	}
	return n
}

func mustSpanID(t *testing.T, s string) trace.SpanID {
	t.Helper()
	id, err := trace.SpanIDFromHex(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
