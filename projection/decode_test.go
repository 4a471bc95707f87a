package projection

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/retry"
	"github.com/causet/projection-worker/schemas"
)

var eventSchema = sync.OnceValues(schemas.NewValidator)

// checkEventSchema fails t unless value, which DecodeEvent accepted, is valid
// against the published event schema (schemas/projection-event.v1): the
// decoder must never be more lenient than the contract given to producers.
func checkEventSchema(t *testing.T, value []byte) {
	t.Helper()
	v, err := eventSchema()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.ValidateEvent(value); err != nil {
		t.Fatalf("DecodeEvent accepted %q, which the event schema refuses: %v", value, err)
	}
}

// specExample is the event of SPEC §3.
const specExampleEvent = `{
  "eventType": "ARTIST_FOLLOWED",
  "entityId": "user-123",
  "forkId": "production",
  "tenantSchema": "acme_concertapp_production",
  "irVersion": "v42",
  "sequenceNumber": 1891,
  "ts": 1719331200000,
  "payload": { "user_id": "user-123", "artist_id": "artist-456" }
}`

// event returns a valid event with the top-level members replaced by
// overrides (raw JSON text; "" removes the member).
func testEventJSON(overrides map[string]string) string {
	members := []struct{ k, v string }{
		{"eventType", `"ARTIST_FOLLOWED"`},
		{"entityId", `"user-123"`},
		{"forkId", `"production"`},
		{"tenantSchema", `"acme_concertapp_production"`},
		{"irVersion", `"v42"`},
		{"sequenceNumber", `1891`},
		{"ts", `1719331200000`},
		{"payload", `{"user_id":"user-123","artist_id":"artist-456"}`},
	}
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for _, m := range members {
		v := m.v
		if o, ok := overrides[m.k]; ok {
			v = o
		}
		if v == "" {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Quote(m.k) + ":" + v)
	}
	b.WriteByte('}')
	return b.String()
}

func TestDecodeEventSpecExample(t *testing.T) {
	ev, err := DecodeEvent([]byte(specExampleEvent))
	if err != nil {
		t.Fatal(err)
	}
	checkEventSchema(t, ev.Raw)
	payload := map[string]any{"user_id": "user-123", "artist_id": "artist-456"}
	want := &Event{
		Raw:            []byte(specExampleEvent),
		EventType:      "ARTIST_FOLLOWED",
		EntityID:       "user-123",
		ForkID:         "production",
		TenantSchema:   "acme_concertapp_production",
		IRVersion:      "v42",
		SequenceNumber: 1891,
		TS:             1719331200000,
	}
	if diff := cmp.Diff(want, ev, cmpopts.IgnoreUnexported(Event{})); diff != "" {
		t.Errorf("DecodeEvent(spec example) mismatch (-want +got):\n%s", diff)
	}
	wantFields := map[string]any{
		"eventType":      "ARTIST_FOLLOWED",
		"entityId":       "user-123",
		"forkId":         "production",
		"tenantSchema":   "acme_concertapp_production",
		"irVersion":      "v42",
		"sequenceNumber": json.Number("1891"),
		"ts":             json.Number("1719331200000"),
		"payload":        payload,
	}
	if diff := cmp.Diff(wantFields, ev.Fields()); diff != "" {
		t.Errorf("Fields() mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(payload, ev.Payload()); diff != "" {
		t.Errorf("Payload() mismatch (-want +got):\n%s", diff)
	}
}

// TestDecodeRecordSharesTheValueSaveWhatTheWorkerKeeps: the worker's
// decode of a record value (decodeRecord) reads the event DecodeEvent
// reads, with its strings in the value's own memory (no copy of it),
// except the event type and tenant schema, which the worker keeps beyond
// the record (metric labels, the SQL text of each tenant schema, the
// event types no projection handles) and which would keep the whole
// fetched batch alive.
func TestDecodeRecordSharesTheValueSaveWhatTheWorkerKeeps(t *testing.T) {
	value := []byte(specExampleEvent)
	want, err := DecodeEvent(value)
	if err != nil {
		t.Fatal(err)
	}
	var tenants *TenantSchemas
	ev, err := tenants.decodeRecord(value, &jsonstrict.NodeSlab{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, ev, cmpopts.IgnoreUnexported(Event{})); diff != "" {
		t.Errorf("decodeRecord mismatch (-DecodeEvent +decodeRecord):\n%s", diff)
	}
	if diff := cmp.Diff(want.Fields(), ev.Fields()); diff != "" {
		t.Errorf("Fields() mismatch (-DecodeEvent +decodeRecord):\n%s", diff)
	}
	inValue := func(s string) bool {
		p, start := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(value)))
		return p >= start && p < start+uintptr(len(value))
	}
	for _, s := range []struct{ name, s string }{{"entityId", ev.EntityID}, {"forkId", ev.ForkID}, {"payload.user_id", ev.Payload()["user_id"].(string)}} {
		if !inValue(s.s) {
			t.Errorf("%s %q is a copy, want a span of the record value", s.name, s.s)
		}
	}
	for _, s := range []struct{ name, s string }{{"eventType", ev.EventType}, {"tenantSchema", ev.TenantSchema}} {
		if inValue(s.s) {
			t.Errorf("%s %q is a span of the record value, want a copy (the worker keeps it)", s.name, s.s)
		}
	}
	for _, s := range []struct{ name, s string }{{"entityId", want.EntityID}, {"payload.user_id", want.Payload()["user_id"].(string)}} {
		if inValue(s.s) {
			t.Errorf("DecodeEvent: %s %q is a span of the value, want a copy (its caller may reuse the value)", s.name, s.s)
		}
	}
}

