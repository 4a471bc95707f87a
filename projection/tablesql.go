package projection

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// sqlTemplate is SQL text split where the quoted tenant schema goes: the
// SQL for schema s is parts[0] + quote(s) + parts[1] + ... + parts[n]. The
// text for a schema is always the same, so pgx's per-connection statement
// cache finds it; build keeps the text of the first maxCachedSchemas
// schemas, so that planning a statement does not write it again.
type sqlTemplate struct {
	parts []string
	cache *schemaSQL
}

// maxCachedSchemas bounds the SQL texts a template keeps (one per tenant
// schema, a few hundred bytes each); the text of a schema beyond it is
// built at every call.
const maxCachedSchemas = 4096

// schemaSQL is a template's SQL text per tenant schema. It is safe for
// concurrent use.
type schemaSQL struct {
	bySchema sync.Map // tenant schema → SQL text
	n        atomic.Int32
}

// schemaMark stands for the quoted schema while a template is written. It
// cannot occur in the rest of the SQL, which holds only validated
// identifiers, keywords and placeholders.
const schemaMark = "\x00schema\x00"

func newSQLTemplate(sql string) sqlTemplate {
	return sqlTemplate{parts: strings.Split(sql, schemaMark), cache: &schemaSQL{}}
}

// build returns the SQL for schema, which must satisfy ValidTenantSchema.
// It is safe for concurrent use.
func (t sqlTemplate) build(schema string) string {
	if sql, ok := t.cache.bySchema.Load(schema); ok {
		return sql.(string)
	}
	sql := t.write(schema)
	if t.cache.n.Load() < maxCachedSchemas {
		if _, loaded := t.cache.bySchema.LoadOrStore(strings.Clone(schema), sql); !loaded {
			t.cache.n.Add(1)
		}
	}
	return sql
}

// write writes the SQL for schema.
func (t sqlTemplate) write(schema string) string {
	q := pgx.Identifier{schema}.Sanitize()
	n := len(q) * (len(t.parts) - 1)
	for _, part := range t.parts {
		n += len(part)
	}
	var b strings.Builder
	b.Grow(n)
	for i, part := range t.parts {
		if i > 0 {
			b.WriteString(q)
		}
		b.WriteString(part)
	}
	return b.String()
}

