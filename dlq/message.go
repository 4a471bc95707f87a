// Package dlq is the dead-letter side of the Causet projection worker: the
// dead-letter message and its headers (SPEC §6), publishing dead letters,
// creating the topics, reading the dead-letter topic back and the replay
// ledger (SPEC §7).
//
// It does not import the projection package; the worker hands it a DeadLetter.
package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/retry"
)

// Default topic names (SPEC §2). Both are configurable.
const (
	DefaultTopic       = "causet.projection-dlq.v1"
	DefaultLedgerTopic = "causet.projection-dlq-ledger.v1"
)

// MaxOriginalEventDepth is the deepest nesting of objects and arrays, the
// event object itself counting as level 1, that a dead letter embeds
// verbatim in originalEvent: 126; a deeper value is kept in
// originalValueBase64. The dead letter adds one level, and 127 levels are
// what serde_json's default recursion limit (128) accepts, the smallest
// among common strict parsers (jq 1.6 stops after 256, Python's json near
// 1000, encoding/json after 10000). The worker refuses deeper events
// (projection.DecodeEvent), so that every event it accepts can be
// dead-lettered verbatim and replayed.
const MaxOriginalEventDepth = jsonstrict.MaxDepth

// MinRetention is the shortest retention.ms the dead-letter topic may have:
// 30 days (2592000000 ms), from the Causet DLQ guide.
const MinRetention = 30 * 24 * time.Hour

// Headers the worker writes on every dead letter (SPEC §6). The original
// record's headers are carried over as well.
const (
	HeaderOriginalTopic     = "causet.dlq.original-topic"
	HeaderOriginalPartition = "causet.dlq.original-partition" // decimal int32
	HeaderOriginalOffset    = "causet.dlq.original-offset"    // decimal int64
	HeaderOriginalTimestamp = "causet.dlq.original-timestamp" // epoch ms, decimal
	HeaderProjection        = "causet.dlq.projection"
	HeaderForkID            = "causet.dlq.fork-id"
	HeaderTenantSchema      = "causet.dlq.tenant-schema"
	HeaderEventType         = "causet.dlq.event-type"
	HeaderErrorClass        = "causet.dlq.error-class" // permanent|projection|infrastructure
	HeaderSQLState          = "causet.dlq.sqlstate"    // "" when not a PostgreSQL error
	HeaderFingerprint       = "causet.dlq.fingerprint" // 16 hex digits
	HeaderWorker            = "causet.dlq.worker"
	HeaderGeneration        = "causet.dlq.generation" // "<build version>/<IR version>"
	HeaderReplayCount       = "causet.dlq.replay-count"
	// HeaderTruncated lists, comma-separated, the message fields that were
	// shortened to fit the topic's size limit ("stackTrace", "error").
	HeaderTruncated = "causet.dlq.truncated"
	// HeaderShortCircuit is the fingerprint whose breaker dead-lettered the
	// pair without retries (SPEC §5); absent otherwise.
	HeaderShortCircuit = "causet.dlq.short-circuit"
	// HeaderOriginalOmitted is set when the original record value did not
	// fit the dead-letter topic and was left out (originalEvent null,
	// originalValueBase64 ""): "size=<bytes> sha256=<lowercase hex>" of the
	// value, which dlq-replayer reads again from the original topic,
	// partition and offset (the causet.dlq.original-* headers) while that
	// topic retains it.
	HeaderOriginalOmitted = "causet.dlq.original-omitted"
	// HeaderOriginalHeadersOmitted says that the source record's own
	// headers (and so the causet.dlq.original-traceparent and -tracestate
	// copies of its trace headers) were left out because, with the rest,
	// they did not fit the dead-letter topic: "count=N size=B sha256=hex",
	// B the bytes of their keys and values and hex the SHA-256 of
	// HeadersDigest's encoding of them. dlq-replayer reads them again from
	// the original topic, partition and offset, as for
	// HeaderOriginalOmitted.
	HeaderOriginalHeadersOmitted = "causet.dlq.original-headers-omitted"
	// HeaderOriginalKeyOmitted says that the source record's key was left
	// out (the dead letter has none) because, with the rest, it did not
	// fit the dead-letter topic: "size=N sha256=hex" of the key.
	// dlq-replayer reads it again, as for HeaderOriginalOmitted.
	HeaderOriginalKeyOmitted = "causet.dlq.original-key-omitted"
	// HeaderOriginalTraceparent and HeaderOriginalTracestate keep the source
	// record's W3C traceparent and tracestate headers (present when it had
	// them): with tracing on, the dead letter's own traceparent is its send
	// span's, in the failed record's trace.
	HeaderOriginalTraceparent = "causet.dlq.original-traceparent"
	HeaderOriginalTracestate  = "causet.dlq.original-tracestate"
)

