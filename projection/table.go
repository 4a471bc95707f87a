package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/retry"
)

// seqColumn is the column every projection table carries: the sequence
// number of the last event applied to the row (SPEC §4).
const seqColumn = "_causet_seq"

// tombstoneTable is the side table, one per tenant schema, that remembers
// deleted primary keys and the sequence number of their delete.
const tombstoneTable = "_causet_tombstones"

// Statement is one SQL statement with its arguments, ready for
// DB.Exec or pgx.Batch.Queue. Every argument is a string or nil (SQL NULL);
// the SQL casts each one ($1::text::bigint), so values reach PostgreSQL as
// exact text.
type Statement struct {
	SQL  string
	Args []any
}

// Outcome maps the command tag of the executed statement to the outcome:
// 0 rows means the event was stale.
func (s Statement) Outcome(tag pgconn.CommandTag) Outcome {
	if tag.RowsAffected() == 0 {
		return Stale
	}
	return Applied
}

// TableProjection is a projection of a definitions file (SPEC §4): it keeps
// one row per primary key in its table inside each event's tenant schema.
// It implements Handler and is safe for concurrent use.
//
// Upsert and delete converge under re-delivery and late replay: a row is
// only overwritten by an event whose sequence number is not older than the
// row's _causet_seq, and a delete leaves a tombstone (table, primary key as
// text[], sequence number) in <schema>._causet_tombstones that stops an
// upsert that is not newer than the delete. Events of one entity must be
// applied in order by one worker at a time (they share a Kafka partition);
// the checks are not serialisable against a concurrent writer of the same
// key. Tombstones are kept forever.
//
// The primary key in a tombstone is each key value cast to its column type
// and then to text (timestamptz at time zone UTC), so its spelling depends on
// the session's DateStyle (keep the default ISO) and numeric keys keep their
// scale (1.0 and 1.00 are different tombstones).
type TableProjection struct {
	def    ProjectionDef
	cols   []column // in def.ColumnNames order
	pk     []int    // indexes into cols, in primary key order
	upsert sqlTemplate
	delete sqlTemplate
}

// column is a column with its value source resolved.
type column struct {
	name string
	typ  string
	path []string    // from, split at dots; nil for derive
	prog cel.Program // derive; nil for from
}

