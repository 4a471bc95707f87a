package projection

// The worker's spans (Config.TracerProvider; none without it):
//
//   - one "process <topic>" span per record (kind consumer), the child of
//     the W3C trace context in the record's headers (a new trace without
//     one), from when the record is taken until it is done: every pair
//     applied, stale or dead-lettered (acknowledged by Kafka). Its status
//     is Error when a pair of it, or the record itself, was dead-lettered.
//   - one "apply <projection>" span per (record, projection) pair that
//     failed an attempt (every pair with Config.TraceEveryPair), the child
//     of its record's span, from when the record was taken until the
//     pair's outcome; each failed attempt is recorded on it as an exception
//     event, each retry made as a "retry" event; status Error when
//     it is dead-lettered. A pair applied at its first attempt has no span
//     of its own by default: its record's span and the batch transaction's
//     span linked to it say so, at a third of the spans. The dead letter's "send <dlq topic>" span (package dlq)
//     is its child, so the dead letter and its traceparent header continue
//     the record's own trace.
//   - one span per database transaction of the batch path ("apply batch",
//     "copy batch"), a new root linked to the
//     record spans of the pairs in it: a transaction serves many records
//     and belongs to none of them. The database client's spans (pgx's
//     tracer, set up by the caller) are its children.
//
// Attribute names follow OpenTelemetry's messaging and database semantic
// conventions (messaging.*, db.response.status_code, error.type); the
// project's own are causet.*.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/retry"
)

// Span attribute keys of the project's own (the rest are OpenTelemetry's
// semantic conventions).
const (
	AttrProjection   = attribute.Key("causet.projection")
	AttrTenantSchema = attribute.Key("causet.tenant_schema")
	AttrEventType    = attribute.Key("causet.event_type")
	// AttrOutcome is a pair's outcome: applied, stale (older than the row),
	// copied (upserted by a COPY group, whose merge does not say whether
	// this pair's row was the newer one), dead_lettered; and for a record,
	// also handed_off (finished by the partition's previous owner),
	// released (its partition was revoked before it was done) and
	// unhandled (no projection handles its event type: committed without
	// a write).
	AttrOutcome    = attribute.Key("causet.outcome")
	AttrRetryCount = attribute.Key("causet.retry.count")
	// AttrShortCircuit is the fingerprint of the open breaker that
	// dead-lettered a pair before its retries ran out (the dead letter's
	// causet.dlq.short-circuit header).
	AttrShortCircuit = attribute.Key("causet.dlq.short_circuit")
	// AttrBatchPairs is the number of pairs in a batch transaction: when
	// it ends committed, the ones it applied (the batch_size metric's).
	AttrBatchPairs = attribute.Key("causet.batch.pairs")
	// AttrBatchPairsLeft is the number of pairs a committed batch
	// transaction tried and did not apply (rows PostgreSQL refused,
	// upserts left for statements), set when there are any: its links are
	// to every record it tried.
	AttrBatchPairsLeft = attribute.Key("causet.batch.pairs_left")
)

// Outcomes of AttrOutcome.
const (
	outcomeApplied      = "applied"
	outcomeStale        = "stale"
	outcomeCopied       = "copied"
	outcomeDeadLettered = "dead_lettered"
	outcomeHandedOff    = "handed_off"
	outcomeReleased     = "released"
	outcomeUnhandled    = "unhandled"
)

// tracing starts the worker's spans; a nil *tracing starts none.
type tracing struct {
	tracer      trace.Tracer
	prop        propagation.TraceContext
	processName string // "process <topic>"
	common      []attribute.KeyValue
	everyPair   bool // Config.TraceEveryPair
}

func newTracing(cfg Config) *tracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &tracing{
		tracer: cfg.TracerProvider.Tracer("github.com/causet/projection-worker/projection",
			trace.WithSchemaURL(semconv.SchemaURL)),
		processName: "process " + cfg.Topic,
		everyPair:   cfg.TraceEveryPair,
		common: []attribute.KeyValue{
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(cfg.Topic),
			semconv.MessagingConsumerGroupName(cfg.Group),
		},
	}
}

