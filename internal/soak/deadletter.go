package soak

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/schemas"
)

// PairID names a (source record, projection) pair: the source partition and
// offset and the projection ("" for a record that reached no projection).
type PairID struct {
	Partition  int32
	Offset     int64
	Projection string
}

func (id PairID) String() string {
	p := id.Projection
	if p == "" {
		p = `""`
	}
	return fmt.Sprintf("%d@%d/%s", id.Partition, id.Offset, p)
}

// DeadLetter is one dead letter read back (from the topic, or from a produce
// request a broker received).
type DeadLetter struct {
	Key     []byte
	Value   []byte
	Headers map[string]string
	Pair    PairID
	Worker  string
	Class   string
	SQLSt   string
}

// ParseDeadLetter reads the source pair and context of a dead letter from
// its headers (SPEC §6).
func ParseDeadLetter(key, value []byte, headers [][2]string) (DeadLetter, error) {
	dl := DeadLetter{Key: key, Value: value, Headers: map[string]string{}}
	for _, h := range headers {
		dl.Headers[h[0]] = h[1]
	}
	p, err := strconv.ParseInt(dl.Headers[dlq.HeaderOriginalPartition], 10, 32)
	if err != nil {
		return dl, fmt.Errorf("dead letter header %s: %w", dlq.HeaderOriginalPartition, err)
	}
	o, err := strconv.ParseInt(dl.Headers[dlq.HeaderOriginalOffset], 10, 64)
	if err != nil {
		return dl, fmt.Errorf("dead letter header %s: %w", dlq.HeaderOriginalOffset, err)
	}
	proj, ok := dl.Headers[dlq.HeaderProjection]
	if !ok {
		return dl, fmt.Errorf("dead letter has no header %s", dlq.HeaderProjection)
	}
	dl.Pair = PairID{int32(p), o, proj}
	dl.Worker = dl.Headers[dlq.HeaderWorker]
	dl.Class = dl.Headers[dlq.HeaderErrorClass]
	dl.SQLSt = dl.Headers[dlq.HeaderSQLState]
	return dl, nil
}

// Cause is a short label of why the pair was dead-lettered: its error class
// and SQLSTATE.
func (dl DeadLetter) Cause() string {
	if dl.SQLSt != "" {
		return dl.Class + "/" + dl.SQLSt
	}
	return dl.Class
}

// CheckDeadLetter is invariant 5 for one dead letter: the value validates
// against the dead-letter schema, parses with a strict JSON parser (no
// duplicate key, no invalid UTF-8, no lone UTF-16 surrogate escape, as jq 1.6
// requires), and carries the source record's value: originalEvent verbatim,
// or, when null, originalValueBase64. source is the produced value (nil for
// a Kafka tombstone).
func CheckDeadLetter(v *schemas.Validator, dl DeadLetter, source []byte) error {
	if err := StrictJSON(dl.Value); err != nil {
		return fmt.Errorf("not strict JSON: %w", err)
	}
	if err := v.ValidateDeadLetter(dl.Value); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	var m struct {
		OriginalEvent       json.RawMessage `json:"originalEvent"`
		OriginalValueBase64 *string         `json:"originalValueBase64"`
		ProjectionName      string          `json:"projectionName"`
	}
	if err := json.Unmarshal(dl.Value, &m); err != nil {
		return err
	}
	if m.ProjectionName != dl.Pair.Projection {
		return fmt.Errorf("projectionName %q, header %q", m.ProjectionName, dl.Pair.Projection)
	}
	if string(m.OriginalEvent) != "null" {
		if !bytes.Equal(m.OriginalEvent, source) {
			return fmt.Errorf("originalEvent is not the source value verbatim")
		}
		return nil
	}
	if m.OriginalValueBase64 == nil {
		if source == nil {
			return nil // a Kafka tombstone has no value to keep
		}
		return errors.New("originalEvent null without originalValueBase64")
	}
	raw, err := base64.StdEncoding.DecodeString(*m.OriginalValueBase64)
	if err != nil {
		return fmt.Errorf("originalValueBase64: %w", err)
	}
	if !bytes.Equal(raw, source) {
		return errors.New("originalValueBase64 is not the source value")
	}
	return nil
}

// StrictJSON returns an error when b is not one JSON value that every strict
// parser accepts: invalid UTF-8, a lone UTF-16 surrogate escape (\ud800
// without its pair: jq 1.6 refuses it), a duplicate object key, or anything
// encoding/json refuses.
func StrictJSON(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("invalid UTF-8")
	}
	if err := surrogates(b); err != nil {
		return err
	}
	if !json.Valid(b) {
		return errors.New("invalid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // next token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].obj {
					stack[len(stack)-1].key = true
				}
				continue
			}
			k := tok.(string)
			if top.keys[k] {
				return fmt.Errorf("duplicate key %q", k)
			}
			top.keys[k] = true
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keys: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].key = true
		}
	}
}

// surrogates finds a \u escape of a UTF-16 surrogate that is not part of a
// high-low pair.
func surrogates(b []byte) error {
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !in {
			in = c == '"'
			continue
		}
		switch c {
		case '"':
			in = false
		case '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				r, ok := hex4(b, i+2)
				switch {
				case !ok:
				case r >= 0xd800 && r <= 0xdbff:
					lo, ok := rune(0), false
					if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
						lo, ok = hex4(b, i+8)
					}
					if !ok || lo < 0xdc00 || lo > 0xdfff {
						return fmt.Errorf("lone UTF-16 surrogate escape at byte %d", i)
					}
					i += 11
					continue
				case r >= 0xdc00 && r <= 0xdfff:
					return fmt.Errorf("lone UTF-16 surrogate escape at byte %d", i)
				}
				i += 5
				continue
			}
			i++
		}
	}
	return nil
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[at:at+4]), 16, 32)
	return rune(n), err == nil
}
