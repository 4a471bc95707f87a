package projection

import (
	"encoding/json"
	"errors"
	"github.com/causet/projection-worker/internal/jsonstrict"
	"math"
	"strconv"
	"strings"
	"time"
)

// ValueError is a column value that PostgreSQL would refuse for the
// column's type (or a NULL for a NOT NULL column), found by Plan before any
// SQL is sent. It is permanent (retry.Classify reports retry.Permanent): the
// same event always carries the same value. Its message names the
// projection, the column, where the value came from and its JSON type:
//
//	projection "p": column stars (from payload.stars, JSON number): value "3000000000" is out of range for type integer
type ValueError struct {
	// Projection is the projection's name.
	Projection string
	// Column is the column's name.
	Column string
	// Source is where the value came from: the column's from path
	// ("payload.stars") or `derive "<expression>"`.
	Source string
	// JSONType is the JSON type of the value: null, boolean, number,
	// string, object, array; "timestamp" for a derive's CEL timestamp.
	JSONType string
	// Reason says what PostgreSQL would refuse, in its words where it has
	// them (`value "40000" is out of range for type smallint`).
	Reason string
}

// Error returns `projection "<p>": column <c> (<source>, JSON <type>): <reason>`.
func (e *ValueError) Error() string {
	return "projection " + strconv.Quote(e.Projection) + ": column " + e.Column + " (" + e.Source + ", JSON " + e.JSONType + "): " + e.Reason
}

// Permanent reports true: the event always carries the same value
// (retry.PermanentError).
func (e *ValueError) Permanent() bool { return true }

// colKind is a column type as checkValue knows it.
type colKind uint8

const (
	kindText colKind = iota
	kindSmallint
	kindInteger
	kindBigint
	kindNumeric
	kindDouble
	kindReal
	kindBoolean
	kindTimestamptz
	kindDate
	kindJSONB
	kindUUID
)

// kindOf returns the kind of a canonical column type (see ColumnTypes), or
// of a type as PostgreSQL's format_type spells it without its modifier
// ("timestamp with time zone", "character varying"; see catalogTypes).
// Any other type is text.
func kindOf(typ string) colKind {
	switch typ {
	case "text", "character varying", "character":
		return kindText
	case "smallint":
		return kindSmallint
	case "integer":
		return kindInteger
	case "bigint":
		return kindBigint
	case "numeric":
		return kindNumeric
	case "double precision":
		return kindDouble
	case "real":
		return kindReal
	case "boolean":
		return kindBoolean
	case "timestamptz", "timestamp with time zone":
		return kindTimestamptz
	case "date":
		return kindDate
	case "jsonb":
		return kindJSONB
	case "uuid":
		return kindUUID
	}
	return kindText
}

// jsonType names the JSON type of an event tree value.
func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case *treeNode:
		if x.t.Nodes[x.i].Kind == jsonstrict.ObjectNode {
			return "object"
		}
		return "array"
	case time.Time:
		return "timestamp"
	}
	return "value"
}

// Limits of PostgreSQL's types that the checks use: the date range
// (src/include/datatype/timestamp.h: Julian day 0 to DATE_END_JULIAN,
// 4714-11-24 BC to 5874898-01-01 exclusive) in epoch milliseconds, and
// numeric's digits before the decimal point (NUMERIC_WEIGHT_MAX + 1 digit
// groups of 4) and after it (NUMERIC_DSCALE_MAX, src/backend/utils/adt/numeric.c).
const (
	minDateMillis             = MinTimestampMillis
	endDateMillis       int64 = (2147483494 - 2440588) * 86400000 // DATE_END_JULIAN − UNIX_EPOCH_JDATE, in ms
	numericMaxIntDigits       = 131072
	numericMaxScale           = 16383
)

// checkValue reports why PostgreSQL would refuse the event tree value v
// (as toParam converts it) for a column of kind k, or "" when it would
// take it. It does not allocate when v is acceptable.
func checkValue(k colKind, typ string, v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return checkString(k, typ, x)
	case json.Number:
		return checkNumber(k, typ, string(x))
	case bool:
		switch k {
		case kindText, kindBoolean, kindJSONB:
			return ""
		}
		return "a JSON boolean cannot be stored in " + article(typ) + " column"
	case time.Time:
		switch k {
		case kindText, kindTimestamptz, kindDate:
			return ""
		}
		return "a timestamp cannot be stored in " + article(typ) + " column"
	case map[string]any, []any, *treeNode:
		if k == kindJSONB {
			return checkJSONB(x)
		}
		return "a JSON " + jsonType(v) + " cannot be stored in " + article(typ) + " column (only jsonb)"
	}
	return ""
}

