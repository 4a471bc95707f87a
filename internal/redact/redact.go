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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Mask replaces a secret in redacted text.
const Mask = "xxxxx"

// MinSubstringLen is the length, in bytes, from which a secret is masked
// wherever its text appears (8). A shorter secret ("a", "pw", "1234") is
// masked only where it appears as a secret (see Redactor), because masking
// every occurrence of a letter or a common word would shred every message
// (new-user trial: a one-letter password masked that letter in every log
// line). The cost: a short password that some text quotes outside of those
// places (a role named like it, say) is printed there.
const MinSubstringLen = 8

// Redactor masks secrets in text with Mask. Wherever a secret appears as a
// secret, it is masked whatever its length, and so is any other value there:
//   - the password of a URL's userinfo (scheme://user:PASSWORD@host);
//   - the value of a key ending in "password" (password, sslpassword,
//     kafka-sasl-password, any case) written key=value, with or without
//     spaces around '=', quoted or not, as in a key=value connection
//     string or a URL query;
//   - the value of a JSON field whose name ends in "password";
//   - a log attribute whose key ends in "password" (Handler), whatever its
//     value.
//
// A known secret of MinSubstringLen bytes or more is also masked wherever
// its text appears, even inside other words. A nil *Redactor redacts
// nothing. It is safe for concurrent use.
type Redactor struct {
	r *strings.Replacer // the secrets of MinSubstringLen bytes or more
}

// publicSchemes are the URL schemes (with "://") that New never masks a
// secret inside.
var publicSchemes = []string{"postgres://", "postgresql://"}

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
	type pair struct{ old, new string }
	var ps []pair
	for _, v := range s {
		if len(v) < MinSubstringLen {
			// Masked only where it appears as a secret (the patterns of
			// String), never by its text: masking a name or value that
			// equals it named the wrong thing (new-user trial: got string
			// "xxxxx" for an event's "5", projection "xxxxx"), and a
			// masked role "xxxxx" next to pgx's user=acme told the
			// password.
			continue
		}
		ps = append(ps, pair{v, Mask})
		// As a quoted value shows it: an error that quotes the value
		// it refuses (%q, JSON) escapes a '"' or '\' of the secret,
		// and the text itself no longer appears (new-user trial: a
		// password holding '"' and '\' was printed in a dead letter's
		// error when an event carried it as a value).
		for _, e := range escapedForms(v)[1:] {
			ps = append(ps, pair{e, Mask})
		}
		// A URL scheme holding the secret is left as it is (it comes
		// before the secret, being longer): the README's test password
		// "postgres" made "want postgres:// or postgresql://" read "want
		// xxxxx:// or xxxxxql://" (new-user trial). The scheme says
		// nothing of the secret that its mere text does not.
		for _, scheme := range publicSchemes {
			if len(scheme) > len(v) && strings.Contains(scheme, v) {
				ps = append(ps, pair{scheme, scheme})
			}
		}
	}
	// The longest text first, so that a secret holding another is masked whole.
	slices.SortStableFunc(ps, func(a, b pair) int { return len(b.old) - len(a.old) })
	pairs := make([]string, 0, 2*len(ps))
	for _, p := range ps {
		pairs = append(pairs, p.old, p.new)
	}
	return &Redactor{r: strings.NewReplacer(pairs...)}
}

// escapedForms returns v and the other texts it takes inside a quoted
// string: Go's %q and %+q, JSON with and without HTML escaping.
func escapedForms(v string) []string {
	forms := []string{v}
	add := func(q string) {
		if len(q) >= 2 {
			if e := q[1 : len(q)-1]; !slices.Contains(forms, e) {
				forms = append(forms, e)
			}
		}
	}
	add(strconv.Quote(v))
	add(strconv.QuoteToASCII(v))
	if b, err := json.Marshal(v); err == nil {
		add(string(b))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) == nil {
		add(strings.TrimSuffix(buf.String(), "\n"))
	}
	return forms
}

var (
	// urlPassword matches a URL up to its userinfo's ':' (group 1) and the
	// password, up to the last '@' before the path, query or fragment.
	urlPassword = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://[^\s/?#@:]*:)[^\s/?#]*@`)
	// keyPassword matches a key ending in "password" and its '=' (group 1)
	// and its value: single- or double-quoted (backslash escapes), or up to
	// a space or '&' (a URL query).
	keyPassword = regexp.MustCompile(`(?i)([\w.\-]*password[ \t]*=[ \t]*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&]+)`)
	// jsonPassword matches a JSON field whose name ends in "password" up
	// to its ':' (group 1) and its string value.
	jsonPassword = regexp.MustCompile(`(?i)("[\w.\-]*password"[ \t]*:[ \t]*)"(?:[^"\\]|\\.)*"`)
)

// String returns s with every secret masked, as Redactor describes.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	// The known secrets first: a connection string that is a whole text
	// is masked whole, not only its password.
	s = r.r.Replace(s)
	if strings.Contains(s, "://") {
		s = urlPassword.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	if containsPassword(s) {
		s = keyPassword.ReplaceAllString(s, "${1}"+Mask)
		s = jsonPassword.ReplaceAllString(s, `${1}"`+Mask+`"`)
	}
	return s
}

// containsPassword reports whether s holds "password" in any case, the
// cheap test before the key and JSON patterns.
func containsPassword(s string) bool {
	const word = "password"
	for i := 0; i+len(word) <= len(s); i++ {
		if (s[i] == 'p' || s[i] == 'P') && strings.EqualFold(s[i:i+len(word)], word) {
			return true
		}
	}
	return false
}

// Holds reports whether String would mask something in s.
func (r *Redactor) Holds(s string) bool {
	return r.String(s) != s
}

// Error returns err unchanged when its text holds no secret (nil for nil),
// else an error whose text is err's redacted. It still unwraps to err, so
// errors.Is and errors.As classify it as before; errors.As to a
// *pgconn.PgError gives a copy whose text fields are redacted too.
func (r *Redactor) Error(err error) error {
	if err == nil {
		return err
	}
	text := r.String(err.Error())
	if text == err.Error() {
		return err
	}
	return &redacted{err: err, text: text, r: r}
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
	if r == nil {
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
	if v.Kind() != slog.KindGroup && !(v.Kind() == slog.KindString && v.String() == "") && IsPasswordKey(a.Key) {
		return slog.String(a.Key, Mask)
	}
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
