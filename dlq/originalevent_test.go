package dlq

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/causet/projection-worker/internal/jqcheck"
)

func TestNewRecordValueThatIsNotAJSONObject(t *testing.T) {
	tests := []struct {
		name  string
		value []byte
	}{
		{"tombstone", nil},
		{"empty", []byte{}},
		{"garbage", []byte("not json")},
		{"json null", []byte("null")},
		{"json array", []byte(`[{"eventType":"A"}]`)},
		{"json string", []byte(`"{}"`)},
		{"json number", []byte(`9007199254740993`)},
		{"truncated object", []byte(`{"eventType":"A"`)},
		{"trailing data", []byte(`{"a":1} {"b":2}`)},
		{"invalid utf-8 inside a string", []byte("{\"a\":\"\xff\xfe\"}")},
		{"duplicate key", []byte(`{"eventType":"A","eventType":"B"}`)},
		{"duplicate key after unescaping", []byte(`{"a":1,"\u0061":2}`)},
		{"nested duplicate key", []byte(`{"payload":{"x":[{"k":1,"k":2}]}}`)},
		{"binary", []byte{0x00, 0x01, 0x02, 0xff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecord(t, testDeadLetter(tt.value), RecordConfig{})
			if !bytes.HasPrefix(rec.Value, []byte(`{"originalEvent":null,"originalValueBase64":`)) {
				t.Errorf("value does not start with a null originalEvent and its base64: %s", rec.Value)
			}
			m := decodeMessage(t, rec.Value)
			if string(m.OriginalEvent) != "null" {
				t.Errorf("originalEvent %s, want null", m.OriginalEvent)
			}
			raw, err := base64.StdEncoding.DecodeString(m.OriginalValueBase64)
			if err != nil {
				t.Fatalf("originalValueBase64 %q: %v", m.OriginalValueBase64, err)
			}
			if !bytes.Equal(raw, tt.value) {
				t.Errorf("originalValueBase64 decodes to %q, want %q", raw, tt.value)
			}
		})
	}
}

func TestNewRecordNestedObjectsWithRepeatedKeysAtDifferentLevelsAreKept(t *testing.T) {
	value := `{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}],"c":{"b":1}}`
	m := decodeMessage(t, newRecord(t, testDeadLetter([]byte(value)), RecordConfig{}).Value)
	if string(m.OriginalEvent) != value {
		t.Errorf("originalEvent %s, want %s", m.OriginalEvent, value)
	}
}

// TestDeadLetterParsesWithStrictParsersWhateverTheValue: every dead letter
// must be read by every strict JSON parser (jq 1.6 included), whatever the
// record value. A value that is not a JSON object every strict parser reads
// (an unpaired UTF-16 surrogate escape, invalid UTF-8, nesting deeper than
// MaxOriginalEventDepth) is kept in originalValueBase64 instead of
// originalEvent; one that is (a surrogate pair, \u0000, numbers beyond
// float64) is embedded verbatim.
func TestDeadLetterParsesWithStrictParsersWhateverTheValue(t *testing.T) {
	nest := func(levels int) string { // an object nesting levels deep in all
		return `{"a":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
	}
	tests := []struct {
		name     string
		value    string
		verbatim bool
	}{
		{"lone high surrogate", `{"tenantSchema":"acme","payload":{"s":"a\ud800b"}}`, false},
		{"lone high surrogate at the end of a string", `{"s":"\ud800"}`, false},
		{"lone low surrogate", `{"s":"\udc00"}`, false},
		{"high surrogate followed by a non-surrogate escape", `{"s":"\ud83d\u0041"}`, false},
		{"surrogates in the wrong order", `{"s":"\udc00\ud800"}`, false},
		{"two high surrogates", `{"s":"\ud83d\ud83d\ude00"}`, false},
		{"lone surrogate in a key", `{"\udfff":1}`, false},
		{"lone surrogate, upper-case hex", `{"s":"\uD800"}`, false},
		{"surrogate pair", `{"s":"\ud83d\ude00","t":"\uD83D\uDE00"}`, true},
		{"escaped backslash before u", `{"s":"\\ud800"}`, true},
		{"escaped quote then a pair", `{"s":"\"\ud83d\ude00"}`, true},
		{"invalid UTF-8", "{\"s\":\"\xed\xa0\x80\"}", false},
		{"NUL escape", `{"s":"\u0000"}`, true},
		{"noncharacter escapes", `{"s":"\ufffe\uffff"}`, true},
		{"huge numbers", `{"a":1e400,"b":-1e400,"c":123456789012345678901234567890,"d":1e-400}`, true},
		{"nesting at the limit", nest(MaxOriginalEventDepth), true},
		{"nesting one level over the limit", nest(MaxOriginalEventDepth + 1), false},
		{"nesting over jq's limit", nest(300), false},
		{"duplicate key", `{"a":1,"a":2}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecord(t, testDeadLetter([]byte(tt.value)), RecordConfig{})
			m := decodeMessage(t, rec.Value)
			if tt.verbatim {
				if string(m.OriginalEvent) != tt.value {
					t.Errorf("originalEvent = %.200s, want the value verbatim", m.OriginalEvent)
				}
			} else {
				raw, err := base64.StdEncoding.DecodeString(m.OriginalValueBase64)
				if string(m.OriginalEvent) != "null" || err != nil || string(raw) != tt.value {
					t.Errorf("originalEvent = %.200s, originalValueBase64 = %.200q; want null and the value in base64", m.OriginalEvent, m.OriginalValueBase64)
				}
			}
			if m.TenantSchema != "acme_concertapp_production" {
				t.Errorf("tenantSchema = %q, want the dead letter's", m.TenantSchema)
			}
			jqcheck.Check(t, rec.Value)
		})
	}
}

// TestNewRecordFollowsTheCallersValueShape: a dead letter whose caller has
// decoded the value (DeadLetter.ValueShape) is built from that verdict,
// without reading the value again; an unchecked one is read.
func TestNewRecordFollowsTheCallersValueShape(t *testing.T) {
	dup := `{"a":1,"a":2}`
	tests := []struct {
		name     string
		value    string
		shape    ValueShape
		verbatim bool
	}{
		{"strict object, unchecked", testEvent, ValueUnchecked, true},
		{"strict object, said so", testEvent, ValueStrictObject, true},
		{"object the caller refused", testEvent, ValueNotStrictObject, false},
		{"duplicate key, unchecked", dup, ValueUnchecked, false},
		{"duplicate key, said so", dup, ValueNotStrictObject, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(tt.value))
			dl.ValueShape = tt.shape
			m := decodeMessage(t, newRecord(t, dl, RecordConfig{}).Value)
			if tt.verbatim {
				if string(m.OriginalEvent) != tt.value || m.OriginalValueBase64 != "" {
					t.Errorf("originalEvent %s, originalValueBase64 %q; want the value verbatim", m.OriginalEvent, m.OriginalValueBase64)
				}
				return
			}
			raw, err := base64.StdEncoding.DecodeString(m.OriginalValueBase64)
			if string(m.OriginalEvent) != "null" || err != nil || string(raw) != tt.value {
				t.Errorf("originalEvent %s, originalValueBase64 %q; want null and the value in base64", m.OriginalEvent, m.OriginalValueBase64)
			}
		})
	}
}