// TestDetachedRecordSharesNoMemoryWithItsBatch: a record waiting for a
// retry is detached (settle), so that it keeps neither the fetched batch
// its value shares nor its batch's NodeSlab alive. With both written over
// after the detach (as a later fetch and batch reuse nothing, but would
// the garbage collector free them), the detached event still reads as it
// did and plans the same statement, and none of its strings or nodes is
// in the old memory. Before the fix the detached event's tree read the
// fetched batch and the slab, and a run with 1 % of the pairs retried
// peaked at 1.1 GiB.
func TestDetachedRecordSharesNoMemoryWithItsBatch(t *testing.T) {
	fetched := []byte(strings.Repeat(" ", 100) + specExampleEvent + strings.Repeat(" ", 100))
	value := fetched[100 : 100+len(specExampleEvent)]
	var slab jsonstrict.NodeSlab
	var tenants *TenantSchemas
	ev, err := tenants.decodeRecord(value, &slab, &keptStrings{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := DecodeEvent([]byte(specExampleEvent))
	if err != nil {
		t.Fatal(err)
	}
	tps := hotProjections(t, hotDefinitions[1].path) // the examples: artist_followers handles ARTIST_FOLLOWED
	wantStmt, err := tps[0].Plan(want)
	if err != nil {
		t.Fatal(err)
	}
	d := detach(&decoded{rec: &kgo.Record{Value: value, Key: []byte("user-123")}, ev: ev})
	oldNodes := ev.tree.Nodes
	inOld := func(p, start unsafe.Pointer, n uintptr) bool {
		return uintptr(p) >= uintptr(start) && uintptr(p) < uintptr(start)+n
	}
	for _, s := range []struct{ name, s string }{{"raw", string(d.ev.Raw)}, {"entityId", d.ev.EntityID}, {"forkId", d.ev.ForkID},
		{"irVersion", d.ev.IRVersion}, {"payload.user_id", d.ev.Payload()["user_id"].(string)},
		{"eventType", d.ev.EventType}, {"tenantSchema", d.ev.TenantSchema}} {
		if s.s != "" && inOld(unsafe.Pointer(unsafe.StringData(s.s)), unsafe.Pointer(&fetched[0]), uintptr(len(fetched))) {
			t.Errorf("detached %s %q is in the fetched batch", s.name, s.s)
		}
	}
	if inOld(unsafe.Pointer(&d.ev.tree.Nodes[0]), unsafe.Pointer(&oldNodes[0]), uintptr(len(oldNodes))*unsafe.Sizeof(oldNodes[0])) {
		t.Error("the detached tree's nodes are the slab's")
	}
	for i := range fetched {
		fetched[i] = 'x'
	}
	clear(oldNodes)
	if diff := cmp.Diff(want, d.ev, cmpopts.IgnoreUnexported(Event{})); diff != "" {
		t.Errorf("detached event after its batch was written over (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Fields(), d.ev.Fields()); diff != "" {
		t.Errorf("detached Fields() after its batch was written over (-want +got):\n%s", diff)
	}
	st, err := tps[0].Plan(d.ev)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantStmt, st); diff != "" {
		t.Errorf("detached event plans another statement (-want +got):\n%s", diff)
	}
}

func TestDecodeEventKeepsUnknownFieldsAndExactValues(t *testing.T) {
	in := testEventJSON(map[string]string{
		"payload": `{"big": 9007199254740993, "dec": 12345678901234567890.123456789, "neg": -0.5e-7,
			"nested": {"list": [1, "two", true, false, null, {"x": []}, {}]},
			"esc": "tab\there \"q\" \\ \/ \u00e9 \ud83d\ude00 \u2028", "utf8": "zoë 😀"}`,
	})
	in = in[:len(in)-1] + `, "traceId": "abc", "extra": {"n": 1.0}, "flag": false}`
	ev, err := DecodeEvent([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"unknown string field", ev.Fields()["traceId"], "abc"},
		{"unknown object field", ev.Fields()["extra"], map[string]any{"n": json.Number("1.0")}},
		{"unknown boolean field", ev.Fields()["flag"], false},
		{"integer beyond float64 precision", ev.Payload()["big"], json.Number("9007199254740993")},
		{"long decimal", ev.Payload()["dec"], json.Number("12345678901234567890.123456789")},
		{"exponent", ev.Payload()["neg"], json.Number("-0.5e-7")},
		{"nested", ev.Payload()["nested"], map[string]any{"list": []any{
			json.Number("1"), "two", true, false, nil, map[string]any{"x": []any{}}, map[string]any{},
		}}},
		{"escapes", ev.Payload()["esc"], "tab\there \"q\" \\ / é 😀 \u2028"},
		{"raw UTF-8", ev.Payload()["utf8"], "zoë 😀"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeEventAccepts(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		check func(*Event) bool
	}{
		{"empty irVersion", testEventJSON(map[string]string{"irVersion": `""`}), func(e *Event) bool { return e.IRVersion == "" }},
		{"sequence number 0", testEventJSON(map[string]string{"sequenceNumber": `0`}), func(e *Event) bool { return e.SequenceNumber == 0 }},
		{"sequence number -0", testEventJSON(map[string]string{"sequenceNumber": `-0`}), func(e *Event) bool { return e.SequenceNumber == 0 }},
		{"max int64 sequence number", testEventJSON(map[string]string{"sequenceNumber": `9223372036854775807`}),
			func(e *Event) bool { return e.SequenceNumber == 1<<63-1 }},
		{"ts at the first timestamptz", testEventJSON(map[string]string{"ts": `-210866803200000`}),
			func(e *Event) bool { return e.TS == MinTimestampMillis }},
		{"ts at the last timestamptz", testEventJSON(map[string]string{"ts": `9224318015999999`}),
			func(e *Event) bool { return e.TS == EndTimestampMillis-1 }},
		{"negative ts before 1970", testEventJSON(map[string]string{"ts": `-1`}), func(e *Event) bool { return e.TS == -1 }},
		{"tenant schema of 63 bytes", testEventJSON(map[string]string{"tenantSchema": strconv.Quote("_" + strings.Repeat("a9", 31))}),
			func(e *Event) bool { return len(e.TenantSchema) == 63 }},
		{"whitespace around the object", " \t\r\n" + testEventJSON(nil) + "\n", func(e *Event) bool { return e.EventType == "ARTIST_FOLLOWED" }},
		{"escaped key", strings.Replace(testEventJSON(nil), `"eventType"`, `"event\u0054ype"`, 1),
			func(e *Event) bool { return e.EventType == "ARTIST_FOLLOWED" }},
		{"escaped tenant schema", testEventJSON(map[string]string{"tenantSchema": `"a\u005fb"`}), func(e *Event) bool { return e.TenantSchema == "a_b" }},
		{"deep nesting within the limit", testEventJSON(map[string]string{"payload": `{"a":` + strings.Repeat("[", maxEventDepth-2) + strings.Repeat("]", maxEventDepth-2) + `}`}),
			func(e *Event) bool { return e.Payload()["a"] != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(tt.in))
			if err != nil {
				t.Fatalf("DecodeEvent: %v", err)
			}
			if !tt.check(ev) {
				t.Errorf("unexpected event %+v", ev)
			}
			checkEventSchema(t, ev.Raw)
			checkDeadLetterVerbatim(t, ev.Raw)
		})
	}
}

func TestDecodeEventRejects(t *testing.T) {
	dupIn := func(where string) string {
		return strings.Replace(testEventJSON(nil), `"user_id":"user-123"`, where, 1)
	}
	tests := []struct {
		name       string
		in         string
		field      string
		wantReason string // substring of the reason
	}{
		{"empty value, not a tombstone", ``, "", "record value is empty (0 bytes, not a tombstone), want an object"},
		{"null", `null`, "", "record value is JSON null, want an object"},
		{"null with whitespace", " null\n", "", "record value is JSON null, want an object"},
		{"array", `[]`, "", "record value is a JSON array, want an object"},
		{"string", `"str"`, "", "record value is a JSON string, want an object"},
		{"number", `42`, "", "record value is a JSON number, want an object"},
		{"boolean", `true`, "", "record value is a JSON boolean, want an object"},
		{"garbage", `garbage`, "", "not valid JSON: invalid character 'g' looking for beginning of value at byte 1"},
		{"only whitespace", "  \n", "", "not valid JSON: unexpected end of JSON input"},
		{"truncated", specExampleEvent[:len(specExampleEvent)/2], "", "not valid JSON: unexpected end of JSON input"},
		{"truncated after key", `{"eventType"`, "", "not valid JSON: unexpected end of JSON input"},
		{"trailing object", `{}{}`, "", "not valid JSON: invalid character '{' after top-level value at byte 3"},
		{"trailing garbage", testEventJSON(nil) + `x`, "", "not valid JSON: invalid character 'x' after top-level value"},
		{"trailing comma in object", `{"a":1,}`, "", "not valid JSON"},
		{"trailing comma in array", `{"a":[1,]}`, "", "not valid JSON"},
		{"missing colon", `{"a" 1}`, "", "not valid JSON"},
		{"missing comma", `{"a":1 "b":2}`, "", "not valid JSON"},
		{"missing comma in array", `{"a":[1 2]}`, "", "not valid JSON"},
		{"leading zero", `{"a":01}`, "", "not valid JSON"},
		{"non-string key", `{1:2}`, "", "not valid JSON"},
		{"colon in array", `{"a":[1:2]}`, "", "not valid JSON"},
		{"mismatched brackets", `{"a":[}`, "", "not valid JSON"},
		{"bad escape", `{"a":"\x"}`, "", "not valid JSON"},
		{"raw control character", "{\"a\":\"\t\"}", "", "not valid JSON"},
		{"single quotes", `{'a':1}`, "", "not valid JSON"},
		{"NaN", `{"a":NaN}`, "", "not valid JSON"},
		{"plus sign", `{"a":+1}`, "", "not valid JSON"},
		{"byte order mark", "\ufeff" + testEventJSON(nil), "", "record value starts with a UTF-8 byte order mark (EF BB BF), which JSON text must not (RFC 8259 §8.1): not valid JSON"},
		{"too deep for a dead letter", `{"a":` + strings.Repeat("[", maxEventDepth) + strings.Repeat("]", maxEventDepth) + `}`, "a",
			"nests deeper than 126 levels (what every strict JSON parser reads inside a dead letter) at byte 131"},
		{"too deep for encoding/json", `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`, "", "not valid JSON: invalid character '[' exceeded max depth at byte 10005"},
		{"invalid UTF-8 in a string", strings.Replace(testEventJSON(nil), "user-123", "user-\xff", 1), "",
			"record value is not valid UTF-8: invalid byte 0xff at byte 49"},
		{"invalid UTF-8 outside strings", "\xc3" + testEventJSON(nil), "", "record value is not valid UTF-8"},
		{"UTF-8 encoded surrogate", strings.Replace(testEventJSON(nil), "user-123", "\xed\xa0\x80", 1), "", "record value is not valid UTF-8"},
		{"unpaired high surrogate escape", testEventJSON(map[string]string{"payload": `{"name":"a\ud800b"}`}), "payload.name",
			`unpaired UTF-16 surrogate escape \ud800`},
		{"unpaired low surrogate escape", testEventJSON(map[string]string{"payload": `{"l":["ok","\udc00"]}`}), "payload.l[1]",
			`unpaired UTF-16 surrogate escape \udc00`},
		{"high surrogate followed by a non-surrogate", testEventJSON(map[string]string{"entityId": `"\ud83d\u0041"`}), "entityId",
			`unpaired UTF-16 surrogate escape \ud83d`},
		{"unpaired surrogate in a key", testEventJSON(map[string]string{"payload": `{"\udfff":1}`}), "payload",
			`unpaired UTF-16 surrogate escape \udfff`},

		{"duplicate key at top level", strings.Replace(testEventJSON(nil), `{`, `{"eventType":"OTHER",`, 1), "eventType", `duplicate key "eventType"`},
		{"duplicate unknown key at top level", `{"a":1,"a":1}`, "a", `duplicate key "a"`},
		{"duplicate key in payload", dupIn(`"user_id":"user-123","user_id":"user-124"`), "payload.user_id",
			`duplicate key "user_id" in payload`},
		{"duplicate key in an object in an array", dupIn(`"items":[{"a":1},{"a":1,"b":2,"a":3}]`), "payload.items[1].a",
			`duplicate key "a" in payload.items[1]`},
		{"duplicate key spelled with an escape", dupIn(`"k":1,"\u006b":2`), "payload.k", `duplicate key "k" in payload`},
		{"duplicate key that is not a plain name", dupIn(`"a.b":1,"a.b":2`), `payload["a.b"]`, `duplicate key "a.b" in payload`},

		{"missing eventType", testEventJSON(map[string]string{"eventType": ""}), "eventType", "is required"},
		{"empty eventType", testEventJSON(map[string]string{"eventType": `""`}), "eventType", "must not be empty"},
		{"null eventType", testEventJSON(map[string]string{"eventType": `null`}), "eventType", "must be a string, got null"},
		{"numeric eventType", testEventJSON(map[string]string{"eventType": `7`}), "eventType", "must be a string, got number 7"},
		{"missing entityId", testEventJSON(map[string]string{"entityId": ""}), "entityId", "is required"},
		{"empty entityId", testEventJSON(map[string]string{"entityId": `""`}), "entityId", "must not be empty"},
		{"object entityId", testEventJSON(map[string]string{"entityId": `{}`}), "entityId", "must be a string, got object"},
		{"missing forkId", testEventJSON(map[string]string{"forkId": ""}), "forkId", "is required"},
		{"empty forkId", testEventJSON(map[string]string{"forkId": `""`}), "forkId", "must not be empty"},
		{"missing irVersion", testEventJSON(map[string]string{"irVersion": ""}), "irVersion", "is required"},
		{"numeric irVersion", testEventJSON(map[string]string{"irVersion": `42`}), "irVersion", "must be a string, got number 42"},

		{"missing tenantSchema", testEventJSON(map[string]string{"tenantSchema": ""}), "tenantSchema", "is required"},
		{"SQL injection in tenantSchema", testEventJSON(map[string]string{"tenantSchema": `"tenant_a\"; DROP TABLE x; --"`}), "tenantSchema",
			`must match ^[a-z_][a-z0-9_]{0,62}$ (a lowercase PostgreSQL identifier), got "tenant_a\"; DROP TABLE x; --"`},
		{"uppercase tenantSchema", testEventJSON(map[string]string{"tenantSchema": `"Acme"`}), "tenantSchema", `got "Acme"`},
		{"tenantSchema starting with a digit", testEventJSON(map[string]string{"tenantSchema": `"1acme"`}), "tenantSchema", `got "1acme"`},
		{"empty tenantSchema", testEventJSON(map[string]string{"tenantSchema": `""`}), "tenantSchema", `got ""`},
		{"tenantSchema of 64 bytes", testEventJSON(map[string]string{"tenantSchema": strconv.Quote(strings.Repeat("a", 64))}), "tenantSchema",
			"must be at most 63 bytes (a PostgreSQL identifier), got 64"},
		{"non-ASCII tenantSchema", testEventJSON(map[string]string{"tenantSchema": `"zoë"`}), "tenantSchema", `got "zoë"`},
		{"numeric tenantSchema", testEventJSON(map[string]string{"tenantSchema": `1`}), "tenantSchema", "must be a string, got number 1"},
		{"tenantSchema public", testEventJSON(map[string]string{"tenantSchema": `"public"`}), "tenantSchema",
			`must name a tenant, not one of PostgreSQL's own schemas (public, information_schema, pg_*), got "public"`},
		{"tenantSchema pg_catalog", testEventJSON(map[string]string{"tenantSchema": `"pg_catalog"`}), "tenantSchema", `got "pg_catalog"`},
		{"tenantSchema pg_toast", testEventJSON(map[string]string{"tenantSchema": `"pg_toast"`}), "tenantSchema", `got "pg_toast"`},
		{"tenantSchema pg_temp_3", testEventJSON(map[string]string{"tenantSchema": `"pg_temp_3"`}), "tenantSchema", `got "pg_temp_3"`},
		{"tenantSchema pg_toast_temp_1", testEventJSON(map[string]string{"tenantSchema": `"pg_toast_temp_1"`}), "tenantSchema", `got "pg_toast_temp_1"`},
		{"tenantSchema information_schema", testEventJSON(map[string]string{"tenantSchema": `"information_schema"`}), "tenantSchema", `got "information_schema"`},
		{"tenantSchema pg_ spelled with an escape", testEventJSON(map[string]string{"tenantSchema": `"pg\u005fcatalog"`}), "tenantSchema", `got "pg_catalog"`},

		{"missing sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": ""}), "sequenceNumber", "is required"},
		{"quoted sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": `"7"`}), "sequenceNumber",
			`must be a JSON integer, got string "7"`},
		{"fractional sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": `7.5`}), "sequenceNumber",
			"must be a JSON integer, got number 7.5"},
		{"sequenceNumber with a zero fraction", testEventJSON(map[string]string{"sequenceNumber": `7.0`}), "sequenceNumber",
			"must be a JSON integer, got number 7.0"},
		{"sequenceNumber with an exponent", testEventJSON(map[string]string{"sequenceNumber": `7e2`}), "sequenceNumber",
			"must be a JSON integer, got number 7e2"},
		{"negative sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": `-1`}), "sequenceNumber", "must be >= 0, got -1"},
		{"sequenceNumber beyond int64", testEventJSON(map[string]string{"sequenceNumber": `9223372036854775808`}), "sequenceNumber",
			"must fit in int64, got 9223372036854775808"},
		{"huge sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": strings.Repeat("9", 100)}), "sequenceNumber",
			"must fit in int64, got " + strings.Repeat("9", 64) + "... (100 bytes)"},
		{"null sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": `null`}), "sequenceNumber", "must be a JSON integer, got null"},

		{"missing ts", testEventJSON(map[string]string{"ts": ""}), "ts", "is required"},
		{"quoted ts", testEventJSON(map[string]string{"ts": `"123"`}), "ts", `must be a JSON integer (epoch ms), got string "123"`},
		{"RFC 3339 ts", testEventJSON(map[string]string{"ts": `"2024-06-25T16:00:00Z"`}), "ts", `got string "2024-06-25T16:00:00Z"`},
		{"fractional ts", testEventJSON(map[string]string{"ts": `1.5`}), "ts", "must be a JSON integer (epoch ms), got number 1.5"},
		{"ts with an exponent", testEventJSON(map[string]string{"ts": `1.7e12`}), "ts", "got number 1.7e12"},
		{"ts after 294276 AD", testEventJSON(map[string]string{"ts": `9224318016000000`}), "ts",
			"must be in PostgreSQL's timestamptz range (4713 BC to 294276 AD: -210866803200000 <= ts < 9224318016000000 epoch ms), got 9224318016000000"},
		{"ts before 4713 BC", testEventJSON(map[string]string{"ts": `-210866803200001`}), "ts", "got -210866803200001"},
		{"ts beyond int64", testEventJSON(map[string]string{"ts": `99999999999999999999`}), "ts", "got 99999999999999999999"},
		{"null ts", testEventJSON(map[string]string{"ts": `null`}), "ts", "must be a JSON integer (epoch ms), got null"},

		{"missing payload", testEventJSON(map[string]string{"payload": ""}), "payload", "is required"},
		{"array payload", testEventJSON(map[string]string{"payload": `[]`}), "payload", "must be a JSON object, got array"},
		{"null payload", testEventJSON(map[string]string{"payload": `null`}), "payload", "must be a JSON object, got null"},
		{"string payload", testEventJSON(map[string]string{"payload": `"{}"`}), "payload", `must be a JSON object, got string "{}"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(tt.in))
			if err == nil {
				t.Fatalf("DecodeEvent accepted %q: %+v", tt.in, ev)
			}
			if ev != nil {
				t.Errorf("DecodeEvent returned an event with the error %v", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
			}
			if ve.Field != tt.field {
				t.Errorf("Field = %q, want %q (error %v)", ve.Field, tt.field, err)
			}
			if !strings.Contains(ve.Reason, tt.wantReason) {
				t.Errorf("Reason = %q, want it to contain %q", ve.Reason, tt.wantReason)
			}
			if got := retry.Classify(err); got != retry.Permanent {
				t.Errorf("retry.Classify = %v, want permanent", got)
			}
			if msg := err.Error(); strings.HasSuffix(msg, ".") || !strings.HasPrefix(msg, "invalid event: "+tt.field) {
				t.Errorf("Error() = %q, want it to start with %q and not end with a period", msg, "invalid event: "+tt.field)
			}
		})
	}
}

func TestValidationErrorMessage(t *testing.T) {
	_, err := DecodeEvent([]byte(testEventJSON(map[string]string{"sequenceNumber": `"7"`})))
	if got, want := err.Error(), `invalid event: sequenceNumber: must be a JSON integer, got string "7"`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// A tombstone (null value) and an empty value read differently.
	_, err = DecodeEvent(nil)
	if got, want := err.Error(), `invalid event: record value is a Kafka tombstone (null), want an object`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	_, err = DecodeEvent([]byte{})
	if got, want := err.Error(), `invalid event: record value is empty (0 bytes, not a tombstone), want an object`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestValidTenantSchema(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"acme_concertapp_production", true},
		{"a", true},
		{"_", true},
		{"_1", true},
		{"a1_b2", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"1a", false},
		{"Acme", false},
		{"acme-prod", false},
		{"acme prod", false},
		{"a$", false},
		{`tenant_a"; DROP TABLE x; --`, false},
		{"zoë", false},
		{"a\x00", false},
		{"public", false},
		{"information_schema", false},
		{"pg_catalog", false},
		{"pg_toast", false},
		{"pg_temp_1", false},
		{"pg_", false},
		{"pg", true},
		{"pgx_tenant", true},
		{"public_tenant", true},
		{"acme_pg_", true},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.s), func(t *testing.T) {
			if got := ValidTenantSchema(tt.s); got != tt.want {
				t.Errorf("ValidTenantSchema(%q) = %v, want %v", tt.s, got, tt.want)
			}
		})
	}
}