// NewTableProjections validates d (see Definitions.Validate) and returns one
// TableProjection per projection, in file order. Derive expressions compiled
// by LoadDefinitions are reused.
func NewTableProjections(d *Definitions) ([]*TableProjection, error) {
	if d == nil {
		return nil, errors.New("no projection definitions")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	out := make([]*TableProjection, 0, len(d.Projections))
	for _, pd := range d.Projections {
		p := &TableProjection{def: pd}
		keyIndex := map[string]int{}
		for _, name := range pd.ColumnNames {
			cd := pd.Columns[name]
			c := column{name: name, typ: cd.Type}
			if cd.From != "" {
				c.path = strings.Split(cd.From, ".")
			} else {
				c.prog = d.programs[cd.Derive]
			}
			keyIndex[name] = len(p.cols)
			p.cols = append(p.cols, c)
		}
		for _, k := range pd.PrimaryKey {
			p.pk = append(p.pk, keyIndex[k])
		}
		p.upsert = p.upsertSQL()
		p.delete = p.deleteSQL()
		out = append(out, p)
	}
	return out, nil
}

// Name returns the projection's name.
func (p *TableProjection) Name() string { return p.def.Name }

// Table returns the projection's table name (inside each tenant schema).
func (p *TableProjection) Table() string { return p.def.Table }

// Handles reports whether the projection has an operation for eventType.
func (p *TableProjection) Handles(eventType string) bool {
	_, ok := p.def.Events[eventType]
	return ok
}

// Apply plans ev (see Plan) and executes the statement on db. It returns
// Stale when the statement changed no row: the row or its tombstone is newer
// than ev. Errors of Plan are permanent; a PostgreSQL error is returned as
// is (*pgconn.PgError, unwrapped), so that the dead letter's error reads as
// PostgreSQL prints it (SPEC §6; projection and tenant schema are fields of
// the dead letter already).
func (p *TableProjection) Apply(ctx context.Context, db DB, ev *Event) (Outcome, error) {
	st, err := p.Plan(ev)
	if err != nil {
		return Applied, err
	}
	tag, err := db.Exec(ctx, st.SQL, st.Args...)
	if err != nil {
		return Applied, err
	}
	return st.Outcome(tag), nil
}

// Plan returns the statement that applies ev: the upsert or the delete for
// ev.EventType inside ev.TenantSchema, with every column value converted to
// text. It does not touch the database.
//
// Errors, all marked permanent (retry.MarkPermanent) and naming the
// projection: ev.TenantSchema fails ValidTenantSchema (not a valid
// identifier, or one of PostgreSQL's own schemas; the SQL is never built),
// the projection does not handle ev.EventType, a derive expression
// fails at run time (`projection "p": derive score: division by zero`), a
// value cannot be converted to its column's type (an object or array into a
// column that is not jsonb, a non-integer epoch into timestamptz), or a
// primary key value is NULL.
//
// Conversions, by column type: jsonb gets the JSON text of the value (numbers
// exact); timestamptz and date get a JSON number as epoch milliseconds,
// rendered exactly in UTC, and a string as it is (PostgreSQL parses it); every
// other type gets a string as it is, a number as its exact JSON text and a
// boolean as true/false, and PostgreSQL's cast decides (its class 22 errors,
// such as 22P02 for "abc" into bigint, are permanent too). JSON null and an
// absent from path give NULL.
func (p *TableProjection) Plan(ev *Event) (Statement, error) {
	if ev == nil {
		return Statement{}, p.permanent(errors.New("nil event"))
	}
	if err := tenantSchemaError(ev.TenantSchema); err != nil {
		return Statement{}, p.permanent(err)
	}
	op, ok := p.def.Events[ev.EventType]
	if !ok {
		return Statement{}, p.permanent(fmt.Errorf("event type %q is not handled", ev.EventType))
	}
	if ev.SequenceNumber < 0 {
		return Statement{}, p.permanent(fmt.Errorf("sequence number %d is negative", ev.SequenceNumber))
	}
	var vars *deriveActivation // built on first use
	value := func(c *column) (any, error) {
		var v any
		if c.prog != nil {
			if vars == nil {
				vars = deriveVars(ev)
			}
			var err error
			if v, err = evalDerive(c.prog, vars); err != nil {
				return nil, p.permanent(fmt.Errorf("derive %s: %w", c.name, err))
			}
		} else {
			v = lookupPath(ev, c.path)
		}
		s, err := toParam(c.typ, v)
		if err != nil {
			return nil, p.permanent(fmt.Errorf("column %s: %w", c.name, err))
		}
		return s, nil
	}
	seq := strconv.FormatInt(ev.SequenceNumber, 10)
	switch op {
	case OpUpsert:
		args := make([]any, 0, len(p.cols)+2)
		for i := range p.cols {
			v, err := value(&p.cols[i])
			if err != nil {
				return Statement{}, err
			}
			args = append(args, v)
		}
		for _, i := range p.pk {
			if args[i] == nil {
				return Statement{}, p.nullKey(i)
			}
		}
		args = append(args, seq, p.def.Table)
		return Statement{SQL: p.upsert.build(ev.TenantSchema), Args: args}, nil
	default: // OpDelete
		args := make([]any, 0, len(p.pk)+2)
		for _, i := range p.pk {
			v, err := value(&p.cols[i])
			if err != nil {
				return Statement{}, err
			}
			if v == nil {
				return Statement{}, p.nullKey(i)
			}
			args = append(args, v)
		}
		args = append(args, seq, p.def.Table)
		return Statement{SQL: p.delete.build(ev.TenantSchema), Args: args}, nil
	}
}

func (p *TableProjection) permanent(err error) error {
	return retry.MarkPermanent(fmt.Errorf("projection %q: %w", p.def.Name, err))
}

func (p *TableProjection) nullKey(i int) error {
	return p.permanent(fmt.Errorf("primary key column %s is null", p.cols[i].name))
}

// eventPayload returns ev.Payload, or Fields["payload"] for a hand-built
// Event without Payload.
func eventPayload(ev *Event) map[string]any {
	if ev.Payload != nil {
		return ev.Payload
	}
	m, _ := ev.Fields["payload"].(map[string]any)
	return m
}

// lookupPath returns the value at a from path, nil when absent. The typed
// fields of ev are used for the top-level event fields; payload paths walk
// objects by key and arrays by decimal index.
func lookupPath(ev *Event, path []string) any {
	switch path[0] {
	case "eventType":
		return ev.EventType
	case "entityId":
		return ev.EntityID
	case "forkId":
		return ev.ForkID
	case "tenantSchema":
		return ev.TenantSchema
	case "irVersion":
		return ev.IRVersion
	case "sequenceNumber":
		return json.Number(strconv.FormatInt(ev.SequenceNumber, 10))
	case "ts":
		return json.Number(strconv.FormatInt(ev.TS, 10))
	}
	payload := eventPayload(ev)
	if payload == nil {
		return nil
	}
	var cur any = payload
	for _, seg := range path[1:] {
		switch x := cur.(type) {
		case map[string]any:
			var ok bool
			if cur, ok = x[seg]; !ok {
				return nil
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			cur = x[i]
		default:
			return nil
		}
	}
	return cur
}

// toParam converts an event tree value (nil, string, bool, json.Number,
// time.Time, map[string]any, []any) to the text sent for a column of type
// typ, or nil for NULL.
func toParam(typ string, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if typ == "jsonb" {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, fmt.Errorf("cannot encode as JSON: %w", err)
		}
		return strings.TrimSuffix(buf.String(), "\n"), nil
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case json.Number:
		if typ == "timestamptz" || typ == "date" {
			ms, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s from a number wants integer epoch milliseconds, got %s", typ, x)
			}
			return formatTime(time.UnixMilli(ms), typ == "date"), nil
		}
		return string(x), nil
	case time.Time:
		return formatTime(x, typ == "date"), nil
	case map[string]any:
		return nil, fmt.Errorf("a JSON object cannot be stored in a %s column (only jsonb)", typ)
	case []any:
		return nil, fmt.Errorf("a JSON array cannot be stored in a %s column (only jsonb)", typ)
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
}

// formatTime renders t for PostgreSQL exactly: ISO 8601 in UTC with the
// fraction as given (at least milliseconds), years beyond 9999 in full and
// years before 1 AD with the BC suffix PostgreSQL reads. With dateOnly it
// renders the UTC date.
func formatTime(t time.Time, dateOnly bool) string {
	t = t.UTC()
	y, mo, d := t.Date()
	bc := y <= 0
	if bc {
		y = 1 - y // Go's year 0 is 1 BC
	}
	b := make([]byte, 0, 40)
	b = appendPadded(b, y, 4)
	b = append(b, '-')
	b = appendPadded(b, int(mo), 2)
	b = append(b, '-')
	b = appendPadded(b, d, 2)
	if !dateOnly {
		b = append(b, 'T')
		b = appendPadded(b, t.Hour(), 2)
		b = append(b, ':')
		b = appendPadded(b, t.Minute(), 2)
		b = append(b, ':')
		b = appendPadded(b, t.Second(), 2)
		b = append(b, '.')
		frac := appendPadded(nil, t.Nanosecond(), 9)
		n := len(frac)
		for n > 3 && frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
		b = append(b, 'Z')
	}
	if bc {
		b = append(b, " BC"...)
	}
	return string(b)
}

// appendPadded appends the decimal form of n (≥ 0), zero-padded to width.
func appendPadded(b []byte, n, width int) []byte {
	var buf [20]byte
	digits := strconv.AppendInt(buf[:0], int64(n), 10)
	for i := len(digits); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, digits...)
}

