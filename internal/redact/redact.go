// Package redact keeps connection secrets (PostgreSQL passwords in every
// form a connection string accepts, the Kafka SASL password) out of what the
// commands print: logs, HTTP answers, dead letters and error messages.
//
// pgx masks the passwords it recognizes in its own errors, on a best-effort
// basis: a malformed connection string can hide a password from it (issue
// 14: `password = secret` with spaces and a typo elsewhere was printed
// whole). The commands therefore never print pgx's rendering of a
// connection string (ParsePostgres), and pass everything else they print
// through a Redactor that knows the secrets.
package redact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Mask replaces a secret in redacted text.
const Mask = "xxxxx"

// Redactor replaces known secrets in text with Mask. A nil *Redactor
// redacts nothing. It is safe for concurrent use.
type Redactor struct {
	secrets []string // longest first
	r       *strings.Replacer
}

// New returns a Redactor of secrets; empty strings are ignored. The longest
// secret is replaced first, so that a secret containing another one is
// masked whole.
func New(secrets ...string) *Redactor {
	var s []string
	for _, v := range secrets {
		if v != "" && !slices.Contains(s, v) {
			s = append(s, v)
		}
	}
	if len(s) == 0 {
		return &Redactor{}
	}
	slices.SortStableFunc(s, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(s))
	for _, v := range s {
		pairs = append(pairs, v, Mask)
	}
	return &Redactor{secrets: s, r: strings.NewReplacer(pairs...)}
}

// String returns s with every secret replaced by Mask.
func (r *Redactor) String(s string) string {
	if r == nil || r.r == nil {
		return s
	}
	return r.r.Replace(s)
}

// Holds reports whether s contains a secret.
func (r *Redactor) Holds(s string) bool {
	if r == nil {
		return false
	}
	for _, v := range r.secrets {
		if strings.Contains(s, v) {
			return true
		}
	}
	return false
}

// Error returns err unchanged when its text holds no secret (nil for nil),
// else an error whose text is err's redacted. It still unwraps to err, so
// errors.Is and errors.As classify it as before; errors.As to a
// *pgconn.PgError gives a copy whose text fields are redacted too.
func (r *Redactor) Error(err error) error {
	if err == nil || !r.Holds(err.Error()) {
		return err
	}
	return &redacted{err: err, text: r.String(err.Error()), r: r}
}

type redacted struct {
	err  error
	text string
	r    *Redactor
}

func (e *redacted) Error() string { return e.text }
func (e *redacted) Unwrap() error { return e.err }

// As gives a redacted copy of the *pgconn.PgError in e's chain, because its
// fields are printed on their own (the dead letter's error text).
func (e *redacted) As(target any) bool {
	t, ok := target.(**pgconn.PgError)
	if !ok {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(e.err, &pgErr) {
		return false
	}
	c := *pgErr
	for _, f := range []*string{&c.Message, &c.Detail, &c.Hint, &c.Where, &c.InternalQuery,
		&c.SchemaName, &c.TableName, &c.ColumnName, &c.DataTypeName, &c.ConstraintName, &c.File, &c.Routine} {
		*f = e.r.String(*f)
	}
	*t = &c
	return true
}

// Handler returns a slog.Handler that redacts the message and the string,
// error and fmt.Stringer attribute values of every record (groups included)
// before h handles it.
func (r *Redactor) Handler(h slog.Handler) slog.Handler {
	if r == nil || r.r == nil {
		return h
	}
	return &handler{h: h, r: r}
}

type handler struct {
	h slog.Handler
	r *Redactor
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &handler{h: h.h.WithAttrs(red), r: h.r}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{h: h.h.WithGroup(name), r: h.r}
}

func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.r.String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = h.attr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.r.String(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.r.String(x.String()))
		case []string:
			red := make([]string, len(x))
			for i, s := range x {
				red[i] = h.r.String(s)
			}
			return slog.Any(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
