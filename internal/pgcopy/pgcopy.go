// Package pgcopy writes rows to PostgreSQL with COPY ... FROM STDIN in the
// binary format, encoding them itself for the two column types the
// worker's temporary COPY tables have: text and bigint.
//
// pgx's Conn.CopyFrom encodes each value through its type map (a plan
// looked up per value) on a goroutine of its own feeding a pipe; for rows
// that are already text that is most of the COPY's cost in the worker
// (`go test ./projection -run '^$' -bench HotCopy`: the encode and
// encode_pgcopy figures, per upsert). From streams the rows as it encodes
// them, in chunks of about 64 KiB, so a COPY of large records holds one
// chunk (and the largest row) beyond the rows themselves; it calls the
// connection's pgx tracer (pgx.CopyFromTracer) as Conn.CopyFrom does, so
// that the COPY keeps its database span.
//
// The format is PostgreSQL's (https://www.postgresql.org/docs/current/sql-copy.html,
// "Binary Format"): an 11-byte signature, a 32-bit flags field (0) and a
// 32-bit header-extension length (0); each row a 16-bit field count, then
// each field a 32-bit length (−1 for NULL) and its bytes; a 16-bit −1
// trailer. Integers are big-endian. A text field's bytes are its UTF-8
// text; a bigint's are 8 bytes.
package pgcopy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// header opens every binary COPY stream: the signature, the flags (0) and
// the header-extension length (0).
const header = "PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"

// Row is the row being encoded: the encoding function given to From calls
// Text or Int8 once per column, in the columns' order.
type Row struct {
	buf  []byte
	want int // fields per row
	got  int // fields written to this row
	i    int // the row's index
	err  error
}

// Text appends a text field: v a string, or nil for NULL. Any other type
// is an error, which ends the COPY (From returns it).
func (r *Row) Text(v any) {
	r.got++
	switch s := v.(type) {
	case string:
		if len(s) > math.MaxInt32 {
			r.fail(fmt.Errorf("a value of %d bytes is beyond COPY's 2 GiB field", len(s)))
			return
		}
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(s)))
		r.buf = append(r.buf, s...)
	case nil:
		r.buf = binary.BigEndian.AppendUint32(r.buf, math.MaxUint32) // −1: NULL
	default:
		r.fail(fmt.Errorf("a text field given a %T", v))
	}
}

// Int8 appends a bigint field.
func (r *Row) Int8(v int64) {
	r.got++
	r.buf = binary.BigEndian.AppendUint32(r.buf, 8)
	r.buf = binary.BigEndian.AppendUint64(r.buf, uint64(v))
}

func (r *Row) fail(err error) {
	if r.err == nil {
		r.err = fmt.Errorf("pgcopy: row %d: %w", r.i, err)
	}
}

// chunk is how much From encodes ahead of what PostgreSQL has been sent:
// pgconn sends at most 64 KiB per CopyData message.
const chunk = 64 << 10

// maxPooled bounds the buffers kept for reuse: a buffer grown by a row
// larger than that is left to the garbage collector.
const maxPooled = 1 << 20

var pool = sync.Pool{New: func() any { return &stream{} }}

// chunks are Write's buffers, read into as pgconn reads From's stream.
var chunks = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// stream is the io.Reader pgconn's CopyFrom sends: it encodes rows as it
// is read.
type stream struct {
	// mu orders Read, on pgconn's writing goroutine, with end: pgconn's
	// CopyFrom can return (a server or connection error) before that
	// goroutine has ended, and the goroutine may then call Read again.
	mu     sync.Mutex
	ended  bool // end was called: Read encodes nothing more
	row    Row
	off    int // bytes of row.buf already read
	n      int // rows to encode
	encode func(i int, r *Row)
	done   bool // the trailer is in row.buf
}

// errEnded is what Read returns once the COPY it served has returned.
var errEnded = errors.New("pgcopy: read after the COPY returned")

