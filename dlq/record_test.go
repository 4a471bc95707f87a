package dlq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/strictjson"
	"github.com/causet/projection-worker/retry"
	"github.com/causet/projection-worker/schemas"
)

// testNow is the fixed "now" of these tests: 2024-06-25T16:00:06.2Z.
var testNow = time.UnixMilli(1719331206200).UTC()

const testEvent = `{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":"acme_concertapp_production","irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}}`

// followedAtErr is the documented "column does not exist" failure.
func followedAtErr() *pgconn.PgError {
	return &pgconn.PgError{
		Severity:   "ERROR",
		Code:       "42703",
		Message:    `column "followed_at" of relation "artist_followers" does not exist`,
		Hint:       `Perhaps you meant to reference the column "artist_followers.followed".`,
		Where:      "PL/pgSQL function f() line 3 at SQL statement",
		SchemaName: "acme_concertapp_production",
		TableName:  "artist_followers",
		ColumnName: "followed_at",
	}
}

func testSource(value []byte) *kgo.Record {
	return &kgo.Record{
		Topic:     "causet.projection-events.v1",
		Partition: 3,
		Offset:    1891,
		Timestamp: time.UnixMilli(1719331200000),
		Key:       []byte("user-123"),
		Value:     value,
		Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
			{Key: "content-type", Value: []byte("application/json")},
		},
	}
}

func testDeadLetter(value []byte) DeadLetter {
	return DeadLetter{
		Source:        testSource(value),
		Projection:    "artist_followers",
		TenantSchema:  "acme_concertapp_production",
		ForkID:        "production",
		EventType:     "ARTIST_FOLLOWED",
		Class:         retry.Projection,
		Err:           fmt.Errorf("apply artist_followers to artist_followers: %w", followedAtErr()),
		Stack:         "goroutine 7 [running]:\nmain.apply()\n\t/src/apply.go:42 +0x1d",
		Retries:       5,
		FirstFailedAt: time.UnixMilli(1719331200123),
	}
}

// decodeMessage decodes a dead-letter value, checking it against the
// published JSON Schema first.
func decodeMessage(t *testing.T, value []byte) Message {
	t.Helper()
	v, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.ValidateDeadLetter(value); err != nil {
		t.Errorf("dead letter breaks the schema: %v\n%s", err, value)
	}
	var m Message
	if err := json.Unmarshal(value, &m); err != nil {
		t.Fatalf("decode dead letter: %v\n%s", err, value)
	}
	return m
}

