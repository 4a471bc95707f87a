package dlq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"

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

// NewRecord builds the dead-letter record for dl (SPEC §6), stamped with
// now (FailedAt and the record timestamp; pass time.Now()).
//
// The record has:
//
//   - Topic cfg.Topic (after WithDefaults) and Key the source record's key
//     (nil stays nil);
//   - Value the JSON of a Message: OriginalEvent is the source value byte
//     for byte when it is a JSON object that every strict JSON parser
//     reads (jq 1.6 included): valid UTF-8, valid JSON, an object (first
//     non-space byte '{'), no duplicate key at any level, no unpaired
//     UTF-16 surrogate escape, at most MaxOriginalEventDepth levels deep;
//     otherwise it is null and OriginalValueBase64 holds the value in
//     standard base64 ("" for an empty value or a tombstone). Either way
//     the dead letter parses with every strict parser. Error is, for a
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
//     replay-count and, only when something was cut, truncated.
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
// causet.dlq.truncated ("stackTrace" or "stackTrace,error"). If the record
// is still too large, it returns an error wrapping ErrTooLarge.
//
// It also returns an error when cfg is invalid, dl.Source or dl.Err is nil,
// dl.Retries or dl.ReplayCount is negative, or now is zero.
func NewRecord(dl DeadLetter, cfg RecordConfig, now time.Time) (*kgo.Record, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case dl.Source == nil:
		return nil, errors.New("dead letter has no source record")
	case dl.Err == nil:
		return nil, fmt.Errorf("dead letter for %s: no error", sourceName(dl.Source))
	case dl.Retries < 0:
		return nil, fmt.Errorf("dead letter for %s: negative retry count %d", sourceName(dl.Source), dl.Retries)
	case dl.ReplayCount < 0:
		return nil, fmt.Errorf("dead letter for %s: negative replay count %d", sourceName(dl.Source), dl.ReplayCount)
	case now.IsZero():
		return nil, fmt.Errorf("dead letter for %s: zero time", sourceName(dl.Source))
	}

	src := dl.Source
	tenant := dl.TenantSchema
	if !validSchemaName(tenant) {
		tenant = ""
	}
	failedAt := now.UnixMilli()
	firstFailedAt := failedAt
	if !dl.FirstFailedAt.IsZero() {
		firstFailedAt = min(max(dl.FirstFailedAt.UnixMilli(), 0), failedAt)
	}
	errText := errorText(dl.Err)
	sqlstate := retry.SQLState(dl.Err)

	msg := Message{
		ProjectionName: dl.Projection,
		TenantSchema:   tenant,
		RetryCount:     dl.Retries,
		FirstFailedAt:  firstFailedAt,
		FailedAt:       failedAt,
	}
	if isEventObject(src.Value) {
		msg.OriginalEvent = json.RawMessage(src.Value)
	} else {
		msg.OriginalEvent = json.RawMessage("null")
		msg.OriginalValueBase64 = base64.StdEncoding.EncodeToString(src.Value)
	}

	headers := make([]kgo.RecordHeader, 0, len(src.Headers)+15)
	for _, h := range src.Headers {
		if !strings.HasPrefix(h.Key, dlqHeaderPrefix) {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
		}
	}
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
		{HeaderForkID, dl.ForkID},
		{HeaderTenantSchema, tenant},
		{HeaderEventType, dl.EventType},
		{HeaderErrorClass, dl.Class.String()},
		{HeaderSQLState, sqlstate},
		{HeaderFingerprint, Fingerprint(dl.Projection, dl.Class, sqlstate, errText)},
		{HeaderWorker, cfg.Worker},
		{HeaderGeneration, cfg.Generation},
		{HeaderReplayCount, strconv.Itoa(dl.ReplayCount)},
	} {
		headers = append(headers, kgo.RecordHeader{Key: h.k, Value: []byte(h.v)})
	}
	if dl.ShortCircuit != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderShortCircuit, Value: []byte(dl.ShortCircuit)})
	}

	rec := &kgo.Record{
		Topic:     cfg.Topic,
		Key:       bytes.Clone(src.Key),
		Headers:   headers,
		Timestamp: now,
	}
	stack := cutter{full: stackTrace(dl.Err, dl.Stack)}
	errField := cutter{full: errText}
	// Each pass cuts at least the measured excess, so the loop ends within
	// a few passes per field; the bound only guards against a bug.
	for range 64 {
		msg.StackTrace, msg.Error = stack.value(), errField.value()
		rec.Value = msg.encode() // OriginalEvent checked by isEventObject
		rec.Headers = headers
		if cut := truncatedFields(&stack, &errField); cut != "" {
			rec.Headers = append(headers[:len(headers):len(headers)], kgo.RecordHeader{Key: HeaderTruncated, Value: []byte(cut)})
		}
		size := recordSize(rec)
		if size <= cfg.MaxBytes {
			return rec, nil
		}
		if !stack.shrink(size-cfg.MaxBytes) && !errField.shrink(size-cfg.MaxBytes) {
			return nil, fmt.Errorf("dead letter for %s is %d bytes with stackTrace and error emptied, over the limit of %d (original value %d bytes, never cut): %w",
				sourceName(src), size, cfg.MaxBytes, len(src.Value), ErrTooLarge)
		}
	}
	return nil, fmt.Errorf("dead letter for %s: could not fit %d bytes: %w", sourceName(src), cfg.MaxBytes, ErrTooLarge)
}

