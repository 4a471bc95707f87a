package projection

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

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
	// fail reports a problem of the value at path, unless the parser
	// refused that value or one holding it: "missing" would be wrong then.
	fail := func(path, format string, args ...any) {
		if d.refusedAt(path) {
			return
		}
		err := fmt.Errorf("%s: %s: "+format, append([]any{file, path}, args...)...)
		if line := d.lineOf(path); line > 0 {
			err = fmt.Errorf("%w (line %d)", err, line)
		}
		errs = append(errs, err)
	}
	if d.IRVersion == "" {
		fail("irVersion", "missing")
	}
	if len(d.Projections) == 0 {
		fail("projections", "none defined")
	}
	names := map[string]int{}
	tables := map[string]int{} // table → the index of the first projection of it
	named := map[string]int{}  // projections of each name
	for _, pd := range d.Projections {
		named[pd.Name]++
	}
	for i := range d.Projections {
		pd := &d.Projections[i]
		label := fmt.Sprintf("projection %q", pd.Name)
		if named[pd.Name] > 1 {
			// Its name says not which; each of them by its index, as the
			// parser labels them (new-user trial: the first's refused
			// derive: "" was said twice, under two labels).
			label = fmt.Sprintf("projections[%d] (%q)", i, pd.Name)
		}
		if pd.Name == "" {
			label = fmt.Sprintf("projections[%d]", i)
		}
		// pfail reports a problem of the projection's field.
		pfail := func(field, format string, args ...any) {
			fail(label+": "+field, format, args...)
		}
		switch {
		case pd.Name == "":
			pfail("name", "missing")
		case !validName(pd.Name):
			pfail("name", "%s", nameProblem(pd.Name))
		}
		if j, dup := names[pd.Name]; dup && pd.Name != "" {
			pfail("name", "duplicate projection name (also projections[%d])", j)
		} else {
			names[pd.Name] = i
		}
		switch {
		case pd.Table == "":
			pfail("table", "missing")
		case !validName(pd.Table):
			pfail("table", "%s", nameProblem(pd.Table))
		default:
			if j, dup := tables[pd.Table]; dup {
				// By index too: two projections can share a name as well.
				pfail("table", "%q is also the table of projections[%d] (%q)", pd.Table, j, d.Projections[j].Name)
			} else {
				tables[pd.Table] = i
			}
		}
		d.validateColumns(pd, label, pfail)
		d.validatePrimaryKey(pd, pfail)
		if len(pd.Events) == 0 {
			pfail("events", "none defined")
		}
		for _, et := range sortedKeys(pd.Events) {
			switch op := pd.Events[et]; {
			case et == "":
				pfail("events", "empty event type")
			case op != OpUpsert && op != OpDelete:
				pfail(memberPath("events", et), "unknown operation %q (want upsert or delete)", string(op))
			}
		}
	}
	return errors.Join(errs...)
}

