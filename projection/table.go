package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

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
	// Op is what the statement does to its row, OpUpsert or OpDelete,
	// when TableProjection.Plan made it; "" from another Planner. Only a
	// TableProjection's upserts go to COPY.
	Op Op
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
// applied in order by one worker at a time (they share a Kafka partition).
// The checks read their statement's snapshot: an older upsert and a newer
// delete of one key running at once can leave the row beside the newer
// tombstone, which the sweep after commit removes (sweep.go; Apply sweeps,
// and so does the Worker). Tombstones are kept forever.
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
	sweep  sqlTemplate // sweepSQL; set when deletes
	// deletes: some event type of the projection is a delete, so its
	// upserts and deletes are swept after they commit (sweep.go).
	deletes bool
	vars    sync.Pool // of *deriveActivation, reset
	// table is def.Table as an argument, boxed once (a Statement's last
	// argument: boxing it per plan cost an allocation).
	table any
	// events is def.Events as a list, looked up by op: a projection
	// handles a few event types, and comparing a type with each costs less
	// than hashing it into the map (Handles and Plan are called for every
	// record and projection; the map's lookups were 4 % of the worker's CPU).
	events []eventOp
}

// eventOp is one event type of a projection and its operation.
type eventOp struct {
	eventType string
	op        Op
}

// maxListedEvents is the number of event types up to which op scans
// p.events; beyond it, op looks eventType up in def.Events.
const maxListedEvents = 8

// op returns the operation of eventType, and whether p handles it.
func (p *TableProjection) op(eventType string) (Op, bool) {
	if p.events == nil {
		op, ok := p.def.Events[eventType]
		return op, ok
	}
	for i := range p.events {
		if p.events[i].eventType == eventType {
			return p.events[i].op, true
		}
	}
	return "", false
}

// opOf is op's operation alone ("" when p does not handle eventType).
func (p *TableProjection) opOf(eventType string) Op {
	op, _ := p.op(eventType)
	return op
}

// column is a column with its value source resolved.
type column struct {
	name    string
	typ     string
	kind    colKind
	notNull bool     // notNull and not a primary key column (nullKey reports those)
	source  string   // "from payload.x" or `derive "expr"`, for errors
	path    []string // from, split at dots; nil for derive
	fromTS  bool     // from ts into a timestamptz or date column: formatted from Event.TS
	// jsonbKey: a jsonb column of the primary key, whose numbers are
	// written in one spelling per value (canonicalJSONNumbers); next to
	// fromTS, with which it shares a word.
	jsonbKey bool
	prog     *derivePrg // derive; nil for from
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
			key := slices.Contains(pd.PrimaryKey, name)
			c := column{name: name, typ: cd.Type, kind: kindOf(cd.Type), notNull: cd.NotNull && !key}
			c.jsonbKey = key && c.kind == kindJSONB
			if cd.From != "" {
				c.path = strings.Split(cd.From, ".")
				c.fromTS = cd.From == "ts" && (c.kind == kindTimestamptz || c.kind == kindDate)
				c.source = "from " + cd.From
			} else {
				c.prog = d.programs[cd.Derive]
				c.source = "derive " + strconv.Quote(cd.Derive)
			}
			keyIndex[name] = len(p.cols)
			p.cols = append(p.cols, c)
		}
		for _, k := range pd.PrimaryKey {
			p.pk = append(p.pk, keyIndex[k])
		}
		p.upsert = p.upsertSQL()
		p.delete = p.deleteSQL()
		for et, op := range pd.Events {
			p.deletes = p.deletes || op == OpDelete
			if len(pd.Events) <= maxListedEvents {
				p.events = append(p.events, eventOp{eventType: et, op: op})
			}
		}
		if p.deletes {
			p.sweep = p.sweepSQL()
		}
		p.table = pd.Table
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
	_, ok := p.op(eventType)
	return ok
}

