package projection

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// eventPayload returns ev.Payload, or Fields["payload"] for a hand-built
// Event without Payload.
func eventPayload(ev *Event) map[string]any {
	if ev.Payload != nil {
		return ev.Payload
	}
	m, _ := ev.Fields["payload"].(map[string]any)
	return m
}

// lookupPath returns the value at a from path, nil when absent. The typed
// fields of ev are used for the top-level event fields; payload paths walk
// objects by key and arrays by decimal index.
func lookupPath(ev *Event, path []string) any {
	switch path[0] {
	case "eventType":
		return ev.EventType
	case "entityId":
		return ev.EntityID
	case "forkId":
		return ev.ForkID
	case "tenantSchema":
		return ev.TenantSchema
	case "irVersion":
		return ev.IRVersion
	case "sequenceNumber":
		return json.Number(strconv.FormatInt(ev.SequenceNumber, 10))
	case "ts":
		return json.Number(strconv.FormatInt(ev.TS, 10))
	}
	payload := eventPayload(ev)
	if payload == nil {
		return nil
	}
	var cur any = payload
	for _, seg := range path[1:] {
		switch x := cur.(type) {
		case map[string]any:
			var ok bool
			if cur, ok = x[seg]; !ok {
				return nil
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			cur = x[i]
		default:
			return nil
		}
	}
	return cur
}

// toParam converts an event tree value (nil, string, bool, json.Number,
// time.Time, map[string]any, []any) to the text sent for a column of type
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
		if typ == "timestamptz" || typ == "date" {
			ms, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s from a number wants integer epoch milliseconds, got %s", typ, x)
			}
			return formatTime(time.UnixMilli(ms), typ == "date"), nil
		}
		return string(x), nil
	case time.Time:
		return formatTime(x, typ == "date"), nil
	case map[string]any:
		return nil, fmt.Errorf("a JSON object cannot be stored in a %s column (only jsonb)", typ)
	case []any:
		return nil, fmt.Errorf("a JSON array cannot be stored in a %s column (only jsonb)", typ)
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
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