// article returns typ with its indefinite article ("an integer", "a
// uuid": by sound, so a u read "you" takes "a"; third new-user trial: "an
// uuid").
func article(typ string) string {
	switch typ[0] {
	case 'a', 'e', 'i', 'o': // not u: "a uuid"
		return "an " + typ
	}
	return "a " + typ
}

// checkString is checkValue for a JSON string.
func checkString(k colKind, typ, s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		// 22021 for text, 22P05 for jsonb; no type takes it.
		return "a string with a NUL character (\\u0000) cannot be stored in " + article(typ) + " column"
	}
	switch k {
	case kindText, kindJSONB:
		return ""
	case kindSmallint:
		return checkIntText(pgTrim(s), 16, typ, s)
	case kindInteger:
		return checkIntText(pgTrim(s), 32, typ, s)
	case kindBigint:
		return checkIntText(pgTrim(s), 64, typ, s)
	case kindNumeric:
		t := pgTrim(s)
		if isSpecialNumber(t, false) {
			return ""
		}
		return checkNumericText(t, typ, s)
	case kindDouble:
		return checkFloatText(pgTrim(s), 64, typ, s)
	case kindReal:
		return checkFloatText(pgTrim(s), 32, typ, s)
	case kindBoolean:
		if _, ok := pgBool(pgTrim(s)); !ok {
			return invalidSyntax(typ, s)
		}
		return ""
	case kindTimestamptz, kindDate:
		return checkTimeText(k, typ, s)
	case kindUUID:
		if !validUUID(s) {
			return invalidSyntax(typ, s)
		}
		return ""
	}
	return ""
}

// checkNumber is checkValue for a JSON number (its exact text).
func checkNumber(k colKind, typ, n string) string {
	switch k {
	case kindText:
		return ""
	case kindSmallint:
		return checkIntText(n, 16, typ, n)
	case kindInteger:
		return checkIntText(n, 32, typ, n)
	case kindBigint:
		return checkIntText(n, 64, typ, n)
	case kindNumeric, kindJSONB:
		return checkNumericText(n, "numeric", n)
	case kindDouble:
		return checkFloatText(n, 64, typ, n)
	case kindReal:
		return checkFloatText(n, 32, typ, n)
	case kindBoolean:
		if n == "0" || n == "1" {
			return ""
		}
		return invalidSyntax(typ, n)
	case kindTimestamptz, kindDate:
		ms, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return typ + " from a number wants integer epoch milliseconds, got " + shortenValue(n)
		}
		if !inTimeRange(k, ms) {
			return "epoch milliseconds " + n + " are out of range for type " + typ
		}
		return ""
	case kindUUID:
		return "a JSON number cannot be stored in a uuid column"
	}
	return ""
}

// inTimeRange reports whether epoch milliseconds ms are inside the range
// of kind k, kindTimestamptz or kindDate.
func inTimeRange(k colKind, ms int64) bool {
	if k == kindDate {
		return ms >= minDateMillis && ms < endDateMillis
	}
	return ms >= MinTimestampMillis && ms < EndTimestampMillis
}

// pgTrim trims the white space PostgreSQL's input functions skip.
func pgTrim(s string) string { return strings.Trim(s, " \t\n\r\v\f") }

// invalidSyntax is PostgreSQL's 22P02 message.
func invalidSyntax(typ, s string) string {
	return "invalid input syntax for type " + typ + ": " + quoteValue(s)
}

// outOfRange is PostgreSQL's 22003 message.
func outOfRange(typ, s string) string {
	return "value " + quoteValue(s) + " is out of range for type " + typ
}