// qualified returns the template text of schema.name.
func qualified(name string) string {
	return schemaMark + "." + pgx.Identifier{name}.Sanitize()
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// param returns placeholder n cast to the column type: $n::text::bigint.
func param(n int, typ string) string {
	if typ == "text" {
		return "$" + strconv.Itoa(n) + "::text"
	}
	return "$" + strconv.Itoa(n) + "::text::" + typ
}

// keyText returns the tombstone text of a primary key placeholder: the value
// cast to its type, then to text (timestamptz in UTC).
func keyText(n int, typ string) string { return keyTextOf(param(n, typ), typ) }

// keyTextOf returns the tombstone text of expr, a primary key value already
// cast to its type typ: one text for all the values PostgreSQL deems equal,
// so that a tombstone stops every spelling of its key: timestamptz in UTC,
// numeric without the trailing zeros of its scale (trim_scale, PostgreSQL
// 13: 7.5 and 7.50 are one key), real and double precision with −0 as 0 (a
// zero of the type added); the others as text, which is one per value.
// (jsonb, compared as values too, keeps its numbers' scale in its text:
// Plan writes a jsonb key's numbers in one spelling, canonicalJSONNumbers.)
func keyTextOf(expr, typ string) string {
	switch typ {
	case "text":
		return expr
	case "timestamptz":
		return "(" + expr + " AT TIME ZONE 'UTC')::text"
	case "numeric":
		return "trim_scale(" + expr + ")::text"
	case "real", "double precision":
		return "(" + expr + " + 0::" + typ + ")::text"
	}
	return expr + "::text"
}

// maxIndexTuple is PostgreSQL's largest btree index entry (btree version
// 4, 8 kB pages): "index row size N exceeds btree version 4 maximum 2704"
// (SQLSTATE 54000).
const maxIndexTuple = 2704

// tombstoneEntrySize returns the size in bytes of the entry that the
// tombstone of the key keyArgs (the key values as Plan sends them, in
// primary key order) would take in the primary key index of
// _causet_tombstones, (table_name, pk text[]), before any compression: an
// 8-byte index tuple header and table_name (1-byte varlena header; table
// names are at most 63 bytes), aligned to 4; the text[] header (24 bytes:
// varlena header, dimensions, data offset, element type, length, lower
// bound); each element with a 4-byte header, aligned to 4. (Checked
// against PostgreSQL 17 byte for byte, TestTombstoneEntrySizeIsPostgreSQLs.)
// An element's text is the key value's tombstone text (keyTextOf), whose
// length is computed from the value as Plan sends it: text as it is;
// jsonb and numeric as PostgreSQL writes them (pgJSONBTextLen,
// pgNumericTextLen); the other types' texts take at most 40 bytes.
func (p *TableProjection) tombstoneEntrySize(keyArgs []any) int {
	align := func(n int) int { return (n + 3) &^ 3 }
	size := align(8+1+len(p.def.Table)) + 24
	for j, a := range keyArgs {
		s, _ := a.(string)
		n := 40
		switch p.cols[p.pk[j]].kind {
		case kindText:
			n = len(s)
		case kindJSONB:
			var ok bool
			if n, ok = pgJSONBTextLen(s); !ok { // not JSON: PostgreSQL refuses it anyway
				n = len(s)
			}
		case kindNumeric:
			n = pgNumericTextLen(s)
		}
		size += align(4 + n)
	}
	return size
}

// pgJSONBTextLen returns the length in bytes of the text PostgreSQL's jsonb
// output writes for the JSON document s (jsonb_out, as the tombstone's
// ::text of a jsonb key): ", " between members and elements, ": " after
// a key, strings as escape_json writes them (pgJSONStringLen) and numbers
// at the scale of their spelling, which for a jsonb key (Plan's
// canonicalJSONNumbers spelling) is the smallest: pgNumericTextLen. It
// reports false when s is not JSON. (A bound from the text as sent, before:
// 1e300 in a key is 301 digits in the tombstone, and 15e-1 is 1.5: new-user
// trial, a key accepted that no delete could remove and one refused that
// fitted.)
func pgJSONBTextLen(s string) (int, bool) {
	t, err := jsonstrict.ParseTree([]byte(s))
	if err != nil {
		return 0, false
	}
	return pgJSONBNodeLen(t, 0), true
}

// pgJSONBNodeLen is pgJSONBTextLen of node i of t.
func pgJSONBNodeLen(t *jsonstrict.Tree, i int32) int {
	n := &t.Nodes[i]
	switch n.Kind {
	case jsonstrict.ObjectNode, jsonstrict.ArrayNode:
		size := 2 // the brackets
		for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
			if k > 0 {
				size += 2 // ", "
			}
			if n.Kind == jsonstrict.ObjectNode {
				size += pgJSONStringLen(t.Key(j)) + 2 // `"key": `
			}
			size += pgJSONBNodeLen(t, j)
		}
		return size
	case jsonstrict.StringNode:
		return pgJSONStringLen(t.Text(i))
	case jsonstrict.NumberNode:
		return pgNumericTextLen(t.Text(i))
	case jsonstrict.FalseNode:
		return len("false")
	}
	return len("true") // true, null
}

// pgJSONStringLen returns the length of s as PostgreSQL's escape_json
// writes it: quoted, with \b \f \n \r \t \" and \\ for those bytes, \u00XX
// for the other bytes below 0x20, every other byte as it is.
func pgJSONStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t' || c == '"' || c == '\\':
			n += 2
		case c < 0x20:
			n += 6
		default:
			n++
		}
	}
	return n
}

// pgNumericTextLen returns the length of the text PostgreSQL writes for
// the number n at its smallest scale (trim_scale(n)::text; numeric's
// output never has an exponent: 1e5 is 100000, 15e-1 is 1.5, 1e-3 is
// 0.001); a value that is not a number (NaN, Infinity) is taken as it is.
func pgNumericTextLen(n string) int {
	c := keyValueText(kindNumeric, n) // canonicalNumber's [-]digits[e[-]exp], or nan, infinity
	size := 0
	if strings.HasPrefix(c, "-") {
		size, c = 1, c[1:]
	}
	digits, expText, _ := strings.Cut(c, "e")
	exp, err := strconv.Atoi(expText)
	if expText == "" {
		exp, err = 0, nil
	}
	if err != nil || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return size + len(c) // NaN, Infinity; beyond numeric's range or not a number: PostgreSQL refuses it
	}
	switch {
	case exp >= 0: // the digits, then exp zeros
		return size + len(digits) + exp
	case len(digits) > -exp: // a point inside the digits
		return size + len(digits) + 1
	default: // "0." then zeros, then the digits
		return size + 2 - exp
	}
}