func TestTimestampBoundsMatchPostgres(t *testing.T) {
	// 4714-11-24 BC 00:00 UTC (proleptic Gregorian, year -4713 in ISO 8601)
	// and 294277-01-01 00:00 UTC: PostgreSQL's MIN_TIMESTAMP and
	// END_TIMESTAMP.
	if got := rfc3339OfMillis(MinTimestampMillis); got != "-4713-11-24T00:00:00Z" {
		t.Errorf("MinTimestampMillis is %s", got)
	}
	if got := rfc3339OfMillis(EndTimestampMillis); got != "294277-01-01T00:00:00Z" {
		t.Errorf("EndTimestampMillis is %s", got)
	}
}

func rfc3339OfMillis(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }

func BenchmarkDecodeEvent(b *testing.B) {
	value := []byte(specExampleEvent)
	b.ReportAllocs()
	b.SetBytes(int64(len(value)))
	for b.Loop() {
		if _, err := DecodeEvent(value); err != nil {
			b.Fatal(err)
		}
	}
}

func TestTenantSchemas(t *testing.T) {
	tests := []struct {
		pattern, schema string
		wantReason      string // "" when accepted
	}{
		{"", "acme_prod", ""},
		{"", "public", `must name a tenant, not one of PostgreSQL's own schemas (public, information_schema, pg_*), got "public"`},
		{"acme_[a-z0-9_]+", "acme_prod", ""},
		{"acme_[a-z0-9_]+", "acme_", `must match the tenant schema pattern "acme_[a-z0-9_]+" (the whole name), got "acme_"`},
		{"acme_[a-z0-9_]+", "old_acme_prod", `got "old_acme_prod"`},
		{"acme_[a-z0-9_]+", "acme_prod_x", ""},
		{"acme|beta", "acme", ""},
		{"acme|beta", "acmebeta", `got "acmebeta"`},
		{"acme_prod", "acme_production", `got "acme_production"`},
		{".*", "pg_catalog", `must name a tenant, not one of PostgreSQL's own schemas (public, information_schema, pg_*), got "pg_catalog"`},
		{".*", "Acme", `must match ^[a-z_][a-z0-9_]{0,62}$`},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.schema, func(t *testing.T) {
			ts, err := NewTenantSchemas(tt.pattern)
			if err != nil {
				t.Fatal(err)
			}
			if got := ts.Pattern(); got != tt.pattern {
				t.Errorf("Pattern() = %q, want %q", got, tt.pattern)
			}
			in := testEventJSON(map[string]string{"tenantSchema": strconv.Quote(tt.schema)})
			ev, err := ts.DecodeEvent([]byte(in))
			checkErr := ts.Check(tt.schema)
			if tt.wantReason == "" {
				if err != nil || checkErr != nil || ev.TenantSchema != tt.schema {
					t.Errorf("DecodeEvent = %v, Check = %v; want %q accepted", err, checkErr, tt.schema)
				}
				return
			}
			for _, err := range []error{err, checkErr} {
				var ve *ValidationError
				if !errors.As(err, &ve) || ve.Field != "tenantSchema" || !strings.Contains(ve.Reason, tt.wantReason) {
					t.Errorf("error = %v, want a *ValidationError for tenantSchema with %q", err, tt.wantReason)
				}
				if !retry.IsPermanent(err) {
					t.Errorf("error %v is not permanent", err)
				}
			}
		})
	}
	for _, bad := range []string{"(", "[z-a]", "a**", `\`} {
		if ts, err := NewTenantSchemas(bad); err == nil {
			t.Errorf("NewTenantSchemas(%q) = %+v, want an error", bad, ts)
		} else if strings.Contains(err.Error(), "(?:") {
			t.Errorf("NewTenantSchemas(%q): error %q shows the anchoring, not the operator's pattern", bad, err)
		}
	}
	// Patterns that match no valid tenant schema are refused (new-user
	// trial: accepted, then every event was dead-lettered); patterns it
	// cannot judge by their literal prefix, or that match one, are not.
	for pattern, want := range map[string]string{
		"public":             `the only name it matches is "public"`,
		"information_schema": `the only name it matches is "information_schema"`,
		"pg_.*":              `every name it matches starts with "pg_"`,
		"ACME_.*":            `every name it matches starts with "ACME_"`,
		"acme-.*":            `every name it matches starts with "acme-"`,
		"a{1000}":            `the only name it matches is "aaaa`,
		"x{63}y.*":           `every name it matches starts with "xxxx`,
		"1acme":              `not a valid identifier`,
		// No literal prefix to judge by: the search over every valid name
		// (second new-user trial: each was accepted).
		`public|pg_.*`:                "no name that matches",
		`(?i)pg_.*`:                   "no name that matches",
		`(?i)PUBLIC`:                  "no name that matches",
		`[A-Z]+`:                      "no name that matches",
		`acme_[A-Z]+`:                 "no name that matches",
		`acme_[[:upper:]]+`:           "no name that matches",
		`acme_[^a-z0-9_]+`:            "no name that matches",
		`acme_\s`:                     "no name that matches",
		`acme_.*-`:                    "no name that matches",
		`[0-9].*`:                     "no name that matches",
		`.{64,}`:                      "no name that matches",
		`a{0}`:                        "no name that matches",
		`()`:                          "no name that matches",
		`$^`:                          "no name that matches",
		`\b`:                          "no name that matches",
		`[^\x00-\x{10FFFF}]`:          "no name that matches",
		`(public|information_schema)`: "no name that matches",
	} {
		ts, err := NewTenantSchemas(pattern)
		if !errors.Is(err, ErrNoTenantSchema) || !strings.Contains(err.Error(), want) {
			t.Errorf("NewTenantSchemas(%q) = %+v, %v; want ErrNoTenantSchema saying %s", pattern, ts, err, want)
		}
	}
	for _, pattern := range []string{"acme_[a-z0-9_]+", "(?i)ACME_.*", "acme|pg_x", "a{63}", "acme_prod", "pg.*", `acme_\d+`,
		`(acme|beta)_[a-z]+`, `^acme_.*$`, `\Aacme_.*\z`, "pgx_.*", "public_.*", "public.+", "information_schema.+", `acme_\w+`, "_.*", ".*",
		`a\Bb`, `(?i)publicx`, `x{62}y`} {
		if _, err := NewTenantSchemas(pattern); err != nil {
			t.Errorf("NewTenantSchemas(%q): %v, want it accepted", pattern, err)
		}
	}
}

