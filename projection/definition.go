package projection

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	"go.yaml.in/yaml/v3"
)

// Definitions is a loaded projection definitions file (SPEC §4): one IR
// version and its table projections.
//
// Definitions must not be modified once passed to [NewTableProjections].
type Definitions struct {
	// IRVersion is the IR version the file was compiled for (e.g. "v42").
	IRVersion string
	// Projections are the projections in file order.
	Projections []ProjectionDef

	// source names the file in error messages ("" for hand-built values).
	source string
	// programs caches compiled derive expressions by their text, so that
	// each expression is compiled once (by LoadDefinitions or Validate).
	programs map[string]cel.Program
}

// ProjectionDef is one table projection: it keeps one row per primary key in
// Table inside the event's tenant schema.
type ProjectionDef struct {
	// Name is the projection's name (projectionName in dead letters); a
	// valid identifier, unique in the file.
	Name string
	// Table is the table inside the tenant schema; a valid identifier, used
	// by one projection only.
	Table string
	// PrimaryKey lists the primary key columns, in key order.
	PrimaryKey []string
	// Columns maps each column name to its definition.
	Columns map[string]ColumnDef
	// ColumnNames is the column order used for DDL and SQL: the order of the
	// file. For a hand-built ProjectionDef it may be left empty; Validate then
	// fills it with the sorted column names. When set, it must name exactly
	// the keys of Columns.
	ColumnNames []string
	// Events maps each event type handled to its operation.
	Events map[string]Op
}

// ColumnDef defines one column. Exactly one of From and Derive is set.
type ColumnDef struct {
	// Type is the PostgreSQL type, normalised by Validate to its canonical
	// name (see [ColumnTypes]; "int8" becomes "bigint").
	Type string
	// From is a dotted path into the event: its first segment is a field of
	// the event (SPEC §3: payload, eventType, entityId, forkId, tenantSchema,
	// irVersion, sequenceNumber, ts); only payload has further segments,
	// which are object keys, or decimal indexes into arrays. An absent path
	// gives NULL. Numbers keep their exact text.
	From string
	// Derive is a CEL expression over the variables event (the whole event)
	// and payload; see the package's CEL notes in cel.go.
	Derive string
	// NotNull makes the column NOT NULL. Primary key columns always are.
	NotNull bool
}

// Op is what an event type does to a projection's row.
type Op string

// The operations of a projection.
const (
	// OpUpsert inserts the row or overwrites it when the event is not older
	// than the row (INSERT ... ON CONFLICT DO UPDATE).
	OpUpsert Op = "upsert"
	// OpDelete deletes the row by primary key and leaves a tombstone.
	OpDelete Op = "delete"
)

// ColumnTypes lists the column types accepted in definitions (canonical
// PostgreSQL names). Aliases accepted and normalised: int8 → bigint, int,
// int4 → integer, int2 → smallint, decimal → numeric, float8 → double
// precision, float4 → real, bool → boolean, "timestamp with time zone" →
// timestamptz. Type names are case-insensitive.
var ColumnTypes = []string{
	"text", "bigint", "integer", "smallint", "numeric", "double precision",
	"real", "boolean", "timestamptz", "date", "jsonb", "uuid",
}

var typeAliases = map[string]string{
	"int8":                     "bigint",
	"int":                      "integer",
	"int4":                     "integer",
	"int2":                     "smallint",
	"decimal":                  "numeric",
	"float8":                   "double precision",
	"float4":                   "real",
	"bool":                     "boolean",
	"timestamp with time zone": "timestamptz",
}

// normalizeType returns the canonical name of a column type, or "" when it
// is not accepted.
func normalizeType(t string) string {
	t = strings.Join(strings.Fields(strings.ToLower(t)), " ")
	if slices.Contains(ColumnTypes, t) {
		return t
	}
	return typeAliases[t]
}

// eventFields are the first segments a from path may start with: the fields
// of the projection event (SPEC §3). Only payload has subfields.
var eventFields = []string{
	"payload", "eventType", "entityId", "forkId", "tenantSchema",
	"irVersion", "sequenceNumber", "ts",
}

// validIdentifier reports whether s is a PostgreSQL identifier this package
// accepts: ^[a-z_][a-z0-9_]{0,62}$, the tenantSchema rule of SPEC §3, applied
// to every name that reaches SQL.
func validIdentifier(s string) bool { return ValidTenantSchema(s) }

// reservedPrefix starts the names of the columns and tables this package adds
// (_causet_seq, _causet_tombstones); definitions may not use it.
const reservedPrefix = "_causet"