// checkIntText checks t (s trimmed) as PostgreSQL's int2in, int4in and
// int8in read it. Decimal integers are checked for syntax and range; forms
// PostgreSQL 16 added (0x1F, 0o17, 0b101, 1_000) are left to PostgreSQL.
func checkIntText(t string, bits int, typ, s string) string {
	_, err := strconv.ParseInt(t, 10, bits)
	if err == nil {
		return ""
	}
	if errors.Is(err, strconv.ErrRange) {
		return outOfRange(typ, s)
	}
	if _, err := strconv.ParseInt(t, 0, bits); err == nil || errors.Is(err, strconv.ErrRange) {
		return "" // a PostgreSQL 16 form: its cast decides
	}
	// A number with a fraction or exponent, or not a number: report the
	// range for an integral value out of range, else PostgreSQL's 22P02.
	f, err := strconv.ParseFloat(t, 64)
	if errors.Is(err, strconv.ErrRange) && !math.IsInf(f, 0) {
		return invalidSyntax(typ, s) // an underflow: not an integer
	}
	if err == nil && f == math.Trunc(f) || errors.Is(err, strconv.ErrRange) {
		lim := math.Ldexp(1, bits-1)
		if f >= lim || f < -lim {
			return outOfRange(typ, s)
		}
	}
	return invalidSyntax(typ, s)
}

// isSpecialNumber reports whether t is one of the special values
// PostgreSQL's numeric (float=false) or float input accepts:
// NaN, Infinity, inf with an optional sign, any case.
func isSpecialNumber(t string, float bool) bool {
	u := t
	if len(u) > 0 && (u[0] == '+' || u[0] == '-') {
		u = u[1:]
	}
	if strings.EqualFold(u, "infinity") || strings.EqualFold(u, "inf") {
		return true
	}
	return strings.EqualFold(t, "nan") || float && strings.EqualFold(u, "nan")
}

// checkNumericText checks t as PostgreSQL's numeric_in reads it: decimal
// syntax with optional sign, fraction and exponent, at most 131072 digits
// before the decimal point and 16383 after it (the display scale).
func checkNumericText(t, typ, s string) string {
	i := 0
	if i < len(t) && (t[i] == '+' || t[i] == '-') {
		i++
	}
	intDigits, lead, frac := 0, -1, 0
	for ; i < len(t) && t[i] >= '0' && t[i] <= '9'; i++ {
		if lead < 0 && t[i] != '0' {
			lead = intDigits
		}
		intDigits++
	}
	if i < len(t) && t[i] == '.' {
		i++
		for ; i < len(t) && t[i] >= '0' && t[i] <= '9'; i++ {
			frac++
		}
	}
	if intDigits+frac == 0 {
		if pg16Form(t) {
			return "" // a PostgreSQL 16 form (0x1F): its cast decides
		}
		return invalidSyntax(typ, s)
	}
	exp := int64(0)
	if i < len(t) && (t[i] == 'e' || t[i] == 'E') {
		i++
		start := i
		if i < len(t) && (t[i] == '+' || t[i] == '-') {
			i++
		}
		digits := i
		for ; i < len(t) && t[i] >= '0' && t[i] <= '9'; i++ {
		}
		if i == digits {
			return invalidSyntax(typ, s)
		}
		e, err := strconv.ParseInt(t[start:i], 10, 32)
		if err != nil {
			return "value overflows numeric format: " + quoteValue(s)
		}
		exp = e
	}
	if i != len(t) {
		if pg16Form(t) {
			return "" // a PostgreSQL 16 form (1_000, 0x1F): its cast decides
		}
		return invalidSyntax(typ, s)
	}
	scale := int64(frac) - exp
	if scale > numericMaxScale {
		return "value overflows numeric format: " + quoteValue(s)
	}
	if lead >= 0 && int64(intDigits-lead)+exp > numericMaxIntDigits {
		return "value overflows numeric format: " + quoteValue(s)
	}
	return ""
}

// pg16Form reports whether t may be a form of integer that PostgreSQL 16
// reads and older versions do not: digit separators (1_000) or a base
// prefix (0x1F, 0o17, 0b101).
func pg16Form(t string) bool {
	if strings.IndexByte(t, '_') >= 0 {
		return true
	}
	if len(t) > 0 && (t[0] == '+' || t[0] == '-') {
		t = t[1:]
	}
	return len(t) > 2 && t[0] == '0' && strings.IndexByte("xXoObB", t[1]) >= 0
}

// checkFloatText checks t as PostgreSQL's float8in (bits 64) or float4in
// (bits 32) reads it: NaN and Infinity in any case, or a number within the
// type's range (an overflow, or a non-zero value that underflows to zero,
// is out of range).
func checkFloatText(t string, bits int, typ, s string) string {
	if isSpecialNumber(t, true) {
		return ""
	}
	if strings.IndexByte(t, '_') >= 0 {
		return invalidSyntax(typ, s) // strtod takes no digit separators
	}
	f, err := strconv.ParseFloat(t, bits)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return outOfRange(typ, s)
		}
		if len(t) > 2 && (t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
			return "" // a hexadecimal form strtod may read: its cast decides
		}
		return invalidSyntax(typ, s)
	}
	if f == 0 && hasNonZeroDigit(t) {
		return outOfRange(typ, s) // underflow
	}
	return ""
}