// TestDecodeEventKeepsWhatIsReadableOfAValueStrictParsersRefuse: an event
// refused because strict JSON parsers would not read it as one document (an
// unpaired surrogate escape, a duplicate key, nesting deeper than a dead
// letter may embed) still yields the tenant schema, fork and event type
// that can be read unambiguously, so that its dead letter can be found.
func TestDecodeEventKeepsWhatIsReadableOfAValueStrictParsersRefuse(t *testing.T) {
	deep := `{"a":` + strings.Repeat("[", maxEventDepth-1) + strings.Repeat("]", maxEventDepth-1) + `}`
	tests := []struct {
		name, in, field, wantReason string
		eventType, forkID, tenant   string
	}{
		{"unpaired surrogate in the payload", testEventJSON(map[string]string{"payload": `{"name":"a\ud800b"}`}),
			"payload.name", `unpaired UTF-16 surrogate escape \ud800`, "ARTIST_FOLLOWED", "production", "acme_concertapp_production"},
		{"unpaired surrogate before the fields", strings.Replace(testEventJSON(nil), `{`, `{"note":"\udc00",`, 1),
			"note", `unpaired UTF-16 surrogate escape \udc00`, "ARTIST_FOLLOWED", "production", "acme_concertapp_production"},
		{"unpaired surrogate in eventType", testEventJSON(map[string]string{"eventType": `"A\ud800"`}),
			"eventType", `unpaired UTF-16 surrogate escape \ud800`, "", "production", "acme_concertapp_production"},
		{"unpaired surrogate in tenantSchema", testEventJSON(map[string]string{"tenantSchema": `"acme\udbff"`}),
			"tenantSchema", `unpaired UTF-16 surrogate escape \udbff`, "ARTIST_FOLLOWED", "production", ""},
		{"duplicate key in the payload", testEventJSON(map[string]string{"payload": `{"a":1,"a":2}`}),
			"payload.a", `duplicate key "a" in payload`, "ARTIST_FOLLOWED", "production", "acme_concertapp_production"},
		{"duplicate tenantSchema", strings.Replace(testEventJSON(nil), `{`, `{"tenantSchema":"other",`, 1),
			"tenantSchema", `duplicate key "tenantSchema"`, "ARTIST_FOLLOWED", "production", ""},
		{"duplicate forkId, same value", strings.Replace(testEventJSON(nil), `{`, `{"forkId":"production",`, 1),
			"forkId", `duplicate key "forkId"`, "ARTIST_FOLLOWED", "", "acme_concertapp_production"},
		{"nesting deeper than a dead letter embeds", testEventJSON(map[string]string{"payload": deep}),
			"payload", "nests deeper than 126 levels", "ARTIST_FOLLOWED", "production", "acme_concertapp_production"},
		{"first problem wins", testEventJSON(map[string]string{"payload": `{"s":"\ud800","a":1,"a":2}`}),
			"payload.s", `unpaired UTF-16 surrogate escape \ud800`, "ARTIST_FOLLOWED", "production", "acme_concertapp_production"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeEvent([]byte(tt.in))
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("DecodeEvent error %v, want a *ValidationError", err)
			}
			if ve.Field != tt.field || !strings.Contains(ve.Reason, tt.wantReason) {
				t.Errorf("Field %q Reason %q, want %q and a reason containing %q", ve.Field, ve.Reason, tt.field, tt.wantReason)
			}
			got := [3]string{ve.EventType, ve.ForkID, ve.TenantSchema}
			if want := [3]string{tt.eventType, tt.forkID, tt.tenant}; got != want {
				t.Errorf("readable event type, fork, tenant schema = %q, want %q", got, want)
			}
		})
	}
}