// maxColumns keeps a table inside PostgreSQL's 1600-column limit, with room
// for _causet_seq.
const maxColumns = 1599

// LoadDefinitions reads a definitions file in YAML or JSON (JSON is read as
// YAML) and validates it. Unknown keys, duplicate keys, missing or invalid
// values are errors; all problems are reported together (errors.Join), each
// naming the file, the projection and the field, e.g.
//
//	defs.yaml: projection "artist_followers": primaryKey: unknown column "artist"
//
// Structural problems (YAML syntax, unknown or duplicate keys, a list where
// a mapping belongs) come first, with their line; then the problems of the
// values. Derive expressions are compiled here, once.
func LoadDefinitions(path string) (*Definitions, error) {
	data, err := readDefinitionsFile(path)
	if err != nil {
		return nil, fmt.Errorf("load projection definitions: %w", err)
	}
	return ParseDefinitions(path, data)
}

// MaxDefinitionsSize is the largest definitions file LoadDefinitions reads:
// 8 MiB, far above any real IR version, so that a wrong path (a device, a
// log) fails at once instead of filling memory.
const MaxDefinitionsSize = 8 << 20

// readDefinitionsFile reads a regular file of at most MaxDefinitionsSize
// bytes; a FIFO, device or directory is refused without reading it.
func readDefinitionsFile(path string) ([]byte, error) {
	// Stat before Open: opening a FIFO blocks until someone writes to it.
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > MaxDefinitionsSize {
		return nil, fmt.Errorf("%s: %d bytes, larger than the %d-byte limit", path, st.Size(), MaxDefinitionsSize)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDefinitionsSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxDefinitionsSize {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit", path, MaxDefinitionsSize)
	}
	return data, nil
}

// ParseDefinitions is LoadDefinitions for a file already read; name is used
// in error messages.
func ParseDefinitions(name string, data []byte) (*Definitions, error) {
	p := defParser{file: name}
	d := p.parse(data)
	d.source = name
	// Validate even after structural problems, so that one run reports
	// everything (a misspelt key also shows as the value it failed to set).
	if err := d.Validate(); err != nil || len(p.errs) > 0 {
		return nil, errors.Join(append(p.errs, err)...)
	}
	return d, nil
}

// Validate checks d as LoadDefinitions does (names, types, paths, events)
// and compiles the derive expressions not compiled yet. It normalises column
// types and fills ColumnNames when empty. It returns all problems joined.
//
// Once d has validated (LoadDefinitions validates), Validate only reads it,
// so NewTableProjections and Migrate may then run concurrently on one d.
func (d *Definitions) Validate() error {
	var errs []error
	file := d.source
	if file == "" {
		file = "projection definitions"
	}
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{file}, args...)...))
	}
	if d.IRVersion == "" {
		fail("irVersion: missing")
	}
	if len(d.Projections) == 0 {
		fail("projections: none defined")
	}
	names := map[string]int{}
	tables := map[string]string{}
	for i := range d.Projections {
		pd := &d.Projections[i]
		label := fmt.Sprintf("projection %q", pd.Name)
		if pd.Name == "" {
			label = fmt.Sprintf("projections[%d]", i)
		}
		pfail := func(format string, args ...any) {
			fail("%s: "+format, append([]any{label}, args...)...)
		}
		switch {
		case pd.Name == "":
			pfail("name: missing")
		case !validName(pd.Name):
			pfail("name: %s", nameProblem(pd.Name))
		}
		if j, dup := names[pd.Name]; dup && pd.Name != "" {
			pfail("name: duplicate projection name (also projections[%d])", j)
		} else {
			names[pd.Name] = i
		}
		switch {
		case pd.Table == "":
			pfail("table: missing")
		case !validName(pd.Table):
			pfail("table: %s", nameProblem(pd.Table))
		default:
			if other, dup := tables[pd.Table]; dup {
				pfail("table: %q is also the table of projection %q", pd.Table, other)
			} else {
				tables[pd.Table] = pd.Name
			}
		}
		d.validateColumns(pd, pfail)
		d.validatePrimaryKey(pd, pfail)
		if len(pd.Events) == 0 {
			pfail("events: none defined")
		}
		for _, et := range sortedKeys(pd.Events) {
			switch op := pd.Events[et]; {
			case et == "":
				pfail("events: empty event type")
			case op != OpUpsert && op != OpDelete:
				pfail("events.%s: unknown operation %q (want upsert or delete)", et, string(op))
			}
		}
	}
	return errors.Join(errs...)
}

