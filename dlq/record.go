package dlq

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/retry"
)

// DefaultMaxBytes is the default RecordConfig.MaxBytes: 1,000,000 bytes.
// Kafka's default max.message.bytes is 1,048,588 (1 MiB + 12) and kgo's
// default ProducerBatchMaxBytes is 1,000,012; 1,000,000 stays under both,
// so a dead letter that fits it is accepted by a default client and a
// default topic.
const DefaultMaxBytes = 1000000

// minMaxBytes is the smallest RecordConfig.MaxBytes accepted: kgo's own
// lower bound for ProducerBatchMaxBytes.
const minMaxBytes = 512

// recordBatchOverhead is what kgo counts around a one-record batch when it
// checks ProducerBatchMaxBytes: the 61-byte v2 record batch header plus the
// 4-byte length prefix of the records array.
const recordBatchOverhead = 65

// ErrTooLarge is returned (wrapped) by NewRecord, and so by Writer.Write,
// when a dead letter does not fit RecordConfig.MaxBytes even with its
// stackTrace and error emptied. The original event is never cut: the caller
// must not commit the source offset and should alert, so that an operator
// raises the topic's max.message.bytes and MaxBytes (SPEC §5).
var ErrTooLarge = errors.New("dead letter too large for the dead-letter topic")

// RecordConfig says how dead-letter records are built. The zero value is
// usable: every field has a default (see WithDefaults).
type RecordConfig struct {
	// Topic is the dead-letter topic. Default DefaultTopic
	// ("causet.projection-dlq.v1"). It must be a legal Kafka topic name
	// (1-249 of [a-zA-Z0-9._-], not "." or "..").
	Topic string
	// Worker identifies the worker that wrote the dead letter, e.g. its
	// hostname or pod name; written in header causet.dlq.worker. Default ""
	// (header present and empty): cmd/ should set it.
	Worker string
	// Generation is "<build version>/<IR version>" of the worker that wrote
	// the dead letter, written in header causet.dlq.generation. Default "".
	Generation string
	// MaxBytes is the largest record batch, in bytes, that a dead letter may
	// take on the wire: its key, value and headers plus their varint
	// lengths and the 65 bytes of batch framing that kgo counts against
	// ProducerBatchMaxBytes. Set it to the dead-letter topic's
	// max.message.bytes (TopicReport.DLQMaxMessageBytes) or less, and no
	// higher than the producer client's ProducerBatchMaxBytes. Default
	// DefaultMaxBytes (1,000,000); minimum 512. A larger dead letter is
	// truncated (see NewRecord).
	MaxBytes int
	// Redact, when not nil, masks the message's error and stackTrace
	// texts (its String) before they are fitted to MaxBytes: the worker's
	// *redact.Redactor, so that no text of the error's chain (an inner
	// error's message, a PostgreSQL error's detail) shows a secret.
	// Default nil: the texts as the error gives them.
	Redact interface{ String(string) string }
}

// WithDefaults returns c with every zero field set to its default.
func (c RecordConfig) WithDefaults() RecordConfig {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	return c
}

// Validate returns an error naming the first field of c.WithDefaults()
// that is out of range: an illegal topic name or MaxBytes below 512.
func (c RecordConfig) Validate() error {
	c = c.WithDefaults()
	if err := validTopicName(c.Topic); err != nil {
		return fmt.Errorf("dead-letter topic: %w", err)
	}
	if c.MaxBytes < minMaxBytes {
		return fmt.Errorf("dead-letter max bytes must be >= %d, got %d", minMaxBytes, c.MaxBytes)
	}
	return nil
}

// validTopicName applies Kafka's rules for topic names.
func validTopicName(t string) error {
	switch {
	case t == "":
		return errors.New("topic name is empty")
	case t == "." || t == "..":
		return fmt.Errorf("topic name %q is not allowed", t)
	case len(t) > 249:
		return fmt.Errorf("topic name is %d characters long, the limit is 249", len(t))
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic name %q has character %q, allowed are [a-zA-Z0-9._-]", t, r)
		}
	}
	return nil
}

// ErrInvalidDeadLetter is wrapped by NewRecord's error for a DeadLetter
// that is not one (no source record or error, a negative count): a bug
// of its caller, not of Kafka.
var ErrInvalidDeadLetter = errors.New("invalid dead letter")

