package projection

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	segjson "github.com/segmentio/encoding/json"

	"github.com/causet/projection-worker/dlq"
)

// ValidationError reports a projection event that breaks the rules of SPEC §3.
// Retrying cannot change the record value, so it is permanent: retry.Classify
// reports retry.Permanent and the record is dead-lettered at once with
// retryCount 0.
type ValidationError struct {
	// Field is the JSON path of the offending field: "sequenceNumber",
	// "payload", "payload.items[2].id", `payload["a.b"]` for a key that is not
	// a plain name. It is "" when the whole record value is at fault (empty,
	// not JSON, not an object, invalid UTF-8).
	Field string
	// Reason says what is wrong, lowercase and without trailing punctuation,
	// for example `must be a JSON integer, got string "7"`.
	Reason string
	// EventType, ForkID and TenantSchema are what could still be read of an
	// event that is a JSON object but is refused ("" when absent, not a
	// string, a key that appears twice, a string with an unpaired surrogate
	// escape, or, for TenantSchema, not matching ^[a-z_][a-z0-9_]{0,62}$; a
	// name refused only as not a tenant, such as public, is kept), so that
	// its dead letter can still be found by tenant, fork and event type.
	EventType, ForkID, TenantSchema string
}

// Error returns "invalid event: <field>: <reason>", or "invalid event:
// <reason>" when Field is "".
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return "invalid event: " + e.Reason
	}
	return "invalid event: " + e.Field + ": " + e.Reason
}

// Permanent reports true: a validation failure is a permanent error
// (retry.PermanentError).
func (e *ValidationError) Permanent() bool { return true }

// Timestamp limits of PostgreSQL's timestamptz, in epoch milliseconds. They
// come from MIN_TIMESTAMP and END_TIMESTAMP in PostgreSQL's
// src/include/datatype/timestamp.h (-211813488000000000 and
// 9223371331200000000 µs since 2000-01-01, that is Julian day 0 =
// 4714-11-24 BC and 294277-01-01 AD), shifted by the 946684800000 ms between
// the Unix and PostgreSQL epochs. The lower bound is inclusive and the upper
// one exclusive, as in IS_VALID_TIMESTAMP.
const (
	// MinTimestampMillis is 4714-11-24 00:00:00 UTC BC (proleptic
	// Gregorian; 4713 BC in the Julian calendar), the first timestamptz.
	MinTimestampMillis int64 = -211813488000000000/1000 + 946684800000
	// EndTimestampMillis is 294277-01-01 00:00:00 UTC, the first instant
	// after the last timestamptz (294276-12-31 23:59:59.999999).
	EndTimestampMillis int64 = 9223371331200000000/1000 + 946684800000
)

// maxEventDepth is the deepest nesting of objects and arrays DecodeEvent
// accepts, the event object being level 1: what a dead letter embeds
// verbatim (dlq.MaxOriginalEventDepth, within every strict parser's limit),
// so that every accepted event can be dead-lettered and replayed as it is.
const maxEventDepth = dlq.MaxOriginalEventDepth

// maxParseDepth is where DecodeEvent stops reading a value as not JSON:
// encoding/json's own limit. Between maxEventDepth and it, the value is
// read on (so that its readable fields are kept) and refused.
const maxParseDepth = 10000

// unreadable stands, in a tree that is refused, for a value that cannot be
// read unambiguously: a string with an unpaired surrogate escape, or the
// value of a key that appears twice. It never reaches an Event.
type unreadable struct{}