// TestDeadLettersOfValuesThatAreNotJSONShareAFingerprint: values that are
// not JSON fail with the parser's account of their bytes, in words
// MaskLiterals keeps; their dead letters still group as one failure
// (FingerprintText), in the record's header too, while their error text
// keeps the details (new-user trial: "hello, not json {" and the example's
// value gave two fingerprints). A value that is JSON but not an object is
// another failure.
func TestDeadLettersOfValuesThatAreNotJSONShareAFingerprint(t *testing.T) {
	fingerprint := func(value string) (string, string) {
		t.Helper()
		_, err := DecodeEvent([]byte(value))
		if err == nil {
			t.Fatalf("%q decoded", value)
		}
		dl := dlq.DeadLetter{Source: &kgo.Record{Topic: "events", Value: []byte(value)}, Class: retry.Classify(err), Err: err}
		rec, rerr := dlq.NewRecord(dl, dlq.RecordConfig{Topic: "dlq", Worker: "w"}, time.Unix(0, 0))
		if rerr != nil {
			t.Fatal(rerr)
		}
		for _, h := range rec.Headers {
			if h.Key == dlq.HeaderFingerprint && string(h.Value) != dl.Fingerprint() {
				t.Errorf("%q: header fingerprint %s, DeadLetter.Fingerprint %s", value, h.Value, dl.Fingerprint())
			}
		}
		return dl.Fingerprint(), err.Error()
	}
	a, errA := fingerprint("hello, not json {")
	b, errB := fingerprint("this is not json")
	c, _ := fingerprint("{\"eventType\": tru}")
	if errA == errB {
		t.Fatalf("the test needs errors that differ in words: both %q", errA)
	}
	if a != b || a != c {
		t.Errorf("fingerprints %s (%s), %s (%s), %s: want one", a, errA, b, errB, c)
	}
	if d, _ := fingerprint("[1, 2]"); d == a {
		t.Errorf("a JSON array has the not-JSON fingerprint %s", d)
	}
	// Unpaired surrogate escapes: one fingerprint per path, whatever the
	// escape and where it is in the string (new-user trial: \ud800 and
	// \udc00 at one path gave two).
	surrogate := func(path, s string) (string, string) {
		return fingerprint(testEventJSON(map[string]string{"payload": `{"` + path + `":"` + s + `"}`}))
	}
	s1, err1 := surrogate("note", `\ud800`)
	s2, err2 := surrogate("note", `abc \udc00 def`)
	s3, _ := surrogate("other", `\ud800`)
	if err1 == err2 || !strings.Contains(err1, `\ud800`) || !strings.Contains(err2, `\udc00`) {
		t.Fatalf("the errors should differ and name their escapes: %q, %q", err1, err2)
	}
	if s1 != s2 {
		t.Errorf("unpaired surrogates at one path: fingerprints %s (%s) and %s (%s), want one", s1, err1, s2, err2)
	}
	if s3 == s1 || s1 == a {
		t.Errorf("unpaired surrogates at two paths, or not JSON: fingerprints %s, %s, %s; want three", s1, s3, a)
	}
}

