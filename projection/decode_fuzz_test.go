package projection

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/retry"
)

// FuzzDecodeEvent checks that DecodeEvent never panics and that what it
// accepts is what SPEC §3 allows: valid UTF-8 JSON by encoding/json's own
// judgement, a tenant schema that is a valid identifier, fields that follow
// the rules, a value the published event schema accepts, and a tree equal to
// encoding/json's (with UseNumber). What it
// rejects as "not valid JSON" must be invalid for encoding/json too.
func FuzzDecodeEvent(f *testing.F) {
	seeds := []string{
		specExampleEvent,
		testEventJSON(nil),
		testEventJSON(map[string]string{"payload": `{"big":9007199254740993,"dec":12345678901234567890.123456789,"l":[1,{"a":[]},null,true]}`}),
		testEventJSON(map[string]string{"payload": `{"esc":"\u00e9\ud83d\ude00\n\"\\\/","k":"\u006b"}`}),
		testEventJSON(map[string]string{"irVersion": `""`, "sequenceNumber": `0`, "ts": `-210866803200000`}),
		testEventJSON(map[string]string{"sequenceNumber": `9223372036854775807`, "ts": `9224318015999999`}),
		``, `null`, `[]`, `"str"`, `42`, `true`, `garbage`, `{}{}`, `{"a":1,}`, `{"a" 1}`, `{"a":[1 2]}`, `{"a":01}`,
		specExampleEvent[:len(specExampleEvent)/2],
		"\xff" + testEventJSON(nil),
		strings.Replace(testEventJSON(nil), "user-123", "user-\xff", 1),
		testEventJSON(map[string]string{"payload": `{"name":"a\ud800b"}`}),
		testEventJSON(map[string]string{"entityId": `"\ud83d\u0041"`}),
		strings.Replace(testEventJSON(nil), `{`, `{"eventType":"OTHER",`, 1),
		testEventJSON(map[string]string{"payload": `{"a":1,"a":2}`}),
		testEventJSON(map[string]string{"payload": `{"items":[{"a":1},{"a":1,"a":3}]}`}),
		testEventJSON(map[string]string{"eventType": ""}),
		testEventJSON(map[string]string{"entityId": `""`}),
		testEventJSON(map[string]string{"forkId": `null`}),
		testEventJSON(map[string]string{"tenantSchema": `"tenant_a\"; DROP TABLE x; --"`}),
		testEventJSON(map[string]string{"tenantSchema": `"Acme"`}),
		testEventJSON(map[string]string{"tenantSchema": `"` + strings.Repeat("a", 64) + `"`}),
		testEventJSON(map[string]string{"sequenceNumber": `"7"`}),
		testEventJSON(map[string]string{"sequenceNumber": `7.5`}),
		testEventJSON(map[string]string{"sequenceNumber": `7e2`}),
		testEventJSON(map[string]string{"sequenceNumber": `-1`}),
		testEventJSON(map[string]string{"sequenceNumber": `-0`}),
		testEventJSON(map[string]string{"sequenceNumber": `9223372036854775808`}),
		testEventJSON(map[string]string{"ts": ""}),
		testEventJSON(map[string]string{"ts": `"123"`}),
		testEventJSON(map[string]string{"ts": `1.5`}),
		testEventJSON(map[string]string{"ts": `9224318016000000`}),
		testEventJSON(map[string]string{"payload": ""}),
		testEventJSON(map[string]string{"payload": `[]`}),
		testEventJSON(map[string]string{"payload": `null`}),
		testEventJSON(map[string]string{"tenantSchema": `"public"`}),
		testEventJSON(map[string]string{"payload": `{"a":` + strings.Repeat("[", 124) + strings.Repeat("]", 124) + `}`}),
		testEventJSON(map[string]string{"payload": `{"a":` + strings.Repeat("[", 125) + strings.Repeat("]", 125) + `}`}),
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		in := bytes.Clone(value)
		ev, err := DecodeEvent(value)
		if !bytes.Equal(in, value) {
			t.Fatalf("DecodeEvent modified its input")
		}
		if err != nil {
			checkDecodeRejected(t, value, ev, err)
			return
		}
		checkDecodeAccepted(t, value, ev)
	})
}