func (d *Definitions) validateColumns(pd *ProjectionDef, pfail func(string, ...any)) {
	if len(pd.Columns) == 0 {
		pfail("columns: none defined")
		return
	}
	if len(pd.Columns) > maxColumns {
		pfail("columns: %d columns, at most %d allowed", len(pd.Columns), maxColumns)
	}
	if len(pd.ColumnNames) == 0 {
		pd.ColumnNames = sortedKeys(pd.Columns)
	} else {
		seen := map[string]bool{}
		for _, c := range pd.ColumnNames {
			if _, ok := pd.Columns[c]; !ok || seen[c] {
				pfail("columns: column order lists %q, which is not a column or is listed twice", c)
			}
			seen[c] = true
		}
		if len(seen) != len(pd.Columns) {
			pfail("columns: column order does not list every column")
		}
	}
	for _, name := range sortedKeys(pd.Columns) {
		col := pd.Columns[name]
		cfail := func(format string, args ...any) {
			pfail("columns.%s: "+format, append([]any{name}, args...)...)
		}
		if !validName(name) {
			cfail("%s", nameProblem(name))
		}
		if t := normalizeType(col.Type); t != "" {
			col.Type = t
		} else if col.Type == "" {
			cfail("type: missing")
		} else {
			cfail("type: unknown type %q (want one of %s)", col.Type, strings.Join(ColumnTypes, ", "))
		}
		switch {
		case col.From != "" && col.Derive != "":
			cfail("both from and derive are set; set exactly one")
		case col.From == "" && col.Derive == "":
			cfail("neither from nor derive is set; set exactly one")
		case col.From != "":
			if err := checkFromPath(col.From); err != nil {
				cfail("from: %v", err)
			}
		default:
			if _, ok := d.programs[col.Derive]; !ok {
				prg, err := compileDerive(col.Derive)
				if err != nil {
					cfail("derive: %v", err)
				} else {
					if d.programs == nil {
						d.programs = map[string]cel.Program{}
					}
					d.programs[col.Derive] = prg
				}
			}
		}
		if col != pd.Columns[name] {
			pd.Columns[name] = col // normalised type; only the first Validate writes
		}
	}
}

func (d *Definitions) validatePrimaryKey(pd *ProjectionDef, pfail func(string, ...any)) {
	if len(pd.PrimaryKey) == 0 {
		pfail("primaryKey: missing")
	}
	seen := map[string]bool{}
	for _, k := range pd.PrimaryKey {
		switch {
		case seen[k]:
			pfail("primaryKey: column %q listed twice", k)
		case !hasKey(pd.Columns, k):
			pfail("primaryKey: unknown column %q", k)
		}
		seen[k] = true
	}
}

// validName reports whether s may name a projection, table or column.
func validName(s string) bool {
	return validIdentifier(s) && !strings.HasPrefix(s, reservedPrefix)
}

func nameProblem(s string) string {
	if validIdentifier(s) {
		return fmt.Sprintf("%q starts with the reserved prefix %q", s, reservedPrefix)
	}
	return fmt.Sprintf("%q is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$)", s)
}

// checkFromPath checks a from path: non-empty segments, the first one an
// event field, subfields only under payload.
func checkFromPath(path string) error {
	segs := strings.Split(path, ".")
	if slices.Contains(segs, "") {
		return fmt.Errorf("%q has an empty path segment", path)
	}
	if !slices.Contains(eventFields, segs[0]) {
		return fmt.Errorf("%q does not start with an event field (want one of %s)", path, strings.Join(eventFields, ", "))
	}
	if segs[0] != "payload" && len(segs) > 1 {
		return fmt.Errorf("%q: event field %s has no subfields", path, segs[0])
	}
	return nil
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// defParser turns the YAML node tree into Definitions, checking keys and
// node kinds itself so that every problem names its projection and field
// (the yaml package's KnownFields errors name Go types and stop at the first
// document-level problem).
type defParser struct {
	file string
	errs []error
}

func (p *defParser) fail(where string, n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if where != "" {
		msg = where + ": " + msg
	}
	if n != nil && n.Line > 0 {
		msg += fmt.Sprintf(" (line %d)", n.Line)
	}
	p.errs = append(p.errs, fmt.Errorf("%s: %s", p.file, msg))
}

func (p *defParser) parse(data []byte) *Definitions {
	d := &Definitions{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.fail("", nil, "empty file")
		} else {
			p.fail("", nil, "%v", err)
		}
		return d
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.fail("", nil, "more than one YAML document")
	}
	root := resolve(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolve(root.Content[0])
	}
	p.mapping("", root, map[string]func(*yaml.Node){
		"irVersion": func(v *yaml.Node) { d.IRVersion = p.str("irVersion", v) },
		"projections": func(v *yaml.Node) {
			if v.Kind != yaml.SequenceNode {
				p.fail("projections", v, "must be a list")
				return
			}
			for i, pn := range v.Content {
				d.Projections = append(d.Projections, p.projection(i, resolve(pn)))
			}
		},
	})
	return d
}

