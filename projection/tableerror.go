package projection

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ColumnError is a PostgreSQL error about one column of a table
// projection's row, with what Plan knows of that column: its source and
// the JSON type of the event's value. The column is known when PostgreSQL
// names it (PgError.ColumnName, as for 23502 not-null violations) or names
// the statement parameter that carries it (PgError.Where "unnamed portal
// parameter $2", as for 22021 invalid encoding), or, for a data exception
// (class 22) that names neither, when its message quotes the value of one
// column of the row and of no other (`invalid input syntax for type
// smallint: "0x1F"`: PostgreSQL 15 refuses the hex literals that 16
// takes), or when the table's columns as the worker's catalog cache has
// them refuse the value of exactly one column (`smallint out of range` for a
// column narrowed by hand), or, for a value over PostgreSQL's limits
// (54000: `index row requires 10328 bytes, maximum size is 8191`), when
// the value of exactly one column is longer than a btree index row can
// hold. Err is the
// *pgconn.PgError, unchanged: retry.Classify and retry.SQLState see it
// through Unwrap, and a dead letter's error field reads as PostgreSQL
// prints it (SPEC §6) while its stackTrace shows this error too.
type ColumnError struct {
	// Projection, Column, Source and JSONType are as in ValueError.
	Projection, Column, Source, JSONType string
	// Err is PostgreSQL's error.
	Err error
}

// Error returns `projection "<p>": column <c> (<source>, JSON <type>): <PostgreSQL's error>`.
func (e *ColumnError) Error() string {
	return "projection " + strconv.Quote(e.Projection) + ": column " + e.Column + " (" + e.Source + ", JSON " + e.JSONType + "): " + e.Err.Error()
}

// Unwrap returns Err.
func (e *ColumnError) Unwrap() error { return e.Err }

// columnError returns err, PostgreSQL's error for the statement Plan made
// of ev, as a *ColumnError when it names a column of p's row or the
// parameter carrying one; else err unchanged.
func (p *TableProjection) columnError(ev *Event, err error) error {
	var pg *pgconn.PgError
	if ev == nil || !errors.As(err, &pg) {
		return err
	}
	ci := -1
	if pg.ColumnName != "" && (pg.TableName == "" || pg.TableName == p.def.Table) {
		ci = slices.IndexFunc(p.cols, func(c column) bool { return c.name == pg.ColumnName })
	} else if n := portalParameter(pg.Where); n > 0 {
		// Plan's arguments: an upsert's are the columns in order, a
		// delete's the key columns; then the sequence number and table.
		switch p.opOf(ev.EventType) {
		case OpUpsert:
			if n <= len(p.cols) {
				ci = n - 1
			}
		case OpDelete:
			if n <= len(p.pk) {
				ci = p.pk[n-1]
			}
		}
	}
	if ci < 0 && strings.HasPrefix(pg.Code, "22") {
		ci = p.columnOfQuotedValue(ev, pg.Message)
	}
	if ci < 0 && pg.Code == "54000" {
		ci = p.columnOfOversizeValue(ev)
	}
	if ci < 0 {
		return err
	}
	return p.newColumnError(ev, ci, err)
}

// newColumnError returns err as a *ColumnError about column ci of ev's row.
func (p *TableProjection) newColumnError(ev *Event, ci int, err error) *ColumnError {
	c := &p.cols[ci]
	return &ColumnError{Projection: p.def.Name, Column: c.name, Source: c.source, JSONType: jsonType(p.columnValue(ev, c)), Err: err}
}

// columnOfQuotedValue returns the index of the one column of ev's
// statement whose value is quoted in msg, a data exception's message that
// names neither column nor parameter (`invalid input syntax for type
// smallint: "0x1F"`, `value "0x7FFF" is out of range for type smallint`),
// or −1 when no column's value, or more than one, is.
func (p *TableProjection) columnOfQuotedValue(ev *Event, msg string) int {
	var quoted []string
	for rest := msg; ; {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i+1:], '"')
		if j < 0 {
			break
		}
		quoted = append(quoted, rest[i+1:i+1+j])
		rest = rest[i+1+j+1:]
	}
	if len(quoted) == 0 {
		return -1
	}
	return p.columnWhose(ev, func(v string) bool { return slices.Contains(quoted, v) }, false)
}

// btreeMaxItem is the most bytes a btree index row can hold (PostgreSQL's
// BTMaxItemSize on 8 KiB pages: "index row size 2720 exceeds btree version
// 4 maximum 2704").
const btreeMaxItem = 2704

// columnOfOversizeValue returns the index of the one column of ev's
// statement whose value is longer than a btree index row can hold
// (btreeMaxItem bytes), for a program_limit_exceeded error (54000: `index
// row requires 10328 bytes, maximum size is 8191`), which names neither
// column nor index; or −1 when no column's value, or more than one, is
// that long. The primary key's columns are looked at first: the table's
// index is the primary key's, and a row's other columns may well hold the
// same value (a jsonb column of the whole payload: new-user trial, the
// 54000 of user_follows named no column).
func (p *TableProjection) columnOfOversizeValue(ev *Event) int {
	long := func(v string) bool { return len(v) > btreeMaxItem }
	if ci := p.columnWhose(ev, long, true); ci >= 0 {
		return ci
	}
	return p.columnWhose(ev, long, false)
}

// columnWhose returns the index of the one column of the statement Plan
// makes of ev (of its primary key only, with keysOnly) whose value, as
// text, match accepts; −1 when none or more than one does, or Plan fails.
func (p *TableProjection) columnWhose(ev *Event, match func(string) bool, keysOnly bool) int {
	st, err := p.Plan(ev)
	if err != nil {
		return -1
	}
	cols := make([]int, 0, len(p.cols))
	switch p.opOf(ev.EventType) {
	case OpUpsert:
		for i := range p.cols {
			cols = append(cols, i)
		}
	case OpDelete:
		cols = append(cols, p.pk...)
	}
	found := -1
	for k, ci := range cols {
		if keysOnly && !p.isKey(ci) {
			continue
		}
		if v, ok := st.Args[k].(string); ok && match(v) {
			if found >= 0 {
				return -1 // two columns hold such a value: which one is unknown
			}
			found = ci
		}
	}
	return found
}

// columnValue returns the event tree value of column c for ev, nil when a
// derive fails. It is for error messages: a derive is evaluated again.
func (p *TableProjection) columnValue(ev *Event, c *column) any {
	if c.prog == nil {
		return lookupPath(ev, c.path)
	}
	v, err := evalDerive(c.prog, deriveVars(ev))
	if err != nil {
		return nil
	}
	return v
}

// portalParameter returns N of the "portal parameter $N" that a
// PostgreSQL error context (PgError.Where) names, 0 when it names none.
func portalParameter(where string) int {
	const marker = "portal parameter $"
	i := strings.Index(where, marker)
	if i < 0 {
		return 0
	}
	rest := where[i+len(marker):]
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0
	}
	return n
}
