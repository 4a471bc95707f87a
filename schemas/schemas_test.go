package schemas_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/causet/projection-worker/schemas"
)

// specEvent is the example event of SPEC §3, verbatim.
const specEvent = `{
  "eventType": "ARTIST_FOLLOWED",
  "entityId": "user-123",
  "forkId": "production",
  "tenantSchema": "acme_concertapp_production",
  "irVersion": "v42",
  "sequenceNumber": 1891,
  "ts": 1719331200000,
  "payload": { "user_id": "user-123", "artist_id": "artist-456" }
}`

func newValidator(t *testing.T) *schemas.Validator {
	t.Helper()
	v, err := schemas.NewValidator()
	if err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
	return v
}

// edit decodes base (numbers kept exact), applies change and encodes it
// again. A change sets fields, or deletes them by setting them to deleted.
func edit(t *testing.T, base string, change map[string]any) []byte {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(base))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decode base: %v", err)
	}
	for k, v := range change {
		if v == deleted {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

type deletedField struct{}

var deleted any = deletedField{}

// failures returns "instanceLocation keyword" for each violation of err,
// sorted; nil when err is nil. It fails the test when err is not a
// *schemas.ValidationError.
func failures(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var verr *schemas.ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error is %T (%v), want *schemas.ValidationError", err, err)
	}
	if len(verr.Violations) == 0 {
		t.Fatalf("ValidationError without violations: %v", err)
	}
	var out []string
	for _, v := range verr.Violations {
		if !strings.HasSuffix(v.KeywordLocation, "/"+v.Keyword) && v.Keyword != "false" {
			t.Errorf("violation %+v: keyword location does not end with the keyword", v)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", v.InstanceLocation)) {
			t.Errorf("error %q does not name the instance location %q", err, v.InstanceLocation)
		}
		out = append(out, v.InstanceLocation+" "+v.Keyword)
	}
	sort.Strings(out)
	return out
}

func TestValidateEvent(t *testing.T) {
	v := newValidator(t)
	long63 := "a" + strings.Repeat("b", 62)
	tests := []struct {
		name string
		doc  []byte
		want []string // "instanceLocation keyword"; nil = valid
	}{
		{name: "spec example", doc: []byte(specEvent)},
		{name: "unknown field allowed", doc: edit(t, specEvent, map[string]any{"traceId": "abc", "extra": map[string]any{"x": 1}})},
		{name: "sequence number zero", doc: edit(t, specEvent, map[string]any{"sequenceNumber": 0})},
		{name: "sequence number max int64", doc: edit(t, specEvent, map[string]any{"sequenceNumber": json.Number("9223372036854775807")})},
		{name: "ts before 1970", doc: edit(t, specEvent, map[string]any{"ts": -1})},
		{name: "ts lowest timestamptz", doc: edit(t, specEvent, map[string]any{"ts": json.Number("-210866803200000")})},
		{name: "ts highest timestamptz", doc: edit(t, specEvent, map[string]any{"ts": json.Number("9224318015999999")})},
		{name: "tenant schema 63 chars", doc: edit(t, specEvent, map[string]any{"tenantSchema": long63})},
		{name: "tenant schema leading underscore", doc: edit(t, specEvent, map[string]any{"tenantSchema": "_t1"})},
		{name: "empty irVersion", doc: edit(t, specEvent, map[string]any{"irVersion": ""})},
		{name: "empty payload", doc: edit(t, specEvent, map[string]any{"payload": map[string]any{}})},
		{name: "big payload number", doc: edit(t, specEvent, map[string]any{"payload": map[string]any{"n": json.Number("9007199254740993")}})},

		{name: "tenant schema with quote", doc: edit(t, specEvent, map[string]any{"tenantSchema": `acme"; DROP SCHEMA x; --`}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema upper case", doc: edit(t, specEvent, map[string]any{"tenantSchema": "Acme"}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema leading digit", doc: edit(t, specEvent, map[string]any{"tenantSchema": "1acme"}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema 64 chars", doc: edit(t, specEvent, map[string]any{"tenantSchema": long63 + "c"}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema trailing newline", doc: edit(t, specEvent, map[string]any{"tenantSchema": "acme\n"}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema empty", doc: edit(t, specEvent, map[string]any{"tenantSchema": ""}), want: []string{"/tenantSchema pattern"}},
		{name: "tenant schema public", doc: edit(t, specEvent, map[string]any{"tenantSchema": "public"}), want: []string{"/tenantSchema not"}},
		{name: "tenant schema information_schema", doc: edit(t, specEvent, map[string]any{"tenantSchema": "information_schema"}), want: []string{"/tenantSchema not"}},
		{name: "tenant schema pg_catalog", doc: edit(t, specEvent, map[string]any{"tenantSchema": "pg_catalog"}), want: []string{"/tenantSchema not"}},
		{name: "tenant schema pg_temp_1", doc: edit(t, specEvent, map[string]any{"tenantSchema": "pg_temp_1"}), want: []string{"/tenantSchema not"}},
		{name: "tenant schema pgx", doc: edit(t, specEvent, map[string]any{"tenantSchema": "pgx"})},
		{name: "tenant schema public_acme", doc: edit(t, specEvent, map[string]any{"tenantSchema": "public_acme"})},
		{name: "tenant schema missing", doc: edit(t, specEvent, map[string]any{"tenantSchema": deleted}), want: []string{" required"}},
		{name: "sequence number fraction", doc: edit(t, specEvent, map[string]any{"sequenceNumber": json.Number("7.5")}), want: []string{"/sequenceNumber type"}},
		{name: "sequence number string", doc: edit(t, specEvent, map[string]any{"sequenceNumber": "7"}), want: []string{"/sequenceNumber type"}},
		{name: "sequence number negative", doc: edit(t, specEvent, map[string]any{"sequenceNumber": -1}), want: []string{"/sequenceNumber minimum"}},
		{name: "sequence number beyond int64", doc: edit(t, specEvent, map[string]any{"sequenceNumber": json.Number("9223372036854775808")}), want: []string{"/sequenceNumber maximum"}},
		{name: "ts missing", doc: edit(t, specEvent, map[string]any{"ts": deleted}), want: []string{" required"}},
		{name: "ts string", doc: edit(t, specEvent, map[string]any{"ts": "1719331200000"}), want: []string{"/ts type"}},
		{name: "ts fraction", doc: edit(t, specEvent, map[string]any{"ts": json.Number("1719331200000.5")}), want: []string{"/ts type"}},
		{name: "ts beyond timestamptz", doc: edit(t, specEvent, map[string]any{"ts": json.Number("9224318016000000")}), want: []string{"/ts maximum"}},
		{name: "ts before timestamptz", doc: edit(t, specEvent, map[string]any{"ts": json.Number("-210866803200001")}), want: []string{"/ts minimum"}},
		{name: "empty event type", doc: edit(t, specEvent, map[string]any{"eventType": ""}), want: []string{"/eventType minLength"}},
		{name: "empty entity id", doc: edit(t, specEvent, map[string]any{"entityId": ""}), want: []string{"/entityId minLength"}},
		{name: "numeric fork id", doc: edit(t, specEvent, map[string]any{"forkId": 1}), want: []string{"/forkId type"}},
		{name: "null irVersion", doc: edit(t, specEvent, map[string]any{"irVersion": nil}), want: []string{"/irVersion type"}},
		{name: "payload array", doc: edit(t, specEvent, map[string]any{"payload": []any{}}), want: []string{"/payload type"}},
		{name: "payload null", doc: edit(t, specEvent, map[string]any{"payload": nil}), want: []string{"/payload type"}},
		{name: "two fields wrong", doc: edit(t, specEvent, map[string]any{"tenantSchema": "A", "payload": "x"}), want: []string{"/payload type", "/tenantSchema pattern"}},
		{name: "json null", doc: []byte(`null`), want: []string{" type"}},
		{name: "json array", doc: []byte(`[]`), want: []string{" type"}},
		{name: "empty object", doc: []byte(`{}`), want: []string{" required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.ValidateEvent(tt.doc)
			if diff := cmp.Diff(tt.want, failures(t, err)); diff != "" {
				t.Errorf("ValidateEvent(%s) violations (-want +got):\n%s\nerror: %v", tt.doc, diff, err)
			}
		})
	}
}

func TestValidateEventNotJSON(t *testing.T) {
	v := newValidator(t)
	for _, doc := range []string{"", "garbage", `{"eventType":`, "{} {}", `{"a":1}x`} {
		t.Run(fmt.Sprintf("%q", doc), func(t *testing.T) {
			err := v.ValidateEvent([]byte(doc))
			if err == nil {
				t.Fatal("ValidateEvent returned nil, want a parse error")
			}
			var verr *schemas.ValidationError
			if errors.As(err, &verr) {
				t.Errorf("parse error is a *ValidationError: %v", err)
			}
			if !strings.Contains(err.Error(), schemas.EventSchemaFile) {
				t.Errorf("error %q does not name the schema file", err)
			}
		})
	}
}

// specDeadLetter is a dead letter for the SPEC §3 event with every field of
// SPEC §6.
var specDeadLetter = `{
  "originalEvent": ` + specEvent + `,
  "projectionName": "artist_followers",
  "tenantSchema": "acme_concertapp_production",
  "error": "ERROR: column \"followed_at\" of relation \"artist_followers\" does not exist (SQLSTATE 42703)",
  "stackTrace": "apply artist_followers: ...",
  "retryCount": 5,
  "firstFailedAt": 1719331200123,
  "failedAt": 1719331206200
}`

// garbageDeadLetter is the dead letter of a record value that is not JSON.
const garbageDeadLetter = `{
  "originalEvent": null,
  "originalValueBase64": "bm90IGpzb24=",
  "projectionName": "",
  "tenantSchema": "",
  "error": "value is not a JSON object",
  "stackTrace": "",
  "retryCount": 0,
  "firstFailedAt": 1719331200123,
  "failedAt": 1719331200123
}`

func TestValidateDeadLetter(t *testing.T) {
	v := newValidator(t)
	tests := []struct {
		name string
		doc  []byte
		want []string // "instanceLocation keyword"; nil = valid
	}{
		{name: "projection failure", doc: []byte(specDeadLetter)},
		{name: "value not JSON", doc: []byte(garbageDeadLetter)},
		{name: "tombstone", doc: edit(t, garbageDeadLetter, map[string]any{"originalValueBase64": ""})},
		{name: "invalid event kept as object", doc: edit(t, specDeadLetter, map[string]any{"originalEvent": map[string]any{"eventType": 1}, "projectionName": "", "tenantSchema": ""})},
		{name: "zero times", doc: edit(t, specDeadLetter, map[string]any{"firstFailedAt": 0, "failedAt": 0, "retryCount": 0})},

		{name: "missing retryCount", doc: edit(t, specDeadLetter, map[string]any{"retryCount": deleted}), want: []string{" required"}},
		{name: "missing stackTrace", doc: edit(t, specDeadLetter, map[string]any{"stackTrace": deleted}), want: []string{" required"}},
		{name: "missing originalEvent", doc: edit(t, specDeadLetter, map[string]any{"originalEvent": deleted}), want: []string{" required"}},
		{name: "extra field", doc: edit(t, specDeadLetter, map[string]any{"errorClass": "projection"}), want: []string{" additionalProperties"}},
		{name: "originalEvent null without base64", doc: edit(t, garbageDeadLetter, map[string]any{"originalValueBase64": deleted}), want: []string{" required"}},
		{name: "base64 next to an object", doc: edit(t, specDeadLetter, map[string]any{"originalValueBase64": "e30="}), want: []string{"/originalValueBase64 false"}},
		{name: "originalEvent string", doc: edit(t, specDeadLetter, map[string]any{"originalEvent": specEvent}), want: []string{"/originalEvent type"}},
		{name: "originalEvent array", doc: edit(t, specDeadLetter, map[string]any{"originalEvent": []any{}}), want: []string{"/originalEvent type"}},
		{name: "base64 not base64", doc: edit(t, garbageDeadLetter, map[string]any{"originalValueBase64": "not base64!"}), want: []string{"/originalValueBase64 contentEncoding", "/originalValueBase64 pattern"}},
		{name: "base64 unpadded", doc: edit(t, garbageDeadLetter, map[string]any{"originalValueBase64": "e30"}), want: []string{"/originalValueBase64 contentEncoding", "/originalValueBase64 pattern"}},
		{name: "tenant schema with quote", doc: edit(t, specDeadLetter, map[string]any{"tenantSchema": `a"b`}), want: []string{"/tenantSchema pattern"}},
		{name: "projection name null", doc: edit(t, specDeadLetter, map[string]any{"projectionName": nil}), want: []string{"/projectionName type"}},
		{name: "error not string", doc: edit(t, specDeadLetter, map[string]any{"error": map[string]any{"msg": "x"}}), want: []string{"/error type"}},
		{name: "retryCount negative", doc: edit(t, specDeadLetter, map[string]any{"retryCount": -1}), want: []string{"/retryCount minimum"}},
		{name: "retryCount fraction", doc: edit(t, specDeadLetter, map[string]any{"retryCount": json.Number("1.5")}), want: []string{"/retryCount type"}},
		{name: "failedAt negative", doc: edit(t, specDeadLetter, map[string]any{"failedAt": -1}), want: []string{"/failedAt minimum"}},
		{name: "firstFailedAt RFC 3339", doc: edit(t, specDeadLetter, map[string]any{"firstFailedAt": "2024-06-25T16:00:00Z"}), want: []string{"/firstFailedAt type"}},
		{name: "json null", doc: []byte(`null`), want: []string{" type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.ValidateDeadLetter(tt.doc)
			if diff := cmp.Diff(tt.want, failures(t, err)); diff != "" {
				t.Errorf("ValidateDeadLetter(%s) violations (-want +got):\n%s\nerror: %v", tt.doc, diff, err)
			}
		})
	}
}

func TestValidationErrorNamesField(t *testing.T) {
	v := newValidator(t)
	tests := []struct {
		name     string
		validate func([]byte) error
		doc      []byte
		want     []string // substrings of the error message
	}{
		{
			name:     "event pattern",
			validate: v.ValidateEvent,
			doc:      edit(t, specEvent, map[string]any{"tenantSchema": `a"b`}),
			want:     []string{schemas.EventSchemaFile, `"/tenantSchema"`, `"/properties/tenantSchema/pattern"`},
		},
		{
			name:     "dead letter required",
			validate: v.ValidateDeadLetter,
			doc:      edit(t, specDeadLetter, map[string]any{"retryCount": deleted}),
			want:     []string{schemas.DeadLetterSchemaFile, `"/required"`, "retryCount"},
		},
		{
			name:     "dead letter additional property",
			validate: v.ValidateDeadLetter,
			doc:      edit(t, specDeadLetter, map[string]any{"surprise": true}),
			want:     []string{`"/additionalProperties"`, "surprise"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.validate(tt.doc)
			if err == nil {
				t.Fatal("got nil error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestSchemaFiles checks the embedded files: each names its $id, draft and
// title, documents every property, and its own examples are valid.
func TestSchemaFiles(t *testing.T) {
	v := newValidator(t)
	tests := []struct {
		file     string
		id       string
		validate func([]byte) error
	}{
		{schemas.EventSchemaFile, schemas.EventSchemaID, v.ValidateEvent},
		{schemas.DeadLetterSchemaFile, schemas.DeadLetterSchemaID, v.ValidateDeadLetter},
	}
	names, err := fs.Glob(schemas.Files(), "*")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{schemas.DeadLetterSchemaFile, schemas.EventSchemaFile}, names); diff != "" {
		t.Errorf("Files() (-want +got):\n%s", diff)
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, err := fs.ReadFile(schemas.Files(), tt.file)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Schema      string                     `json:"$schema"`
				ID          string                     `json:"$id"`
				Title       string                     `json:"title"`
				Description string                     `json:"description"`
				Properties  map[string]json.RawMessage `json:"properties"`
				Examples    []json.RawMessage          `json:"examples"`
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatal(err)
			}
			got := []string{doc.Schema, doc.ID}
			want := []string{"https://json-schema.org/draft/2020-12/schema", tt.id}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("$schema, $id (-want +got):\n%s", diff)
			}
			if doc.Title == "" || doc.Description == "" {
				t.Errorf("title %q, description %q: want both", doc.Title, doc.Description)
			}
			for name, raw := range doc.Properties {
				var p struct{ Description string }
				if err := json.Unmarshal(raw, &p); err != nil || p.Description == "" {
					t.Errorf("property %s has no description", name)
				}
			}
			if len(doc.Examples) == 0 {
				t.Error("no examples")
			}
			for i, ex := range doc.Examples {
				if err := tt.validate(ex); err != nil {
					t.Errorf("example %d: %v", i, err)
				}
			}
		})
	}
}

func TestValidatorConcurrent(t *testing.T) {
	v := newValidator(t)
	bad := edit(t, specEvent, map[string]any{"ts": "x"})
	t.Run("group", func(t *testing.T) {
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				for range 50 {
					if err := v.ValidateEvent([]byte(specEvent)); err != nil {
						t.Errorf("valid event: %v", err)
					}
					if err := v.ValidateEvent(bad); err == nil {
						t.Error("invalid event accepted")
					}
				}
			})
		}
	})
}

func ExampleValidator() {
	v, err := schemas.NewValidator()
	if err != nil {
		panic(err)
	}
	event := []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production",` +
		`"tenantSchema":"acme\"x","irVersion":"v42","sequenceNumber":7.5,"ts":1719331200000,"payload":{}}`)
	err = v.ValidateEvent(event)
	var verr *schemas.ValidationError
	if errors.As(err, &verr) {
		for _, f := range verr.Violations {
			fmt.Printf("%s: %s\n", f.InstanceLocation, f.Keyword)
		}
	}

	deadLetter := []byte(`{"originalEvent":null,"projectionName":"","tenantSchema":"","error":"not JSON",` +
		`"stackTrace":"","retryCount":0,"firstFailedAt":1719331200000,"failedAt":1719331200000}`)
	fmt.Println(v.ValidateDeadLetter(deadLetter))
	// Output:
	// /sequenceNumber: type
	// /tenantSchema: pattern
	// projection-dlq.v1.schema.json: at "" (keyword "/then/required"): missing property 'originalValueBase64'
}