// NewRecord builds the dead-letter record for dl (SPEC §6), stamped with
// now (FailedAt and the record timestamp; pass time.Now()).
//
// The record has:
//
//   - Topic cfg.Topic (after WithDefaults) and Key the source record's key
//     (nil stays nil);
//   - Value the JSON of a Message: OriginalEvent is the source value byte
//     for byte when it is a JSON object that every strict JSON parser
//     reads (jq 1.6 included): valid UTF-8, valid JSON, an object, no
//     duplicate key at any level, no unpaired UTF-16 surrogate escape, at
//     most MaxOriginalEventDepth levels deep; otherwise it is null and
//     OriginalValueBase64 holds the value in standard base64 ("" for an
//     empty value or a tombstone). Either way the dead letter parses with
//     every strict parser. dl.ValueShape says which, when the caller has
//     decoded the value already; when it is ValueUnchecked, NewRecord
//     reads the value with the reader the worker's event decoder uses
//     (projection.DecodeEvent), so both apply the same rules. Error is, for a
//     *pgconn.PgError in dl.Err's chain, that error's Error() ("ERROR: ...
//     (SQLSTATE 42703)"), else dl.Err.Error(). StackTrace is the wrapped
//     error chain, one level a line, indented two spaces a level, each
//     followed by its Go type in brackets (the branches of errors.Join
//     in order); then, after a blank line, the PostgreSQL fields that are
//     set ("Detail: ...", "Hint:", "Where:", "Schema:", "Table:",
//     "Column:", "Data type:", "Constraint:"); then, after a blank line,
//     "goroutine stack:" and dl.Stack when it is not "".
//     RetryCount is dl.Retries; FailedAt is now in epoch ms; FirstFailedAt
//     is dl.FirstFailedAt in epoch ms, now when it is zero, and never later
//     than FailedAt (clock skew between workers is clamped);
//   - Headers: every header of the source record except causet.dlq.* ones
//     (a replayed event that fails again gets them restated, not
//     duplicated), in their order, then the causet.dlq.* headers in the
//     order of their constants: original-topic, -partition, -offset,
//     -timestamp (epoch ms, -1 when unset), projection, fork-id,
//     tenant-schema, event-type, error-class, sqlstate, fingerprint
//     (Fingerprint over the untruncated error), worker, generation,
//     replay-count, short-circuit (when set), original-traceparent and
//     original-tracestate (when the source has them; with a Writer that
//     traces, traceparent and tracestate are the send span's, after the
//     source's other headers), and, only when something was cut,
//     truncated; original-omitted, original-headers-omitted and
//     original-key-omitted come before truncated when the value, the
//     source's headers or its key were left out (below).
//
// A TenantSchema that is not a valid identifier (^[a-z_][a-z0-9_]{0,62}$)
// is written as "" in the message and the header, as the schema requires;
// the original event still holds it.
//
// When the record's encoded size (see RecordConfig.MaxBytes) is over
// cfg.MaxBytes, NewRecord cuts StackTrace to a prefix followed by
// "…[truncated N bytes]", then to that marker alone, then to "", and only
// then does the same to Error; it never cuts OriginalEvent or
// OriginalValueBase64, and it lists the fields it cut in header
// causet.dlq.truncated ("stackTrace" or "stackTrace,error"). When even
// that does not fit, the original value is left out whole (OriginalEvent
// null, OriginalValueBase64 "") and header causet.dlq.original-omitted
// gives its size and SHA-256 ("size=N sha256=hex"), StackTrace and Error
// are cut again from their full text as needed: the dead letter is still
// written, and dlq-replayer reads the value again from the original
// topic. When the source's own headers are what does not fit, they are
// left out (with the copies of its trace headers), the value kept if it
// then fits and left out too otherwise, and header
// causet.dlq.original-headers-omitted gives their count, size and digest
// (HeadersDigest); last, the key is left out (the dead letter has none)
// with each of those, and header causet.dlq.original-key-omitted gives its
// size and SHA-256. dlq-replayer reads what was left out again. If the
// record is still too large (a limit smaller than the dead letter's own
// headers and fields), it returns an error wrapping ErrTooLarge.
//
// It also returns an error when cfg is invalid, and one wrapping
// ErrInvalidDeadLetter when dl.Source or dl.Err is nil, dl.Retries or
// dl.ReplayCount is negative, dl.ReplayCount is above MaxReplayCount, or
// now is zero.
func NewRecord(dl DeadLetter, cfg RecordConfig, now time.Time) (*kgo.Record, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case dl.Source == nil:
		return nil, fmt.Errorf("%w: no source record", ErrInvalidDeadLetter)
	case dl.Err == nil:
		return nil, fmt.Errorf("%w for %s: no error", ErrInvalidDeadLetter, sourceName(dl.Source))
	case dl.Retries < 0:
		return nil, fmt.Errorf("%w for %s: negative retry count %d", ErrInvalidDeadLetter, sourceName(dl.Source), dl.Retries)
	case dl.ReplayCount < 0 || dl.ReplayCount > MaxReplayCount:
		return nil, fmt.Errorf("%w for %s: replay count %d not in 0..%d", ErrInvalidDeadLetter, sourceName(dl.Source), dl.ReplayCount, MaxReplayCount)
	case now.IsZero():
		return nil, fmt.Errorf("%w for %s: zero time", ErrInvalidDeadLetter, sourceName(dl.Source))
	}

	src := dl.Source
	tenant := dl.TenantSchema
	if !ValidSchemaName(tenant) {
		tenant = ""
	}
	failedAt := now.UnixMilli()
	firstFailedAt := failedAt
	if !dl.FirstFailedAt.IsZero() {
		firstFailedAt = min(max(dl.FirstFailedAt.UnixMilli(), 0), failedAt)
	}
	errText := errorText(dl.Err)
	if cfg.Redact != nil {
		errText = cfg.Redact.String(errText)
	}
	sqlstate := retry.SQLState(dl.Err)

	msg := Message{
		ProjectionName: dl.Projection,
		TenantSchema:   tenant,
		RetryCount:     dl.Retries,
		FirstFailedAt:  firstFailedAt,
		FailedAt:       failedAt,
	}
	verbatim := embedsVerbatim(dl)
	origLen := base64.StdEncoding.EncodedLen(len(src.Value))
	if verbatim {
		origLen = len(src.Value)
	}
	switch {
	case origLen >= cfg.MaxBytes:
		// It cannot fit (see below): not even encoded.
	case verbatim:
		msg.OriginalEvent = json.RawMessage(src.Value)
	default:
		msg.OriginalEvent = json.RawMessage("null")
		msg.OriginalValueBase64 = base64.StdEncoding.EncodeToString(src.Value)
	}

	headers := make([]kgo.RecordHeader, 0, len(src.Headers)+18)
	var originalTrace [2][]byte // traceparent, tracestate
	var foundTrace [2]bool
	for _, h := range src.Headers {
		if !copiedHeader(h) {
			continue
		}
		if i := traceHeader(h.Key); i >= 0 {
			if !foundTrace[i] { // the first, which propagators follow
				originalTrace[i], foundTrace[i] = h.Value, true
			}
			if len(dl.traceHeaders) > 0 {
				continue // replaced by the send span's
			}
		}
		headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	copied := len(headers) // the source's own headers, at the start
	headers = append(headers, dl.traceHeaders...)
	ts := int64(-1)
	if !src.Timestamp.IsZero() {
		ts = src.Timestamp.UnixMilli()
	}
	for _, h := range [...]struct{ k, v string }{
		{HeaderOriginalTopic, src.Topic},
		{HeaderOriginalPartition, strconv.FormatInt(int64(src.Partition), 10)},
		{HeaderOriginalOffset, strconv.FormatInt(src.Offset, 10)},
		{HeaderOriginalTimestamp, strconv.FormatInt(ts, 10)},
		{HeaderProjection, dl.Projection},
		{HeaderForkID, CapLabel(dl.ForkID)},
		{HeaderTenantSchema, tenant},
		{HeaderEventType, CapLabel(dl.EventType)},
		{HeaderErrorClass, dl.Class.String()},
		{HeaderSQLState, sqlstate},
		{HeaderFingerprint, dl.Fingerprint()},
		{HeaderWorker, cfg.Worker},
		{HeaderGeneration, cfg.Generation},
		{HeaderReplayCount, strconv.Itoa(dl.ReplayCount)},
	} {
		headers = append(headers, kgo.RecordHeader{Key: h.k, Value: []byte(h.v)})
	}
	if dl.ShortCircuit != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderShortCircuit, Value: []byte(dl.ShortCircuit)})
	}
	own := headers[copied:len(headers):len(headers)] // the dead letter's, without the source's
	for i, k := range [...]string{HeaderOriginalTraceparent, HeaderOriginalTracestate} {
		if originalTrace[i] != nil {
			headers = append(headers, kgo.RecordHeader{Key: k, Value: bytes.Clone(originalTrace[i])})
		}
	}

	rec := &kgo.Record{Topic: cfg.Topic, Timestamp: now}
	fullStack := stackTrace(dl.Err, dl.Stack)
	if cfg.Redact != nil {
		fullStack = cfg.Redact.String(fullStack)
	}

	// What does not fit is left out, the fewest parts first, in this
	// order: nothing, the value, the source's own headers, both, then the
	// key with each of those. Each part left out is named in a header with
	// its size and digest, and dlq-replayer reads it again from the
	// original topic. So no key, value or header is too large for a dead
	// letter: a record is never left undead-lettered for its size
	// (new-user trials: megabytes of headers, then a 5 MB key, held the
	// partition).
	withValue := msg
	var omittedValue, omittedHeaders, omittedKey []kgo.RecordHeader
	if len(src.Value) > 0 {
		sum := sha256.Sum256(src.Value)
		omittedValue = []kgo.RecordHeader{{Key: HeaderOriginalOmitted,
			Value: []byte("size=" + strconv.Itoa(len(src.Value)) + " sha256=" + hex.EncodeToString(sum[:]))}}
	}
	if len(own) < len(headers) {
		count, hsize, sum := HeadersDigest(src.Headers)
		omittedHeaders = []kgo.RecordHeader{{Key: HeaderOriginalHeadersOmitted,
			Value: []byte("count=" + strconv.Itoa(count) + " size=" + strconv.Itoa(hsize) + " sha256=" + sum)}}
	}
	if len(src.Key) > 0 {
		sum := sha256.Sum256(src.Key)
		omittedKey = []kgo.RecordHeader{{Key: HeaderOriginalKeyOmitted,
			Value: []byte("size=" + strconv.Itoa(len(src.Key)) + " sha256=" + hex.EncodeToString(sum[:]))}}
	}
	size := origLen
	for _, leave := range leaveOutOrder {
		switch {
		case leave&leaveValue == 0 && origLen >= cfg.MaxBytes, // it cannot fit: no encoding of megabytes to find out
			leave&leaveValue != 0 && omittedValue == nil,
			leave&leaveHeaders != 0 && omittedHeaders == nil,
			leave&leaveKey != 0 && omittedKey == nil:
			continue
		}
		m, hs := withValue, headers
		if leave&leaveHeaders != 0 {
			hs = own
		}
		rec.Key = src.Key
		if leave&leaveKey != 0 {
			rec.Key = nil
		}
		if leave&leaveValue != 0 {
			m.OriginalEvent, m.OriginalValueBase64 = json.RawMessage("null"), ""
			hs = slices.Concat(hs, omittedValue)
		}
		if leave&leaveHeaders != 0 {
			hs = slices.Concat(hs, omittedHeaders)
		}
		if leave&leaveKey != 0 {
			hs = slices.Concat(hs, omittedKey)
		}
		var err error
		if size, err = fit(rec, &m, hs, fullStack, errText, cfg.MaxBytes); err == nil {
			rec.Key = bytes.Clone(rec.Key)
			return rec, nil
		}
	}
	// What is left is the dead letter's own headers and the message's
	// fields: say their sizes.
	hb := 0
	for _, h := range own {
		hb += len(h.Key) + len(h.Value)
	}
	return nil, fmt.Errorf("dead letter for %s is %d bytes with stackTrace and error emptied and the original key, value and headers left out, over the limit of %d: the dead letter's %d headers (%d bytes) and the message's other fields do not fit: %w",
		sourceName(src), size, cfg.MaxBytes, len(own), hb, ErrTooLarge)
}

