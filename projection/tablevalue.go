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
			e, err := strconv.Atoi(seg)
			if err != nil {
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
		return formatTime(time.UnixMilli(ms), typ == "date"), nil
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