func header(rec *kgo.Record, key string) (string, bool) {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func newRecord(t *testing.T, dl DeadLetter, cfg RecordConfig) *kgo.Record {
	t.Helper()
	rec, err := NewRecord(dl, cfg, testNow)
	if err != nil {
		t.Fatalf("NewRecord: %v", err)
	}
	return rec
}

func TestNewRecordKeepsOriginalEventVerbatim(t *testing.T) {
	tests := []struct{ name, value string }{
		{"compact", testEvent},
		{"html characters, unicode and a big integer", `{"eventType":"A<B>&C","entityId":"é€😀\u00e9","sequenceNumber":9007199254740993,"payload":{"html":"<script>&amp;</script>","n":1.0e2,"u":"\u2028"}}`},
		{"whitespace and newlines", "  {\n  \"eventType\" : \"X\",\n\t\"payload\" : { }\n}\n"},
		{"escaped slash and keys", `{"a\/b":"c\"d","a/c":[1,2,{"x":null}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecord(t, testDeadLetter([]byte(tt.value)), RecordConfig{})
			prefix := `{"originalEvent":` + tt.value + `,"projectionName":`
			if !bytes.HasPrefix(rec.Value, []byte(prefix)) {
				t.Fatalf("value does not embed the event verbatim:\n got %s\nwant prefix %s", rec.Value, prefix)
			}
			m := decodeMessage(t, rec.Value)
			// A decoder drops the whitespace around a value; the bytes
			// embedded in the record, checked above, keep it.
			if want := strings.TrimSpace(tt.value); string(m.OriginalEvent) != want {
				t.Errorf("decoded originalEvent %q, want %q", m.OriginalEvent, want)
			}
			if m.OriginalValueBase64 != "" || bytes.Contains(rec.Value, []byte("originalValueBase64")) {
				t.Errorf("originalValueBase64 present next to an object originalEvent: %s", rec.Value)
			}
		})
	}
}

func TestNewRecordMessageFields(t *testing.T) {
	rec := newRecord(t, testDeadLetter([]byte(testEvent)), RecordConfig{})
	m := decodeMessage(t, rec.Value)
	want := Message{
		OriginalEvent:  json.RawMessage(testEvent),
		ProjectionName: "artist_followers",
		TenantSchema:   "acme_concertapp_production",
		Error:          `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`,
		RetryCount:     5,
		FirstFailedAt:  1719331200123,
		FailedAt:       1719331206200,
	}
	m.StackTrace = ""
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
	if string(rec.Key) != "user-123" {
		t.Errorf("key %q, want the original key", rec.Key)
	}
	if rec.Topic != DefaultTopic {
		t.Errorf("topic %q, want %q", rec.Topic, DefaultTopic)
	}
	if !rec.Timestamp.Equal(testNow) {
		t.Errorf("timestamp %v, want %v", rec.Timestamp, testNow)
	}
}

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

func TestNewRecordStackTraceHasChainPostgresFieldsAndGoroutineStack(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	pgErr := followedAtErr()
	pgErr.Detail = "Key (artist_id, user_id)=(artist-456, user-123) already exists."
	pgErr.ConstraintName = "artist_followers_pkey"
	dl.Err = fmt.Errorf("apply artist_followers to artist_followers: %w", fmt.Errorf("exec upsert: %w", pgErr))
	m := decodeMessage(t, newRecord(t, dl, RecordConfig{}).Value)

	want := strings.Join([]string{
		`apply artist_followers to artist_followers: exec upsert: ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703) [*fmt.wrapError]`,
		`  exec upsert: ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703) [*fmt.wrapError]`,
		`    ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703) [*pgconn.PgError]`,
		``,
		`Detail: Key (artist_id, user_id)=(artist-456, user-123) already exists.`,
		`Hint: Perhaps you meant to reference the column "artist_followers.followed".`,
		`Where: PL/pgSQL function f() line 3 at SQL statement`,
		`Schema: acme_concertapp_production`,
		`Table: artist_followers`,
		`Column: followed_at`,
		`Constraint: artist_followers_pkey`,
		``,
		`goroutine stack:`,
		"goroutine 7 [running]:\nmain.apply()\n\t/src/apply.go:42 +0x1d",
	}, "\n")
	if diff := cmp.Diff(want, m.StackTrace); diff != "" {
		t.Errorf("stackTrace (-want +got):\n%s", diff)
	}
	if want := pgErr.Error(); m.Error != want {
		t.Errorf("error %q, want the PostgreSQL text %q", m.Error, want)
	}
}

func TestNewRecordErrorWithoutPostgres(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	dl.Class = retry.Permanent
	dl.Projection = ""
	dl.Stack = ""
	dl.Retries = 0
	dl.Err = errors.Join(errors.New("invalid projection event: sequenceNumber: want an integer"), errors.New("ts: missing"))
	rec := newRecord(t, dl, RecordConfig{})
	m := decodeMessage(t, rec.Value)
	if want := dl.Err.Error(); m.Error != want {
		t.Errorf("error %q, want %q", m.Error, want)
	}
	wantStack := strings.Join([]string{
		"invalid projection event: sequenceNumber: want an integer",
		"ts: missing [*errors.joinError]",
		"  invalid projection event: sequenceNumber: want an integer [*errors.errorString]",
		"  ts: missing [*errors.errorString]",
	}, "\n")
	if diff := cmp.Diff(wantStack, m.StackTrace); diff != "" {
		t.Errorf("stackTrace (-want +got):\n%s", diff)
	}
	if got, _ := header(rec, HeaderSQLState); got != "" {
		t.Errorf("sqlstate header %q, want empty", got)
	}
	if got, _ := header(rec, HeaderErrorClass); got != "permanent" {
		t.Errorf("error-class header %q, want permanent", got)
	}
}

func TestNewRecordHeaders(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	dl.ReplayCount = 2
	// A replayed event carries the replay headers and, from an earlier dead
	// letter, stale causet.dlq.* headers.
	dl.Source.Headers = append(dl.Source.Headers,
		kgo.RecordHeader{Key: HeaderReplayCountOut, Value: []byte("2")},
		kgo.RecordHeader{Key: HeaderFingerprint, Value: []byte("stale")},
		kgo.RecordHeader{Key: "dup", Value: []byte("1")},
		kgo.RecordHeader{Key: "dup", Value: []byte("2")},
	)
	rec := newRecord(t, dl, RecordConfig{Worker: "worker-7f9c", Generation: "1.4.0/v42"})

	type kv struct{ K, V string }
	var got []kv
	for _, h := range rec.Headers {
		got = append(got, kv{h.Key, string(h.Value)})
	}
	want := []kv{
		{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"content-type", "application/json"},
		{HeaderReplayCountOut, "2"},
		{"dup", "1"},
		{"dup", "2"},
		{HeaderOriginalTopic, "causet.projection-events.v1"},
		{HeaderOriginalPartition, "3"},
		{HeaderOriginalOffset, "1891"},
		{HeaderOriginalTimestamp, "1719331200000"},
		{HeaderProjection, "artist_followers"},
		{HeaderForkID, "production"},
		{HeaderTenantSchema, "acme_concertapp_production"},
		{HeaderEventType, "ARTIST_FOLLOWED"},
		{HeaderErrorClass, "projection"},
		{HeaderSQLState, "42703"},
		{HeaderFingerprint, Fingerprint("artist_followers", retry.Projection, "42703", `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`)},
		{HeaderWorker, "worker-7f9c"},
		{HeaderGeneration, "1.4.0/v42"},
		{HeaderReplayCount, "2"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

func TestNewRecordTimes(t *testing.T) {
	tests := []struct {
		name      string
		first     time.Time
		wantFirst int64
	}{
		{"zero first failure is now", time.Time{}, testNow.UnixMilli()},
		{"earlier first failure kept", time.UnixMilli(1000), 1000},
		{"first failure after now is clamped", testNow.Add(time.Hour), testNow.UnixMilli()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(testEvent))
			dl.FirstFailedAt = tt.first
			m := decodeMessage(t, newRecord(t, dl, RecordConfig{}).Value)
			if m.FirstFailedAt != tt.wantFirst || m.FailedAt != testNow.UnixMilli() {
				t.Errorf("firstFailedAt, failedAt = %d, %d; want %d, %d", m.FirstFailedAt, m.FailedAt, tt.wantFirst, testNow.UnixMilli())
			}
		})
	}
}

func TestNewRecordInvalidTenantSchemaIsBlanked(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	dl.TenantSchema = `acme"; DROP SCHEMA x; --`
	rec := newRecord(t, dl, RecordConfig{})
	m := decodeMessage(t, rec.Value)
	if m.TenantSchema != "" {
		t.Errorf("tenantSchema %q, want empty", m.TenantSchema)
	}
	if got, ok := header(rec, HeaderTenantSchema); !ok || got != "" {
		t.Errorf("tenant-schema header %q (present %v), want present and empty", got, ok)
	}
}

func TestNewRecordUnsetSourceTimestamp(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	dl.Source.Timestamp = time.Time{}
	rec := newRecord(t, dl, RecordConfig{})
	if got, _ := header(rec, HeaderOriginalTimestamp); got != "-1" {
		t.Errorf("original-timestamp %q, want -1", got)
	}
}

func TestNewRecordTruncatesOversizeDeadLetters(t *testing.T) {
	bigEvent := `{"eventType":"BIG","payload":{"blob":"` + strings.Repeat("x", 3000) + `"}}`
	tests := []struct {
		name          string
		maxBytes      int
		stack, errMsg string
		wantCut       string
		wantError     func(t *testing.T, m Message, errMsg string)
		wantStack     func(t *testing.T, m Message, stack string)
	}{
		{
			name:     "stack trace cut to a prefix",
			maxBytes: 8000,
			stack:    strings.Repeat("goroutine frame é\n", 1000),
			errMsg:   "boom",
			wantCut:  "stackTrace",
			wantStack: func(t *testing.T, m Message, stack string) {
				prefix, marker, ok := strings.Cut(m.StackTrace, "…[truncated ")
				if !ok || prefix == "" || !strings.HasSuffix(marker, " bytes]") {
					t.Fatalf("stackTrace %q is not a prefix and a marker", m.StackTrace)
				}
				full := stackTrace(errors.New("boom"), stack)
				if !strings.HasPrefix(full, prefix) {
					t.Errorf("stackTrace prefix is not a prefix of the full stack")
				}
				if n := fmt.Sprintf("%d bytes]", len(full)-len(prefix)); marker != n {
					t.Errorf("marker says %q, want %q", marker, n)
				}
			},
		},
		{
			name:     "stack trace emptied, error cut",
			maxBytes: 6000,
			stack:    strings.Repeat("s", 5000),
			errMsg:   strings.Repeat("error text ", 1000),
			wantCut:  "stackTrace,error",
			wantStack: func(t *testing.T, m Message, _ string) {
				if m.StackTrace != "" {
					t.Errorf("stackTrace %q, want empty", m.StackTrace)
				}
			},
			wantError: func(t *testing.T, m Message, errMsg string) {
				prefix, _, ok := strings.Cut(m.Error, "…[truncated ")
				if !ok || prefix == "" || !strings.HasPrefix(errMsg, prefix) {
					t.Errorf("error %q is not a prefix of the error and a marker", m.Error)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(bigEvent))
			dl.Err = errors.New(tt.errMsg)
			dl.Stack = tt.stack
			rec := newRecord(t, dl, RecordConfig{MaxBytes: tt.maxBytes})
			if size := recordSize(rec); size > tt.maxBytes {
				t.Errorf("record is %d bytes, over MaxBytes %d", size, tt.maxBytes)
			}
			m := decodeMessage(t, rec.Value)
			if string(m.OriginalEvent) != bigEvent {
				t.Errorf("originalEvent was changed")
			}
			if got, _ := header(rec, HeaderTruncated); got != tt.wantCut {
				t.Errorf("truncated header %q, want %q", got, tt.wantCut)
			}
			if tt.wantStack != nil {
				tt.wantStack(t, m, tt.stack)
			}
			if tt.wantError != nil {
				tt.wantError(t, m, tt.errMsg)
			} else if m.Error != tt.errMsg {
				t.Errorf("error %q was changed", m.Error)
			}
			if got, _ := header(rec, HeaderFingerprint); got != Fingerprint(dl.Projection, dl.Class, "", tt.errMsg) {
				t.Errorf("fingerprint %s is not that of the untruncated error", got)
			}
		})
	}
}

func TestNewRecordFitsExactlyWithoutTruncating(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	full := newRecord(t, dl, RecordConfig{})
	size := recordSize(full)
	rec := newRecord(t, dl, RecordConfig{MaxBytes: size})
	if _, cut := header(rec, HeaderTruncated); cut {
		t.Errorf("record of exactly MaxBytes (%d) was truncated", size)
	}
	rec = newRecord(t, dl, RecordConfig{MaxBytes: size - 1})
	if got, _ := header(rec, HeaderTruncated); got != "stackTrace" {
		t.Errorf("record one byte over MaxBytes: truncated header %q, want stackTrace", got)
	}
	if s := recordSize(rec); s > size-1 {
		t.Errorf("record is %d bytes, over %d", s, size-1)
	}
}

func TestNewRecordRefusesAnEventTooLargeToFit(t *testing.T) {
	dl := testDeadLetter([]byte(`{"blob":"` + strings.Repeat("x", 2000) + `"}`))
	_, err := NewRecord(dl, RecordConfig{MaxBytes: 1024}, testNow)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("NewRecord error %v, want ErrTooLarge", err)
	}
}

