// Package pgcopy writes rows to PostgreSQL with COPY ... FROM STDIN in the
// binary format, encoding them itself for the two column types the
// worker's temporary COPY tables have: text and bigint.
//
// pgx's Conn.CopyFrom encodes each value through its type map (a plan
// looked up per value) on a goroutine of its own feeding a pipe; for rows
// that are already text that is most of the COPY's cost in the worker
// (`go test ./projection -run '^$' -bench HotCopy`: 223 ns per upsert with
// pgx's encoding, see the encode and encode-pgcopy figures). Rows is the
// encoder; From sends what it encoded on the connection of a transaction,
// calling the connection's pgx tracer (pgx.CopyFromTracer) as Conn.CopyFrom
// does, so that the COPY keeps its database span.
//
// The format is PostgreSQL's (https://www.postgresql.org/docs/current/sql-copy.html,
// "Binary Format"): an 11-byte signature, a 32-bit flags field (0) and a
// 32-bit header-extension length (0); each row a 16-bit field count, then
// each field a 32-bit length (−1 for NULL) and its bytes; a 16-bit −1
// trailer. Integers are big-endian. A text field's bytes are its UTF-8
// text; a bigint's are 8 bytes.
package pgcopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// signature opens every binary COPY stream, followed by the flags and the
// header-extension length (both 0).
const signature = "PGCOPY\n\xff\r\n\x00"

// Rows is a binary COPY stream being encoded. Its zero value is not
// usable: get one with NewRows, and give it back with Release when From
// has sent it.
type Rows struct {
	buf    []byte
	fields int // fields per row, as Row was told
	left   int // fields of the current row still to be written
	err    error
	n      int // rows
}

// maxPooled bounds the buffers kept for reuse: 4 MiB. A larger stream (a
// COPY group of large records) is left to the garbage collector, so that
// one huge batch does not keep its memory for the life of the process.
const maxPooled = 4 << 20

var pool = sync.Pool{New: func() any { return &Rows{} }}

// NewRows returns an empty stream whose rows have fields fields each.
func NewRows(fields int) *Rows {
	r := pool.Get().(*Rows)
	r.buf = append(r.buf[:0], signature...)
	r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // flags
	r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // header extension length
	r.fields, r.left, r.err, r.n = fields, 0, nil, 0
	return r
}

// Release gives r back for reuse; r must not be used after it.
func (r *Rows) Release() {
	if cap(r.buf) > maxPooled {
		r.buf = nil
	}
	pool.Put(r)
}

// Row starts a row. The previous row must have had all its fields.
func (r *Rows) Row() {
	if r.left != 0 && r.err == nil {
		r.err = fmt.Errorf("pgcopy: row %d has %d fields, want %d", r.n, r.fields-r.left, r.fields)
	}
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(r.fields))
	r.left = r.fields
	r.n++
}

// Text appends a text field: v a string, or nil for NULL. Any other type
// is an error, returned by From.
func (r *Rows) Text(v any) {
	r.left--
	switch s := v.(type) {
	case string:
		if len(s) > math.MaxInt32 {
			r.fail(fmt.Errorf("pgcopy: row %d: a value of %d bytes is beyond COPY's 2 GiB field", r.n, len(s)))
			return
		}
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(s)))
		r.buf = append(r.buf, s...)
	case nil:
		r.buf = binary.BigEndian.AppendUint32(r.buf, math.MaxUint32) // −1: NULL
	default:
		r.fail(fmt.Errorf("pgcopy: row %d: a text field given a %T", r.n, v))
		r.buf = binary.BigEndian.AppendUint32(r.buf, math.MaxUint32)
	}
}

// Int8 appends a bigint field.
func (r *Rows) Int8(v int64) {
	r.left--
	r.buf = binary.BigEndian.AppendUint32(r.buf, 8)
	r.buf = binary.BigEndian.AppendUint64(r.buf, uint64(v))
}

func (r *Rows) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Len returns the rows started.
func (r *Rows) Len() int { return r.n }

// bytes returns the finished stream, trailer included, or the first
// encoding error.
func (r *Rows) bytes() ([]byte, error) {
	if r.left != 0 {
		r.fail(fmt.Errorf("pgcopy: row %d has %d fields, want %d", r.n, r.fields-r.left, r.fields))
	}
	if r.err != nil {
		return nil, r.err
	}
	return binary.BigEndian.AppendUint16(r.buf, math.MaxUint16), nil // −1: the end
}

// From copies rows into table's columns (in rows' field order) on tx's
// connection and returns the rows copied. table and columns are quoted
// here (pgx.Identifier). It returns an encoding error of rows before
// sending anything, else PostgreSQL's error (*pgconn.PgError) or the
// connection's. The connection's tracer, when it is a pgx.CopyFromTracer,
// sees the COPY as Conn.CopyFrom's.
func From(ctx context.Context, tx pgx.Tx, table pgx.Identifier, columns []string, rows *Rows) (int64, error) {
	stream, err := rows.bytes()
	if err != nil {
		return 0, err
	}
	conn := tx.Conn()
	tracer, _ := conn.Config().Tracer.(pgx.CopyFromTracer)
	if tracer != nil {
		ctx = tracer.TraceCopyFromStart(ctx, conn, pgx.TraceCopyFromStartData{TableName: table, ColumnNames: columns})
	}
	var sql strings.Builder
	sql.WriteString("COPY ")
	sql.WriteString(table.Sanitize())
	sql.WriteString(" (")
	for i, c := range columns {
		if i > 0 {
			sql.WriteString(", ")
		}
		sql.WriteString(pgx.Identifier{c}.Sanitize())
	}
	sql.WriteString(") FROM STDIN (FORMAT binary)")
	var tag pgconn.CommandTag
	tag, err = conn.PgConn().CopyFrom(ctx, bytes.NewReader(stream), sql.String())
	if tracer != nil {
		tracer.TraceCopyFromEnd(ctx, conn, pgx.TraceCopyFromEndData{CommandTag: tag, Err: err})
	}
	return tag.RowsAffected(), err
}
