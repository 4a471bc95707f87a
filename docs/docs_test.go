// Package docs_test keeps the user documentation in this folder equal to
// the code: the fields of the event and dead-letter tables to the JSON
// Schemas in schemas/, the headers to the dlq package's constants, the
// column types and definition keys to what the definitions parser accepts,
// and the examples to what the decoder, kcat and dlq.Fingerprint do with
// them.
//
// The tables a test reads follow a marker line `<!-- docs-test: NAME -->`
// (the conversion rules: `<!-- column-conversions: begin ... -->`).
package docs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/testtool"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
	"github.com/causet/projection-worker/schemas"
)

// readDoc returns the lines of a file of this folder.
func readDoc(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// afterMarker returns the index of the first line after the one that
// starts with marker, failing t when there is none or more than one.
func afterMarker(t *testing.T, doc string, lines []string, marker string) int {
	t.Helper()
	at := -1
	for i, l := range lines {
		if strings.HasPrefix(l, marker) {
			if at >= 0 {
				t.Fatalf("%s: marker %q appears twice", doc, marker)
			}
			at = i + 1
		}
	}
	if at < 0 {
		t.Fatalf("%s: no line starting with %q", doc, marker)
	}
	return at
}

// docTable is a Markdown table: its header cells and rows of cells, with
// the surrounding spaces trimmed.
type docTable struct {
	header []string
	rows   [][]string
}

// table returns the Markdown table that follows marker in doc.
func table(t *testing.T, doc, marker string) docTable {
	t.Helper()
	lines := readDoc(t, doc)
	i := afterMarker(t, doc, lines, marker)
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	var tb docTable
	for ; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		cells := splitRow(lines[i])
		switch {
		case tb.header == nil:
			tb.header = cells
		case strings.Trim(lines[i], "|- ") == "":
			// the delimiter row
		default:
			if len(cells) != len(tb.header) {
				t.Fatalf("%s: row %q has %d cells, the header %d", doc, lines[i], len(cells), len(tb.header))
			}
			tb.rows = append(tb.rows, cells)
		}
	}
	if len(tb.rows) == 0 {
		t.Fatalf("%s: no table after %q", doc, marker)
	}
	return tb
}

// column returns the index of the header cell name.
func (tb docTable) column(t *testing.T, name string) int {
	t.Helper()
	i := slices.Index(tb.header, name)
	if i < 0 {
		t.Fatalf("table has no column %q: %q", name, tb.header)
	}
	return i
}

func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i, c := range cells {
		cells[i] = strings.TrimSpace(c)
	}
	return cells
}

// codeBlock returns the content of the fenced code block that follows
// marker in doc.
func codeBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	lines := readDoc(t, doc)
	i := afterMarker(t, doc, lines, marker)
	if i >= len(lines) || !strings.HasPrefix(lines[i], "```") {
		t.Fatalf("%s: no code block right after %q", doc, marker)
	}
	var b strings.Builder
	for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
		b.WriteString(lines[i])
		b.WriteString("\n")
	}
	return b.String()
}

// unquote strips the backticks around a code span.
func unquote(cell string) string {
	return strings.TrimSuffix(strings.TrimPrefix(cell, "`"), "`")
}

// schemaDoc is the part of a JSON Schema the field tables document.
type schemaDoc struct {
	Required             []string                   `json:"required"`
	Properties           map[string]json.RawMessage `json:"properties"`
	AdditionalProperties *bool                      `json:"additionalProperties"`
	If                   *struct {
		Properties map[string]struct {
			Type string `json:"type"`
		} `json:"properties"`
	} `json:"if"`
	Then *struct {
		Required []string `json:"required"`
	} `json:"then"`
}

func readSchema(t *testing.T, file string) schemaDoc {
	t.Helper()
	b, err := fs.ReadFile(schemas.Files(), file)
	if err != nil {
		t.Fatal(err)
	}
	var s schemaDoc
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return s
}

// otherFields is the field cell of the row that documents the fields a
// schema allows besides its properties.
const otherFields = "*(any other)*"

// documentedField is one row of a field table, as the test compares it.
type documentedField struct {
	Type, Required string
}