// dlqHeaderPrefix is the prefix of the headers NewRecord writes.
const dlqHeaderPrefix = "causet.dlq."

// sourceName names a source record as topic[partition]@offset.
func sourceName(r *kgo.Record) string {
	return fmt.Sprintf("%s[%d]@%d", r.Topic, r.Partition, r.Offset)
}

// validSchemaName reports whether s matches ^[a-z_][a-z0-9_]{0,62}$.
func validSchemaName(s string) bool {
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

// errorText is the Message.Error of err: a PostgreSQL error as PostgreSQL
// prints it, anything else as err.Error().
func errorText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Error()
	}
	return err.Error()
}

// stackTrace is the Message.StackTrace of err: the wrapped error chain,
// one level a line, indented two spaces per level and followed by its Go
// type ("apply x: ERROR: ... [*fmt.wrapError]"; the branches of an
// errors.Join or a multi-%w error in order); then, for the first
// *pgconn.PgError in the chain, its Detail, Hint, Where, SchemaName,
// TableName, ColumnName, DataTypeName and ConstraintName when set
// ("Detail: Key (id)=(5) already exists."); then "goroutine stack:" and
// stack when stack is not "". Sections are separated by a blank line.
func stackTrace(err error, stack string) string {
	var b strings.Builder
	writeChain(&b, err, 0)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		first := true
		for _, f := range [...]struct{ name, v string }{
			{"Detail", pgErr.Detail},
			{"Hint", pgErr.Hint},
			{"Where", pgErr.Where},
			{"Schema", pgErr.SchemaName},
			{"Table", pgErr.TableName},
			{"Column", pgErr.ColumnName},
			{"Data type", pgErr.DataTypeName},
			{"Constraint", pgErr.ConstraintName},
		} {
			if f.v == "" {
				continue
			}
			if first {
				b.WriteString("\n")
				first = false
			}
			fmt.Fprintf(&b, "\n%s: %s", f.name, f.v)
		}
	}
	if stack != "" {
		b.WriteString("\n\ngoroutine stack:\n")
		b.WriteString(stack)
	}
	return b.String()
}

// maxChainDepth bounds writeChain against a pathological Unwrap.
const maxChainDepth = 64

func writeChain(b *strings.Builder, err error, depth int) {
	if err == nil || depth >= maxChainDepth {
		return
	}
	if depth > 0 {
		b.WriteString("\n")
	}
	indent := strings.Repeat("  ", depth)
	b.WriteString(indent)
	// A multi-line message (errors.Join) keeps its indentation.
	b.WriteString(strings.ReplaceAll(err.Error(), "\n", "\n"+indent))
	fmt.Fprintf(b, " [%T]", err)
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		writeChain(b, u.Unwrap(), depth+1)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			writeChain(b, e, depth+1)
		}
	}
}

// isEventObject reports whether v can be embedded as originalEvent: a JSON
// object that every strict parser reads as the same document (SPEC §6).
// That is valid UTF-8, one valid JSON value that is an object, no
// duplicate key at any level (the schema's rule: an ambiguous object is
// kept as base64), no unpaired UTF-16 surrogate escape (jq 1.6 refuses
// "\ud800"; encoding/json silently reads it as U+FFFD) and at most
// MaxOriginalEventDepth levels of nesting. Numbers are not checked: JSON
// sets no range (RFC 8259 §6), jq reads 1e400, and readers keep them
// exact with json.Number.
func isEventObject(v []byte) bool {
	if !utf8.Valid(v) || !json.Valid(v) {
		return false
	}
	if t := bytes.TrimLeft(v, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return false
	}
	depth, unpaired := scanValidJSON(v)
	return !unpaired && depth <= MaxOriginalEventDepth && !hasDuplicateKeys(v)
}