// hasNonZeroDigit reports whether the mantissa of the decimal number t has
// a digit other than 0.
func hasNonZeroDigit(t string) bool {
	for i := 0; i < len(t); i++ {
		switch c := t[i]; {
		case c == 'e' || c == 'E' || c == 'p' || c == 'P':
			return false
		case c >= '1' && c <= '9':
			return true
		}
	}
	return false
}

// pgBool reads t as a boolean as PostgreSQL's boolin reads it: true, yes,
// on, 1, false, no, off, 0, or a unique prefix of one of the words (t, tr,
// f, y, n, of, ...), in any case; ok is false when it is none of them.
func pgBool(t string) (value, ok bool) {
	if t == "" || len(t) > 5 {
		return false, false
	}
	var buf [5]byte
	for i := 0; i < len(t); i++ {
		c := t[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	l := string(buf[:len(t)]) // no allocation: compared only
	switch {
	case strings.HasPrefix("true", l), strings.HasPrefix("yes", l), l == "on", l == "1":
		return true, true
	case strings.HasPrefix("false", l), strings.HasPrefix("no", l), l == "off", l == "of", l == "0":
		return false, true
	}
	return false, false
}

// validUUID reports whether s is a uuid as PostgreSQL's uuid_in reads it:
// 32 hexadecimal digits, optionally in braces, with an optional hyphen
// after any group of four digits.
func validUUID(s string) bool {
	i := 0
	braces := len(s) > 0 && s[0] == '{'
	if braces {
		i++
	}
	for b := 0; b < 16; b++ {
		if i+2 > len(s) || !isHex(s[i]) || !isHex(s[i+1]) {
			return false
		}
		i += 2
		if i < len(s) && s[i] == '-' && b%2 == 1 && b < 15 {
			i++
		}
	}
	if braces {
		if i >= len(s) || s[i] != '}' {
			return false
		}
		i++
	}
	return i == len(s)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// rfc3339Space is RFC 3339 with the space separator its section 5.6 allows.
const rfc3339Space = "2006-01-02 15:04:05.999999999Z07:00"

// parseTimeText reads s as checkTimeText takes it: the time, or that it is
// infinity or -infinity, or the parse error.
func parseTimeText(k colKind, s string) (tm time.Time, infinite bool, err error) {
	t := pgTrim(s)
	if strings.EqualFold(t, "infinity") || strings.EqualFold(t, "-infinity") || strings.EqualFold(t, "+infinity") {
		return time.Time{}, true, nil
	}
	// RFC 3339 (section 5.6) allows a lowercase t and z, as PostgreSQL
	// reads them; Go's layout wants T and Z.
	if len(t) > 10 && t[10] == 't' {
		t = t[:10] + "T" + t[11:]
	}
	if n := len(t); n > 10 && t[n-1] == 'z' {
		t = t[:n-1] + "Z"
	}
	if len(t) > 10 && t[10] == ' ' {
		tm, err = time.Parse(rfc3339Space, t)
	} else {
		tm, err = time.Parse(time.RFC3339Nano, t)
	}
	if err != nil && leapSecond(t) {
		// RFC 3339 and PostgreSQL take second 60 (PostgreSQL as the next
		// minute, with no fraction); Go's parser does not.
		if tm, err = time.Parse(time.RFC3339Nano, t[:10]+"T"+t[11:17]+"59"+t[19:]); err == nil {
			tm = tm.Truncate(time.Second).Add(time.Second) // the instant PostgreSQL reads
		}
	}
	if err != nil && k == kindDate && !fieldOutOfRange(err) {
		tm, err = time.Parse(time.DateOnly, t)
	}
	return tm, false, err
}

// fieldOutOfRange reports whether err is time.Parse's for a field beyond
// its range in a well-formed text: day 30 of February, hour 25, second 61.
func fieldOutOfRange(err error) bool {
	var pe *time.ParseError
	return errors.As(err, &pe) && strings.HasSuffix(pe.Message, " out of range")
}

// checkTimeText checks a string for a timestamptz or date column: an RFC
// 3339 timestamp ('T', 't' or space between date and time; 'Z' or 'z' for
// UTC), for date also a full-date (2024-06-25), or infinity and -infinity.
// Other spellings PostgreSQL reads ("yesterday", "June 25") are refused:
// the definitions format takes RFC 3339.
func checkTimeText(k colKind, typ, s string) string {
	tm, infinite, err := parseTimeText(k, s)
	if infinite {
		return ""
	}
	if err != nil && fieldOutOfRange(err) {
		if t := pgTrim(s); len(t) > 13 && t[11:13] == "24" {
			// PostgreSQL reads 24:00:00 as the next midnight; RFC 3339
			// has no hour 24 (definition-author trial: refused in
			// PostgreSQL's words, which PostgreSQL 15 takes).
			return "hour 24 is not RFC 3339 (hours 00 to 23): write 00:00:00 of the next day: " + quoteValue(s)
		}
		// RFC 3339, of a time that does not exist: PostgreSQL's words
		// (definitions trial: 2024-02-30T00:00:00Z was told to be RFC 3339).
		return "date/time field value out of range: " + quoteValue(s)
	}
	if err != nil {
		want := " (want RFC 3339, such as 2024-06-25T16:00:00Z)"
		if k == kindDate {
			// A date column takes a timestamp too, but a date is what it
			// holds (new-user trial: 2024-02-30 was told of a timestamp).
			want = " (want a date, such as 2024-06-25, or an RFC 3339 timestamp)"
		}
		return "invalid input syntax for type " + typ + ": " + quoteValue(s) + want
	}
	if tm.Year() < 1 {
		return "date/time field value out of range: " + quoteValue(s) // year 0000 does not exist
	}
	if _, off := tm.Zone(); off >= maxTZDisplacement || off <= -maxTZDisplacement {
		// PostgreSQL's words and limit (22009; definition-author trial:
		// +16:00 reached PostgreSQL, its dead letter naming no column).
		return "time zone displacement out of range: " + quoteValue(s)
	}
	return ""
}

// maxTZDisplacement is the first UTC offset PostgreSQL refuses, in
// seconds: 16 hours (its MAX_TZDISP_HOUR is 15).
const maxTZDisplacement = 16 * 3600

// leapSecond reports whether t is an RFC 3339 date-time whose seconds are
// 60, with no fraction or a fraction of zeros.
func leapSecond(t string) bool {
	if len(t) < 20 || t[13] != ':' || t[16] != ':' || t[17:19] != "60" {
		return false
	}
	rest := t[19:]
	if rest[0] == '.' {
		rest = strings.TrimLeft(rest[1:], "0")
	}
	return rest != "" && (rest[0] == 'Z' || rest[0] == 'z' || rest[0] == '+' || rest[0] == '-')
}

// checkJSONB checks what PostgreSQL's jsonb input refuses inside a JSON
// value: a NUL character (\u0000) in a string or key (22P05), a number
// beyond numeric's range.
func checkJSONB(v any) string {
	switch x := v.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			return "a string with a NUL character (\\u0000) cannot be stored in a jsonb column"
		}
	case json.Number:
		return checkNumericText(string(x), "numeric", string(x))
	case map[string]any:
		for k, e := range x {
			if strings.IndexByte(k, 0) >= 0 {
				return "a key with a NUL character (\\u0000) cannot be stored in a jsonb column"
			}
			if r := checkJSONB(e); r != "" {
				return r
			}
		}
	case []any:
		for _, e := range x {
			if r := checkJSONB(e); r != "" {
				return r
			}
		}
	case *treeNode:
		return checkTreeJSONB(x.t, x.i)
	}
	return ""
}

// checkTreeJSONB is checkJSONB of the object or array at node i of t.
func checkTreeJSONB(t *jsonstrict.Tree, i int32) string {
	for j := i; j < t.Nodes[i].End; j++ {
		if strings.IndexByte(t.Key(j), 0) >= 0 && j != i {
			return "a key with a NUL character (\\u0000) cannot be stored in a jsonb column"
		}
		switch t.Nodes[j].Kind {
		case jsonstrict.StringNode:
			if strings.IndexByte(t.Text(j), 0) >= 0 {
				return "a string with a NUL character (\\u0000) cannot be stored in a jsonb column"
			}
		case jsonstrict.NumberNode:
			if r := checkNumericText(t.Text(j), "numeric", t.Text(j)); r != "" {
				return r
			}
		}
	}
	return ""
}