// schemaFields returns, for each property of s, the JSON type and the
// requiredness its row must show: "yes" for a required property; "when
// `p` is null" for one that the schema's if/then requires when property
// p is null; "no" otherwise. A schema that allows other properties has
// the row otherFields, any type, not required.
func schemaFields(t *testing.T, file string, s schemaDoc) map[string]documentedField {
	t.Helper()
	condition := ""
	if s.If != nil && s.Then != nil {
		for p, c := range s.If.Properties {
			if c.Type != "null" || condition != "" {
				t.Fatalf("%s: the test knows an if on one property being null, not %+v", file, s.If)
			}
			condition = "when `" + p + "` is null"
		}
	}
	out := map[string]documentedField{}
	for name, raw := range s.Properties {
		var p struct {
			Type any `json:"type"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatalf("%s: property %s: %v", file, name, err)
		}
		var typ string
		switch v := p.Type.(type) {
		case string:
			typ = v
		case []any:
			var names []string
			for _, n := range v {
				names = append(names, fmt.Sprint(n))
			}
			typ = strings.Join(names, " or ")
		default:
			t.Fatalf("%s: property %s has no type", file, name)
		}
		req := "no"
		switch {
		case slices.Contains(s.Required, name):
			req = "yes"
		case s.Then != nil && slices.Contains(s.Then.Required, name):
			req = condition
		}
		out[name] = documentedField{Type: typ, Required: req}
	}
	if s.AdditionalProperties == nil || *s.AdditionalProperties {
		out[otherFields] = documentedField{Type: "any", Required: "no"}
	}
	return out
}

// checkFieldTable compares the field table after marker in doc with the
// properties of schema file.
func checkFieldTable(t *testing.T, doc, marker, file string) {
	tb := table(t, doc, marker)
	f, typ, req := tb.column(t, "field"), tb.column(t, "JSON type"), tb.column(t, "required")
	got := map[string]documentedField{}
	for _, r := range tb.rows {
		name := unquote(r[f])
		if _, dup := got[name]; dup {
			t.Errorf("%s: field %s documented twice", doc, name)
		}
		got[name] = documentedField{Type: r[typ], Required: r[req]}
	}
	want := schemaFields(t, file, readSchema(t, file))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: the field table differs from schemas/%s (-schema +doc):\n%s", doc, file, diff)
	}
}

// TestEventFieldsMatchSchema checks that docs/events.md documents every
// property of the event schema with its JSON type and requiredness, that
// it documents no field the schema lacks, and that it says whether other
// fields are allowed as the schema does.
func TestEventFieldsMatchSchema(t *testing.T) {
	checkFieldTable(t, "events.md", "<!-- docs-test: event-fields -->", schemas.EventSchemaFile)
}

// TestDeadLetterFieldsMatchSchema does the same for the dead-letter
// fields of docs/dead-letters.md and the dead-letter schema.
func TestDeadLetterFieldsMatchSchema(t *testing.T) {
	checkFieldTable(t, "dead-letters.md", "<!-- docs-test: dead-letter-fields -->", schemas.DeadLetterSchemaFile)
}

// exampleEvent returns the example event of docs/events.md.
func exampleEvent(t *testing.T) []byte {
	t.Helper()
	return []byte(codeBlock(t, "events.md", "<!-- docs-test: example-event -->"))
}

// TestExampleEventIsAccepted checks that the example event of
// docs/events.md validates against the event schema and is accepted by the
// worker's decoder.
func TestExampleEventIsAccepted(t *testing.T) {
	v, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	ev := exampleEvent(t)
	if err := v.ValidateEvent(ev); err != nil {
		t.Errorf("the example event does not validate against the schema: %v\n%s", err, ev)
	}
	if _, err := projection.DecodeEvent(ev); err != nil {
		t.Errorf("the decoder refuses the example event: %v\n%s", err, ev)
	}
}

// produceLine is one documented kcat line: echo '<event>' | kcat -P ...
var produceLine = regexp.MustCompile(`^echo '([^']*)' \| kcat -P -b 127\.0\.0\.1:9092 -t causet\.projection-events\.v1 -k (\S+)$`)

// TestProduceExampleWithKcat runs the kcat lines of docs/events.md against
// a broker (kfake, or KAFKA_BROKERS) and checks that each produces one
// record, keyed by its event's entityId, whose value validates against the
// schema and is accepted by the decoder, and that the first one produces
// the example event.
func TestProduceExampleWithKcat(t *testing.T) {
	lines := strings.Split(strings.TrimSpace(codeBlock(t, "events.md", "<!-- docs-test: produce-example -->")), "\n")
	v, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	type want struct{ key, value string }
	var wants []want
	for i, l := range lines {
		m := produceLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %d is not `echo '<event>' | kcat -P -b 127.0.0.1:9092 -t causet.projection-events.v1 -k <key>`: %s", i+1, l)
		}
		value, key := m[1], m[2]
		if err := v.ValidateEvent([]byte(value)); err != nil {
			t.Errorf("line %d: the event does not validate: %v", i+1, err)
		}
		ev, err := projection.DecodeEvent([]byte(value))
		if err != nil {
			t.Fatalf("line %d: the decoder refuses the event: %v", i+1, err)
		}
		if key != ev.EntityID {
			t.Errorf("line %d: key %q, want the entityId %q", i+1, key, ev.EntityID)
		}
		wants = append(wants, want{key, value})
	}
	var example bytes.Buffer
	if err := json.Compact(&example, exampleEvent(t)); err != nil {
		t.Fatal(err)
	}
	if wants[0].value != example.String() {
		t.Errorf("the first kcat line sends\n%s\nnot the example event\n%s", wants[0].value, example.String())
	}

	testtool.Require(t, "kcat")
	b := kafkatest.New(t)
	topic := kafkatest.TopicName(t, "events")
	b.CreateTopic(t, topic, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, l := range lines {
		l = strings.Replace(l, "-b 127.0.0.1:9092", "-b "+strings.Join(b.Addrs, ","), 1)
		l = strings.Replace(l, "-t "+projection.DefaultEventsTopic, "-t "+topic, 1)
		out, err := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", l).CombinedOutput()
		if err != nil {
			t.Fatalf("$ %s\n%v\n%s", l, err, out)
		}
	}
	cl := b.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []want
	for len(got) < len(wants) && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		for _, r := range fs.Records() {
			got = append(got, want{string(r.Key), string(r.Value)})
		}
	}
	if diff := cmp.Diff(wants, got, cmp.AllowUnexported(want{})); diff != "" {
		t.Errorf("records on the topic (-documented +produced):\n%s", diff)
	}
}

