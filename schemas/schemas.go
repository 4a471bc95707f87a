// Package schemas holds the JSON Schemas (draft 2020-12) of the Causet
// projection event (SPEC §3) and of the dead-letter message (SPEC §6),
// embedded in the binary, and a [Validator] that checks documents against
// them.
//
// The schemas are the published contract for producers and for operators
// reading the dead-letter topic with kcat; tests validate every message the
// project produces against them. A few rules cannot be written in JSON
// Schema and are enforced by the worker itself: duplicate object keys,
// integers written as 7.0 or 1e3 (JSON Schema counts them as integers), the
// byte-for-byte copy of originalEvent, and firstFailedAt <= failedAt.
//
// The package imports no other package of this module.
package schemas

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// File names of the embedded schemas, as found in [Files] and in the
// schemas/ folder of the repository.
const (
	// EventSchemaFile is the JSON Schema of the projection event (SPEC §3).
	EventSchemaFile = "projection-event.v1.schema.json"
	// DeadLetterSchemaFile is the JSON Schema of the dead-letter message
	// value (SPEC §6).
	DeadLetterSchemaFile = "projection-dlq.v1.schema.json"
)

// Schema identifiers: the "$id" of each embedded schema. They name the
// schemas; nothing is fetched from these URLs.
const (
	// EventSchemaID is the "$id" of [EventSchemaFile].
	EventSchemaID = "https://github.com/causet/projection-worker/schemas/" + EventSchemaFile
	// DeadLetterSchemaID is the "$id" of [DeadLetterSchemaFile].
	DeadLetterSchemaID = "https://github.com/causet/projection-worker/schemas/" + DeadLetterSchemaFile
)

// files holds the schema files; embed.FS is read-only, so this is not
// mutable state.
//
//go:embed *.json
var files embed.FS

// Files returns the embedded schema files (flat, named [EventSchemaFile]
// and [DeadLetterSchemaFile]), for serving or writing out as documentation.
// The returned file system is read-only and safe for concurrent use.
func Files() fs.FS {
	return files
}

// Validator checks JSON documents against the embedded schemas. Build one
// with [NewValidator] and share it: both schemas are compiled once, and its
// methods are safe for concurrent use. The zero value is not usable.
type Validator struct {
	event      *jsonschema.Schema
	deadLetter *jsonschema.Schema
}

// NewValidator compiles both embedded schemas (draft 2020-12, with
// contentEncoding assertions on, so originalValueBase64 must be valid
// standard base64). It returns an error only if an embedded schema is
// broken, which the package tests rule out.
func NewValidator() (*Validator, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertContent()
	var v Validator
	for _, s := range []struct {
		file, id string
		dst      **jsonschema.Schema
	}{
		{EventSchemaFile, EventSchemaID, &v.event},
		{DeadLetterSchemaFile, DeadLetterSchemaID, &v.deadLetter},
	} {
		b, err := files.ReadFile(s.file)
		if err != nil {
			return nil, fmt.Errorf("read schema %s: %w", s.file, err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("parse schema %s: %w", s.file, err)
		}
		if err := c.AddResource(s.id, doc); err != nil {
			return nil, fmt.Errorf("add schema %s: %w", s.file, err)
		}
		sch, err := c.Compile(s.id)
		if err != nil {
			return nil, fmt.Errorf("compile schema %s: %w", s.file, err)
		}
		*s.dst = sch
	}
	return &v, nil
}

// ValidateEvent checks b, one projection event record value, against
// [EventSchemaFile]. Numbers are decoded exactly (json.Number), never
// through float64, so 9223372036854775808 is refused as a sequenceNumber.
//
// It returns nil when b is valid; a *[ValidationError] naming each failing
// instance location and schema keyword when b is JSON but breaks the
// schema; and a parse error (not a *ValidationError) when b is empty, not
// JSON, or has trailing data. Duplicate keys are not detected.
func (v *Validator) ValidateEvent(b []byte) error {
	return validate(v.event, EventSchemaFile, b)
}

// ValidateDeadLetter checks b, one dead-letter record value, against
// [DeadLetterSchemaFile]: exactly the documented fields, with
// originalValueBase64 present if and only if originalEvent is null. Errors
// are as for [Validator.ValidateEvent].
func (v *Validator) ValidateDeadLetter(b []byte) error {
	return validate(v.deadLetter, DeadLetterSchemaFile, b)
}

func validate(sch *jsonschema.Schema, file string, b []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: parse document: %w", file, err)
	}
	if err := sch.Validate(doc); err != nil {
		verr, ok := err.(*jsonschema.ValidationError)
		if !ok {
			return fmt.Errorf("%s: %w", file, err)
		}
		return newValidationError(file, verr)
	}
	return nil
}

