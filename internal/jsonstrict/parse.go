package jsonstrict

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	segjson "github.com/segmentio/encoding/json"
)

// Parser states: what the next token may be.
const (
	wantValue      = iota // a value: at the top, after ':', after ',' in an array
	wantValueOrEnd        // a value or ']': after '['
	wantKeyOrEnd          // a key or '}': after '{'
	wantKey               // a key: after ',' in an object
	wantColon             // ':' after a key
	wantCommaOrEnd        // ',' or the container's end, after a member
	wantEOF               // nothing: the top-level value is complete
)

// rootObjectSize is the room made in the outermost object's map: the
// members of a projection event (SPEC §3), the document Parse reads most.
const rootObjectSize = 8

// frame is an object or array under construction.
type frame struct {
	obj map[string]any // nil for an array
	arr []any
	key string // object: the key of the member being parsed
	dup bool   // object: key appeared before in it
}

// parser builds the tree of one document from segmentio's tokenizer, which
// lexes tokens but does not check the grammar between them: that is the
// state machine in parse.
type parser struct {
	src []byte
	str string // string(src): tokens are sliced from it without allocating
	tok segjson.Tokenizer
	// refused is the first reason the document, although JSON, is not
	// strict. The parse goes on past it, so that what can be read is kept.
	refused *Refusal
}

// refuse records r unless a reason was recorded before.
func (p *parser) refuse(r *Refusal) {
	if p.refused == nil {
		p.refused = r
	}
}

func (p *parser) parse() (any, error) {
	p.tok.Reset(p.src)
	defer p.tok.Reset(nil) // returns the tokenizer's stack to its pool
	// stack holds the open containers, outermost first. It is a local
	// variable (not a field) so that its first eight frames stay on the
	// goroutine stack.
	stack := make([]frame, 0, 8)
	var root any
	state := wantValue
	for {
		if !p.tok.Next() {
			if p.tok.Err != nil || state != wantEOF {
				return nil, p.syntaxError()
			}
			return root, nil
		}
		if state == wantEOF {
			return nil, p.syntaxError()
		}
		var v any
		switch p.tok.Delim {
		case '{', '[':
			if state != wantValue && state != wantValueOrEnd {
				return nil, p.syntaxError()
			}
			if len(stack) == maxParseDepth {
				return nil, p.syntaxError()
			}
			if len(stack) == MaxDepth {
				p.refuse(&Refusal{Kind: TooDeep, Path: path(stack[:1], true), Offset: len(p.src) - p.tok.Remaining()})
			}
			if p.tok.Delim == '{' {
				n := 0
				if len(stack) == 0 {
					n = rootObjectSize
				}
				stack = append(stack, frame{obj: make(map[string]any, n)})
				state = wantKeyOrEnd
			} else {
				stack = append(stack, frame{arr: make([]any, 0)})
				state = wantValueOrEnd
			}
			continue
		case '}', ']':
			top := len(stack) - 1
			if top < 0 || (p.tok.Delim == '}') != (stack[top].obj != nil) {
				return nil, p.syntaxError()
			}
			if state != wantCommaOrEnd && state != wantKeyOrEnd && state != wantValueOrEnd {
				return nil, p.syntaxError()
			}
			if f := stack[top]; f.obj != nil {
				v = f.obj
			} else {
				v = f.arr
			}
			stack[top] = frame{}
			stack = stack[:top]
		case ':':
			if state != wantColon {
				return nil, p.syntaxError()
			}
			state = wantValue
			continue
		case ',':
			if state != wantCommaOrEnd {
				return nil, p.syntaxError()
			}
			if stack[len(stack)-1].obj != nil {
				state = wantKey
			} else {
				state = wantValue
			}
			continue
		case 0:
			raw := p.tok.Value
			off := len(p.src) - p.tok.Remaining() - len(raw)
			if state == wantKeyOrEnd || state == wantKey {
				if raw[0] != '"' {
					return nil, p.syntaxError()
				}
				key, _ := p.unquote(stack, off, raw, false)
				f := &stack[len(stack)-1]
				_, f.dup = f.obj[key]
				if f.dup {
					object := path(stack, false)
					p.refuse(&Refusal{Kind: DuplicateKey, Path: string(appendKey([]byte(object), key)), Object: object, Key: key})
				}
				f.key = key
				state = wantColon
				continue
			}
			if state != wantValue && state != wantValueOrEnd {
				return nil, p.syntaxError()
			}
			switch raw[0] {
			case '"':
				if s, ok := p.unquote(stack, off, raw, true); ok {
					v = s
				} else {
					v = Unreadable{}
				}
			case 'n':
				v = nil
			case 't':
				v = true
			case 'f':
				v = false
			default:
				v = json.Number(p.str[off : off+len(raw)])
			}
		default:
			return nil, p.syntaxError()
		}

		// v is a complete value: a scalar or a closed container.
		if len(stack) == 0 {
			root = v
			state = wantEOF
			continue
		}
		f := &stack[len(stack)-1]
		if f.obj != nil && f.dup {
			f.obj[f.key] = Unreadable{} // neither value is the one
		} else if f.obj != nil {
			f.obj[f.key] = v
		} else {
			f.arr = append(f.arr, v)
		}
		state = wantCommaOrEnd
	}
}

