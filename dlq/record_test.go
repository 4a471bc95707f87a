package dlq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

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

// TestNewEntryKeepsTheWhitespaceAroundOriginalEvent: a record value with
// whitespace around its object is embedded verbatim, and the entry the
// replayer reads holds the same bytes, which retry republishes. The new-
// user trial's inputs: an event ending in a newline was replayed a byte
// shorter, one with whitespace on both sides six bytes shorter.
func TestNewEntryKeepsTheWhitespaceAroundOriginalEvent(t *testing.T) {
	for _, value := range []string{
		testEvent,
		testEvent + "\n",
		" \n\t" + testEvent + " \r\n",
		"\n\n{ \"eventType\" : \"X\" , \"payload\":{}}\t",
	} {
		rec := newRecord(t, testDeadLetter([]byte(value)), RecordConfig{})
		e, err := NewEntry(rec)
		if err != nil {
			t.Fatalf("NewEntry(%q): %v", value, err)
		}
		if string(e.Message.OriginalEvent) != value {
			t.Errorf("entry's originalEvent %q, want %q", e.Message.OriginalEvent, value)
		}
	}
}

// TestNewEntryRefusesAnObjectWithoutErrorOrFailedAt: every dead letter
// has both (the schema requires them); a JSON object lacking either is
// not one, whatever else it holds (new-user trial: {"error":"e"} on a
// wrong --dlq-topic was listed as a dead letter failed at 0).
func TestNewEntryRefusesAnObjectWithoutErrorOrFailedAt(t *testing.T) {
	for _, v := range []string{`{"error":"e"}`, `{"failedAt":1}`, `{}`, `{"error":"","failedAt":1,"originalEvent":{"a":1}}`,
		`{"error":"x","originalEvent":{"eventType":"E"}}`} {
		if _, err := NewEntry(&kgo.Record{Value: []byte(v)}); err == nil || !strings.Contains(err.Error(), "not a dead-letter message") {
			t.Errorf("NewEntry(%s): %v, want not a dead-letter message", v, err)
		}
	}
	if _, err := NewEntry(&kgo.Record{Value: []byte(`{"error":"x","failedAt":1}`)}); err != nil {
		t.Errorf("NewEntry with both: %v", err)
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
		{HeaderOriginalTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
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
		{"replay count above the maximum", func(dl *DeadLetter) { dl.ReplayCount = MaxReplayCount + 1 }, RecordConfig{}, testNow},
		{"zero now", func(*DeadLetter) {}, RecordConfig{}, time.Time{}},
		{"bad topic", func(*DeadLetter) {}, RecordConfig{Topic: "dlq topic"}, testNow},
		{"max bytes too small", func(*DeadLetter) {}, RecordConfig{MaxBytes: 100}, testNow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(testEvent))
			tt.modify(&dl)
			rec, err := NewRecord(dl, tt.cfg, tt.now)
			if err == nil {
				t.Fatalf("NewRecord returned %v, want an error", rec)
			}
			if invalid := tt.cfg == (RecordConfig{}); errors.Is(err, ErrInvalidDeadLetter) != invalid {
				t.Errorf("NewRecord: %v; wraps ErrInvalidDeadLetter: %v, want %v (a bad DeadLetter, not a bad config)", err, !invalid, invalid)
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

// TestNewRecordRedactsEveryTextOfTheChain: RecordConfig.Redact applies to
// the whole error and stackTrace texts: an inner error of the chain and a
// PostgreSQL error's detail too, which a mask of the outermost error alone
// leaves (new-user trial: the stackTrace repeated an inner error, and a
// CHECK constraint's "Failing row contains", with the password).
func TestNewRecordRedactsEveryTextOfTheChain(t *testing.T) {
	const secret = `Se"cr\et@ 9`
	pgErr := &pgconn.PgError{Severity: "ERROR", Code: "23514", Message: `new row for relation "artist_followers" violates check constraint "short_user"`,
		Detail: "Failing row contains (a2, " + secret + ", 2024-06-25)", TableName: "artist_followers", ConstraintName: "short_user"}
	dl := testDeadLetter([]byte(testEvent))
	dl.Err = fmt.Errorf("outer %q: %w", "masked", fmt.Errorf("inner %q: %w", secret, pgErr))
	dl.Stack = "main.apply(" + secret + ")"
	red := strings.NewReplacer(secret, "xxxxx", strings.Trim(fmt.Sprintf("%q", secret), `"`), "xxxxx")
	rec, err := NewRecord(dl, RecordConfig{Redact: stringer{red}}, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(rec.Value, []byte("cr\\")) || bytes.Contains(rec.Value, []byte(`cr\\\\et`)) || bytes.Contains(rec.Value, []byte("Se\\\"cr")) {
		t.Errorf("the dead letter still holds the secret:\n%s", rec.Value)
	}
	m := decodeMessage(t, rec.Value)
	if !strings.Contains(m.StackTrace, "Failing row contains (a2, xxxxx, 2024-06-25)") || !strings.Contains(m.StackTrace, "inner \"xxxxx\"") {
		t.Errorf("stackTrace not redacted where the secret was:\n%s", m.StackTrace)
	}
	rec, err = NewRecord(dl, RecordConfig{}, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(decodeMessage(t, rec.Value).StackTrace, "Failing row contains (a2, "+secret) {
		t.Error("without Redact the stackTrace does not hold the detail as PostgreSQL gave it: the test no longer shows what it should")
	}
}

// stringer is a strings.Replacer as RecordConfig.Redact.
type stringer struct{ r *strings.Replacer }

func (s stringer) String(t string) string { return s.r.Replace(t) }