func TestNewRecordRefusesBadInput(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*DeadLetter)
		cfg    RecordConfig
		now    time.Time
	}{
		{"nil source", func(dl *DeadLetter) { dl.Source = nil }, RecordConfig{}, testNow},
		{"nil error", func(dl *DeadLetter) { dl.Err = nil }, RecordConfig{}, testNow},
		{"negative retries", func(dl *DeadLetter) { dl.Retries = -1 }, RecordConfig{}, testNow},
		{"negative replay count", func(dl *DeadLetter) { dl.ReplayCount = -1 }, RecordConfig{}, testNow},
		{"zero now", func(*DeadLetter) {}, RecordConfig{}, time.Time{}},
		{"bad topic", func(*DeadLetter) {}, RecordConfig{Topic: "dlq topic"}, testNow},
		{"max bytes too small", func(*DeadLetter) {}, RecordConfig{MaxBytes: 100}, testNow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(testEvent))
			tt.modify(&dl)
			if rec, err := NewRecord(dl, tt.cfg, tt.now); err == nil {
				t.Errorf("NewRecord returned %v, want an error", rec)
			}
		})
	}
}

func TestRecordConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     RecordConfig
		wantErr bool
	}{
		{"zero value", RecordConfig{}, false},
		{"custom", RecordConfig{Topic: "my.dlq-topic_1", MaxBytes: 2 << 20}, false},
		{"minimum max bytes", RecordConfig{MaxBytes: 512}, false},
		{"negative max bytes", RecordConfig{MaxBytes: -1}, true},
		{"below minimum", RecordConfig{MaxBytes: 511}, true},
		{"illegal character", RecordConfig{Topic: "dlq/topic"}, true},
		{"dot", RecordConfig{Topic: "."}, true},
		{"too long", RecordConfig{Topic: strings.Repeat("t", 250)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error %v", err, tt.wantErr)
			}
		})
	}
	if got := (RecordConfig{}).WithDefaults(); got.Topic != DefaultTopic || got.MaxBytes != DefaultMaxBytes {
		t.Errorf("defaults %+v", got)
	}
}