// TestKeptStringsCopiesOnce checks decodeRecord's copies of the event type
// and tenant schema: equal to the record's, in none of its memory, one
// copy for all the records of a partition that repeat them, and at most
// maxKeptStrings of them kept.
func TestKeptStringsCopiesOnce(t *testing.T) {
	var kept keptStrings
	var tenants *TenantSchemas
	var first *Event
	for i := range 3 {
		value := []byte(specExampleEvent)
		ev, err := tenants.decodeRecord(value, &jsonstrict.NodeSlab{}, &kept)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{ev.EventType, ev.TenantSchema} {
			if p := uintptr(unsafe.Pointer(unsafe.StringData(s))); p >= uintptr(unsafe.Pointer(&value[0])) && p < uintptr(unsafe.Pointer(&value[0]))+uintptr(len(value)) {
				t.Errorf("record %d: %q is in the record's value", i, s)
			}
		}
		if first == nil {
			first = ev
			continue
		}
		if ev.EventType != first.EventType || unsafe.StringData(ev.EventType) != unsafe.StringData(first.EventType) ||
			unsafe.StringData(ev.TenantSchema) != unsafe.StringData(first.TenantSchema) {
			t.Errorf("record %d: event type %q and tenant schema %q are new copies, want the first record's", i, ev.EventType, ev.TenantSchema)
		}
	}
	for i := range 3 * maxKeptStrings {
		s := fmt.Sprintf("tenant_%d", i)
		if c := kept.clone(s); c != s {
			t.Fatalf("clone(%q) = %q", s, c)
		}
		if len(kept.m) > maxKeptStrings {
			t.Fatalf("%d strings kept, want at most %d", len(kept.m), maxKeptStrings)
		}
	}
	if c := (*keptStrings)(nil).clone("x"); c != "x" {
		t.Errorf("nil keptStrings: clone = %q", c)
	}
}