// DecodeEvent decodes and validates one record value as a projection event
// (SPEC §3). The value is decoded once: the tree in Event.Fields is built and
// checked as the tokens are read, and the typed fields are taken from it.
//
// The value must be non-empty, valid UTF-8 and exactly one JSON object
// (whitespace around it is allowed) that every strict JSON parser reads as
// the same document, so that its dead letter can embed it verbatim (SPEC
// §6): no duplicate keys at any depth, no unpaired UTF-16 surrogate escapes
// (encoding/json would silently replace \ud800 by U+FFFD, jq 1.6 refuses it)
// and at most 126 levels of nesting (dlq.MaxOriginalEventDepth). In it:
//
//   - eventType, entityId and forkId are non-empty strings;
//   - irVersion is a string; it is required but may be "";
//   - tenantSchema is a string that satisfies ValidTenantSchema: it matches
//     ^[a-z_][a-z0-9_]{0,62}$ and is not one of PostgreSQL's own schemas
//     (public, information_schema, pg_*; see ReservedSchema);
//   - sequenceNumber is a JSON integer (no fraction, no exponent, not quoted)
//     ≥ 0 that fits int64;
//   - ts is a JSON integer of epoch milliseconds in PostgreSQL's timestamptz
//     range, [MinTimestampMillis, EndTimestampMillis); it is required (never
//     defaulted to 1970 or year 1);
//   - payload is a JSON object.
//
// Unknown fields are kept in Event.Fields. Numbers are json.Number holding
// their exact text; they are never converted to float64. The fields are
// checked in the order above and the first failure is returned as a
// *ValidationError, which retry.Classify reports as Permanent. A value that
// is not JSON is reported as such; otherwise the first duplicate key,
// unpaired surrogate escape or excess nesting met, if any, comes before the
// rules above. When the value is an object, the error carries the
// eventType, forkId and tenantSchema that can be read unambiguously
// (ValidationError.EventType, ...). Positions in
// "not valid JSON" and "not valid UTF-8" reasons count bytes from 1, like
// encoding/json's SyntaxError.Offset.
//
// Event.Raw is value itself, not a copy: the caller must not modify value
// afterwards. The strings in Event (including those inside Fields) share one
// copy of value, so keeping any of them keeps that copy alive; clone
// (strings.Clone) a string that must outlive the event.
//
// TenantSchemas.DecodeEvent narrows the accepted tenant schemas further.
func DecodeEvent(value []byte) (*Event, error) { return decodeEvent(value, nil) }

// decodeEvent is DecodeEvent with tenantSchema checked by tenants.Check.
func decodeEvent(value []byte, tenants *TenantSchemas) (*Event, error) {
	if len(value) == 0 {
		return nil, &ValidationError{Reason: "record value is empty (tombstone)"}
	}
	if !utf8.Valid(value) {
		return nil, invalidUTF8Error(value)
	}
	d := eventDecoder{src: value, str: string(value)}
	root, err := d.parse()
	if err != nil {
		return nil, err
	}
	m, isObject := root.(map[string]any)
	switch {
	case d.refused != nil:
		err = d.refused
	case !isObject:
		return nil, &ValidationError{Reason: "record value is " + describeJSONRoot(root) + ", want an object"}
	default:
		var ev *Event
		if ev, err = validateEvent(value, m, tenants); err == nil {
			return ev, nil
		}
	}
	if ve, ok := err.(*ValidationError); ok && isObject {
		ve.EventType, _ = m["eventType"].(string)
		ve.ForkID, _ = m["forkId"].(string)
		// A name refused only as not a tenant (public, pg_catalog) is kept:
		// it is what the event says, and a safe identifier.
		if ts, _ := m["tenantSchema"].(string); validIdentifier(ts) {
			ve.TenantSchema = ts
		}
	}
	return nil, err
}

func validateEvent(value []byte, m map[string]any, tenants *TenantSchemas) (*Event, error) {
	ev := &Event{Raw: value, Fields: m}
	var err error
	if ev.EventType, err = eventNonEmptyString(m, "eventType"); err != nil {
		return nil, err
	}
	if ev.EntityID, err = eventNonEmptyString(m, "entityId"); err != nil {
		return nil, err
	}
	if ev.ForkID, err = eventNonEmptyString(m, "forkId"); err != nil {
		return nil, err
	}
	if ev.TenantSchema, err = eventString(m, "tenantSchema"); err != nil {
		return nil, err
	}
	if err := tenants.Check(ev.TenantSchema); err != nil {
		return nil, err
	}
	if ev.IRVersion, err = eventString(m, "irVersion"); err != nil {
		return nil, err
	}

	n, err := eventInteger(m, "sequenceNumber")
	if err != nil {
		return nil, err
	}
	if len(n) > 0 && n[0] == '-' && n != "-0" {
		return nil, &ValidationError{Field: "sequenceNumber", Reason: "must be >= 0, got " + shortenValue(string(n))}
	}
	if ev.SequenceNumber, err = strconv.ParseInt(string(n), 10, 64); err != nil {
		return nil, &ValidationError{Field: "sequenceNumber", Reason: "must fit in int64, got " + shortenValue(string(n))}
	}

	if n, err = eventInteger(m, "ts"); err != nil {
		return nil, err
	}
	ts, perr := strconv.ParseInt(string(n), 10, 64)
	if perr != nil || ts < MinTimestampMillis || ts >= EndTimestampMillis {
		return nil, &ValidationError{Field: "ts", Reason: "must be in PostgreSQL's timestamptz range (4713 BC to 294276 AD: " +
			strconv.FormatInt(MinTimestampMillis, 10) + " <= ts < " + strconv.FormatInt(EndTimestampMillis, 10) +
			" epoch ms), got " + shortenValue(string(n))}
	}
	ev.TS = ts

	p, ok := m["payload"]
	if !ok {
		return nil, &ValidationError{Field: "payload", Reason: "is required"}
	}
	if ev.Payload, ok = p.(map[string]any); !ok {
		return nil, &ValidationError{Field: "payload", Reason: "must be a JSON object, got " + describeJSON(p)}
	}
	return ev, nil
}