// Apply plans ev (see Plan) and executes the statement on db. It returns
// Stale when the statement changed no row: the row or its tombstone is newer
// than ev. Errors of Plan are permanent; a PostgreSQL error is returned as
// a *ColumnError wrapping it when it names a column of the row or the
// parameter carrying one, else as is (*pgconn.PgError); either way the dead
// letter's error reads as PostgreSQL prints it (SPEC §6; projection and
// tenant schema are fields of the dead letter already).
//
// For a projection with a delete, Apply then sweeps the row's key in a
// statement of its own (sweep.go), which must see what commits after the
// first: db should not be a transaction. A failed sweep returns its error,
// "sweep after commit: ..."; applying ev again is harmless.
func (p *TableProjection) Apply(ctx context.Context, db DB, ev *Event) (Outcome, error) {
	st, err := p.Plan(ev)
	if err != nil {
		return Applied, err
	}
	tag, err := db.Exec(ctx, st.SQL, st.Args...)
	if err != nil {
		return Applied, p.columnError(ev, err)
	}
	if p.deletes {
		// Its sweep (sweep.go): the row, when an older upsert and a newer
		// delete of its key ran at once.
		sw := sweepGroups([]pair{{d: &decoded{ev: ev}, h: p, stmt: st}})[0].statement()
		if _, err := db.Exec(ctx, sw.SQL, sw.Args...); err != nil {
			return Applied, fmt.Errorf("sweep after commit: %w", err)
		}
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
// primary key value is NULL, or a value that PostgreSQL would refuse for
// its column's type, or a NULL for a notNull column: a *ValueError naming
// the column, the source (from path or derive) and the value's JSON type.
//
// Conversions, by column type: jsonb gets the JSON text of the value (numbers
// exact); timestamptz and date get a JSON number as epoch milliseconds,
// rendered exactly in UTC, and an RFC 3339 string as it is; every other type
// gets a string as it is, a number as its exact JSON text and a boolean as
// true/false. Before that, the value is checked as PostgreSQL's input
// function for the type would read it (see checkValue): integer range and
// syntax for smallint, integer and bigint; numeric syntax and range; the
// range of double precision and real (1e400 is refused, not stored as
// Infinity); boolean spellings; uuid syntax; the timestamptz and date range;
// no NUL character in any string (text and jsonb refuse it). JSON null and an
// absent from path give NULL.
func (p *TableProjection) Plan(ev *Event) (Statement, error) {
	if ev == nil {
		return Statement{}, p.permanent(errors.New("nil event"))
	}
	if err := tenantSchemaError(ev.TenantSchema); err != nil {
		return Statement{}, p.permanent(err)
	}
	op, ok := p.op(ev.EventType)
	if !ok {
		return Statement{}, p.permanent(fmt.Errorf("event type %q is not handled", ev.EventType))
	}
	if ev.SequenceNumber < 0 {
		return Statement{}, p.permanent(fmt.Errorf("sequence number %d is negative", ev.SequenceNumber))
	}
	var vars *deriveActivation // taken on first use
	defer func() {
		if vars != nil {
			vars.reset(nil)
			p.vars.Put(vars)
		}
	}()
	value := func(c *column) (any, error) {
		if c.fromTS && inTimeRange(c.kind, ev.TS) {
			// What the general path gives, without the text of ev.TS.
			if c.kind != kindDate && ev.tsArg != nil {
				return ev.tsArg, nil
			}
			return formatMillis(ev.TS, c.kind == kindDate), nil
		}
		var v any
		if c.prog != nil {
			if vars == nil {
				if vars, _ = p.vars.Get().(*deriveActivation); vars == nil {
					vars = &deriveActivation{}
				}
				vars.reset(ev)
			}
			var err error
			if v, err = evalDerive(c.prog, vars); err != nil {
				return nil, p.permanent(fmt.Errorf("derive %s: %w", c.name, deriveError(err, ev)))
			}
		} else if s, number, ok := c.text(ev); ok {
			// checkValue and toParam of a string or json.Number, without
			// boxing the value for them.
			if number {
				if r := checkNumber(c.kind, c.typ, s); r != "" {
					return nil, p.valueError(c, json.Number(s), r)
				}
				param, err := numberParam(c.typ, s)
				if err != nil {
					return nil, p.permanent(fmt.Errorf("column %s: %w", c.name, err))
				}
				return param, nil
			}
			if r := checkString(c.kind, c.typ, s); r != "" {
				return nil, p.valueError(c, s, r)
			}
			return s, nil
		} else if t, i, raw, ok := jsonbRaw(c, ev); ok {
			if r := checkTreeJSONB(t, i); r != "" {
				return nil, p.valueError(c, &treeNode{t, i}, r)
			}
			return raw, nil
		} else {
			v = lookupPath(ev, c.path)
		}
		if v == nil {
			if c.notNull {
				return nil, p.valueError(c, v, "null value in a notNull column"+absentNote(c, ev))
			}
			return nil, nil
		}
		if r := checkValue(c.kind, c.typ, v); r != "" {
			return nil, p.valueError(c, v, r)
		}
		s, err := toParam(c.typ, v)
		if err != nil {
			return nil, p.permanent(fmt.Errorf("column %s: %w", c.name, err))
		}
		if c.jsonbKey {
			// PostgreSQL deems {"x": 1.0} and {"x": 1} one key, but its
			// text, the tombstone's, keeps the spelling: one spelling
			// makes one tombstone text (new-user trial: an older upsert
			// of 1.0 brought back the row a delete of 1 had deleted).
			s = canonicalJSONNumbers(s.(string))
		}
		return s, nil
	}
	seq := ev.seqArg
	if seq == nil {
		seq = strconv.FormatInt(ev.SequenceNumber, 10)
	}
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
				return Statement{}, p.nullKey(i, ev)
			}
		}
		if p.deletes {
			if err := p.tombstoneFits(p.upsertKeyArgs(args), OpUpsert); err != nil {
				return Statement{}, err
			}
		}
		args = append(args, seq, p.table)
		return Statement{SQL: p.upsert.build(ev.TenantSchema), Args: args, Op: OpUpsert}, nil
	default: // OpDelete
		args := make([]any, 0, len(p.pk)+2)
		for _, i := range p.pk {
			v, err := value(&p.cols[i])
			if err != nil {
				return Statement{}, err
			}
			if v == nil {
				return Statement{}, p.nullKey(i, ev)
			}
			args = append(args, v)
		}
		if err := p.tombstoneFits(args, OpDelete); err != nil {
			return Statement{}, err
		}
		args = append(args, seq, p.table)
		return Statement{SQL: p.delete.build(ev.TenantSchema), Args: args, Op: OpDelete}, nil
	}
}