func (d *Definitions) validateColumns(pd *ProjectionDef, label string, pfail func(field, format string, args ...any)) {
	if len(pd.Columns) == 0 {
		pfail("columns", "none defined")
		return
	}
	if len(pd.Columns) > maxColumns {
		pfail("columns", "%d columns, at most %d allowed", len(pd.Columns), maxColumns)
	}
	if len(pd.ColumnNames) == 0 {
		pd.ColumnNames = sortedKeys(pd.Columns)
	} else {
		seen := map[string]bool{}
		for _, c := range pd.ColumnNames {
			if _, ok := pd.Columns[c]; !ok || seen[c] {
				pfail("columns", "column order lists %q, which is not a column or is listed twice", c)
			}
			seen[c] = true
		}
		if len(seen) != len(pd.Columns) {
			pfail("columns", "column order does not list every column")
		}
	}
	for _, name := range sortedKeys(pd.Columns) {
		col := pd.Columns[name]
		field := memberPath("columns", name)
		// cfail reports a problem of the column (sub "") or of its key sub.
		cfail := func(sub, format string, args ...any) {
			if sub != "" {
				sub = ": " + sub
			}
			pfail(field+sub, format, args...)
		}
		if !validName(name) {
			cfail("", "%s", nameProblem(name))
		} else if slices.Contains(systemColumns, name) {
			// PostgreSQL refuses the table (42701) only when migrate
			// creates it (new-user trial: validate said ok).
			cfail("", "%q is the name of a PostgreSQL system column (%s), which no table column may take; rename it", name, strings.Join(systemColumns, ", "))
		}
		if t := normalizeType(col.Type); t != "" {
			col.Type = t
		} else if col.Type == "" {
			cfail("type", "missing")
		} else if base, _, ok := strings.Cut(col.Type, "("); ok && normalizeType(strings.TrimSpace(base)) != "" {
			// numeric(10,2), bigint(20) (new-user trial: "unknown type").
			// In a flow mapping the comma splits numeric(10,2) into two
			// keys, type "numeric(10" and "2)": say so.
			split := ""
			if !strings.HasSuffix(col.Type, ")") {
				split = " (in a { } mapping, the comma of numeric(10,2) also starts a key)"
			}
			cfail("type", "%q: type modifiers are not supported: write %s%s", col.Type, normalizeType(strings.TrimSpace(base)), split)
		} else {
			cfail("type", "unknown type %q (want one of %s)", col.Type, strings.Join(ColumnTypes, ", "))
		}
		switch {
		case col.From != "" && col.Derive != "":
			cfail("", "both from and derive are set; set exactly one")
		case col.From == "" && col.Derive == "":
			// Not when the parser refused the from or derive given.
			at := label + ": " + field + ": "
			if !d.refusedAt(at+"from") && !d.refusedAt(at+"derive") {
				cfail("", "neither from nor derive is set; set exactly one")
			}
		case col.From != "":
			if err := checkFromPath(col.From); err != nil {
				cfail("from", "%v", err)
			} else if (col.From == "sequenceNumber" || col.From == "ts") && col.Type != "" && kindOf(col.Type) == kindUUID {
				// Always an integer (SPEC section 3), which no uuid
				// takes: every event would be dead-lettered.
				fix := "bigint"
				if col.From == "ts" {
					fix = "timestamptz (the event time) or bigint"
				}
				cfail("from", "%s is a JSON number, which a uuid column never takes (docs/definitions.md); use %s", col.From, fix)
			} else if k := kindOf(col.Type); col.From == "tenantSchema" && col.Type != "" && (k == kindSmallint || k == kindInteger || k == kindBigint) {
				// A schema name, ^[a-z_][a-z0-9_]{0,62}$, which no
				// integer type reads (new-user trial: validate said ok,
				// and every event was dead-lettered).
				cfail("from", "tenantSchema is a schema name (^[a-z_][a-z0-9_]{0,62}$), which no %s column takes (docs/definitions.md); use text", normalizeType(col.Type))
			} else if col.From == "payload" && col.Type != "" && kindOf(col.Type) != kindJSONB {
				// Always an object (SPEC section 3), which only jsonb
				// takes (new-user trial: every event was dead-lettered).
				cfail("from", "payload is the whole JSON object, which only a jsonb column takes (docs/definitions.md); make the column jsonb or take a field, payload.<key>")
			}
		default:
			if _, ok := d.programs[col.Derive]; !ok {
				prg, err := compileDerive(col.Derive)
				if err != nil {
					cfail("derive", "%v", err)
				} else {
					if d.programs == nil {
						d.programs = map[string]*derivePrg{}
					}
					d.programs[col.Derive] = prg
				}
			}
			if prg := d.programs[col.Derive]; prg != nil && col.Type != "" && normalizeType(col.Type) == col.Type {
				if why := prg.neverFits(col.Derive, kindOf(col.Type), col.Type, col.NotNull || slices.Contains(pd.PrimaryKey, name)); why != "" {
					// Every event would be dead-lettered (new-user trial).
					cfail("derive", "%s", why)
				}
			}
		}
		if col != pd.Columns[name] {
			pd.Columns[name] = col // normalised type; only the first Validate writes
		}
	}
}