// tombstoneMatch is the condition on tb.pk that finds the tombstone of
// the key whose values are exprs (each cast to its type, types[i]): its
// keyTextOf texts, and also the texts an older worker wrote, the value as
// text, for a key with a numeric, real or double precision column (so
// that an upsert is still stopped by a tombstone written before a worker
// wrote keyTextOf's texts).
func tombstoneMatch(exprs, types []string) string {
	var texts, legacy []string
	differ := false
	for i, e := range exprs {
		texts = append(texts, keyTextOf(e, types[i]))
		switch types[i] {
		case "numeric", "real", "double precision":
			differ = true
			legacy = append(legacy, e+"::text")
		default:
			legacy = append(legacy, texts[i])
		}
	}
	m := "tb.pk = ARRAY[" + strings.Join(texts, ", ") + "]"
	if !differ {
		return m
	}
	return "(" + m + " OR tb.pk = ARRAY[" + strings.Join(legacy, ", ") + "])"
}

// upsertSQL writes, for columns c1..cn (parameters $1..$n), sequence number
// $n+1 and table name $n+2:
//
//	INSERT INTO s.t AS t (c1, ..., cn, _causet_seq)
//	SELECT $1::text::type1, ..., $n+1::text::bigint
//	WHERE NOT EXISTS (SELECT 1 FROM s._causet_tombstones tb
//	    WHERE tb.table_name = $n+2::text AND tb.pk = ARRAY[<key params as text>] (tombstoneMatch)
//	    AND tb._causet_seq >= $n+1::text::bigint)
//	AND NOT EXISTS (SELECT 1 FROM s.t WHERE k1 = $k1 AND ... AND _causet_seq > $n+1::text::bigint)
//	ON CONFLICT (pk...) DO UPDATE SET c = EXCLUDED.c, ..., _causet_seq = EXCLUDED._causet_seq
//	WHERE t._causet_seq <= EXCLUDED._causet_seq
//
// The second NOT EXISTS proposes no row when the row is newer: PostgreSQL
// checks a proposed row's CHECK and NOT NULL constraints (and runs BEFORE
// INSERT triggers) before ON CONFLICT finds the row, so an older upsert
// that they refuse would otherwise fail (23514, 23502) at every retry
// where it is stale, and be dead-lettered (tracing trial: a rating of 8
// stars, superseded by one of 4, dead-lettered after 5 retries). It costs
// an index probe of the primary key.
func (p *TableProjection) upsertSQL() sqlTemplate {
	n := len(p.cols)
	seq := param(n+1, "bigint")
	var names, values, sets, keys, keyExprs, keyTypes []string
	for i, c := range p.cols {
		names = append(names, ident(c.name))
		values = append(values, param(i+1, c.typ))
	}
	var match []string
	for _, i := range p.pk {
		keys = append(keys, ident(p.cols[i].name))
		keyExprs = append(keyExprs, param(i+1, p.cols[i].typ))
		keyTypes = append(keyTypes, p.cols[i].typ)
		match = append(match, ident(p.cols[i].name)+" = "+param(i+1, p.cols[i].typ))
	}
	for i, c := range p.cols {
		if !p.isKey(i) {
			sets = append(sets, ident(c.name)+" = EXCLUDED."+ident(c.name))
		}
	}
	sets = append(sets, seqColumn+" = EXCLUDED."+seqColumn)
	names = append(names, seqColumn)
	values = append(values, seq)
	sql := "INSERT INTO " + qualified(p.def.Table) + " AS t (" + strings.Join(names, ", ") + ")" +
		" SELECT " + strings.Join(values, ", ") +
		" WHERE NOT EXISTS (SELECT 1 FROM " + qualified(tombstoneTable) + " tb" +
		" WHERE tb.table_name = $" + strconv.Itoa(n+2) + "::text" +
		" AND " + tombstoneMatch(keyExprs, keyTypes) +
		" AND tb." + seqColumn + " >= " + seq + ")" +
		" AND NOT EXISTS (SELECT 1 FROM " + qualified(p.def.Table) +
		" WHERE " + strings.Join(match, " AND ") + " AND " + seqColumn + " > " + seq + ")" +
		" ON CONFLICT (" + strings.Join(keys, ", ") + ") DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE t." + seqColumn + " <= EXCLUDED." + seqColumn
	return newSQLTemplate(sql)
}