// Read encodes rows until p can be filled (or the rows end), then copies.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return 0, errEnded
	}
	if s.off > 0 { // keep only what was not read yet, at the front
		s.row.buf = s.row.buf[:copy(s.row.buf, s.row.buf[s.off:])]
		s.off = 0
	}
	for len(s.row.buf) < len(p) && !s.done {
		if s.row.i == s.n {
			s.row.buf = binary.BigEndian.AppendUint16(s.row.buf, math.MaxUint16) // −1: the end
			s.done = true
			break
		}
		s.row.buf = binary.BigEndian.AppendUint16(s.row.buf, uint16(s.row.want))
		s.row.got = 0
		s.encode(s.row.i, &s.row)
		if s.row.got != s.row.want {
			s.row.fail(fmt.Errorf("%d fields, want %d", s.row.got, s.row.want))
		}
		if s.row.err != nil {
			return 0, s.row.err
		}
		s.row.i++
	}
	k := copy(p, s.row.buf)
	s.off = k
	if k == 0 && s.done {
		return 0, io.EOF
	}
	return k, nil
}

// newStream returns a stream of n rows of fields fields each, from pool:
// give it back with release.
func newStream(fields, n int, encode func(i int, r *Row)) *stream {
	s := pool.Get().(*stream)
	s.row = Row{buf: append(s.row.buf[:0], header...), want: fields}
	s.off, s.n, s.encode, s.done, s.ended = 0, n, encode, false, false
	return s
}

// end stops s: a Read after it (pgconn's writing goroutine, still running
// after CopyFrom returned) encodes nothing and fails, so that encode is
// not called once From has returned. It returns the encoding error, if
// any.
func (s *stream) end() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	return s.row.err
}

// release gives s back to the pool when reuse is set: only once no Read
// can come (the COPY ended normally, pgconn having waited for its writing
// goroutine, or Write's own reads). Otherwise s is left to the garbage
// collector: a late Read on it fails (end), where on a pooled stream it
// would encode another COPY's rows.
func (s *stream) release(reuse bool) {
	s.end()
	if !reuse {
		return
	}
	if cap(s.row.buf) > maxPooled {
		s.row.buf = nil
	}
	s.encode = nil
	pool.Put(s)
}

// Write writes the binary COPY stream of n rows of fields fields each to
// w, encoded as From encodes them, and returns the bytes written and the
// first encoding or write error: what From would send, for tests and
// benchmarks.
func Write(w io.Writer, fields, n int, encode func(i int, r *Row)) (int64, error) {
	s := newStream(fields, n, encode)
	defer s.release(true)
	bp := chunks.Get().(*[]byte)
	defer chunks.Put(bp)
	buf := *bp
	var written int64
	for {
		k, err := s.Read(buf)
		if k > 0 {
			m, werr := w.Write(buf[:k])
			written += int64(m)
			if werr != nil {
				return written, werr
			}
		}
		if err == io.EOF {
			return written, nil
		}
		if err != nil {
			return written, err
		}
	}
}

// From copies n rows into table's columns on tx's connection and returns
// the rows copied. encode(i, r) writes row i (0 ≤ i < n, in order) into r,
// one field per column; it is called while From runs, on the connection's
// writing goroutine, so what it reads must not change until From returns.
// table and columns are quoted here (pgx.Identifier). From returns the
// first encoding error (a field of another type, a row of too few or too
// many fields), after which the COPY is aborted and tx needs a rollback
// (to a savepoint), PostgreSQL's error (*pgconn.PgError), or the
// connection's. The connection's tracer, when it is a pgx.CopyFromTracer,
// sees the COPY as Conn.CopyFrom's.
func From(ctx context.Context, tx pgx.Tx, table pgx.Identifier, columns []string, n int, encode func(i int, r *Row)) (rows int64, err error) {
	s := newStream(len(columns), n, encode)
	defer func() { s.release(err == nil) }()

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
	tag, err := conn.PgConn().CopyFrom(ctx, s, sql.String())
	if rowErr := s.end(); rowErr != nil {
		err = rowErr // PostgreSQL's error only says the COPY was aborted
	}
	if tracer != nil {
		tracer.TraceCopyFromEnd(ctx, conn, pgx.TraceCopyFromEndData{CommandTag: tag, Err: err})
	}
	return tag.RowsAffected(), err
}
