package projection

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// lookupPath returns the value at a from path, nil when absent: a string,
// json.Number or bool, or for an object or array a *treeNode. The typed
// fields of ev are used for the top-level event fields; payload paths walk
// objects by key and arrays by decimal index.
func lookupPath(ev *Event, path []string) any {
	if s, number, ok := lookupText(ev, path); ok {
		if number {
			return json.Number(s)
		}
		return s
	}
	t, i, ok := payloadNode(ev, path)
	if !ok {
		return nil
	}
	switch t.Nodes[i].Kind {
	case jsonstrict.ObjectNode, jsonstrict.ArrayNode:
		return &treeNode{t, i}
	}
	return t.Any(i) // a bool or nil
}

// payloadNode returns the node of ev's tree at the payload path path
// ("payload", "items", "0", ...), and false when there is none.
func payloadNode(ev *Event, path []string) (*jsonstrict.Tree, int32, bool) {
	t := ev.tree
	if t == nil {
		return nil, 0, false
	}
	i := ev.payload
	for _, seg := range path[1:] {
		var ok bool
		switch t.Nodes[i].Kind {
		case jsonstrict.ObjectNode:
			i, ok = t.Member(i, seg)
		case jsonstrict.ArrayNode:
			e, isIndex := arrayIndex(seg)
			if !isIndex {
				return nil, 0, false
			}
			i, ok = t.Element(i, e)
		}
		if !ok {
			return nil, 0, false
		}
	}
	return t, i, true
}