// consumerKind is the kind of record spans, made once (each
// trace.WithSpanKind allocates).
var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// startRecord starts the span of d (its record decoded into d.ev, nil when
// invalid), the child of the trace context in the record's headers; nil
// when t is nil. base is the partition's partitionAttrs: the record's own
// attributes are appended in its spare capacity, which the SDK copies, so
// that no slice is made per record; base must be used by one goroutine at
// a time (its partition's).
func (t *tracing) startRecord(d *decoded, base []attribute.KeyValue) trace.Span {
	if t == nil {
		return nil
	}
	rec := d.rec
	ctx := t.prop.Extract(context.Background(), kotel.NewRecordCarrier(rec))
	// The span starts at the SDK's clock, not at a timestamp option
	// (which cost an allocation per record, sampled or not); the record's
	// pair spans start when it did (d.taken).
	_, span := t.tracer.Start(ctx, t.processName, consumerKind)
	if !span.IsRecording() {
		return span // not sampled: no attributes to build, no pair span
	}
	if ro, ok := span.(interface{ StartTime() time.Time }); ok { // the SDK's spans (sdktrace.ReadOnlySpan)
		d.taken = ro.StartTime()
	} else {
		d.taken = time.Now()
	}
	// The outcome is set now as applied, what nearly every record comes
	// to, so that endRecord of an applied record adds no attribute (a
	// second SetAttributes copies them all): only a span processor's
	// OnStart could see it before the record is applied.
	attrs := append(base, semconv.MessagingKafkaOffset(int(rec.Offset)), AttrOutcome.String(outcomeApplied))
	if len(rec.Key) > 0 {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(recordKeyText(rec.Key)))
	}
	if ev := d.ev; ev != nil {
		attrs = append(attrs, AttrTenantSchema.String(ev.TenantSchema), AttrEventType.String(ev.EventType))
	}
	span.SetAttributes(attrs...)
	clear(attrs[len(base):]) // hold no record's key or tenant
	return span
}

// recordKeyText is a record key as its span's messaging.kafka.message.key: the
// key itself when it is UTF-8, else its bytes in hexadecimal (OTLP carries
// strings as UTF-8: one string that is not fails the export of every span
// sent with it).
func recordKeyText(key []byte) string {
	if utf8.Valid(key) {
		return string(key)
	}
	return hex.EncodeToString(key)
}

// maxSpanText is the longest error text a span's status or exception event
// takes, in bytes; a longer one is cut in its middle. The SDK's attribute
// value length limit (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT) does not apply
// to either.
const maxSpanText = 4096

// spanText is s as a span's status description or exception message: valid
// UTF-8 (an error may quote a record's bytes) of at most maxSpanText bytes.
func spanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxSpanText {
		return s
	}
	const cut = " [...] "
	head, tail := (maxSpanText-len(cut))/2, len(s)-(maxSpanText-len(cut))/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + cut + s[tail:]
}

// recordError records err on s as an exception event, its message
// spanText's, its type the innermost error's that err wraps (such as
// *pgconn.PgError, where err's own would be *fmt.wrapError: tracing
// trial), with attrs.
func recordError(s trace.Span, err error, attrs ...attribute.KeyValue) {
	inner := err
	for next := errors.Unwrap(inner); next != nil; next = errors.Unwrap(inner) {
		inner = next
	}
	s.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(append(attrs,
		semconv.ExceptionType(fmt.Sprintf("%T", inner)), semconv.ExceptionMessage(spanText(err.Error())))...))
}

// recordAttrs is how many attributes startRecord appends to a partition's
// (partitionAttrs' spare capacity).
const recordAttrs = 5

// partitionAttrs are the attributes every record span of partition shares
// (startRecord's base), with room for the record's own: nil when t is nil.
func (t *tracing) partitionAttrs(partition int32) []attribute.KeyValue {
	if t == nil {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, len(t.common)+1+recordAttrs)
	return append(append(attrs, t.common...), semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))))
}

