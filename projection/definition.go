package projection

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
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
	programs map[string]*derivePrg
	// refused holds the paths whose value the parser refused (a present key
	// of the wrong kind), so that Validate does not report it again as
	// missing, nor what follows from it.
	refused map[string]bool
	// lines holds the line of each value the parser read, by path, so
	// that Validate's messages say where the value is.
	lines map[string]int
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

// ColumnTypeAliases returns the other names accepted for column types, each
// mapped to its canonical name in [ColumnTypes] ("int8" → "bigint"). The
// map is a fresh copy on each call.
func ColumnTypeAliases() map[string]string { return maps.Clone(typeAliases) }

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
	if st.IsDir() {
		return nil, fmt.Errorf("%s: a directory, not a definitions file", path)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s): give the definitions file's path", path, fileKind(st.Mode()))
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
	d.refused, d.lines = p.refused, p.lines
	// Validate even after structural problems, so that one run reports
	// everything (a misspelt key also shows as the value it failed to set),
	// unless nothing of the file could be read.
	if p.unread {
		return nil, errors.Join(p.errs...)
	}
	if err := d.Validate(); err != nil || len(p.errs) > 0 {
		return nil, errors.Join(append(p.errs, err)...)
	}
	return d, nil
}

// fileKind names the kind of file mode m is, in words (a mode string such
// as "Dc---------" for /dev/null says little: second new-user trial).
func fileKind(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeCharDevice != 0, t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeSocket != 0:
		return "a socket"
	default:
		return "mode " + t.String()
	}
}