// maxLabelBytes bounds the event's forkId and eventType in the dead
// letter's headers: they come from the wire, and a dead letter must fit
// whatever they hold.
const maxLabelBytes = 256

// CapLabel returns s, or, when it is longer than maxLabelBytes (256), its
// first bytes (on a rune boundary) followed by "…[truncated N bytes]",
// within maxLabelBytes: for the labels of a dead letter that come from the
// wire (forkId, eventType, the causet.replay.projection header), so that
// the dead letter fits whatever they hold.
func CapLabel(s string) string {
	if len(s) <= maxLabelBytes {
		return s
	}
	return truncate(s, labelKeep)
}

// labelKeep is the bytes CapLabel keeps of a label, fewer (down to
// labelKeep-3) to end on a rune boundary: room for the longest marker.
const labelKeep = maxLabelBytes - len("…[truncated 1000000000 bytes]")

// The parts of the source record NewRecord may leave out of a dead letter.
const (
	leaveValue = 1 << iota
	leaveHeaders
	leaveKey
)

// leaveOutOrder is the order in which NewRecord tries to leave parts out:
// the fewest first, the key last.
var leaveOutOrder = []int{0, leaveValue, leaveHeaders, leaveHeaders | leaveValue,
	leaveKey, leaveKey | leaveValue, leaveKey | leaveHeaders, leaveKey | leaveHeaders | leaveValue}