// constantsWithPrefix returns the string constants of the non-test Go
// files of dir whose value starts with prefix (the prefix itself left out).
func constantsWithPrefix(t *testing.T, dir, prefix string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				for _, v := range spec.(*ast.ValueSpec).Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					s, err := strconv.Unquote(lit.Value)
					if err == nil && strings.HasPrefix(s, prefix) && s != prefix {
						out = append(out, s)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// firstColumn returns the unquoted first cells of tb, sorted.
func firstColumn(tb docTable) []string {
	var out []string
	for _, r := range tb.rows {
		out = append(out, unquote(r[0]))
	}
	slices.Sort(out)
	return out
}

// TestHeadersDocumented checks that docs/dead-letters.md documents each
// causet.dlq.* header and docs/events.md each causet.replay.* header that
// the dlq package declares, and no other.
func TestHeadersDocumented(t *testing.T) {
	for _, c := range []struct{ doc, marker, prefix string }{
		{"dead-letters.md", "<!-- docs-test: dead-letter-headers -->", "causet.dlq."},
		{"events.md", "<!-- docs-test: replay-headers -->", "causet.replay."},
	} {
		want := constantsWithPrefix(t, "../dlq", c.prefix)
		if len(want) == 0 {
			t.Fatalf("no %s* constants found in dlq", c.prefix)
		}
		got := firstColumn(table(t, c.doc, c.marker))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: the %s* headers differ from the dlq package's constants (-code +doc):\n%s", c.doc, c.prefix, diff)
		}
	}
}

// definitionWith returns a definitions file with one projection whose
// column v has the given type.
func definitionWith(typ string) []byte {
	return fmt.Appendf(nil, `irVersion: v1
projections:
  - name: p
    table: p
    primaryKey: [k]
    columns:
      k: { type: text, from: entityId }
      v: { type: %q, from: payload.v }
    events: { E: upsert }
`, typ)
}

// TestColumnTypesDocumented checks that docs/definitions.md lists every
// column type and alias the definitions parser accepts, and no other; that
// the parser accepts each documented name, in any case, as its documented
// type; and that the conversion table has one row for each type.
func TestColumnTypesDocumented(t *testing.T) {
	tb := table(t, "definitions.md", "<!-- docs-test: column-types -->")
	aliases := map[string]string{}
	for _, r := range tb.rows {
		canonical := unquote(r[0])
		names := []string{canonical}
		if r[1] != "" {
			for _, a := range strings.Split(r[1], ", ") {
				aliases[unquote(a)] = canonical
				names = append(names, unquote(a))
			}
		}
		for _, name := range names {
			for _, spelling := range []string{name, strings.ToUpper(name)} {
				d, err := projection.ParseDefinitions("types.yaml", definitionWith(spelling))
				if err != nil {
					t.Errorf("the parser refuses documented type %q: %v", spelling, err)
					continue
				}
				if got := d.Projections[0].Columns["v"].Type; got != canonical {
					t.Errorf("type %q is read as %q, documented as %q", spelling, got, canonical)
				}
			}
		}
	}
	want := slices.Sorted(slices.Values(projection.ColumnTypes))
	if diff := cmp.Diff(want, firstColumn(tb)); diff != "" {
		t.Errorf("column types (-projection.ColumnTypes +doc):\n%s", diff)
	}
	if diff := cmp.Diff(projection.ColumnTypeAliases(), aliases); diff != "" {
		t.Errorf("column type aliases (-projection.ColumnTypeAliases +doc):\n%s", diff)
	}

	conv := table(t, "definitions.md", "<!-- column-conversions: begin")
	var converted []string
	for _, r := range conv.rows {
		for _, typ := range strings.Split(r[0], ", ") {
			converted = append(converted, unquote(typ))
		}
	}
	slices.Sort(converted)
	if diff := cmp.Diff(want, converted); diff != "" {
		t.Errorf("the conversion table's types (-projection.ColumnTypes +doc):\n%s", diff)
	}
	lines := readDoc(t, "definitions.md")
	afterMarker(t, "definitions.md", lines, "<!-- column-conversions: end -->")
}

// acceptedKeys returns the keys the definitions parser accepts where an
// unknown key is put in file, from its error ("unknown key "x" (want one
// of a, b)").
func acceptedKeys(t *testing.T, file string) []string {
	t.Helper()
	_, err := projection.ParseDefinitions("keys.yaml", []byte(file))
	m := regexp.MustCompile(`unknown key "zz_unknown" \(want one of ([^)]*)\)`).FindStringSubmatch(fmt.Sprint(err))
	if m == nil {
		t.Fatalf("no unknown-key error naming the accepted keys for\n%s\ngot: %v", file, err)
	}
	keys := strings.Split(m[1], ", ")
	slices.Sort(keys)
	return keys
}

// TestDefinitionKeysDocumented checks that docs/definitions.md documents
// every key the definitions parser accepts, at each level, and no other.
func TestDefinitionKeysDocumented(t *testing.T) {
	tb := table(t, "definitions.md", "<!-- docs-test: definition-keys -->")
	key, in := tb.column(t, "key"), tb.column(t, "in")
	got := map[string][]string{}
	for _, r := range tb.rows {
		got[r[in]] = append(got[r[in]], unquote(r[key]))
	}
	for _, keys := range got {
		slices.Sort(keys)
	}
	want := map[string][]string{
		"the file":     acceptedKeys(t, "irVersion: v1\nzz_unknown: 1\n"),
		"a projection": acceptedKeys(t, "irVersion: v1\nprojections:\n  - zz_unknown: 1\n"),
		"a column": acceptedKeys(t, "irVersion: v1\nprojections:\n  - name: p\n    columns:\n"+
			"      c: { zz_unknown: 1 }\n"),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("definition keys (-parser +doc):\n%s", diff)
	}
}

// TestFingerprintExample checks the worked fingerprint of
// docs/dead-letters.md: the masked error is dlq.MaskLiterals's, the hashed
// text follows the documented rule (each field as its byte length, ':' and
// its bytes), its SHA-256 begins with the documented fingerprint, which is
// dlq.Fingerprint's, and the documented shell lines print it.
func TestFingerprintExample(t *testing.T) {
	tb := table(t, "dead-letters.md", "<!-- docs-test: fingerprint-example -->")
	doc := map[string]string{}
	for _, r := range tb.rows {
		doc[r[0]] = unquote(r[1])
	}
	if got := dlq.MaskLiterals(doc["error"]); got != doc["masked error"] {
		t.Errorf("MaskLiterals(%q) = %q, documented %q", doc["error"], got, doc["masked error"])
	}
	var hashed strings.Builder
	for _, f := range []string{doc["projection"], doc["class"], doc["SQLSTATE"], doc["masked error"]} {
		fmt.Fprintf(&hashed, "%d:%s", len(f), f)
	}
	if hashed.String() != doc["hashed"] {
		t.Errorf("the documented rule hashes %q, documented %q", hashed.String(), doc["hashed"])
	}
	sum := sha256.Sum256([]byte(doc["hashed"]))
	if got := hex.EncodeToString(sum[:8]); got != doc["fingerprint"] {
		t.Errorf("SHA-256 of the hashed text begins %s, documented %s", got, doc["fingerprint"])
	}
	class := map[string]retry.Class{"projection": retry.Projection, "permanent": retry.Permanent, "infrastructure": retry.Infrastructure}[doc["class"]]
	if got := dlq.Fingerprint(doc["projection"], class, doc["SQLSTATE"], doc["error"]); got != doc["fingerprint"] {
		t.Errorf("dlq.Fingerprint = %s, documented %s", got, doc["fingerprint"])
	}

	script := codeBlock(t, "dead-letters.md", "<!-- docs-test: fingerprint-shell -->")
	testtool.Require(t, "sha256sum")
	out, err := exec.Command("bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("the shell lines fail: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != doc["fingerprint"] {
		t.Errorf("the shell lines print %q, documented %s", got, doc["fingerprint"])
	}
}

// TestDefinitionsExamples checks that the example definitions of
// docs/definitions.md load, and that each documented error is one the
// parser reports for a file with that mistake.
func TestDefinitionsExamples(t *testing.T) {
	example := codeBlock(t, "definitions.md", "<!-- docs-test: example-definitions -->")
	if _, err := projection.ParseDefinitions("example.yaml", []byte(example)); err != nil {
		t.Errorf("the example definitions do not load: %v", err)
	}
	// Each mistake is made in the example file named defs.yaml.
	mistakes := []struct{ from, to string }{
		{"primaryKey: [artist_id, user_id]", "primaryKey: [artist, user_id]"},
		{"score:       { type: bigint,", "score:       { type: int9,"},
		{`derive: "has(payload.games) ? payload.points / payload.games : null"`, `derive: "payload.points /"`},
	}
	documented := strings.Split(strings.TrimSpace(codeBlock(t, "definitions.md", "<!-- docs-test: definition-errors -->")), "\n")
	if len(documented) != len(mistakes) {
		t.Fatalf("%d documented errors, the test makes %d mistakes", len(documented), len(mistakes))
	}
	for i, m := range mistakes {
		if !strings.Contains(example, m.from) {
			t.Fatalf("the example has no %q", m.from)
		}
		_, err := projection.ParseDefinitions("defs.yaml", []byte(strings.Replace(example, m.from, m.to, 1)))
		// A documented error may end in "..." for the rest of a long message.
		want := strings.TrimSuffix(documented[i], "...")
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("with %s the parser reports\n%v\ndocumented\n%s", m.to, err, documented[i])
		}
	}
}

// markdownLink is a link target in Markdown: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lowercased, punctuation other than '-' and '_' dropped,
// spaces turned into '-'.
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var a strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				a.WriteRune(r)
			}
		}
		anchors[a.String()] = true
	}
	return anchors
}

// TestLinksResolve checks that every relative link of the pages in this
// folder, and every link of README.md into it, names a file that exists
// and, with a #fragment into a Markdown file, one of its headings.
func TestLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range append(pages, "../README.md") {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || page == "../README.md" && !strings.HasPrefix(target, "docs/") {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			if fragment != "" && strings.HasSuffix(path, ".md") && !headingAnchors(t, path)[fragment] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", page, target, path, fragment)
			}
		}
	}
}