// TestMissingFieldNamesTheNearMember: an event without a required field
// but with a member that differs from it only in case, '_' or '-' is told
// which (new-user trial: an event in snake_case was told only
// "tenantSchema: is required"); a member that merely looks alike after
// dropping many separators, or none, adds nothing.
func TestMissingFieldNamesTheNearMember(t *testing.T) {
	for _, tt := range []struct{ from, to, field, reason string }{
		{`"tenantSchema":`, `"tenant_schema":`, "tenantSchema", `is required (the event has "tenant_schema": did you mean tenantSchema?)`},
		{`"eventType":`, `"EventType":`, "eventType", `is required (the event has "EventType": did you mean eventType?)`},
		{`"sequenceNumber":`, `"sequence-number":`, "sequenceNumber", `is required (the event has "sequence-number": did you mean sequenceNumber?)`},
		{`"payload":`, `"Payload":`, "payload", `is required (the event has "Payload": did you mean payload?)`},
		{`"ts":`, `"t_________s":`, "ts", "is required"},
		{`"forkId":`, `"fork":`, "forkId", "is required"},
	} {
		_, err := DecodeEvent([]byte(strings.Replace(testEventJSON(nil), tt.from, tt.to, 1)))
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != tt.field || ve.Reason != tt.reason {
			t.Errorf("%s for %s: %v, want %s: %s", tt.to, tt.from, err, tt.field, tt.reason)
		}
	}
}
