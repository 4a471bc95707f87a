package dlq

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// sendTracer starts the send spans of dead letters (WriterConfig.
// TracerProvider); a nil *sendTracer starts none.
type sendTracer struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
	name   string // "send <dead-letter topic>"
	attrs  []attribute.KeyValue
}

func newSendTracer(tp trace.TracerProvider, topic string) *sendTracer {
	if tp == nil {
		return nil
	}
	return &sendTracer{
		tracer: tp.Tracer("github.com/causet/projection-worker/dlq", trace.WithSchemaURL(semconv.SchemaURL)),
		name:   "send " + topic,
		attrs: []attribute.KeyValue{
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(topic),
		},
	}
}

// start starts dl's send span, the child of the span in dl.Context, and
// sets the W3C headers that NewRecord writes in place of the source's; nil
// when t is nil or dl has no Context.
func (t *sendTracer) start(dl *DeadLetter) trace.Span {
	if t == nil || dl.Context == nil {
		return nil
	}
	attrs := append(t.attrs[:len(t.attrs):len(t.attrs)],
		attribute.String("causet.projection", dl.Projection),
		attribute.String("causet.dlq.error_class", dl.Class.String()),
		attribute.String("causet.dlq.original_topic", dl.Source.Topic),
		attribute.String("causet.dlq.original_partition", strconv.Itoa(int(dl.Source.Partition))),
		attribute.Int64("causet.dlq.original_offset", dl.Source.Offset))
	ctx, span := t.tracer.Start(dl.Context, t.name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	for _, k := range [...]string{"traceparent", "tracestate"} {
		if v := carrier.Get(k); v != "" {
			dl.traceHeaders = append(dl.traceHeaders, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	return span
}

// endSend ends a send span: the dead letter's partition and offset once
// acknowledged (rec, nil when not produced), status Error with err.
func endSend(span trace.Span, rec *kgo.Record, err error) {
	if span == nil {
		return
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case rec != nil:
		span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(int(rec.Partition))),
			semconv.MessagingKafkaOffset(int(rec.Offset)))
	}
	span.End()
}
