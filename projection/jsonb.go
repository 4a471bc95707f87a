package projection

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/causet/projection-worker/internal/jsonstrict"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonbText returns the JSON text of the event tree value v for a jsonb
// column: what encoding/json's Encoder writes with SetEscapeHTML(false),
// without its trailing newline (object keys sorted, numbers as their exact
// text, U+2028 and U+2029 escaped, invalid UTF-8 as \ufffd). Trees of nil,
// bool, string, json.Number, map[string]any and []any, the event's own
// (DecodeEvent), are written by appendJSON without encoding/json's
// reflection; anything else (a CEL timestamp in a derive's list) goes to
// encoding/json. Errors are encoding/json's (an invalid json.Number).
func jsonbText(v any) (string, error) {
	var buf [512]byte
	if b, ok := appendJSON(buf[:0], v); ok {
		return string(b), nil
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("cannot encode as JSON: %w", err)
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// appendJSON appends the JSON text of v to b as jsonbText describes it. It
// reports false, and b is to be dropped, when v holds a value of another
// type, or a json.Number that is not a JSON number (encoding/json's error).
func appendJSON(b []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), true
	case bool:
		if x {
			return append(b, "true"...), true
		}
		return append(b, "false"...), true
	case string:
		return appendJSONString(b, x), true
	case json.Number:
		if !validJSONNumber(string(x)) {
			return b, false // "" (which encoding/json writes as 0) and errors too
		}
		return append(b, x...), true
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendJSON(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case map[string]any:
		var small [16]string
		keys := small[:0]
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // encoding/json's order: bytewise
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			var ok bool
			if b, ok = appendJSON(b, x[k]); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	case *treeNode:
		return appendTreeJSON(b, x.t, x.i), true
	}
	return b, false
}

// appendTreeJSON appends the JSON text of node i of t as appendJSON does
// for the same value as map[string]any and []any.
func appendTreeJSON(b []byte, t *jsonstrict.Tree, i int32) []byte {
	n := &t.Nodes[i]
	switch n.Kind {
	case jsonstrict.ObjectNode:
		var small [16]int32
		members := small[:0]
		for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
			members = append(members, j)
		}
		slices.SortFunc(members, func(x, y int32) int { return strings.Compare(t.Key(x), t.Key(y)) })
		b = append(b, '{')
		for k, j := range members {
			if k > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, t.Key(j))
			b = append(b, ':')
			b = appendTreeJSON(b, t, j)
		}
		return append(b, '}')
	case jsonstrict.ArrayNode:
		b = append(b, '[')
		for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
			if k > 0 {
				b = append(b, ',')
			}
			b = appendTreeJSON(b, t, j)
		}
		return append(b, ']')
	case jsonstrict.StringNode:
		return appendJSONString(b, t.Text(i))
	case jsonstrict.NumberNode:
		return append(b, t.Text(i)...)
	case jsonstrict.TrueNode:
		return append(b, "true"...)
	case jsonstrict.FalseNode:
		return append(b, "false"...)
	}
	return append(b, "null"...)
}

// appendJSONString appends s as a JSON string the way encoding/json does
// without HTML escaping: ", \ and control characters escaped (\b, \f, \n,
// \r, \t, else \u00XX), U+2028 and U+2029 as \u2028 and \u2029, and each
// byte of invalid UTF-8 as \ufffd.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// validJSONNumber reports whether s is a number of the JSON grammar (RFC
// 8259 §6): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func validJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// canonicalJSONNumbers returns the JSON text s (valid JSON, as jsonbText
// writes it) with each number written in one spelling per numeric value:
// its significant digits without trailing zeros, then an exponent
// ("1.50" → "15e-1", "100" → "1e2", "-0.0" → "0"). PostgreSQL reads such a
// number as a numeric of the smallest scale that holds it (scale
// max(0, −exponent)), so that every spelling of one value, which jsonb
// compares equal, prints as one text: "1.0", "1" and "10e-1" all as 1.
// The value is unchanged; only a jsonb primary key needs it (its tombstone
// is its text).
func canonicalJSONNumbers(s string) string {
	var out []byte // nil until a number differs from its canonical spelling
	last := 0      // s[:last] is in out
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"':
			i++
			for i < len(s) && s[i] != '"' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(s) && strings.IndexByte("0123456789.eE+-", s[j]) >= 0 {
				j++
			}
			if n := canonicalNumber(s[i:j]); n != s[i:j] {
				out = append(append(out, s[last:i]...), n...)
				last = j
			}
			i = j
		default:
			i++
		}
	}
	if out == nil {
		return s
	}
	return string(append(out, s[last:]...))
}

// canonicalNumber is canonicalJSONNumbers of one JSON number n.
func canonicalNumber(n string) string {
	neg := strings.HasPrefix(n, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(strings.TrimPrefix(n, "-")), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	exp, err := strconv.ParseInt(expText, 10, 64)
	if expText == "" {
		exp, err = 0, nil
	}
	if err != nil { // an exponent beyond int64, which jsonb refuses anyway
		return n
	}
	digits := strings.TrimLeft(whole+frac, "0")
	exp -= int64(len(frac))
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	if trimmed == "" {
		return "0"
	}
	b := make([]byte, 0, len(trimmed)+8)
	if neg {
		b = append(b, '-')
	}
	b = append(b, trimmed...)
	if exp != 0 {
		b = append(b, 'e')
		b = strconv.AppendInt(b, exp, 10)
	}
	return string(b)
}