// startPair starts the span of the pair (d, projection), the child of the
// record's span, from when the record was taken; nil when the record has
// none.
func (t *tracing) startPair(d *decoded, projection string) trace.Span {
	if t == nil || d.span == nil {
		return nil
	}
	if !d.span.IsRecording() { // not sampled: its children are not either
		return d.span
	}
	ev := d.ev
	_, span := t.tracer.Start(trace.ContextWithSpan(context.Background(), d.span), "apply "+projection, trace.WithTimestamp(d.taken),
		trace.WithAttributes(AttrProjection.String(projection), AttrTenantSchema.String(ev.TenantSchema), AttrEventType.String(ev.EventType)))
	return span
}

// spansEveryPair reports whether every pair has a span from its planning
// (Config.TraceEveryPair).
func (t *tracing) spansEveryPair() bool { return t != nil && t.everyPair }

// planSpan is the span a pair gets when it is planned: with
// Config.TraceEveryPair, its span; else none yet (pairFailed starts it if
// the pair fails).
func (t *tracing) planSpan(d *decoded, projection string) trace.Span {
	if t == nil || !t.everyPair {
		return nil
	}
	return t.startPair(d, projection)
}

// pairFailed records a failed attempt of the pair (d, projection) on its
// span, starting the span (from when the record was taken) when it has
// none yet, and returns the span.
func (t *tracing) pairFailed(span trace.Span, d *decoded, projection string, err error) trace.Span {
	if t == nil {
		return nil
	}
	if span == nil {
		span = t.startPair(d, projection)
	}
	failedAttempt(span, err)
	return span
}

// spanContext returns ctx with s as its span (ctx when s is nil).
func spanContext(ctx context.Context, s trace.Span) context.Context {
	if s == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, s)
}

// traceContext returns a context holding s, nil when s is nil: a dead
// letter's Context.
func traceContext(s trace.Span) context.Context {
	if s == nil {
		return nil
	}
	return trace.ContextWithSpan(context.Background(), s)
}

// endPair ends a pair's span with its outcome.
func endPair(s trace.Span, outcome string, retries int) {
	if s == nil || !s.IsRecording() {
		return
	}
	s.SetAttributes(AttrOutcome.String(outcome), AttrRetryCount.Int(retries))
	s.End()
}

// failedAttempt records a pair's failed attempt on its span: an exception
// event with the error's class (error.type) and SQLSTATE
// (db.response.status_code). They are the event's, not the span's: a pair
// that then applies did not fail, and error.type on a span marks it failed
// (tracing trial: applied pairs carried their failed attempts' error.type).
func failedAttempt(s trace.Span, err error) {
	if s == nil || !s.IsRecording() {
		return
	}
	recordError(s, err, errorAttrs(retry.Classify(err), err)...)
}

// errorAttrs are error.type (class) and, when err holds one,
// db.response.status_code (its SQLSTATE).
func errorAttrs(class retry.Class, err error) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.ErrorTypeKey.String(class.String())}
	if code := retry.SQLState(err); code != "" {
		attrs = append(attrs, semconv.DBResponseStatusCode(code))
	}
	return attrs
}

// retryEvent records on a pair's span that its retry number n was made
// (at), after waiting wait, as it was scheduled: one event per retry
// made, none for a retry scheduled and never made (the breaker opened, or
// the partition was released, first).
func retryEvent(s trace.Span, n int, wait time.Duration, at time.Time) {
	if s == nil || !s.IsRecording() {
		return
	}
	opts := []trace.EventOption{trace.WithAttributes(AttrRetryCount.Int(n), attribute.Int64("causet.retry.wait_ms", wait.Milliseconds()))}
	if !at.IsZero() {
		opts = append(opts, trace.WithTimestamp(at))
	}
	s.AddEvent("retry", opts...)
}