// unquote returns the string that the string token raw at byte offset off
// stands for, and true. For an unpaired UTF-16 surrogate escape it records
// the refusal (p.refuse) and returns false, with U+FFFD in its place.
// isValue tells whether raw is a value (its path ends in its key or index)
// or a key (its path is its object's).
func (p *parser) unquote(stack []frame, off int, raw []byte, isValue bool) (string, bool) {
	inner := raw[1 : len(raw)-1]
	if p.tok.Kind() == segjson.Unescaped || bytes.IndexByte(inner, '\\') < 0 {
		return p.str[off+1 : off+len(raw)-1], true
	}
	// The tokenizer has checked the escapes' syntax: a backslash is followed
	// by one of "\/bfnrtu, and \u by four hex digits.
	buf := make([]byte, 0, len(inner))
	ok := true
	for i := 0; i < len(inner); {
		c := inner[i]
		if c != '\\' {
			buf = append(buf, c)
			i++
			continue
		}
		switch e := inner[i+1]; e {
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r := parseHex4(inner[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+6 <= len(inner) && inner[i] == '\\' && inner[i+1] == 'u' {
					if r2 := parseHex4(inner[i+2:]); r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
						i += 6
						buf = utf8.AppendRune(buf, r)
						continue
					}
				}
				p.refuse(&Refusal{Kind: UnpairedSurrogate, Path: path(stack, isValue),
					Escape: string(inner[i-6 : i]), Offset: off + 1 + i - 5})
				ok = false
				buf = utf8.AppendRune(buf, utf8.RuneError)
				continue
			}
			buf = utf8.AppendRune(buf, r)
			continue
		default: // '"', '\\', '/'
			buf = append(buf, e)
		}
		i += 2
	}
	return string(buf), ok
}

// parseHex4 decodes the four hex digits at the start of b.
func parseHex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// path returns the JSON path of the position being parsed, given the open
// containers: of the member or element in progress when withLast, else of
// the innermost open container.
func path(stack []frame, withLast bool) string {
	var b []byte
	n := len(stack)
	if !withLast {
		n--
	}
	for i := range n {
		f := &stack[i]
		if f.obj != nil {
			b = appendKey(b, f.key)
		} else {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(len(f.arr)), 10)
			b = append(b, ']')
		}
	}
	return string(b)
}

// appendKey appends key to the path b: ".key" (no dot at the start) for a
// plain name, else `["key"]`.
func appendKey(b []byte, key string) []byte {
	plain := key != ""
	for i := 0; i < len(key) && plain; i++ {
		c := key[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !plain {
		b = append(b, '[')
		b = strconv.AppendQuote(b, key)
		return append(b, ']')
	}
	if len(b) > 0 {
		b = append(b, '.')
	}
	return append(b, key...)
}

// syntaxError describes why the document is not JSON. The parse stops at
// the first error; the standard library then re-reads the document (only
// on this cold path) for its familiar message and position.
func (p *parser) syntaxError() error {
	var se *json.SyntaxError
	var discard json.RawMessage
	if err := json.Unmarshal(p.src, &discard); errors.As(err, &se) {
		return &SyntaxError{Msg: se.Error(), Offset: se.Offset}
	}
	// Not reached for valid UTF-8 input unless the tokenizer and
	// encoding/json disagree; the fuzz tests guard that.
	return &SyntaxError{Offset: int64(len(p.src) - p.tok.Remaining())}
}