// text returns lookupText of c's from path, except for a jsonb column
// (ok false): its string or number becomes JSON text (toParam).
func (c *column) text(ev *Event) (s string, number, ok bool) {
	if c.kind == kindJSONB {
		return "", false, false
	}
	return lookupText(ev, c.path)
}

// upsertKeyArgs returns the primary key values of an upsert's arguments
// (Statement.Args of an upsert Plan made), in primary key order.
func (p *TableProjection) upsertKeyArgs(args []any) []any {
	keyArgs := make([]any, len(p.pk))
	for j, i := range p.pk {
		keyArgs[j] = args[i]
	}
	return keyArgs
}

// tombstoneFits returns nil when the tombstone of the key keyArgs (its
// values as Plan sends them, in primary key order, none nil) fits the
// primary key index of _causet_tombstones (tombstoneEntrySize), else a
// *ValueError naming the key's longest column. An upsert (op) of such a
// key is refused, so that no row stays that no delete could remove
// (new-user trial: a key of 2 649 bytes was upserted, and its delete
// refused with 54000); a delete of it too, rather than with PostgreSQL's
// words, saying that its row, written before the projection had a delete,
// is to be deleted by hand.
func (p *TableProjection) tombstoneFits(keyArgs []any, op Op) error {
	longest := 0
	for j, a := range keyArgs {
		if s, _ := a.(string); len(s) > len(keyArgs[longest].(string)) {
			longest = j
		}
	}
	size := p.tombstoneEntrySize(keyArgs)
	if size <= maxIndexTuple {
		return nil
	}
	c := &p.cols[p.pk[longest]]
	then := "so a delete of it could never be applied (projections with a delete take keys of up to about 2.6 kB)"
	if op == OpDelete {
		then = "so this delete cannot be applied: a row of this key can only have been written before the projection had a delete; if there is one, delete it by hand (docs/events.md, Key length)"
	}
	err := p.valueError(c, keyArgs[longest], fmt.Sprintf(
		"primary key too long for its tombstone: %d bytes in the index of %s, over PostgreSQL's limit of %d, %s",
		(size+7)&^7, tombstoneTable, maxIndexTuple, then)) // PostgreSQL's figure: the entry aligned to 8 (definitions trial: 2708 said for its 2712)
	if ve, ok := err.(*ValueError); ok && c.kind == kindJSONB {
		// Plan sends a jsonb value as its JSON text: the value's type is
		// the text's, not "string" (new-user trial).
		ve.JSONType = jsonTextType(keyArgs[longest].(string))
	}
	return err
}

// jsonTextType returns the JSON type of the JSON text s, as jsonType names
// types, from its first byte.
func jsonTextType(s string) string {
	if s == "" {
		return "value"
	}
	switch s[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func (p *TableProjection) permanent(err error) error {
	return retry.MarkPermanent(fmt.Errorf("projection %q: %w", p.def.Name, err))
}

func (p *TableProjection) valueError(c *column, v any, reason string) error {
	return &ValueError{Projection: p.def.Name, Column: c.name, Source: c.source, JSONType: jsonType(v), Reason: reason}
}

// nullKey is the error of a null value (JSON null, an absent path, a
// derive's null) for primary key column i of ev's row: a *ValueError
// naming the column and its source (new-user trial: "primary key column
// user_id is null" said neither where it came from nor that it was
// absent).
func (p *TableProjection) nullKey(i int, ev *Event) error {
	c := &p.cols[i]
	return p.valueError(c, nil, "null value in a primary key column"+absentNote(c, ev))
}

// absentNote returns ", absent from the event" when column c reads a
// payload path that ev does not have (lookupPath gives nil for an absent
// path as for JSON null), else "".
func absentNote(c *column, ev *Event) string {
	if c.prog != nil || len(c.path) == 0 || c.path[0] != "payload" {
		return ""
	}
	if _, _, ok := payloadNode(ev, c.path); ok {
		return ""
	}
	return ": " + strings.TrimPrefix(c.source, "from ") + " is absent from the event"
}