// deleteSQL writes, for key columns k1..km (parameters $1..$m), sequence
// number $m+1 and table name $m+2:
//
//	WITH del AS (DELETE FROM s.t WHERE k1 = $1::text::type1 AND ... AND _causet_seq <= $m+1::text::bigint)
//	INSERT INTO s._causet_tombstones AS tb (table_name, pk, _causet_seq)
//	SELECT $m+2::text, ARRAY[<key params as text>], $m+1::text::bigint
//	WHERE NOT EXISTS (SELECT 1 FROM s.t WHERE k1 = ... AND _causet_seq > $m+1::text::bigint)
//	ON CONFLICT (table_name, pk) DO UPDATE SET _causet_seq = EXCLUDED._causet_seq
//	WHERE tb._causet_seq <= EXCLUDED._causet_seq
//
// It affects 0 rows (Stale) when the row is newer than the delete or a newer
// tombstone exists; re-delivering the same delete rewrites its tombstone
// (Applied), as re-delivering an upsert rewrites its row.
func (p *TableProjection) deleteSQL() sqlTemplate {
	m := len(p.pk)
	seq := param(m+1, "bigint")
	var match, keyTexts []string
	for j, i := range p.pk {
		c := p.cols[i]
		match = append(match, ident(c.name)+" = "+param(j+1, c.typ))
		keyTexts = append(keyTexts, keyText(j+1, c.typ))
	}
	where := strings.Join(match, " AND ")
	sql := "WITH del AS (DELETE FROM " + qualified(p.def.Table) +
		" WHERE " + where + " AND " + seqColumn + " <= " + seq + ")" +
		" INSERT INTO " + qualified(tombstoneTable) + " AS tb (table_name, pk, " + seqColumn + ")" +
		" SELECT $" + strconv.Itoa(m+2) + "::text, ARRAY[" + strings.Join(keyTexts, ", ") + "], " + seq +
		" WHERE NOT EXISTS (SELECT 1 FROM " + qualified(p.def.Table) +
		" WHERE " + where + " AND " + seqColumn + " > " + seq + ")" +
		" ON CONFLICT (table_name, pk) DO UPDATE SET " + seqColumn + " = EXCLUDED." + seqColumn +
		" WHERE tb." + seqColumn + " <= EXCLUDED." + seqColumn
	return newSQLTemplate(sql)
}

// sweepSQL writes, for key columns k1..km (parameters $1..$m, each a
// text[] of the keys' values as Plan sends them, one key per index), the
// sequence numbers of the keys' upserts or deletes ($m+1, a text[] of
// bigints, same indexes) and table name $m+2:
//
//	WITH hit AS MATERIALIZED (
//	    SELECT k.c1, ..., k.cm, tb._causet_seq
//	    FROM unnest($1::text[], ..., $m::text[], $m+1::text[]) AS k(c1, ..., cm, seq)
//	    JOIN s._causet_tombstones tb ON tb.table_name = $m+2::text
//	        AND tb.pk = ARRAY[<k.ci cast to its type, as text>] (tombstoneMatch)
//	        AND tb._causet_seq >= k.seq::bigint)
//	DELETE FROM s.t AS t USING hit
//	WHERE t.k1 = hit.c1::type1 AND ... AND t._causet_seq <= hit._causet_seq
//
// It deletes the row of each key that a tombstone at least as new covers
// (sweep.go). The tombstones are probed first (MATERIALIZED), so that a
// key without a tombstone as new as its event costs an index probe of the
// tombstones and none of the table. (A row an upsert at seq wrote is at
// seq or newer; a tombstone older than seq cannot cover it.)
func (p *TableProjection) sweepSQL() sqlTemplate {
	m := len(p.pk)
	var arrays, names, exprs, types, match []string
	for j, i := range p.pk {
		c := p.cols[i]
		n := strconv.Itoa(j + 1)
		arrays = append(arrays, "$"+n+"::text[]")
		names = append(names, "c"+n)
		cast := func(v string) string {
			if c.typ == "text" {
				return v
			}
			return v + "::" + c.typ
		}
		exprs = append(exprs, cast("k.c"+n))
		types = append(types, c.typ)
		match = append(match, "t."+ident(c.name)+" = "+cast("hit.c"+n))
	}
	sql := "WITH hit AS MATERIALIZED (SELECT k." + strings.Join(names, ", k.") + ", tb." + seqColumn +
		" FROM unnest(" + strings.Join(arrays, ", ") + ", $" + strconv.Itoa(m+1) + "::text[])" +
		" AS k(" + strings.Join(names, ", ") + ", seq)" +
		" JOIN " + qualified(tombstoneTable) + " tb ON tb.table_name = $" + strconv.Itoa(m+2) + "::text" +
		" AND " + tombstoneMatch(exprs, types) + " AND tb." + seqColumn + " >= k.seq::bigint)" +
		" DELETE FROM " + qualified(p.def.Table) + " AS t USING hit" +
		" WHERE " + strings.Join(match, " AND ") + " AND t." + seqColumn + " <= hit." + seqColumn
	return newSQLTemplate(sql)
}

func (p *TableProjection) isKey(i int) bool {
	for _, k := range p.pk {
		if k == i {
			return true
		}
	}
	return false
}