// copiedHeader reports whether NewRecord copies the source record's header
// h into the dead letter: every header but causet.dlq.* ones (a replayed
// event that fails again gets them restated, not duplicated).
func copiedHeader(h kgo.RecordHeader) bool { return !strings.HasPrefix(h.Key, dlqHeaderPrefix) }

// HeadersDigest returns what header causet.dlq.original-headers-omitted
// says of a record's headers hs: the count and bytes (keys and values) of
// those a dead letter copies (every one but causet.dlq.* ones), and the
// lowercase hex SHA-256 of their encoding, for each in order: its key's
// length as an unsigned varint, the key, its value's length as an
// unsigned varint, the value.
func HeadersDigest(hs []kgo.RecordHeader) (count, size int, sha256Hex string) {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, hd := range hs {
		if !copiedHeader(hd) {
			continue
		}
		count++
		size += len(hd.Key) + len(hd.Value)
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(hd.Key)))])
		h.Write([]byte(hd.Key))
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(hd.Value)))])
		h.Write(hd.Value)
	}
	return count, size, hex.EncodeToString(h.Sum(nil))
}

// fit sets rec's value (msg with stackTrace and error) and headers
// (headers, plus causet.dlq.truncated when something was cut) so that rec
// encodes in at most maxBytes: it cuts stackTrace to a prefix followed by
// "…[truncated N bytes]", then to that marker alone, then to "", and only
// then does the same to error. It returns the last size and, when even
// that does not fit, an error.
func fit(rec *kgo.Record, msg *Message, headers []kgo.RecordHeader, stackTrace, errText string, maxBytes int) (int, error) {
	stack := cutter{full: stackTrace}
	errField := cutter{full: errText}
	size := 0
	// Each pass cuts at least the measured excess, so the loop ends within
	// a few passes per field; the bound only guards against a bug.
	for range 64 {
		msg.StackTrace, msg.Error = stack.value(), errField.value()
		rec.Value = msg.encode() // OriginalEvent checked by embedsVerbatim
		rec.Headers = headers
		if cut := truncatedFields(&stack, &errField); cut != "" {
			rec.Headers = append(headers[:len(headers):len(headers)], kgo.RecordHeader{Key: HeaderTruncated, Value: []byte(cut)})
		}
		size = recordSize(rec)
		if size <= maxBytes {
			return size, nil
		}
		if !stack.shrink(size-maxBytes) && !errField.shrink(size-maxBytes) {
			return size, errors.New("too large")
		}
	}
	return size, errors.New("could not fit")
}

// embedsVerbatim reports whether dl's source value goes into originalEvent
// as it is: what the caller learnt when it decoded the value
// (dl.ValueShape), else what jsonstrict reads.
func embedsVerbatim(dl DeadLetter) bool {
	switch dl.ValueShape {
	case ValueStrictObject:
		return true
	case ValueNotStrictObject:
		return false
	}
	return jsonstrict.IsObject(dl.Source.Value)
}

// traceHeader returns 0 for the W3C traceparent header key, 1 for
// tracestate, −1 for any other.
func traceHeader(key string) int {
	switch key {
	case "traceparent":
		return 0
	case "tracestate":
		return 1
	}
	return -1
}

// dlqHeaderPrefix is the prefix of the headers NewRecord writes.
const dlqHeaderPrefix = "causet.dlq."

// sourceName names a source record as topic[partition]@offset.
func sourceName(r *kgo.Record) string {
	return fmt.Sprintf("%s[%d]@%d", r.Topic, r.Partition, r.Offset)
}

// ValidSchemaName reports whether s matches ^[a-z_][a-z0-9_]{0,62}$: the
// tenant schemas a dead letter holds (NewRecord writes "" for another).
func ValidSchemaName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