// endDeadLettered ends the span of a pair (or of a record that reached no
// projection) whose dead letter Kafka acknowledged: status Error, with the
// last error's class and SQLSTATE, and causet.dlq.short_circuit, the
// fingerprint, when an open breaker dead-lettered it before its retries
// ran out (shortCircuit non-empty).
func endDeadLettered(s trace.Span, class retry.Class, err error, retries int, shortCircuit string) {
	if s == nil || !s.IsRecording() {
		return
	}
	attrs := append(errorAttrs(class, err), AttrOutcome.String(outcomeDeadLettered), AttrRetryCount.Int(retries))
	if shortCircuit != "" {
		attrs = append(attrs, AttrShortCircuit.String(shortCircuit))
	}
	s.SetAttributes(attrs...)
	s.SetStatus(codes.Error, spanText("dead-lettered: "+err.Error()))
	s.End()
}

// endRecord ends a record's span: status Error with the reason when a pair
// of it (or the record itself) was dead-lettered (deadLettered non-empty).
func endRecord(s trace.Span, outcome, deadLettered string) {
	if s == nil || !s.IsRecording() {
		return
	}
	if deadLettered != "" {
		s.SetStatus(codes.Error, spanText(deadLettered))
		outcome = outcomeDeadLettered
	}
	if outcome != outcomeApplied { // startRecord set applied
		s.SetAttributes(AttrOutcome.String(outcome))
	}
	s.End()
}

// startBatch starts the span of one database transaction of the batch
// path, of n pairs: a new root, linked to the record spans of the pairs,
// each record once however many of its pairs the transaction holds (a COPY
// transaction yields its pairs table by table, so a record of two tables
// comes twice, apart); read only when the span is sampled. ctx is returned
// unchanged when t is nil.
func (t *tracing) startBatch(ctx context.Context, name string, n int, pairs iter.Seq[pair]) (context.Context, trace.Span) {
	if t == nil {
		return ctx, nil
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithNewRoot())
	if !span.IsRecording() {
		return ctx, span // not sampled: no links to build
	}
	span.SetAttributes(semconv.DBSystemNamePostgreSQL, AttrBatchPairs.Int(n))
	var last *decoded
	linked := make(map[*decoded]struct{}, min(n, maxBatchLinksHint))
	for p := range pairs {
		if p.d == last || p.d.span == nil {
			continue // the same record as the pair before
		}
		last = p.d
		if _, ok := linked[p.d]; ok {
			continue
		}
		linked[p.d] = struct{}{}
		if sc := p.d.span.SpanContext(); sc.IsSampled() {
			span.AddLink(trace.Link{SpanContext: sc})
		}
	}
	return ctx, span
}

// maxBatchLinksHint caps the records startBatch makes room for at once.
const maxBatchLinksHint = 4096

// batchApplied sets the pairs a committed batch transaction of n pairs
// applied on its span, when they are fewer (tracing trial: a COPY batch
// said 40 pairs where it had applied 37 and left 3 refused).
func batchApplied(s trace.Span, n, applied int) {
	if s == nil || !s.IsRecording() || applied == n {
		return
	}
	s.SetAttributes(AttrBatchPairs.Int(applied), AttrBatchPairsLeft.Int(n-applied))
}

// endBatch ends a batch transaction's span, status Error when err is set.
func endBatch(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		recordError(s, err)
		s.SetStatus(codes.Error, spanText(err.Error()))
	}
	s.End()
}

// NewDBTracer returns pgx's tracer for the worker's pool
// (pgx.ConnConfig.Tracer): otelpgx's spans (SQL, COPY, prepare, one
// pipelined batch) into tp, under the span of the pair or batch
// transaction that runs them; none outside a recording span (otelpgx
// starts none without one: the readiness checks make no spans). A
// pipelined batch is one span with its size (db.operation.batch.size), not
// one span per statement besides: 500 statements applied in one round trip
// are one piece of work. Its metrics are off: the worker's own say enough.
func NewDBTracer(tp trace.TracerProvider) pgx.QueryTracer {
	return dbTracer{otelpgx.NewTracer(otelpgx.WithTracerProvider(tp),
		otelpgx.WithMeterProvider(noopmetric.NewMeterProvider()),
		otelpgx.WithDisableAcquireTracer())}
}

// dbTracer is otelpgx's tracer with a pipelined batch as one span.
type dbTracer struct{ *otelpgx.Tracer }

// TraceBatchQuery does nothing: the batch's span covers its statements.
func (dbTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
