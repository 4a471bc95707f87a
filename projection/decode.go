package projection

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/causet/projection-worker/internal/jsonstrict"
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
	// StrictObject reports that the value itself is a JSON object every
	// strict JSON parser reads, only its fields breaking the rules (a
	// missing ts, sequenceNumber "7", a refused tenant schema): its dead
	// letter embeds it verbatim in originalEvent (dlq.ValueStrictObject).
	// It is false for a value that is empty, not valid UTF-8, not JSON,
	// not an object, or that strict parsers may read differently (a
	// duplicate key, an unpaired surrogate escape, excess nesting).
	StrictObject bool
	// group is what the dead letters of the failure group by, when Reason's
	// words vary with the bytes (FingerprintText); "" for Reason itself.
	group string
}

// FingerprintText returns what the dead letters of e group by
// (dlq.FingerprintTexter): "invalid event: not valid JSON" for a record
// value that is not JSON, whatever the parser says of where and why (new-user
// trial: two values that were not JSON gave two fingerprints, so no one
// --fingerprint selected them all); "invalid event: <path>: unpaired UTF-16
// surrogate escape in a string" for an unpaired surrogate escape, whichever
// escape it is and wherever in the string; "" (the error's text) otherwise.
func (e *ValidationError) FingerprintText() string {
	if e.group == "" {
		return ""
	}
	return "invalid event: " + e.group
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
const maxEventDepth = jsonstrict.MaxDepth

// DecodeEvent decodes and validates one record value as a projection event
// (SPEC §3). The value is decoded once: its tree (Event.Fields) is built and
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
// Unknown fields are kept (Event.Fields). Numbers are json.Number holding
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
// A nil value (a Kafka tombstone) and an empty, non-null one are refused
// with different reasons, so a dead letter tells them apart.
//
// TenantSchemas.DecodeEvent narrows the accepted tenant schemas further.
func DecodeEvent(value []byte) (*Event, error) { return decodeEvent(value, nil, nil, nil) }

// decodeEvent is DecodeEvent with tenantSchema checked by tenants.Check.
// With a slab (shared), the event's strings are spans of value itself
// and its tree's nodes are the slab's (NodeSlab.ParseTreeShared), save
// its event type and tenant schema, which are copies: the worker keeps
// those (metric labels, the SQL text of each tenant schema, the event
// types no projection handles), and a span would keep the whole fetched
// batch that value is part of. Those copies are taken from kept when it
// has them (nil: copied each time).
func decodeEvent(value []byte, tenants *TenantSchemas, slab *jsonstrict.NodeSlab, kept *keptStrings) (ev *Event, err error) {
	shared := slab != nil
	if shared {
		defer func() { detachKept(ev, err, kept) }()
	}
	if value == nil {
		return nil, &ValidationError{Reason: "record value is a Kafka tombstone (null), want an object"}
	}
	if len(value) == 0 {
		return nil, &ValidationError{Reason: "record value is empty (0 bytes, not a tombstone), want an object"}
	}
	var t *jsonstrict.Tree
	if shared {
		t, err = slab.ParseTreeShared(value)
	} else {
		t, err = jsonstrict.ParseTree(value)
	}
	isObject := t != nil && t.Nodes[0].Kind == jsonstrict.ObjectNode
	switch err := err.(type) {
	case nil:
	case *jsonstrict.Refusal:
		return nil, refusedError(err, t)
	case *jsonstrict.UTF8Error:
		return nil, &ValidationError{Reason: "record value is " + err.Error()}
	default: // *jsonstrict.SyntaxError
		if bytes.HasPrefix(value, utf8BOM) {
			// Said, rather than "invalid character 'ï'" (new-user trial).
			return nil, &ValidationError{Reason: "record value starts with a UTF-8 byte order mark (EF BB BF), which JSON text must not (RFC 8259 §8.1): " + err.Error(),
				group: "record value starts with a UTF-8 byte order mark"}
		}
		return nil, &ValidationError{Reason: err.Error(), group: "not valid JSON"}
	}
	if !isObject {
		return nil, &ValidationError{Reason: "record value is " + describeJSONRoot(t.Nodes[0].Kind) + ", want an object"}
	}
	ev, err = validateEvent(value, t, tenants)
	if ve, ok := err.(*ValidationError); ok {
		ve.StrictObject = true
		keepReadable(ve, t)
	}
	return ev, err
}

// detachKept copies the strings of ev, or of err when it is a
// *ValidationError, that the worker keeps beyond the record (decodeEvent's
// shared): the event type and tenant schema (kept's copies), and the
// fields of a dead letter's error (its metric labels take the tenant
// schema).
func detachKept(ev *Event, err error, kept *keptStrings) {
	if ev != nil {
		ev.EventType, ev.TenantSchema = kept.clone(ev.EventType), kept.clone(ev.TenantSchema)
	}
	if ve, ok := err.(*ValidationError); ok {
		ve.EventType, ve.ForkID, ve.TenantSchema = strings.Clone(ve.EventType), strings.Clone(ve.ForkID), strings.Clone(ve.TenantSchema)
		ve.Field, ve.Reason, ve.group = strings.Clone(ve.Field), strings.Clone(ve.Reason), strings.Clone(ve.group)
	}
}

// keptStrings hands out one copy of each event type and tenant schema that
// the records of a partition repeat (decodeEvent's kept), instead of a copy
// per record. It holds at most maxKeptStrings strings, and starts anew when
// full (a stream of ever new ones costs what copies would). The zero
// keptStrings is ready; a nil one copies each time. It is not safe for
// concurrent use.
type keptStrings struct{ m map[string]string }

// maxKeptStrings bounds a keptStrings: 1024 strings of at most 63 bytes
// (a tenant schema) or of an event type.
const maxKeptStrings = 1024

// clone returns a copy of s that shares no memory with s: k's, when it has
// one.
func (k *keptStrings) clone(s string) string {
	if k == nil {
		return strings.Clone(s)
	}
	if c, ok := k.m[s]; ok {
		return c
	}
	if k.m == nil || len(k.m) >= maxKeptStrings {
		k.m = make(map[string]string, 64)
	}
	c := strings.Clone(s)
	k.m[c] = c
	return c
}

// detachedTo returns a copy of ev that shares no memory with the fetched
// batch or the NodeSlab its record was decoded from (decodeRecord shares
// both): raw, a copy of ev.Raw, is its value, which its tree reads from,
// the tree's nodes are copied and its strings cloned. A record waiting
// for a retry so keeps about its own bytes alive, not a slab of 1024
// nodes and a fetched batch each (a run with 1 % of the pairs retried
// peaked at 1.1 GiB where it had 0.25).
func (ev *Event) detachedTo(raw []byte) *Event {
	c := *ev
	c.Raw = raw
	c.EntityID, c.ForkID, c.IRVersion = strings.Clone(ev.EntityID), strings.Clone(ev.ForkID), strings.Clone(ev.IRVersion)
	if ev.tree != nil {
		c.tree = ev.tree.Detached(unsafe.String(unsafe.SliceData(raw), len(raw)))
	}
	return &c
}

// utf8BOM is the UTF-8 byte order mark.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// refusedError is the *ValidationError of a value that is JSON but that
// strict JSON parsers would not all read as one document, with what can be
// read of it (keepReadable).
func refusedError(r *jsonstrict.Refusal, t *jsonstrict.Tree) *ValidationError {
	ve := &ValidationError{Field: r.Path}
	switch r.Kind {
	case jsonstrict.DuplicateKey:
		ve.Reason = "duplicate key " + quoteValue(r.Key)
		if r.Object != "" {
			ve.Reason += " in " + r.Object
		}
	case jsonstrict.UnpairedSurrogate:
		ve.Reason = "unpaired UTF-16 surrogate escape " + r.Escape + " in a string at byte " + strconv.Itoa(r.Offset)
		// The escape is the data's (\ud800 ... \udfff): the dead letters
		// group by the field and the rule (FingerprintText; new-user
		// trial: \ud800 and \udc00 at one path gave two fingerprints).
		ve.group = "unpaired UTF-16 surrogate escape in a string"
		if r.Path != "" {
			ve.group = r.Path + ": " + ve.group
		}
	default: // jsonstrict.TooDeep
		ve.Reason = "nests deeper than " + strconv.Itoa(maxEventDepth) +
			" levels (what every strict JSON parser reads inside a dead letter) at byte " + strconv.Itoa(r.Offset)
	}
	keepReadable(ve, t)
	return ve
}

// keepReadable sets ve's EventType, ForkID and TenantSchema from the event
// tree t where they are strings.
func keepReadable(ve *ValidationError, t *jsonstrict.Tree) {
	ve.EventType = rootString(t, "eventType")
	ve.ForkID = rootString(t, "forkId")
	// A name refused only as not a tenant (public, pg_catalog) is kept:
	// it is what the event says, and a safe identifier.
	if ts := rootString(t, "tenantSchema"); validIdentifier(ts) {
		ve.TenantSchema = ts
	}
}

// rootString returns the member field of the object t when it is a
// string, else "".
func rootString(t *jsonstrict.Tree, field string) string {
	if i, ok := t.Member(0, field); ok && t.Nodes[i].Kind == jsonstrict.StringNode {
		return t.Text(i)
	}
	return ""
}

// eventMembers are the nodes of the members of SPEC §3 in an event tree,
// 0 for a member that is absent (node 0 is the event object itself).
type eventMembers struct {
	eventType, entityID, forkID, tenantSchema, irVersion, sequenceNumber, ts, payload int32
}

// findMembers finds the members of SPEC §3 among the event object's
// members, in one pass.
func findMembers(t *jsonstrict.Tree) eventMembers {
	var m eventMembers
	for j, k := int32(1), int32(0); k < t.Nodes[0].Len; j, k = t.Nodes[j].End, k+1 {
		var p *int32
		switch t.Key(j) {
		case "eventType":
			p = &m.eventType
		case "entityId":
			p = &m.entityID
		case "forkId":
			p = &m.forkID
		case "tenantSchema":
			p = &m.tenantSchema
		case "irVersion":
			p = &m.irVersion
		case "sequenceNumber":
			p = &m.sequenceNumber
		case "ts":
			p = &m.ts
		case "payload":
			p = &m.payload
		default:
			continue
		}
		if *p == 0 { // the first, as Tree.Member
			*p = j
		}
	}
	return m
}

func validateEvent(value []byte, t *jsonstrict.Tree, tenants *TenantSchemas) (*Event, error) {
	ev := &Event{Raw: value, tree: t}
	m := findMembers(t)
	var err error
	if ev.EventType, err = eventNonEmptyString(t, m.eventType, "eventType"); err != nil {
		return nil, err
	}
	if ev.EntityID, err = eventNonEmptyString(t, m.entityID, "entityId"); err != nil {
		return nil, err
	}
	if ev.ForkID, err = eventNonEmptyString(t, m.forkID, "forkId"); err != nil {
		return nil, err
	}
	if ev.TenantSchema, err = eventString(t, m.tenantSchema, "tenantSchema"); err != nil {
		return nil, err
	}
	if err := tenants.Check(ev.TenantSchema); err != nil {
		return nil, err
	}
	if ev.IRVersion, err = eventString(t, m.irVersion, "irVersion"); err != nil {
		return nil, err
	}

	n, err := eventInteger(t, m.sequenceNumber, "sequenceNumber")
	if err != nil {
		return nil, err
	}
	if len(n) > 0 && n[0] == '-' && n != "-0" {
		return nil, &ValidationError{Field: "sequenceNumber", Reason: "must be >= 0, got " + shortenValue(n)}
	}
	if ev.SequenceNumber, err = strconv.ParseInt(n, 10, 64); err != nil {
		return nil, &ValidationError{Field: "sequenceNumber", Reason: "must fit in int64, got " + shortenValue(n)}
	}

	if n, err = eventInteger(t, m.ts, "ts"); err != nil {
		return nil, err
	}
	ts, perr := strconv.ParseInt(n, 10, 64)
	if perr != nil || ts < MinTimestampMillis || ts >= EndTimestampMillis {
		return nil, &ValidationError{Field: "ts", Reason: "must be in PostgreSQL's timestamptz range (4713 BC to 294276 AD: " +
			strconv.FormatInt(MinTimestampMillis, 10) + " <= ts < " + strconv.FormatInt(EndTimestampMillis, 10) +
			" epoch ms), got " + shortenValue(n)}
	}
	ev.TS = ts

	if m.payload == 0 {
		return nil, missingField(t, "payload")
	}
	if t.Nodes[m.payload].Kind != jsonstrict.ObjectNode {
		return nil, &ValidationError{Field: "payload", Reason: "must be a JSON object, got " + describeNode(t, m.payload)}
	}
	ev.payload = m.payload
	return ev, nil
}

func eventString(t *jsonstrict.Tree, i int32, field string) (string, error) {
	if i == 0 {
		return "", missingField(t, field)
	}
	if t.Nodes[i].Kind != jsonstrict.StringNode {
		return "", &ValidationError{Field: field, Reason: "must be a string, got " + describeNode(t, i)}
	}
	return t.Text(i), nil
}

// missingField is the error of the event t without its field: "is
// required", and, when the event has a member that differs from it only in
// case, '_' or '-' (tenant_schema, EventType), which one: ` (the event has
// "tenant_schema": did you mean tenantSchema?)` (new-user trial: an event
// in snake_case was told only that tenantSchema is required).
func missingField(t *jsonstrict.Tree, field string) *ValidationError {
	reason := "is required"
	want := looseName(field)
	for j, k := int32(1), int32(0); k < t.Nodes[0].Len; j, k = t.Nodes[j].End, k+1 {
		if key := t.Key(j); len(key) <= 2*len(field) && looseName(key) == want {
			reason += " (the event has " + strconv.Quote(key) + ": did you mean " + field + "?)"
			break
		}
	}
	return &ValidationError{Field: field, Reason: reason}
}

// looseName is name in lower case without '_' and '-'.
func looseName(name string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(name))
}