// Headers the replayer adds to a republished event (SPEC §7).
const (
	HeaderReplayProjection    = "causet.replay.projection"
	HeaderReplaySource        = "causet.replay.source"          // "<dlq partition>:<dlq offset>"
	HeaderReplayCountOut      = "causet.replay.count"           // decimal, 1 for the first replay
	HeaderReplayFirstFailedAt = "causet.replay.first-failed-at" // epoch ms, decimal
)

// MaxReplayCount is the largest replay count a header may carry
// (causet.replay.count, causet.dlq.replay-count): ParseReplayCount reads
// any other value as absent, so that a count can always be incremented.
const MaxReplayCount = 1_000_000

// ParseReplayCount reads a replay-count header's value: a decimal from 1
// to MaxReplayCount, digits only. It returns 0 and false for anything
// else (empty, a sign, zero, not decimal, larger), which the worker and
// the replayer read as no replay (a first failure).
func ParseReplayCount(v []byte) (int, bool) {
	if len(v) == 0 || len(v) > 7 || v[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > MaxReplayCount {
		return 0, false
	}
	return n, true
}

// Message is the JSON value of a dead-letter record: exactly the documented
// fields of SPEC §6, validated by schemas/projection-dlq.v1.schema.json.
type Message struct {
	// OriginalEvent is the failed record's value verbatim (byte for byte) when
	// it is a JSON object that every strict JSON parser reads (see
	// NewRecord), else JSON null.
	OriginalEvent json.RawMessage `json:"originalEvent"`
	// OriginalValueBase64 is the raw record value, standard base64, present
	// only when OriginalEvent is null.
	OriginalValueBase64 string `json:"originalValueBase64,omitempty"`
	// ProjectionName is the projection that failed; "" for a permanent input
	// error that no projection saw.
	ProjectionName string `json:"projectionName"`
	// TenantSchema is the event's tenant schema, "" when unreadable.
	TenantSchema string `json:"tenantSchema"`
	// Error is the message of the last failure; PostgreSQL errors read as
	// PostgreSQL prints them ("ERROR: ... (SQLSTATE 42703)").
	Error string `json:"error"`
	// StackTrace is the wrapped error chain, PostgreSQL detail, hint, where,
	// table, column and constraint, and the Go stack where the handler failed.
	StackTrace string `json:"stackTrace"`
	// RetryCount is the number of retries made before dead-lettering (0 for
	// permanent errors).
	RetryCount int `json:"retryCount"`
	// FirstFailedAt is the epoch ms of the first failure; a replayed event that
	// fails again keeps the original value.
	FirstFailedAt int64 `json:"firstFailedAt"`
	// FailedAt is the epoch ms of the dead-letter submission.
	FailedAt int64 `json:"failedAt"`
}

// DeadLetter is one failed (record, projection) pair as the worker hands it
// over for publishing.
type DeadLetter struct {
	// Context holds the span of the failed pair (or record), nil when the
	// worker does not trace: a Writer with a TracerProvider starts the
	// dead letter's send span as its child and writes that span's
	// traceparent (and tracestate) header.
	Context context.Context
	// Source is the record that failed, as consumed (topic, partition, offset,
	// timestamp, key, value, headers). Required.
	Source *kgo.Record
	// Projection is the projection that failed, "" for an input error no
	// projection saw.
	Projection string
	// TenantSchema, ForkID and EventType come from the event, "" when it could
	// not be decoded.
	TenantSchema, ForkID, EventType string
	// Class is the failure's class.
	Class retry.Class
	// Err is the last failure. Required.
	Err error
	// Stack is the Go stack where the handler failed or panicked, "" if none
	// was captured.
	Stack string
	// Retries is the number of retries made (0 for permanent errors).
	Retries int
	// FirstFailedAt is the time of the first failure of this pair, or of the
	// original failure for a replayed event (header
	// causet.replay.first-failed-at).
	FirstFailedAt time.Time
	// ReplayCount is how many times the event has been replayed from the DLQ
	// (header causet.replay.count), 0 for a first failure.
	ReplayCount int
	// ValueShape is what the caller learnt of Source.Value when it decoded
	// it, so that NewRecord does not read the value again to choose between
	// originalEvent and originalValueBase64. Default ValueUnchecked:
	// NewRecord reads the value itself. Trap: set it only from a strict
	// read of these very bytes (projection.DecodeEvent's); a value
	// wrongly marked ValueStrictObject is embedded as it is, and the dead
	// letter may then not be JSON.
	ValueShape ValueShape
	// ShortCircuit is the fingerprint of the open breaker that dead-lettered
	// the pair at once, "" when the pair was not short-circuited (header
	// causet.dlq.short-circuit).
	ShortCircuit string

	// traceHeaders are the W3C headers of the send span (Writer), which
	// replace the source's in the record.
	traceHeaders []kgo.RecordHeader
}

// ValueShape is what is known of a source record's value: whether a dead
// letter can embed it verbatim in originalEvent (SPEC §6).
type ValueShape uint8

const (
	// ValueUnchecked: nothing is known; NewRecord reads the value.
	ValueUnchecked ValueShape = iota
	// ValueStrictObject: the value is a JSON object that every strict JSON
	// parser reads as the same document (see NewRecord); it is embedded
	// verbatim in originalEvent. projection.DecodeEvent accepted it, or
	// refused it only for its fields (projection.ValidationError's
	// StrictObject).
	ValueStrictObject
	// ValueNotStrictObject: anything else (empty, not valid UTF-8, not
	// JSON, not an object, a duplicate key, an unpaired surrogate escape,
	// deeper than MaxOriginalEventDepth); it is kept in
	// originalValueBase64.
	ValueNotStrictObject
)

// Fingerprint returns the dead letter's failure group, as NewRecord writes
// it in the causet.dlq.fingerprint header: Fingerprint of its projection,
// class, SQLSTATE and error text (its FingerprintText when the error gives
// one: FingerprintTexter).
func (dl DeadLetter) Fingerprint() string {
	return Fingerprint(dl.Projection, dl.Class, retry.SQLState(dl.Err), fingerprintText(dl.Err))
}

// MarshalJSON returns the dead-letter JSON of m: its fields in the order
// of the schema, OriginalEvent copied byte for byte (an empty
// OriginalEvent is written as null), originalValueBase64 written if and
// only if OriginalEvent is null (even when "", as the schema requires),
// and strings escaped without HTML escaping, so '<', '>' and '&' stay as
// they are.
//
// It returns an error when OriginalEvent is neither null nor a valid JSON
// object. Unlike NewRecord it does not insist on an object every strict
// parser reads, so that dead letters written before that rule still list.
// Note that json.Marshal and json.Encoder re-compact (and by
// default HTML-escape) what a MarshalJSON method returns, which would
// change the original event's bytes: call m.MarshalJSON directly to keep
// them, as NewRecord does.
func (m Message) MarshalJSON() ([]byte, error) {
	event := bytes.TrimSpace(m.OriginalEvent)
	if !isNullEvent(event) && (event[0] != '{' || !utf8.Valid(event) || !json.Valid(event)) {
		return nil, errors.New("originalEvent is neither null nor a JSON object")
	}
	return m.encode(), nil
}

func isNullEvent(event []byte) bool {
	event = bytes.TrimSpace(event)
	return len(event) == 0 || string(event) == "null"
}

// originalPrefix is how every dead letter's value starts: encode writes
// originalEvent first, and NewEntry reads its bytes from there
// (verbatimOriginal).
const originalPrefix = `{"originalEvent":`

// encode is MarshalJSON without checking OriginalEvent, which the caller
// has checked.
func (m Message) encode() []byte {
	isNull := isNullEvent(m.OriginalEvent)
	var b bytes.Buffer
	b.Grow(len(m.OriginalEvent) + len(m.OriginalValueBase64) + len(m.Error) + len(m.StackTrace) + 256)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	str := func(s string) {
		_ = enc.Encode(s) // encoding a string cannot fail; invalid UTF-8 becomes U+FFFD
		b.Truncate(b.Len() - 1)
	}
	b.WriteString(originalPrefix)
	if isNull {
		b.WriteString(`null,"originalValueBase64":`)
		str(m.OriginalValueBase64)
	} else {
		b.Write(m.OriginalEvent)
	}
	b.WriteString(`,"projectionName":`)
	str(m.ProjectionName)
	b.WriteString(`,"tenantSchema":`)
	str(m.TenantSchema)
	b.WriteString(`,"error":`)
	str(m.Error)
	b.WriteString(`,"stackTrace":`)
	str(m.StackTrace)
	b.WriteString(`,"retryCount":`)
	b.WriteString(strconv.Itoa(m.RetryCount))
	b.WriteString(`,"firstFailedAt":`)
	b.WriteString(strconv.FormatInt(m.FirstFailedAt, 10))
	b.WriteString(`,"failedAt":`)
	b.WriteString(strconv.FormatInt(m.FailedAt, 10))
	b.WriteString("}")
	return b.Bytes()
}