func eventString(m map[string]any, field string) (string, error) {
	v, ok := m[field]
	if !ok {
		return "", &ValidationError{Field: field, Reason: "is required"}
	}
	s, ok := v.(string)
	if !ok {
		return "", &ValidationError{Field: field, Reason: "must be a string, got " + describeJSON(v)}
	}
	return s, nil
}

func eventNonEmptyString(m map[string]any, field string) (string, error) {
	s, err := eventString(m, field)
	if err == nil && s == "" {
		err = &ValidationError{Field: field, Reason: "must not be empty"}
	}
	return s, err
}

// eventInteger returns the text of m[field] when it is a JSON number
// without fraction or exponent.
func eventInteger(m map[string]any, field string) (json.Number, error) {
	v, ok := m[field]
	if !ok {
		return "", &ValidationError{Field: field, Reason: "is required"}
	}
	n, ok := v.(json.Number)
	if ok {
		for i := 0; i < len(n); i++ {
			if c := n[i]; c == '.' || c == 'e' || c == 'E' {
				ok = false
				break
			}
		}
	}
	if !ok {
		reason := "must be a JSON integer, got " + describeJSON(v)
		if field == "ts" {
			reason = "must be a JSON integer (epoch ms), got " + describeJSON(v)
		}
		return "", &ValidationError{Field: field, Reason: reason}
	}
	return n, nil
}

// describeJSON names the JSON type of v with a short rendering of its value,
// for "got ..." in a reason.
func describeJSON(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "string " + quoteValue(v)
	case json.Number:
		return "number " + shortenValue(string(v))
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown value"
}

func describeJSONRoot(v any) string {
	switch v.(type) {
	case nil:
		return "JSON null"
	case []any:
		return "a JSON array"
	case string:
		return "a JSON string"
	case json.Number:
		return "a JSON number"
	case bool:
		return "a JSON boolean"
	}
	return "not an object"
}

// maxValueEcho bounds how much of a wire value a reason repeats.
const maxValueEcho = 64