func eventNonEmptyString(t *jsonstrict.Tree, i int32, field string) (string, error) {
	s, err := eventString(t, i, field)
	if err == nil && s == "" {
		err = &ValidationError{Field: field, Reason: "must not be empty"}
	}
	return s, err
}

// eventInteger returns the text of node i, member field of the event, when
// it is a JSON number without fraction or exponent.
func eventInteger(t *jsonstrict.Tree, i int32, field string) (string, error) {
	if i == 0 {
		return "", missingField(t, field)
	}
	n := t.Text(i)
	ok := t.Nodes[i].Kind == jsonstrict.NumberNode
	if ok {
		for i := 0; i < len(n); i++ {
			if c := n[i]; c == '.' || c == 'e' || c == 'E' {
				ok = false
				break
			}
		}
	}
	if !ok {
		reason := "must be a JSON integer, got " + describeNode(t, i)
		if field == "ts" {
			reason = "must be a JSON integer (epoch ms), got " + describeNode(t, i)
		}
		return "", &ValidationError{Field: field, Reason: reason}
	}
	return n, nil
}

// describeNode is describeJSON of node i of t, without building a
// container's tree.
func describeNode(t *jsonstrict.Tree, i int32) string {
	switch t.Nodes[i].Kind {
	case jsonstrict.ObjectNode:
		return "object"
	case jsonstrict.ArrayNode:
		return "array"
	}
	return describeJSON(t.Any(i))
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

// describeJSONRoot names the JSON type of a record value that is not an
// object, for "record value is ...".
func describeJSONRoot(k jsonstrict.NodeKind) string {
	switch k {
	case jsonstrict.NullNode:
		return "JSON null"
	case jsonstrict.ArrayNode:
		return "a JSON array"
	case jsonstrict.StringNode:
		return "a JSON string"
	case jsonstrict.NumberNode:
		return "a JSON number"
	case jsonstrict.TrueNode, jsonstrict.FalseNode:
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
