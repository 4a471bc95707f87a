package projection

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/retry"
)

// catalogTTL is how long the worker trusts what it read of a table's
// columns in the catalog (tableCatalog): a column widened, or its NOT NULL
// dropped, after the lookup only sends a few upserts to statements for at
// most this long, where PostgreSQL takes them.
const catalogTTL = 30 * time.Second

// maxCatalogTables bounds the (tenant schema, table) entries a worker's
// catalog cache holds; when it is full, expired entries are dropped, then
// an arbitrary one.
const maxCatalogTables = 4096

// catalogColumnsSQL reads the columns of the table named by $1, a
// qualified name quoted as pgx.Identifier.Sanitize quotes it: name, type
// as format_type spells it ("integer", "numeric(10,2)", "character
// varying(20)") and NOT NULL. A table that does not exist gives no row.
const catalogColumnsSQL = `SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull
	FROM pg_catalog.pg_attribute a
	WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// catalogQuerier is what the catalog lookups need of the worker's database
// (*pgxpool.Pool has it). Without it the worker knows nothing of the
// tables and every upsert goes to its COPY group.
type catalogQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// tableCatalog caches, per worker, the columns of each (tenant schema,
// table) as PostgreSQL's catalog has them, so that copyGroupsChecked leaves to
// statements the upserts that the table would refuse although the
// definition's column type takes them (a table stricter than its
// definition), and its CHECK constraints: those checkExpr reads leave the
// upserts they refuse to statements too (rowCheck.withChecks), and all of
// them are evaluated in PostgreSQL after a group had a row refused
// (copyGroup.check). An entry is
// read with two queries (catalogColumnsSQL, then catalogChecksSQL for a
// table that exists) the first time a table has a COPY group, kept for catalogTTL, and dropped
// when an apply on the table fails with a class 42 error (forgetOn). A
// lookup that fails means no knowledge: it is logged at DEBUG and not
// kept. The cache is only ever a hint: an upsert it calls suspect is
// applied by its own statement, and PostgreSQL decides. It is safe for
// concurrent use.
type tableCatalog struct {
	db  catalogQuerier // nil: no knowledge
	log *slog.Logger
	ttl time.Duration
	max int

	mu     sync.Mutex
	tables map[catalogKey]catalogEntry
}

// catalogKey names a table in a tenant schema.
type catalogKey struct{ schema, table string }

// catalogEntry is what a lookup found: the columns by name (none when the
// table does not exist), and when.
type catalogEntry struct {
	at     time.Time
	cols   map[string]catalogColumn
	checks []catalogCheck
}

// catalogCheck is a CHECK constraint of a table: its expression as
// pg_get_expr prints it, the columns it reads, and the expression parsed
// for Go to evaluate (nil when parseCheckExpr does not read it).
type catalogCheck struct {
	expr   string
	cols   []string
	parsed *checkExpr
}

// catalogChecksSQL reads the CHECK constraints of the table named by $1
// (quoted as catalogColumnsSQL's): expression and the columns it reads.
const catalogChecksSQL = `SELECT pg_catalog.pg_get_expr(c.conbin, c.conrelid),
		ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey))
	FROM pg_catalog.pg_constraint c
	WHERE c.conrelid = pg_catalog.to_regclass($1) AND c.contype = 'c'`

// newTableCatalog returns an empty cache reading db's catalog when db has
// Query (catalogQuerier).
func newTableCatalog(db DB, log *slog.Logger) *tableCatalog {
	c := &tableCatalog{log: log, ttl: catalogTTL, max: maxCatalogTables, tables: map[catalogKey]catalogEntry{}}
	c.db, _ = db.(catalogQuerier)
	return c
}

// columns returns the columns of table in schema by name, from the cache
// or read now: none when the table does not exist, nil when nothing is
// known (no Query, or the lookup failed). Either way nothing is checked.
func (c *tableCatalog) columns(ctx context.Context, schema, table string) map[string]catalogColumn {
	if c == nil || c.db == nil {
		return nil
	}
	k := catalogKey{schema, table}
	now := time.Now()
	c.mu.Lock()
	e, ok := c.tables[k]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.ttl {
		return e.cols
	}
	cols, checks, err := c.lookup(ctx, schema, table)
	if err != nil {
		c.log.Debug("table columns not read from the catalog; its upserts go to COPY unchecked",
			"tenant_schema", schema, "table", table, "error", err)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.tables[k]; !ok && len(c.tables) >= c.max {
		for old, e := range c.tables {
			if now.Sub(e.at) >= c.ttl {
				delete(c.tables, old)
			}
		}
		for old := range c.tables {
			if len(c.tables) < c.max {
				break
			}
			delete(c.tables, old)
		}
	}
	c.tables[k] = catalogEntry{at: now, cols: cols, checks: checks}
	return cols
}

// checks returns the CHECK constraints of table in schema as the cache has
// them (read with its columns), nil when it has none.
func (c *tableCatalog) checks(schema, table string) []catalogCheck {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tables[catalogKey{schema, table}].checks
}

// lookup reads the columns of table in schema (catalogColumnsSQL) and its
// CHECK constraints (catalogChecksSQL).
func (c *tableCatalog) lookup(ctx context.Context, schema, table string) (map[string]catalogColumn, []catalogCheck, error) {
	name := pgx.Identifier{schema, table}.Sanitize()
	cols, err := c.lookupColumns(ctx, name)
	if err != nil || len(cols) == 0 {
		return cols, nil, err
	}
	rows, err := c.db.Query(ctx, catalogChecksSQL, name)
	if err != nil {
		return nil, nil, err
	}
	var checks []catalogCheck
	var ck catalogCheck
	if _, err := pgx.ForEachRow(rows, []any{&ck.expr, &ck.cols}, func() error {
		parsed, _ := parseCheckExpr(ck.expr) // nil: PostgreSQL alone evaluates it
		checks = append(checks, catalogCheck{expr: ck.expr, cols: slices.Clone(ck.cols), parsed: parsed})
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return cols, checks, nil
}

// lookupColumns reads the columns of the table qualified (catalogColumnsSQL).
func (c *tableCatalog) lookupColumns(ctx context.Context, qualified string) (map[string]catalogColumn, error) {
	return readColumns(ctx, c.db, qualified)
}

// readColumns reads the columns of the table qualified
// (catalogColumnsSQL): none when it does not exist.
func readColumns(ctx context.Context, db catalogQuerier, qualified string) (map[string]catalogColumn, error) {
	rows, err := db.Query(ctx, catalogColumnsSQL, qualified)
	if err != nil {
		return nil, err
	}
	cols := map[string]catalogColumn{}
	var name, typ string
	var notNull bool
	_, err = pgx.ForEachRow(rows, []any{&name, &typ, &notNull}, func() error {
		col := parseCatalogType(typ)
		col.notNull = notNull
		cols[name] = col
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cols, nil
}

// forgetOn drops what the cache knows of p's table in schema when err, an
// apply's error on it, has SQLSTATE class 42 (an undefined or changed
// column or table): the next COPY group of the table reads it again.
func (c *tableCatalog) forgetOn(p *TableProjection, schema string, err error) {
	if c == nil || !strings.HasPrefix(retry.SQLState(err), "42") {
		return
	}
	c.mu.Lock()
	delete(c.tables, catalogKey{schema, p.def.Table})
	c.mu.Unlock()
}

// catalogColumn is a column as PostgreSQL's catalog has it.
type catalogColumn struct {
	typ       string  // format_type's spelling: "integer", "numeric(10,2)"
	kind      colKind // the kind of the type without its modifier
	known     bool    // the type is one the checks know (catalogTypes)
	notNull   bool
	length    int // n of character varying(n) and character(n); 0 none
	precision int // p of numeric(p,s); 0 none
	scale     int // s of numeric(p,s)
}

// catalogTypes are the types, as format_type spells them without a
// modifier, that parseCatalogType knows: the definitions' types and the
// bounded character types.
var catalogTypes = []string{
	"text", "character varying", "character", "smallint", "integer", "bigint", "numeric",
	"double precision", "real", "boolean", "timestamp with time zone", "date", "jsonb", "uuid",
}

// parseCatalogType returns the column of type typ, as format_type spells
// it: the kind of its base type (kindOf) and its modifier, the length of
// "character varying(n)" and "character(n)" and the precision and scale of
// "numeric(p,s)". An unknown type, or a modifier it cannot read, gives a
// column that is not known.
func parseCatalogType(typ string) catalogColumn {
	c := catalogColumn{typ: typ}
	base, mod := typ, ""
	if i := strings.IndexByte(typ, '('); i > 0 && strings.HasSuffix(typ, ")") {
		base, mod = typ[:i], typ[i+1:len(typ)-1]
	}
	if !slices.Contains(catalogTypes, base) {
		return c
	}
	c.kind = kindOf(base)
	switch {
	case mod == "":
		c.known = true
	case base == "character varying" || base == "character":
		n, err := strconv.Atoi(mod)
		c.length, c.known = n, err == nil && n > 0
	case base == "numeric":
		ps, ss, _ := strings.Cut(mod, ",")
		p, err1 := strconv.Atoi(ps)
		s, err2 := strconv.Atoi(ss)
		c.precision, c.scale, c.known = p, s, err1 == nil && err2 == nil && p > 0
	}
	if !c.known {
		return catalogColumn{typ: typ}
	}
	return c
}

// rowCheck is what the catalog says of a table projection's upserts in one
// tenant schema: the columns where the table is stricter than the
// definition, and the table's CHECK constraints that Go evaluates
// (withChecks). It belongs to one batch.
type rowCheck struct {
	cols    []colCheck
	checks  []*boundCheck
	suspect int // upserts found suspect (counted by suspectKeys)
}

// colCheck is one column of a rowCheck.
type colCheck struct {
	i       int               // index into the projection's columns and an upsert's arguments
	notNull bool              // the table refuses NULL where the definition takes it
	refuses func(string) bool // the table's type refuses the value (text, as Plan sends it); nil: no check
}

// newRowCheck returns the checks of p's upserts against the columns cols
// of its table (nil when the table is not stricter than the definition,
// or nothing is known). A column the table lacks is left to PostgreSQL.
func newRowCheck(p *TableProjection, cols map[string]catalogColumn) *rowCheck {
	if len(cols) == 0 {
		return nil
	}
	var rc rowCheck
	for i := range p.cols {
		c := &p.cols[i]
		cat, ok := cols[c.name]
		if !ok {
			continue
		}
		cc := colCheck{i: i,
			notNull: cat.notNull && !c.notNull && !p.isKey(i),
			refuses: typeCheck(c.kind, cat)}
		if cc.notNull || cc.refuses != nil {
			rc.cols = append(rc.cols, cc)
		}
	}
	if len(rc.cols) == 0 {
		return nil
	}
	return &rc
}

// withChecks returns rc with those of the table's CHECK constraints
// (checks, as the catalog has them) that Go evaluates bound to p's
// columns (cols: the table's), a new rowCheck when rc is nil and one
// binds; rc when none does.
func (rc *rowCheck) withChecks(p *TableProjection, checks []catalogCheck, cols map[string]catalogColumn) *rowCheck {
	for _, ck := range checks {
		if ck.parsed == nil {
			continue
		}
		b, ok := ck.parsed.bind(p, cols)
		if !ok {
			continue
		}
		if rc == nil {
			rc = &rowCheck{}
		}
		rc.checks = append(rc.checks, b)
	}
	return rc
}

// refuses reports whether the table would refuse the upsert with
// arguments args (as Plan sends them: text or nil): a NULL for a NOT NULL
// column, a value its column type refuses, or values a CHECK constraint
// is false for.
func (rc *rowCheck) refuses(args []any) bool {
	for _, b := range rc.checks {
		if b.refuses(args) {
			return true
		}
	}
	for _, c := range rc.cols {
		v := args[c.i]
		if v == nil {
			if c.notNull {
				return true
			}
			continue
		}
		if s, ok := v.(string); ok && c.refuses != nil && c.refuses(s) {
			return true
		}
	}
	return false
}

// refusing returns the index (into the projection's columns) of the one
// column whose value in args the table would refuse, −1 when none is or
// more than one.
func (rc *rowCheck) refusing(args []any) int {
	found := -1
	for _, c := range rc.cols {
		v := args[c.i]
		s, isText := v.(string)
		if v == nil && c.notNull || isText && c.refuses != nil && c.refuses(s) {
			if found >= 0 {
				return -1
			}
			found = c.i
		}
	}
	return found
}

// intBits is the width of the integer kinds, 0 for the others.
func intBits(k colKind) int {
	switch k {
	case kindSmallint:
		return 16
	case kindInteger:
		return 32
	case kindBigint:
		return 64
	}
	return 0
}

// typeCheck returns the check of a value of a column of kind def (the
// definition's) stored in a column of the table's type cat (the value is
// cast to def's type, then assigned to the column), or nil when cat takes
// every value of def that Plan lets through, or when the pair is not one
// it knows. It knows:
//   - an integer type narrower than def's integer type: the range (22003);
//   - an integer type from numeric, double precision or real: the range of
//     the value rounded as PostgreSQL's cast rounds it (half away from
//     zero for numeric, to even for the floats; values within one unit of
//     the limit may be called refused where PostgreSQL takes them);
//   - numeric(p,s) from an integer type or numeric: the value rounded to s
//     decimals must have at most p−s digits before the point (22003);
//   - real from numeric and double precision, double precision from
//     numeric: the range (22003);
//   - character varying(n) and character(n) from text: at most n
//     characters, unless the excess is spaces (22001).
func typeCheck(def colKind, cat catalogColumn) func(string) bool {
	if !cat.known {
		return nil
	}
	bits, defBits := intBits(cat.kind), intBits(def)
	switch {
	case bits > 0 && defBits > bits:
		return func(s string) bool { return checkValue(cat.kind, cat.typ, s) != "" }
	case bits > 0 && (def == kindNumeric || def == kindDouble || def == kindReal):
		return func(s string) bool { return !roundsIntoInt(def, s, bits) }
	case cat.precision > 0 && (defBits > 0 || def == kindNumeric):
		return func(s string) bool { return !numericFits(pgTrim(s), cat.precision, cat.scale) }
	case cat.kind == kindReal && (def == kindNumeric || def == kindDouble),
		cat.kind == kindDouble && def == kindNumeric:
		return func(s string) bool { return checkValue(cat.kind, cat.typ, s) != "" }
	case cat.length > 0 && def == kindText:
		return func(s string) bool { return tooLong(s, cat.length) }
	}
	return nil
}

// roundsIntoInt reports whether the number s, of a column of kind def
// (numeric, double precision or real), rounded as PostgreSQL's cast to an
// integer type of bits rounds it, is within that type's range. A text it
// cannot read is left to PostgreSQL (true).
func roundsIntoInt(def colKind, s string, bits int) bool {
	t := pgTrim(s)
	if isSpecialNumber(t, true) {
		return false // NaN and Infinity have no integer
	}
	fbits := 64
	if def == kindReal {
		fbits = 32
	}
	f, err := strconv.ParseFloat(t, fbits)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return true // a PostgreSQL 16 form: its cast decides
	}
	if def == kindNumeric {
		f = math.Round(f)
	} else {
		f = math.RoundToEven(f)
	}
	lim := math.Ldexp(1, bits-1)
	return f < lim && f >= -lim
}

// numericFits reports whether the numeric text t fits numeric(p,s): once
// rounded to s decimals (half away from zero, as PostgreSQL's numeric
// does), it has at most p−s digits before the decimal point. NaN fits,
// Infinity does not; a text it cannot read is left to PostgreSQL (true).
func numericFits(t string, p, s int) bool {
	if isSpecialNumber(t, false) {
		return strings.EqualFold(t, "nan")
	}
	i := 0
	if i < len(t) && (t[i] == '+' || t[i] == '-') {
		i++
	}
	var digits []byte // the mantissa's digits, leading zeros dropped
	point := 0        // digits before the decimal point, counted from the first of digits
	seenPoint := false
mantissa:
	for ; i < len(t); i++ {
		switch c := t[i]; {
		case c >= '0' && c <= '9':
			if c == '0' && len(digits) == 0 {
				if seenPoint {
					point--
				}
				continue
			}
			digits = append(digits, c)
			if !seenPoint {
				point++
			}
		case c == '.' && !seenPoint:
			seenPoint = true
		default:
			break mantissa
		}
	}
	if i < len(t) {
		if t[i] != 'e' && t[i] != 'E' {
			return true // not decimal syntax: PostgreSQL decides
		}
		e, err := strconv.Atoi(t[i+1:])
		if err != nil {
			return true
		}
		point += e
	}
	if len(digits) == 0 {
		return true // zero
	}
	// The value is 0.digits × 10^point; rounding keeps point+s digits.
	if keep := point + s; keep < len(digits) {
		if keep < 0 {
			return true // rounds to zero
		}
		if digits[keep] >= '5' && allNines(digits[:keep]) {
			point++ // the rounding carries into a new digit
		}
	}
	return point <= p-s
}

// allNines reports whether every digit of d is 9 (true for none).
func allNines(d []byte) bool {
	for _, c := range d {
		if c != '9' {
			return false
		}
	}
	return true
}

// tooLong reports whether s has more than n characters that are not
// trailing spaces beyond the n-th, as PostgreSQL's character varying(n)
// and character(n) refuse on assignment (22001).
func tooLong(s string, n int) bool {
	if len(s) <= n {
		return false // at most n bytes, so at most n characters
	}
	chars := 0
	for i := range s {
		if chars == n {
			return strings.TrimRight(s[i:], " ") != ""
		}
		chars++
	}
	return false
}

// keyMarks marks primary keys of a copyGroup by index into its pairs (one
// upsert per key): true for each key marked.
type keyMarks []bool

// suspectKeys marks the primary keys of g's upserts that the table would
// refuse (rc.refuses), nil when there is none, and counts those upserts in
// rc.suspect.
func (rc *rowCheck) suspectKeys(g *copyGroup) keyMarks {
	var keys keyMarks
	for j, pr := range g.all {
		if !rc.refuses(pr.stmt.Args) {
			continue
		}
		rc.suspect++
		if keys == nil {
			keys = make(keyMarks, len(g.pairs))
		}
		keys[g.key[j]] = true
	}
	return keys
}

// without removes from g every upsert of the primary keys marked in keys,
// in place, and returns them in batch order: g.all and g.pairs keep their
// order, g.key is renumbered for what is left, and g.n counts it.
func (g *copyGroup) without(keys keyMarks) (removed []pair) {
	shared := g.sharesPairs()
	renum := make([]int32, len(g.pairs)) // new index into pairs of each kept key
	next := int32(0)
	for i := range g.pairs {
		if !keys[i] {
			renum[i] = next
			next++
		}
	}
	all, key := g.all[:0], g.key[:0]
	for j, pr := range g.all {
		if k := g.key[j]; keys[k] {
			removed = append(removed, pr)
		} else {
			all = append(all, pr)
			key = append(key, renum[k])
		}
	}
	clear(g.all[len(all):]) // no event held beyond the slice
	g.all, g.key = all, key
	g.n = len(g.all)
	if shared {
		g.pairs = g.all
		return removed
	}
	pairs := g.pairs[:0]
	for i, pr := range g.pairs {
		if !keys[i] {
			pairs = append(pairs, pr)
		}
	}
	clear(g.pairs[len(pairs):])
	g.pairs = pairs
	return removed
}

// keysOf marks the primary keys of g.pairs[i] for each i of idx.
func (g *copyGroup) keysOf(idx []int) keyMarks {
	keys := make(keyMarks, len(g.pairs))
	for _, i := range idx {
		keys[i] = true
	}
	return keys
}

// checkPredicate returns checks, the table's CHECK constraints, as one
// boolean expression on a row src of the temporary table (every column
// text), each column the constraints read cast to the table's type
// (cols) and named as the table names it: "" when no constraint reads
// only p's columns of the table. Like a CHECK, it refuses a row when it is
// false, not NULL; a cast that fails fails the statement. The expressions
// are the catalog's own (pg_get_expr), not the wire's.
func (p *TableProjection) checkPredicate(checks []catalogCheck, cols map[string]catalogColumn) string {
	var exprs []string
	used := map[string]bool{}
	for _, ck := range checks {
		ok := len(ck.cols) > 0
		for _, name := range ck.cols {
			_, inTable := cols[name]
			if !inTable || !slices.ContainsFunc(p.cols, func(c column) bool { return c.name == name }) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		for _, name := range ck.cols {
			used[name] = true
		}
		exprs = append(exprs, "("+ck.expr+")")
	}
	if len(exprs) == 0 {
		return ""
	}
	var casts []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		casts = append(casts, "src."+ident(name)+"::"+cols[name].typ+" AS "+ident(name))
	}
	return "(SELECT " + strings.Join(exprs, " AND ") + " FROM (SELECT " + strings.Join(casts, ", ") + ") AS _causet_chk)"
}

// formCopyGroups is copyGroupsChecked with the worker's catalog: the tables
// with a COPY group in planned are looked up (tableCatalog), and the
// upserts they would refuse are left to statements, logged at DEBUG.
func (pc *partition) formCopyGroups(ctx context.Context, planned []pair) ([]*copyGroup, []pair, []pair) {
	w := pc.w
	type checked struct {
		p      *TableProjection
		schema string
		rc     *rowCheck
	}
	var seen []checked
	groups, rest, suspects := copyGroupsChecked(planned, w.cfg.CopyMinRows, func(g *copyGroup) *rowCheck {
		cols := w.catalog.columns(ctx, g.schema, g.p.def.Table)
		rc := newRowCheck(g.p, cols).withChecks(g.p, w.catalog.checks(g.schema, g.p.def.Table), cols)
		if pc.refusedGroups.has(g) {
			// A row of the last group of this table was refused: the
			// table's CHECK constraints are evaluated on this one's rows
			// in its COPY transaction (copyRows), so that the rows they
			// refuse leave the group and the group is copied, not
			// isolated.
			g.check = g.p.checkPredicate(w.catalog.checks(g.schema, g.p.def.Table), cols)
		}
		if rc != nil {
			seen = append(seen, checked{g.p, g.schema, rc})
		}
		return rc
	})
	for _, c := range seen {
		if c.rc.suspect > 0 {
			w.log.Debug("upserts the table would refuse left to statements", "partition", pc.partition,
				"projection", c.p.Name(), "tenant_schema", c.schema, "upserts", c.rc.suspect)
		}
	}
	return groups, rest, suspects
}