// shortenValue returns s, or its first maxValueEcho bytes (cut at a rune
// boundary) followed by "... (N bytes)".
func shortenValue(s string) string {
	if len(s) <= maxValueEcho {
		return s
	}
	return truncateValue(s) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// quoteValue returns s quoted as a Go string, cut like shortenValue.
func quoteValue(s string) string {
	if len(s) <= maxValueEcho {
		return strconv.Quote(s)
	}
	return strconv.Quote(truncateValue(s)) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

func truncateValue(s string) string {
	cut := maxValueEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func invalidUTF8Error(value []byte) error {
	i := 0
	for i < len(value) {
		r, size := utf8.DecodeRune(value[i:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		i += size
	}
	return &ValidationError{Reason: "record value is not valid UTF-8: invalid byte 0x" +
		strconv.FormatUint(uint64(value[i]), 16) + " at byte " + strconv.Itoa(i+1)}
}

// Parser states: what the next token may be.
const (
	decWantValue      = iota // a value: at the top, after ':', after ',' in an array
	decWantValueOrEnd        // a value or ']': after '['
	decWantKeyOrEnd          // a key or '}': after '{'
	decWantKey               // a key: after ',' in an object
	decWantColon             // ':' after a key
	decWantCommaOrEnd        // ',' or the container's end, after a member
	decWantEOF               // nothing: the top-level value is complete
)

// jsonFrame is an object or array under construction.
type jsonFrame struct {
	obj map[string]any // nil for an array
	arr []any
	key string // object: the key of the member being parsed
	dup bool   // object: key appeared before in it
}

// eventDecoder builds the tree of one record value from segmentio's tokenizer,
// which lexes tokens but does not check the grammar between them: that is the
// state machine in parse.
type eventDecoder struct {
	src []byte
	str string // string(src): tokens are sliced from it without allocating
	tok segjson.Tokenizer
	// refused is the first reason the value, although JSON, is refused:
	// a duplicate key, an unpaired surrogate escape, nesting deeper than
	// maxEventDepth. The parse goes on past it, so that the fields that
	// can be read are kept for the dead letter.
	refused *ValidationError
}

// refuse records e unless a reason was recorded before.
func (d *eventDecoder) refuse(e *ValidationError) {
	if d.refused == nil {
		d.refused = e
	}
}

func (d *eventDecoder) parse() (any, error) {
	d.tok.Reset(d.src)
	defer d.tok.Reset(nil) // returns the tokenizer's stack to its pool
	// stack holds the open containers, outermost first. It is a local
	// variable (not a field) so that its first eight frames stay on the
	// goroutine stack.
	stack := make([]jsonFrame, 0, 8)
	var root any
	state := decWantValue
	for {
		if !d.tok.Next() {
			if d.tok.Err != nil || state != decWantEOF {
				return nil, d.syntaxError()
			}
			return root, nil
		}
		if state == decWantEOF {
			return nil, d.syntaxError()
		}
		var v any
		switch d.tok.Delim {
		case '{', '[':
			if state != decWantValue && state != decWantValueOrEnd {
				return nil, d.syntaxError()
			}
			if len(stack) == maxParseDepth {
				return nil, d.syntaxError()
			}
			if len(stack) == maxEventDepth {
				d.refuse(&ValidationError{Field: jsonPath(stack[:1], true), Reason: "nests deeper than " + strconv.Itoa(maxEventDepth) +
					" levels (what every strict JSON parser reads inside a dead letter) at byte " + strconv.Itoa(len(d.src)-d.tok.Remaining())})
			}
			if d.tok.Delim == '{' {
				n := 0
				if len(stack) == 0 {
					n = 8 // the event's own fields
				}
				stack = append(stack, jsonFrame{obj: make(map[string]any, n)})
				state = decWantKeyOrEnd
			} else {
				stack = append(stack, jsonFrame{arr: make([]any, 0)})
				state = decWantValueOrEnd
			}
			continue
		case '}', ']':
			top := len(stack) - 1
			if top < 0 || (d.tok.Delim == '}') != (stack[top].obj != nil) {
				return nil, d.syntaxError()
			}
			if state != decWantCommaOrEnd && state != decWantKeyOrEnd && state != decWantValueOrEnd {
				return nil, d.syntaxError()
			}
			if f := stack[top]; f.obj != nil {
				v = f.obj
			} else {
				v = f.arr
			}
			stack[top] = jsonFrame{}
			stack = stack[:top]
		case ':':
			if state != decWantColon {
				return nil, d.syntaxError()
			}
			state = decWantValue
			continue
		case ',':
			if state != decWantCommaOrEnd {
				return nil, d.syntaxError()
			}
			if stack[len(stack)-1].obj != nil {
				state = decWantKey
			} else {
				state = decWantValue
			}
			continue
		case 0:
			raw := d.tok.Value
			off := len(d.src) - d.tok.Remaining() - len(raw)
			if state == decWantKeyOrEnd || state == decWantKey {
				if raw[0] != '"' {
					return nil, d.syntaxError()
				}
				key, _ := d.unquote(stack, off, raw, false)
				f := &stack[len(stack)-1]
				_, f.dup = f.obj[key]
				if f.dup {
					parent := jsonPath(stack, false)
					reason := "duplicate key " + quoteValue(key)
					if parent != "" {
						reason += " in " + parent
					}
					d.refuse(&ValidationError{Field: string(appendPathKey([]byte(parent), key)), Reason: reason})
				}
				f.key = key
				state = decWantColon
				continue
			}
			if state != decWantValue && state != decWantValueOrEnd {
				return nil, d.syntaxError()
			}
			switch raw[0] {
			case '"':
				if s, ok := d.unquote(stack, off, raw, true); ok {
					v = s
				} else {
					v = unreadable{}
				}
			case 'n':
				v = nil
			case 't':
				v = true
			case 'f':
				v = false
			default:
				v = json.Number(d.str[off : off+len(raw)])
			}
		default:
			return nil, d.syntaxError()
		}

		// v is a complete value: a scalar or a closed container.
		if len(stack) == 0 {
			root = v
			state = decWantEOF
			continue
		}
		f := &stack[len(stack)-1]
		if f.obj != nil && f.dup {
			f.obj[f.key] = unreadable{} // neither value is the one
		} else if f.obj != nil {
			f.obj[f.key] = v
		} else {
			f.arr = append(f.arr, v)
		}
		state = decWantCommaOrEnd
	}
}

// unquote returns the string that the string token raw at byte offset off
// stands for, and true. For an unpaired UTF-16 surrogate escape it records
// the refusal (d.refuse) and returns false, with U+FFFD in its place.
// isValue tells whether raw is a value (its path ends in its key or index)
// or a key (its path is its object's).
func (d *eventDecoder) unquote(stack []jsonFrame, off int, raw []byte, isValue bool) (string, bool) {
	inner := raw[1 : len(raw)-1]
	if d.tok.Kind() == segjson.Unescaped || bytes.IndexByte(inner, '\\') < 0 {
		return d.str[off+1 : off+len(raw)-1], true
	}
	// The tokenizer has checked the escapes' syntax: a backslash is followed
	// by one of "\/bfnrtu, and \u by four hex digits.
	buf := make([]byte, 0, len(inner))
	ok := true
	for i := 0; i < len(inner); {
		c := inner[i]
		if c != '\\' {
			buf = append(buf, c)
			i++
			continue
		}
		switch e := inner[i+1]; e {
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r := parseHex4(inner[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+6 <= len(inner) && inner[i] == '\\' && inner[i+1] == 'u' {
					if r2 := parseHex4(inner[i+2:]); r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
						i += 6
						buf = utf8.AppendRune(buf, r)
						continue
					}
				}
				d.refuse(&ValidationError{Field: jsonPath(stack, isValue), Reason: "unpaired UTF-16 surrogate escape \\u" +
					string(inner[i-4:i]) + " in a string at byte " + strconv.Itoa(off+1+i-5)})
				ok = false
				buf = utf8.AppendRune(buf, utf8.RuneError)
				continue
			}
			buf = utf8.AppendRune(buf, r)
			continue
		default: // '"', '\\', '/'
			buf = append(buf, e)
		}
		i += 2
	}
	return string(buf), ok
}

// parseHex4 decodes the four hex digits at the start of b.
func parseHex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// jsonPath returns the JSON path of the position being parsed, given the open
// containers: of the member or element in progress when withLast, else of the
// innermost open container.
func jsonPath(stack []jsonFrame, withLast bool) string {
	var b []byte
	n := len(stack)
	if !withLast {
		n--
	}
	for i := range n {
		f := &stack[i]
		if f.obj != nil {
			b = appendPathKey(b, f.key)
		} else {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(len(f.arr)), 10)
			b = append(b, ']')
		}
	}
	return string(b)
}

// appendPathKey appends key to the path b: ".key" (no dot at the start) for a
// plain name, else `["key"]`.
func appendPathKey(b []byte, key string) []byte {
	plain := key != ""
	for i := 0; i < len(key) && plain; i++ {
		c := key[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !plain {
		b = append(b, '[')
		b = strconv.AppendQuote(b, key)
		return append(b, ']')
	}
	if len(b) > 0 {
		b = append(b, '.')
	}
	return append(b, key...)
}

// syntaxError describes why the value is not JSON. The parse stops at the
// first error; the standard library then re-reads the value (only on this
// cold path) for its familiar message and position.
func (d *eventDecoder) syntaxError() error {
	var se *json.SyntaxError
	var discard json.RawMessage
	if err := json.Unmarshal(d.src, &discard); errors.As(err, &se) {
		return &ValidationError{Reason: "not valid JSON: " + se.Error() + " at byte " + strconv.FormatInt(se.Offset, 10)}
	}
	// Not reached for valid UTF-8 input unless the tokenizer and
	// encoding/json disagree; the fuzz test guards that.
	pos := len(d.src) - d.tok.Remaining()
	return &ValidationError{Reason: "not valid JSON at byte " + strconv.Itoa(pos)}
}