func (p *defParser) projection(i int, n *yaml.Node) ProjectionDef {
	var pd ProjectionDef
	where := fmt.Sprintf("projections[%d]", i)
	// Name the projection in every message when it has a usable name.
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if k, v := n.Content[j], resolve(n.Content[j+1]); k.Value == "name" && v.Kind == yaml.ScalarNode && v.Value != "" {
				where = fmt.Sprintf("projection %q", v.Value)
			}
		}
	}
	p.mapping(where, n, map[string]func(*yaml.Node){
		"name":  func(v *yaml.Node) { pd.Name = p.str(where+": name", v) },
		"table": func(v *yaml.Node) { pd.Table = p.str(where+": table", v) },
		"primaryKey": func(v *yaml.Node) {
			if v.Kind != yaml.SequenceNode {
				p.fail(where+": primaryKey", v, "must be a list of column names")
				return
			}
			for _, e := range v.Content {
				pd.PrimaryKey = append(pd.PrimaryKey, p.str(where+": primaryKey", resolve(e)))
			}
		},
		"columns": func(v *yaml.Node) {
			if v.Kind != yaml.MappingNode {
				p.fail(where+": columns", v, "must be a mapping of column name to definition")
				return
			}
			pd.Columns = map[string]ColumnDef{}
			p.eachPair(where+": columns", v, func(k, cv *yaml.Node) {
				pd.Columns[k.Value] = p.column(where+": columns."+k.Value, cv)
				pd.ColumnNames = append(pd.ColumnNames, k.Value)
			})
		},
		"events": func(v *yaml.Node) {
			if v.Kind != yaml.MappingNode {
				p.fail(where+": events", v, "must be a mapping of event type to upsert or delete")
				return
			}
			pd.Events = map[string]Op{}
			p.eachPair(where+": events", v, func(k, ov *yaml.Node) {
				pd.Events[k.Value] = Op(p.str(where+": events."+k.Value, ov))
			})
		},
	})
	return pd
}

func (p *defParser) column(where string, n *yaml.Node) ColumnDef {
	var c ColumnDef
	p.mapping(where, n, map[string]func(*yaml.Node){
		"type":   func(v *yaml.Node) { c.Type = p.str(where+": type", v) },
		"from":   func(v *yaml.Node) { c.From = p.str(where+": from", v) },
		"derive": func(v *yaml.Node) { c.Derive = p.str(where+": derive", v) },
		"notNull": func(v *yaml.Node) {
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&c.NotNull) != nil {
				p.fail(where+": notNull", v, "must be true or false")
			}
		},
	})
	return c
}

// mapping calls fields[key] for each key of the mapping n; unknown and
// duplicate keys are errors.
func (p *defParser) mapping(where string, n *yaml.Node, fields map[string]func(*yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.fail(where, n, "must be a mapping")
		return
	}
	p.eachPair(where, n, func(k, v *yaml.Node) {
		f, ok := fields[k.Value]
		if !ok {
			p.fail(where, k, "unknown key %q (want one of %s)", k.Value, strings.Join(sortedKeys(fields), ", "))
			return
		}
		f(v)
	})
}

// eachPair calls f for each key/value pair of the mapping n, reporting
// non-scalar and duplicate keys.
func (p *defParser) eachPair(where string, n *yaml.Node, f func(k, v *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.fail(where, k, "keys must be strings")
			continue
		}
		if line, dup := seen[k.Value]; dup {
			p.fail(where, nil, "duplicate key %q (line %d; first at line %d)", k.Value, k.Line, line)
			continue
		}
		seen[k.Value] = k.Line
		f(k, v)
	}
}

// str returns the value of a scalar node, reporting other nodes and null.
func (p *defParser) str(where string, n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.fail(where, n, "must be a string")
		return ""
	}
	return n.Value
}

// resolve follows YAML aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}