// FuzzDecodeEventPayload fuzzes the payload of an otherwise valid event, so
// that most inputs reach the tree builder and are accepted, and checks them
// like FuzzDecodeEvent.
func FuzzDecodeEventPayload(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":1}`, `{"a":1,"a":2}`, `{"":""}`, `{"a":{"b":[{"c":null}]}}`, `[]`, `null`, `{"a":[1,2,]}`,
		`{"big":9007199254740993,"dec":12345678901234567890.123456789,"e":-1.5E+300,"z":-0}`,
		`{"esc":"\u00e9\ud83d\ude00\n\"\\\/\b\f\r\t","k\u006b":"\u0000"}`,
		`{"s":"\ud800"}`, `{"s":"\udc00\ud800"}`, `{"s":"zoë 😀 \u2028"}`,
		`{"a":[[[[[[[[[[]]]]]]]]]]}`, `{"a":true,"b":false,"c":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		value := []byte(testEventJSON(map[string]string{"payload": "0"}))
		value = append(value[:len(value)-2:len(value)-2], payload...)
		value = append(value, '}')
		ev, err := DecodeEvent(value)
		if err != nil {
			checkDecodeRejected(t, value, ev, err)
			return
		}
		checkDecodeAccepted(t, value, ev)
	})
}

func checkDecodeRejected(t *testing.T, value []byte, ev *Event, err error) {
	t.Helper()
	if ev != nil {
		t.Fatalf("DecodeEvent returned an event with the error %v", err)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if retry.Classify(err) != retry.Permanent {
		t.Fatalf("retry.Classify(%v) is not permanent", err)
	}
	if strings.HasPrefix(ve.Reason, "not valid JSON") && json.Valid(value) {
		t.Fatalf("rejected valid JSON %q: %v", value, err)
	}
	if strings.HasPrefix(ve.Reason, "duplicate key") && json.Valid(value) && !hasDuplicateKey(value) {
		t.Fatalf("rejected %q for a duplicate key it does not have: %v", value, err)
	}
	// The verdict the worker hands to dlq (DeadLetter.ValueShape) is what
	// dlq reads itself without it, and an object by encoding/json's
	// judgement without a duplicate key.
	if ve.StrictObject != jsonstrict.IsObject(value) {
		t.Fatalf("StrictObject = %v for %q, but jsonstrict.IsObject says %v (%v)", ve.StrictObject, value, !ve.StrictObject, err)
	}
	if ve.StrictObject && (!json.Valid(value) || bytes.TrimLeft(value, " \t\r\n")[0] != '{' || hasDuplicateKey(value)) {
		t.Fatalf("StrictObject for %q, which is not a JSON object without duplicate keys (%v)", value, err)
	}
}

func checkDecodeAccepted(t *testing.T, value []byte, ev *Event) {
	t.Helper()
	if !utf8.Valid(value) || !json.Valid(value) {
		t.Fatalf("accepted %q, which is not valid UTF-8 JSON", value)
	}
	if !ValidTenantSchema(ev.TenantSchema) {
		t.Fatalf("accepted tenant schema %q", ev.TenantSchema)
	}
	if ev.EventType == "" || ev.EntityID == "" || ev.ForkID == "" || ev.SequenceNumber < 0 ||
		ev.TS < MinTimestampMillis || ev.TS >= EndTimestampMillis || ev.Payload() == nil {
		t.Fatalf("accepted an event that breaks SPEC §3: %+v", ev)
	}
	if !bytes.Equal(ev.Raw, value) {
		t.Fatalf("Raw = %q, want the record value %q", ev.Raw, value)
	}
	checkEventSchema(t, value)
	if hasDuplicateKey(value) {
		t.Fatalf("accepted %q, which has a duplicate key", value)
	}
	checkDeadLetterVerbatim(t, value)

	again, err := DecodeEvent(ev.Raw)
	if err != nil {
		t.Fatalf("re-decoding Raw: %v", err)
	}
	if !reflect.DeepEqual(ev, again) {
		t.Fatalf("re-decoding Raw gives another event (-first +second):\n%s", cmp.Diff(ev, again, cmpopts.IgnoreUnexported(Event{})))
	}

	// The tree is the one encoding/json builds with UseNumber: same strings
	// (escapes decoded), same number text, same nesting.
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var std any
	if err := dec.Decode(&std); err != nil {
		t.Fatalf("encoding/json cannot decode an accepted value: %v", err)
	}
	if !reflect.DeepEqual(std, any(ev.Fields())) {
		t.Fatalf("Fields differ from encoding/json's tree (-encoding/json +DecodeEvent):\n%s", cmp.Diff(std, any(ev.Fields())))
	}

	// Fields re-encoded by encoding/json decode to the same event.
	reencoded, err := json.Marshal(ev.Fields())
	if err != nil {
		t.Fatalf("re-encoding Fields: %v", err)
	}
	ev2, err := DecodeEvent(reencoded)
	if err != nil {
		t.Fatalf("decoding re-encoded Fields %s: %v", reencoded, err)
	}
	ev2.Raw = ev.Raw
	// The tree's spans differ (the texts are not the same), their values
	// must not.
	if f, f2 := ev.Fields(), ev2.Fields(); !reflect.DeepEqual(f, f2) {
		t.Fatalf("re-encoded Fields decode to another tree (-first +second):\n%s", cmp.Diff(f, f2))
	}
	e1, e2 := *ev, *ev2
	e1.tree, e1.payload, e2.tree, e2.payload = nil, 0, nil, 0
	if !reflect.DeepEqual(e1, e2) {
		t.Fatalf("re-encoded Fields decode to another event (-first +second):\n%s", cmp.Diff(e1, e2, cmpopts.IgnoreUnexported(Event{})))
	}
}

// checkDeadLetterVerbatim fails t unless the dead letter of the accepted
// value embeds it verbatim (SPEC §6), so that it can be replayed: the
// decoder accepts only what every strict parser reads.
func checkDeadLetterVerbatim(t *testing.T, value []byte) {
	t.Helper()
	rec, err := dlq.NewRecord(dlq.DeadLetter{Source: &kgo.Record{Value: value}, Err: errors.New("x")}, dlq.RecordConfig{MaxBytes: 1 << 30}, time.UnixMilli(1))
	if err != nil {
		t.Fatalf("dead letter of an accepted value: %v", err)
	}
	if !bytes.HasPrefix(rec.Value, append([]byte(`{"originalEvent":`), value...)) {
		t.Fatalf("the dead letter of accepted %.200q does not embed it verbatim: %.200s", value, rec.Value)
	}
}

// hasDuplicateKey reports whether the valid JSON value has an object with two
// equal keys (after unescaping), found with encoding/json's tokenizer as an
// oracle independent of DecodeEvent.
func hasDuplicateKey(value []byte) bool {
	type container struct {
		keys    map[string]bool // nil for an array
		wantKey bool
	}
	var stack []*container
	dec := json.NewDecoder(bytes.NewReader(value))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				stack = append(stack, &container{keys: map[string]bool{}, wantKey: true})
				continue
			case '[':
				stack = append(stack, &container{})
				continue
			}
			stack = stack[:len(stack)-1]
		case string:
			if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
				if stack[n-1].keys[tok] {
					return true
				}
				stack[n-1].keys[tok] = true
				stack[n-1].wantKey = false
				continue
			}
		}
		// A value is complete: the next token of an enclosing object is a key.
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
}