// scanValidJSON returns the deepest nesting of objects and arrays in the
// valid JSON document v (0 for a scalar) and whether a string in it has an
// unpaired UTF-16 surrogate escape: a high one (\ud800-\udbff) not
// followed by an escaped low one (\udc00-\udfff), or a low one alone.
func scanValidJSON(v []byte) (depth int, unpaired bool) {
	level, inString := 0, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if inString {
			switch {
			case c == '"':
				inString = false
			case c == '\\' && v[i+1] != 'u':
				i++ // a one-character escape; it may be \" or \\
			case c == '\\':
				// v is valid JSON: \u is followed by four hex digits.
				r := hex4(v[i+2 : i+6])
				i += 5
				if r >= 0xdc00 && r <= 0xdfff {
					return depth, true
				}
				if r >= 0xd800 && r <= 0xdbff {
					if i+7 >= len(v) || v[i+1] != '\\' || v[i+2] != 'u' {
						return depth, true
					}
					if r2 := hex4(v[i+3 : i+7]); r2 < 0xdc00 || r2 > 0xdfff {
						return depth, true
					}
					i += 6
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			level++
			depth = max(depth, level)
		case '}', ']':
			level--
		}
	}
	return depth, false
}

// hex4 decodes four hex digits.
func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(n)
}

// hasDuplicateKeys reports whether the valid JSON document v has an object
// with the same key twice (after unescaping). Numbers are not decoded.
func hasDuplicateKeys(v []byte) bool {
	type frame struct {
		keys      map[string]struct{} // nil for an array
		expectKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return true // not reached for valid JSON; refuse to embed
		}
		top := len(stack) - 1
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, frame{keys: map[string]struct{}{}, expectKey: true})
			case '[':
				stack = append(stack, frame{})
			default:
				stack = stack[:top]
				if top > 0 && stack[top-1].keys != nil {
					stack[top-1].expectKey = true
				}
			}
			continue
		}
		if top < 0 || stack[top].keys == nil {
			continue
		}
		if stack[top].expectKey {
			k, _ := tok.(string)
			if _, dup := stack[top].keys[k]; dup {
				return true
			}
			stack[top].keys[k] = struct{}{}
			stack[top].expectKey = false
		} else {
			stack[top].expectKey = true
		}
	}
}

// recordSize is the size kgo counts for rec alone in a record batch, which
// is what it compares with ProducerBatchMaxBytes and what the broker
// compares with max.message.bytes (within kgo's 4 extra bytes): the batch
// framing plus the record's length-prefixed encoding.
func recordSize(rec *kgo.Record) int {
	l := 1 + // attributes
		kbin.VarlongLen(0) + // timestamp delta
		kbin.VarintLen(0) + // offset delta
		kbin.VarintLen(int32(len(rec.Key))) + len(rec.Key) +
		kbin.VarintLen(int32(len(rec.Value))) + len(rec.Value) +
		kbin.VarintLen(int32(len(rec.Headers)))
	for _, h := range rec.Headers {
		l += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) +
			kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + kbin.VarintLen(int32(l)) + l
}

// cutter shortens one message field step by step: whole, then a prefix
// with a marker, then the marker alone, then "".
type cutter struct {
	full  string
	keep  int  // bytes of full kept while cut
	cut   bool // a prefix (possibly empty) and the marker
	empty bool
}

func (c *cutter) value() string {
	switch {
	case c.empty:
		return ""
	case c.cut:
		return truncate(c.full, c.keep)
	}
	return c.full
}

// shrink cuts at least excess more bytes, reporting false when the field
// is already "" and nothing more can be cut.
func (c *cutter) shrink(excess int) bool {
	switch {
	case c.empty || c.full == "":
		return false
	case c.cut && c.keep == 0:
		c.empty = true
	case c.cut:
		c.keep = max(0, c.keep-excess)
	default:
		c.cut = true
		c.keep = max(0, len(c.full)-excess)
	}
	return true
}

// truncatedFields is the causet.dlq.truncated value: the names of the
// fields cut so far, or "".
func truncatedFields(stack, errField *cutter) string {
	var names []string
	if stack.cut || stack.empty {
		names = append(names, "stackTrace")
	}
	if errField.cut || errField.empty {
		names = append(names, "error")
	}
	return strings.Join(names, ",")
}

// truncate returns s cut to at most keep bytes on a rune boundary,
// followed by "…[truncated N bytes]" with N the number of bytes cut.
func truncate(s string, keep int) string {
	keep = max(0, min(keep, len(s)))
	for keep > 0 && keep < len(s) && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + "…[truncated " + strconv.Itoa(len(s)-keep) + " bytes]"
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
	b.WriteString(`{"originalEvent":`)
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
