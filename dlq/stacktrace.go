package dlq

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// errorText is the Message.Error of err: a PostgreSQL error as PostgreSQL
// prints it, anything else as err.Error().
func errorText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Error()
	}
	return err.Error()
}

// FingerprintTexter is an error whose dead letters group by another text
// than their error's: one whose details vary with the data in words that
// MaskLiterals does not mask (a parser's account of where a value stops
// being JSON). FingerprintText returns that text, "" for the error's own.
type FingerprintTexter interface {
	FingerprintText() string
}

// fingerprintText is the text Fingerprint reads for err: the
// FingerprintText of the first error in its chain that gives one, else
// errorText(err).
func fingerprintText(err error) string {
	var ft FingerprintTexter
	if errors.As(err, &ft) {
		if s := ft.FingerprintText(); s != "" {
			return s
		}
	}
	return errorText(err)
}

// stackTrace is the Message.StackTrace of err: the wrapped error chain,
// one level a line, indented two spaces per level and followed by its Go
// type ("apply x: ERROR: ... [*fmt.wrapError]"; the branches of an
// errors.Join or a multi-%w error in order); then, for the first
// *pgconn.PgError in the chain, its Detail, Hint, Where, SchemaName,
// TableName, ColumnName, DataTypeName and ConstraintName when set
// ("Detail: Key (id)=(5) already exists."); then "goroutine stack:" and
// stack when stack is not "". Sections are separated by a blank line.
func stackTrace(err error, stack string) string {
	var b strings.Builder
	writeChain(&b, err, 0)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		first := true
		for _, f := range [...]struct{ name, v string }{
			{"Detail", pgErr.Detail},
			{"Hint", pgErr.Hint},
			{"Where", pgErr.Where},
			{"Schema", pgErr.SchemaName},
			{"Table", pgErr.TableName},
			{"Column", pgErr.ColumnName},
			{"Data type", pgErr.DataTypeName},
			{"Constraint", pgErr.ConstraintName},
		} {
			if f.v == "" {
				continue
			}
			if first {
				b.WriteString("\n")
				first = false
			}
			fmt.Fprintf(&b, "\n%s: %s", f.name, f.v)
		}
	}
	if stack != "" {
		b.WriteString("\n\ngoroutine stack:\n")
		b.WriteString(stack)
	}
	return b.String()
}

// maxChainDepth bounds writeChain against a pathological Unwrap.
const maxChainDepth = 64

func writeChain(b *strings.Builder, err error, depth int) {
	if err == nil || depth >= maxChainDepth {
		return
	}
	if depth > 0 {
		b.WriteString("\n")
	}
	indent := strings.Repeat("  ", depth)
	b.WriteString(indent)
	// A multi-line message (errors.Join) keeps its indentation.
	b.WriteString(strings.ReplaceAll(err.Error(), "\n", "\n"+indent))
	fmt.Fprintf(b, " [%T]", err)
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		writeChain(b, u.Unwrap(), depth+1)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			writeChain(b, e, depth+1)
		}
	}
}