// ValidationError reports that a document breaks a schema. Use errors.As to
// get it from the error of [Validator.ValidateEvent] or
// [Validator.ValidateDeadLetter].
type ValidationError struct {
	// Schema is the file name of the schema, [EventSchemaFile] or
	// [DeadLetterSchemaFile].
	Schema string
	// Violations lists each failing keyword, sorted by InstanceLocation
	// then KeywordLocation; never empty.
	Violations []Violation

	cause *jsonschema.ValidationError
}

// Violation is one failing schema keyword.
type Violation struct {
	// InstanceLocation is the JSON Pointer (RFC 6901) of the offending value
	// in the document, e.g. "/tenantSchema"; "" is the whole document (as
	// for a missing required property or an unexpected one).
	InstanceLocation string
	// KeywordLocation is the JSON Pointer of the failing keyword in the
	// schema, e.g. "/properties/tenantSchema/pattern" or "/required".
	KeywordLocation string
	// Keyword is the failing keyword, the last token of KeywordLocation,
	// e.g. "pattern", "required", "additionalProperties", "not"; "false" for a
	// value the schema forbids outright (originalValueBase64 next to a
	// non-null originalEvent).
	Keyword string
	// Message is the validator's English message, e.g.
	// "missing property 'retryCount'".
	Message string
}

// Error returns the schema file and every violation, e.g.
// `projection-event.v1.schema.json: at "/sequenceNumber" (keyword
// "/properties/sequenceNumber/type"): got number, want integer`.
func (e *ValidationError) Error() string {
	var sb strings.Builder
	sb.WriteString(e.Schema)
	sb.WriteString(": ")
	for i, v := range e.Violations {
		if i > 0 {
			sb.WriteString("; ")
		}
		fmt.Fprintf(&sb, "at %q (keyword %q): %s", v.InstanceLocation, v.KeywordLocation, v.Message)
	}
	return sb.String()
}

// Unwrap returns the underlying *jsonschema.ValidationError, which carries
// the full error tree.
func (e *ValidationError) Unwrap() error {
	return e.cause
}

func newValidationError(file string, verr *jsonschema.ValidationError) *ValidationError {
	e := &ValidationError{Schema: file, cause: verr}
	// The detailed output keeps the schema's structure; its leaves are the
	// keywords that failed, each with relative keyword and instance
	// locations already as JSON Pointers.
	var walk func(u jsonschema.OutputUnit)
	walk = func(u jsonschema.OutputUnit) {
		for _, c := range u.Errors {
			walk(c)
		}
		if len(u.Errors) > 0 || u.Error == nil {
			return
		}
		keyword, msg := "false", "not allowed here (false schema)"
		loc := u.KeywordLocation
		if kw := u.Error.Kind.KeywordPath(); len(kw) > 0 {
			keyword, msg = kw[len(kw)-1], u.Error.String()
		} else if _, ok := u.Error.Kind.(*kind.Not); ok {
			// The validator reports "not" without its keyword path.
			keyword, msg, loc = "not", "is a value the schema excludes ('not')", loc+"/not"
		}
		e.Violations = append(e.Violations, Violation{
			InstanceLocation: u.InstanceLocation,
			KeywordLocation:  loc,
			Keyword:          keyword,
			Message:          msg,
		})
	}
	walk(*verr.DetailedOutput())
	// Properties are validated in map order; sort for a stable message.
	slices.SortStableFunc(e.Violations, func(a, b Violation) int {
		return cmp.Or(
			strings.Compare(a.InstanceLocation, b.InstanceLocation),
			strings.Compare(a.KeywordLocation, b.KeywordLocation),
		)
	})
	if len(e.Violations) == 0 {
		e.Violations = []Violation{{Message: verr.Error()}}
	}
	return e
}