// sqlTemplate is SQL text split where the quoted tenant schema goes: the
// SQL for schema s is parts[0] + quote(s) + parts[1] + ... + parts[n].
// Building it costs one allocation; the text for a schema is always the
// same, so pgx's per-connection statement cache finds it.
type sqlTemplate []string

// schemaMark stands for the quoted schema while a template is written. It
// cannot occur in the rest of the SQL, which holds only validated
// identifiers, keywords and placeholders.
const schemaMark = "\x00schema\x00"

func newSQLTemplate(sql string) sqlTemplate { return strings.Split(sql, schemaMark) }

// build returns the SQL for schema, which must satisfy ValidTenantSchema.
func (t sqlTemplate) build(schema string) string {
	q := pgx.Identifier{schema}.Sanitize()
	n := len(q) * (len(t) - 1)
	for _, part := range t {
		n += len(part)
	}
	var b strings.Builder
	b.Grow(n)
	for i, part := range t {
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
func keyText(n int, typ string) string {
	switch typ {
	case "text":
		return param(n, typ)
	case "timestamptz":
		return "(" + param(n, typ) + " AT TIME ZONE 'UTC')::text"
	}
	return param(n, typ) + "::text"
}

// upsertSQL writes, for columns c1..cn (parameters $1..$n), sequence number
// $n+1 and table name $n+2:
//
//	INSERT INTO s.t AS t (c1, ..., cn, _causet_seq)
//	SELECT $1::text::type1, ..., $n+1::text::bigint
//	WHERE NOT EXISTS (SELECT 1 FROM s._causet_tombstones tb
//	    WHERE tb.table_name = $n+2::text AND tb.pk = ARRAY[<key params as text>]
//	    AND tb._causet_seq >= $n+1::text::bigint)
//	ON CONFLICT (pk...) DO UPDATE SET c = EXCLUDED.c, ..., _causet_seq = EXCLUDED._causet_seq
//	WHERE t._causet_seq <= EXCLUDED._causet_seq
func (p *TableProjection) upsertSQL() sqlTemplate {
	n := len(p.cols)
	seq := param(n+1, "bigint")
	var names, values, sets, keys, keyTexts []string
	for i, c := range p.cols {
		names = append(names, ident(c.name))
		values = append(values, param(i+1, c.typ))
	}
	for _, i := range p.pk {
		keys = append(keys, ident(p.cols[i].name))
		keyTexts = append(keyTexts, keyText(i+1, p.cols[i].typ))
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
		" AND tb.pk = ARRAY[" + strings.Join(keyTexts, ", ") + "]" +
		" AND tb." + seqColumn + " >= " + seq + ")" +
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

func (p *TableProjection) isKey(i int) bool {
	for _, k := range p.pk {
		if k == i {
			return true
		}
	}
	return false
}