// arrayIndex returns the array index a path segment names: a decimal
// number as JSON writes an integer, 0 or without leading zeros and sign
// (definitions trial: payload.arr.+1 and payload.arr.01 read element 1;
// docs/definitions.md says decimal indexes).
func arrayIndex(seg string) (int, bool) {
	if seg == "" || seg[0] == '0' && len(seg) > 1 {
		return 0, false
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(seg)
	return n, err == nil
}

// jsonbRaw returns the object or array at c's from path, a payload path,
// and its text as the record has it (jsonstrict.Tree.Raw), for a jsonb
// column c that is not a primary key column: PostgreSQL reads from it the
// jsonb it reads from jsonbText's, which writes the value anew (keys
// sorted, escapes its own). A key column's text takes jsonbText's
// spelling, one per value, for its tombstone. ok is false for c of
// another type, a path that is not the payload's, or one that holds
// another value or none.
func jsonbRaw(c *column, ev *Event) (t *jsonstrict.Tree, i int32, raw string, ok bool) {
	if c.kind != kindJSONB || c.jsonbKey || c.path[0] != "payload" {
		return nil, 0, "", false
	}
	if t, i, ok = payloadNode(ev, c.path); !ok {
		return nil, 0, "", false
	}
	raw, ok = t.Raw(i)
	return t, i, raw, ok
}

// lookupText returns the text of the string or number at a from path and
// whether it is a number; ok is false when the path holds another value or
// none.
func lookupText(ev *Event, path []string) (s string, number, ok bool) {
	switch path[0] {
	case "eventType":
		return ev.EventType, false, true
	case "entityId":
		return ev.EntityID, false, true
	case "forkId":
		return ev.ForkID, false, true
	case "tenantSchema":
		return ev.TenantSchema, false, true
	case "irVersion":
		return ev.IRVersion, false, true
	case "sequenceNumber":
		return strconv.FormatInt(ev.SequenceNumber, 10), true, true
	case "ts":
		return strconv.FormatInt(ev.TS, 10), true, true
	}
	t, i, found := payloadNode(ev, path)
	if !found {
		return "", false, false
	}
	switch t.Nodes[i].Kind {
	case jsonstrict.StringNode:
		return t.Text(i), false, true
	case jsonstrict.NumberNode:
		return t.Text(i), true, true
	}
	return "", false, false
}

// treeNode is an object or array of an event's tree as a column value
// (lookupPath): checked (checkJSONB) and written as JSON (appendJSON) from
// the tree, never built as map[string]any or []any.
type treeNode struct {
	t *jsonstrict.Tree
	i int32
}

// toParam converts an event tree value (nil, string, bool, json.Number,
// time.Time, map[string]any, []any, *treeNode) to the text sent for a column of type
// typ, or nil for NULL.
func toParam(typ string, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if typ == "jsonb" {
		s, err := jsonbText(v)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	switch x := v.(type) {
	case string:
		return v, nil // v holds x already: no new allocation
	case bool:
		return strconv.FormatBool(x), nil
	case json.Number:
		return numberParam(typ, string(x))
	case time.Time:
		return formatTime(x, typ == "date"), nil
	case map[string]any:
		return nil, fmt.Errorf("a JSON object cannot be stored in a %s column (only jsonb)", typ)
	case []any:
		return nil, fmt.Errorf("a JSON array cannot be stored in a %s column (only jsonb)", typ)
	case *treeNode:
		return nil, fmt.Errorf("a JSON %s cannot be stored in a %s column (only jsonb)", jsonType(v), typ)
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
}

// numberParam is toParam of the JSON number text s for a column of type
// typ other than jsonb.
func numberParam(typ, s string) (any, error) {
	if typ == "timestamptz" || typ == "date" {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s from a number wants integer epoch milliseconds, got %s", typ, s)
		}
		return formatMillis(ms, typ == "date"), nil
	}
	return s, nil
}

// formatTime renders t for PostgreSQL exactly: ISO 8601 in UTC with the
// fraction as given (at least milliseconds), years beyond 9999 in full and
// years before 1 AD with the BC suffix PostgreSQL reads. With dateOnly it
// renders the UTC date.
func formatTime(t time.Time, dateOnly bool) string {
	t = t.UTC()
	y, mo, d := t.Date()
	bc := y <= 0
	if bc {
		y = 1 - y // Go's year 0 is 1 BC
	}
	var buf [48]byte // the longest: year 294276, nanoseconds and " BC" fit
	b := buf[:0]
	b = appendPadded(b, y, 4)
	b = append(b, '-')
	b = appendPadded(b, int(mo), 2)
	b = append(b, '-')
	b = appendPadded(b, d, 2)
	if !dateOnly {
		hh, mm, ss := t.Clock()
		b = append(b, 'T')
		b = appendPadded(b, hh, 2)
		b = append(b, ':')
		b = appendPadded(b, mm, 2)
		b = append(b, ':')
		b = appendPadded(b, ss, 2)
		b = append(b, '.')
		n := len(b)
		b = appendPadded(b, t.Nanosecond(), 9)
		for len(b) > n+3 && b[len(b)-1] == '0' {
			b = b[:len(b)-1]
		}
		b = append(b, 'Z')
	}
	if bc {
		b = append(b, " BC"...)
	}
	return string(b)
}

// msPerDay is the milliseconds of a day (UTC has no leap seconds in Go or
// PostgreSQL).
const msPerDay = 86_400_000

// formatMillis is formatTime(time.UnixMilli(ms), dateOnly) without the
// time.Time, for Plan's from: ts columns (every upsert of the bench's
// projections has one): the civil date comes from the day number by
// civil_from_days (Howard Hinnant, "chrono-Compatible Low-Level Date
// Algorithms", the proleptic Gregorian calendar that package time and
// PostgreSQL use), and the digits are written in place, the fraction
// always three (milliseconds). BenchmarkFormatMillis: about half of
// formatTime's time; TestFormatMillis checks it against formatTime.
func formatMillis(ms int64, dateOnly bool) string {
	days, rem := ms/msPerDay, ms%msPerDay
	if rem < 0 {
		days, rem = days-1, rem+msPerDay
	}
	z := days + 719468 // days since 0000-03-01
	era := z / 146097  // 400-year eras, floored
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097                                  // day of the era, [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of the era, [0, 399]
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of the year from March 1, [0, 365]
	mp := (5*doy + 2) / 153                                // month from March, [0, 11]
	d := doy - (153*mp+2)/5 + 1
	m := mp + 3
	if m > 12 {
		m -= 12
	}
	y := yoe + era*400
	if m <= 2 {
		y++
	}
	bc := y <= 0
	if bc {
		y = 1 - y // year 0 is 1 BC
	}
	var buf [40]byte // the longest: year 5874897, "T...Z" and " BC" fit
	b := appendPadded(buf[:0], int(y), 4)
	b = append(b, '-', byte('0'+m/10), byte('0'+m%10), '-', byte('0'+d/10), byte('0'+d%10))
	if !dateOnly {
		s, frac := rem/1000, rem%1000
		hh, mm, ss := s/3600, s/60%60, s%60
		b = append(b, 'T', byte('0'+hh/10), byte('0'+hh%10), ':', byte('0'+mm/10), byte('0'+mm%10),
			':', byte('0'+ss/10), byte('0'+ss%10), '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10), 'Z')
	}
	if bc {
		b = append(b, " BC"...)
	}
	return string(b)
}

// appendPadded appends the decimal form of n (≥ 0), zero-padded to width.
func appendPadded(b []byte, n, width int) []byte {
	var buf [20]byte
	i := len(buf)
	for n > 0 || len(buf)-i < width {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
	}
	return append(b, buf[i:]...)
}
