package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/causet/projection-worker/retry"
)

// Placeholders MaskLiterals puts in place of literals.
const (
	maskUUID         = "<uuid>"
	maskNumber       = "<num>"
	maskSingleQuoted = "'<str>'"
	maskDoubleQuoted = `"<str>"`
	maskSchema       = "<schema>"
)

// Fingerprint returns the failure group of a dead letter: the first 16
// lowercase hex digits (8 bytes) of the SHA-256 of the projection name, the
// error class (its String form), the SQLSTATE ("" when the failure is not a
// PostgreSQL error) and MaskLiterals(message), so that the same bug lands in
// one group whatever the data (SPEC §6, after Whizbang's failure
// fingerprints). Each field is hashed as its decimal byte length, ':' and
// its bytes, so no two different field tuples hash the same input.
//
// NewRecord passes the untruncated Message.Error text, so a reader can
// recompute the fingerprint of a message whose error was not truncated,
// unless the error gives a text of its own to group by (FingerprintTexter:
// a record value that is not JSON, whatever the parser says of its bytes).
func Fingerprint(projection string, class retry.Class, sqlstate, message string) string {
	h := sha256.New()
	for _, f := range [...]string{projection, class.String(), sqlstate, MaskLiterals(message)} {
		h.Write(strconv.AppendInt(nil, int64(len(f)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(f))
	}
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:8])
}

// identifierWords are the words after which PostgreSQL (and the worker's
// own validation errors) print a double-quoted name rather than a value:
// `column "followed_at" of relation "artist_followers"`, `field
// "eventType"`. Such names are part of the bug, not data, and are kept.
//
// A schema's name is the tenant's, so data: after "schema" it is masked
// as a value, and a name qualified by one (`relation "t_300.artist_followers"`,
// PostgreSQL's 42P01 for a tenant never migrated) keeps only its last part,
// `"<schema>.artist_followers"` (pathological-stream trial: 100 tenants not
// migrated made 200 fingerprints, 200 breakers and a full retry schedule
// each, for one bug).
var identifierWords = map[string]bool{
	"column": true, "relation": true, "table": true, "constraint": true,
	"index": true, "type": true, "function": true,
	"sequence": true, "view": true, "database": true, "role": true,
	"extension": true, "trigger": true, "operator": true, "field": true,
	"projection": true, "property": true, "variable": true,
}

// MaskLiterals returns msg with its literals replaced by placeholders, for
// grouping failures by kind rather than by data:
//
//   - UUIDs (8-4-4-4-12 hex digits) become <uuid>;
//   - numbers (integers, decimals, exponents, a leading minus sign, and
//     any letters or digits glued to them, as in 12ms or 42P01) become
//     <num>; digits inside a word (v42, int4, _causet_seq) are kept;
//   - single-quoted values become '<str>' and double-quoted values
//     "<str>", with doubled quotes and backslash escapes inside them
//     understood; a double-quoted name right after an identifier word (column, relation, constraint,
//     table, type, field, ...) is kept, since it names code, not
//     data, but for its schema qualifier, which becomes <schema> (a
//     schema is a tenant's). A quote glued to a word (an apostrophe as in can't) does not
//     open a value, and an unterminated quote is left as it is.
//
// Everything else is kept byte for byte.
func MaskLiterals(msg string) string {
	var b strings.Builder
	b.Grow(len(msg))
	for i := 0; i < len(msg); {
		c := msg[i]
		switch {
		case (c == '\'' || c == '"') && !wordByte(msg, i-1):
			end := closingQuote(msg, i)
			if end < 0 {
				break
			}
			switch {
			case c == '"' && identifierWords[strings.ToLower(lastWord(msg[:i]))]:
				name := msg[i:end]
				if dot := strings.LastIndexByte(name, '.'); dot > 0 {
					name = `"` + maskSchema + name[dot:]
				}
				b.WriteString(name)
			case c == '"':
				b.WriteString(maskDoubleQuoted)
			default:
				b.WriteString(maskSingleQuoted)
			}
			i = end
			continue
		case isHex(c) && !wordByte(msg, i-1) && isUUIDAt(msg, i):
			b.WriteString(maskUUID)
			i += 36
			continue
		case c == '-' && i+1 < len(msg) && isDigit(msg[i+1]) && !wordByte(msg, i-1):
			b.WriteString(maskNumber)
			i = numberEnd(msg, i+1)
			continue
		case isDigit(c) && !wordByte(msg, i-1):
			b.WriteString(maskNumber)
			i = numberEnd(msg, i)
			continue
		}
		b.WriteByte(c)
		i++
	}
	return b.String()
}

// closingQuote returns the index just past the quote that closes the one
// at msg[open], or -1. A doubled quote character and a backslash escape
// stay inside the value (SQL and Go quoting).
func closingQuote(msg string, open int) int {
	q := msg[open]
	for i := open + 1; i < len(msg); i++ {
		switch msg[i] {
		case '\\':
			i++
		case q:
			if i+1 < len(msg) && msg[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return -1
}

// numberEnd returns the index just past the number starting with the digit
// at msg[i]: digits, an optional fraction, an optional exponent, then any
// letters, digits or underscores glued to it.
func numberEnd(msg string, i int) int {
	for i < len(msg) && isDigit(msg[i]) {
		i++
	}
	if i+1 < len(msg) && msg[i] == '.' && isDigit(msg[i+1]) {
		i++
		for i < len(msg) && isDigit(msg[i]) {
			i++
		}
	}
	if i < len(msg) && (msg[i] == 'e' || msg[i] == 'E') {
		j := i + 1
		if j < len(msg) && (msg[j] == '+' || msg[j] == '-') {
			j++
		}
		if j < len(msg) && isDigit(msg[j]) {
			i = j
		}
	}
	for i < len(msg) && wordByte(msg, i) {
		i++
	}
	return i
}

// isUUIDAt reports whether msg holds a UUID at i that is not followed by a
// word byte.
func isUUIDAt(msg string, i int) bool {
	if len(msg)-i < 36 {
		return false
	}
	for j := 0; j < 36; j++ {
		c := msg[i+j]
		switch j {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isHex(c) {
				return false
			}
		}
	}
	return !wordByte(msg, i+36)
}

// lastWord returns the last run of letters in s, skipping trailing spaces.
func lastWord(s string) string {
	s = strings.TrimRight(s, " \t")
	i := len(s)
	for i > 0 && isLetter(s[i-1]) {
		i--
	}
	return s[i:]
}

// wordByte reports whether msg[i] exists and is part of a word: an ASCII
// letter, digit or underscore, or any byte of a multi-byte UTF-8 sequence.
func wordByte(msg string, i int) bool {
	if i < 0 || i >= len(msg) {
		return false
	}
	c := msg[i]
	return isLetter(c) || isDigit(c) || c == '_' || c >= 0x80
}

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isHex(c byte) bool    { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