func (d *Definitions) validatePrimaryKey(pd *ProjectionDef, pfail func(field, format string, args ...any)) {
	switch {
	case pd.PrimaryKey == nil:
		pfail("primaryKey", "missing")
	case len(pd.PrimaryKey) == 0:
		pfail("primaryKey", "empty: list the columns that identify a row, e.g. [user_id, artist_id]")
	}
	seen := map[string]bool{}
	for _, k := range pd.PrimaryKey {
		switch {
		case seen[k]:
			pfail("primaryKey", "column %q listed twice", k)
		case len(pd.Columns) > 0 && !hasKey(pd.Columns, k): // no columns: reported under columns
			pfail("primaryKey", "unknown column %q", k)
		}
		seen[k] = true
	}
}

// refusedAt reports whether the parser refused the value at path or a value
// holding it (path is "projection \"p\": columns.c: type" and the like).
func (d *Definitions) refusedAt(path string) bool {
	if d.refused[""] { // the file is not a mapping
		return true
	}
	return upPath(path, func(p string) bool { return d.refused[p] })
}

// lineOf returns the line of the value at path in the file, or of the
// innermost value holding it that the parser read (a missing key's
// mapping); 0 when unknown (hand-built definitions).
func (d *Definitions) lineOf(path string) int {
	line := 0
	upPath(path, func(p string) bool {
		line = d.lines[p]
		return line > 0
	})
	return line
}

// upPath calls f with path and then with each path holding it, innermost
// first ("projection \"p\": columns.c: type", "projection \"p\":
// columns.c", ...), until f returns true; it reports whether one did.
func upPath(path string, f func(string) bool) bool {
	for {
		if f(path) {
			return true
		}
		i := strings.LastIndexAny(path, ":.")
		if i < 0 {
			return false
		}
		path = path[:i]
	}
}

// systemColumns are the names of the system columns every PostgreSQL table
// has (PostgreSQL documentation, "System Columns"): CREATE TABLE refuses a
// column of these names (42701).
var systemColumns = []string{"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid"}

// validName reports whether s may name a projection, table or column.
func validName(s string) bool {
	return validIdentifier(s) && !strings.HasPrefix(s, reservedPrefix)
}

func nameProblem(s string) string {
	if validIdentifier(s) {
		return fmt.Sprintf("%q starts with the reserved prefix %q", s, reservedPrefix)
	}
	if len(s) > maxIdentifierBytes && validIdentifier(s[:maxIdentifierBytes]) &&
		strings.Trim(s[maxIdentifierBytes:], "abcdefghijklmnopqrstuvwxyz0123456789_") == "" {
		// Said apart (definition-author trial: only the pattern).
		return fmt.Sprintf("%q is %d bytes, longer than the %d PostgreSQL keeps of a name (want ^[a-z_][a-z0-9_]{0,62}$)", s, len(s), maxIdentifierBytes)
	}
	return fmt.Sprintf("%q is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$)", s)
}

// maxIdentifierBytes is the longest name PostgreSQL keeps whole
// (NAMEDATALEN − 1).
const maxIdentifierBytes = 63

// checkFromPath checks a from path: non-empty segments, the first one an
// event field, subfields only under payload.
func checkFromPath(path string) error {
	segs := strings.Split(path, ".")
	if slices.Contains(segs, "") {
		return fmt.Errorf("%q has an empty path segment", path)
	}
	for i, seg := range segs {
		switch {
		case strings.TrimSpace(seg) == seg:
		case i == 0: // an event field: no key of the payload
			return fmt.Errorf("%q: segment %q starts or ends with white space: remove it", path, seg)
		default:
			// A typo far likelier than a key so spelt (definitions trial:
			// "payload.v " passed, and every row got NULL).
			return fmt.Errorf("%q: segment %q starts or ends with white space; to read a key spelt so, use derive (payload[%q])", path, seg, seg)
		}
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