func TestMessageMarshalJSON(t *testing.T) {
	t.Run("base64 present even when empty", func(t *testing.T) {
		b, err := Message{}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want := `{"originalEvent":null,"originalValueBase64":"","projectionName":"","tenantSchema":"","error":"","stackTrace":"","retryCount":0,"firstFailedAt":0,"failedAt":0}`
		if string(b) != want {
			t.Errorf("got  %s\nwant %s", b, want)
		}
	})
	t.Run("no html escaping", func(t *testing.T) {
		b, err := Message{OriginalEvent: json.RawMessage(`{}`), Error: "a < b && c > d", StackTrace: "line\n\ttab \"q\" \u2028"}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"error":"a < b && c > d"`)) {
			t.Errorf("error was escaped: %s", b)
		}
		var m Message
		if err := json.Unmarshal(b, &m); err != nil || m.StackTrace != "line\n\ttab \"q\" \u2028" {
			t.Errorf("round trip: %v, %q", err, m.StackTrace)
		}
	})
	t.Run("not an object", func(t *testing.T) {
		for _, ev := range []string{`[1]`, `{"a":`, `"x"`, "{\"a\":\"\xff\"}"} {
			if b, err := (Message{OriginalEvent: json.RawMessage(ev)}).MarshalJSON(); err == nil {
				t.Errorf("MarshalJSON with originalEvent %q = %s, want an error", ev, b)
			}
		}
	})
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
			strictjson.Check(t, rec.Value)
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

// BenchmarkNewRecord builds the dead letter of the SPEC's example event,
// with the value's shape known (as the worker hands it over) and unchecked
// (NewRecord reads the value).
func BenchmarkNewRecord(b *testing.B) {
	for _, bb := range []struct {
		name  string
		shape ValueShape
	}{{"shape=known", ValueStrictObject}, {"shape=unchecked", ValueUnchecked}} {
		b.Run(bb.name, func(b *testing.B) {
			dl := testDeadLetter([]byte(testEvent))
			dl.ValueShape = bb.shape
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewRecord(dl, RecordConfig{}, testNow); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
