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

// linearKeys is the member count up to which an object's keys are checked
// for duplicates by comparing them with its earlier members' keys; beyond
// it a map of the keys is built.
const linearKeys = 16

// frame is an object or array being read.
type frame struct {
	node int32 // the container's node
	key  span  // object: the key of the member being read
	dup  bool  // object: key appeared before in it
	// keys maps an object's keys to their first member's node, once the
	// object has more than linearKeys members.
	keys map[string]int32
}

// parser builds the tree of one document from segmentio's tokenizer, which
// lexes tokens but does not check the grammar between them: that is the
// state machine in parse.
type parser struct {
	src   []byte
	str   string // string(src): the Tree's src
	tok   segjson.Tokenizer
	nodes []Node
	esc   []byte // the Tree's esc: strings with escapes, unescaped
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

// initialNodes is the room made for nodes before reading: one node per 16
// bytes, and 4 (projection events take 19-24 bytes per node: the bench's
// 433-byte events have 20-22), at most 256 so that a document holding one
// large string does not reserve much more than it needs. A document of
// denser nodes grows the slice as it is read.
func initialNodes(n int) int { return min(n/16+4, 256) }

func (p *parser) parse() error {
	p.tok.Reset(p.src)
	defer p.tok.Reset(nil) // returns the tokenizer's stack to its pool
	if p.nodes == nil {
		p.nodes = make([]Node, 0, initialNodes(len(p.src)))
	}
	// stack holds the open containers, outermost first. It is a local
	// variable (not a field) so that its first eight frames stay on the
	// goroutine stack.
	stack := make([]frame, 0, 8)
	state := wantValue
	for {
		if !p.tok.Next() {
			if p.tok.Err != nil || state != wantEOF {
				return p.syntaxError()
			}
			return nil
		}
		if state == wantEOF {
			return p.syntaxError()
		}
		var key span // the key of a value in an object
		if top := len(stack) - 1; top >= 0 {
			key = stack[top].key
		}
		switch p.tok.Delim {
		case '{', '[':
			if state != wantValue && state != wantValueOrEnd {
				return p.syntaxError()
			}
			if len(stack) == maxParseDepth {
				return p.syntaxError()
			}
			if len(stack) == MaxDepth {
				p.refuse(&Refusal{Kind: TooDeep, Path: p.path(stack[:1], true), Offset: len(p.src) - p.tok.Remaining()})
			}
			stack = append(stack, frame{node: int32(len(p.nodes))})
			// A container's text starts at its delimiter (just read); its
			// length is set when it closes.
			text := span{off: int32(len(p.src) - p.tok.Remaining() - 1)}
			if p.tok.Delim == '{' {
				p.nodes = append(p.nodes, Node{key: key, text: text, Kind: ObjectNode})
				state = wantKeyOrEnd
			} else {
				p.nodes = append(p.nodes, Node{key: key, text: text, Kind: ArrayNode})
				state = wantValueOrEnd
			}
			continue
		case '}', ']':
			top := len(stack) - 1
			if top < 0 || (p.tok.Delim == '}') != (p.nodes[stack[top].node].Kind == ObjectNode) {
				return p.syntaxError()
			}
			if state != wantCommaOrEnd && state != wantKeyOrEnd && state != wantValueOrEnd {
				return p.syntaxError()
			}
			i := stack[top].node
			p.nodes[i].End = int32(len(p.nodes))
			p.nodes[i].text.n = int32(len(p.src)-p.tok.Remaining()) - p.nodes[i].text.off
			stack[top] = frame{}
			stack = stack[:top]
			state = p.complete(stack, i)
			continue
		case ':':
			if state != wantColon {
				return p.syntaxError()
			}
			state = wantValue
			continue
		case ',':
			if state != wantCommaOrEnd {
				return p.syntaxError()
			}
			if p.nodes[stack[len(stack)-1].node].Kind == ObjectNode {
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
					return p.syntaxError()
				}
				k, _ := p.unquote(stack, off, raw, false)
				p.member(stack, k)
				state = wantColon
				continue
			}
			if state != wantValue && state != wantValueOrEnd {
				return p.syntaxError()
			}
			n := Node{key: key, End: int32(len(p.nodes)) + 1}
			switch raw[0] {
			case '"':
				var ok bool
				if n.text, ok = p.unquote(stack, off, raw, true); ok {
					n.Kind = StringNode
				} else {
					n.Kind = UnreadableNode
				}
			case 'n':
				n.Kind = NullNode
			case 't':
				n.Kind = TrueNode
			case 'f':
				n.Kind = FalseNode
			default:
				n.Kind, n.text = NumberNode, span{int32(off), int32(len(raw))}
			}
			p.nodes = append(p.nodes, n)
			state = p.complete(stack, int32(len(p.nodes)-1))
		default:
			return p.syntaxError()
		}
	}
}

// member starts the member key of the innermost open object: it records
// the key in the frame and, when the object had it before, the refusal,
// with the first member of that key marked unreadable (neither value is
// the one).
func (p *parser) member(stack []frame, key span) {
	f := &stack[len(stack)-1]
	obj := &p.nodes[f.node]
	first := int32(-1)
	switch {
	case f.keys != nil:
		if j, ok := f.keys[p.text(key)]; ok {
			first = j
		}
	case obj.Len < linearKeys:
		for j, k := f.node+1, int32(0); k < obj.Len; j, k = p.nodes[j].End, k+1 {
			if k := p.nodes[j].key; k.n == key.n && p.equal(k, key) {
				first = j
				break
			}
		}
	default:
		f.keys = make(map[string]int32, 2*linearKeys)
		for j, k := f.node+1, int32(0); k < obj.Len; j, k = p.nodes[j].End, k+1 {
			if _, ok := f.keys[p.text(p.nodes[j].key)]; !ok {
				f.keys[p.text(p.nodes[j].key)] = j
			}
		}
		if j, ok := f.keys[p.text(key)]; ok {
			first = j
		}
	}
	f.key, f.dup = key, first >= 0
	if f.dup {
		p.nodes[first].Kind = UnreadableNode
		object := p.path(stack, false)
		k := p.text(key)
		p.refuse(&Refusal{Kind: DuplicateKey, Path: string(AppendKey([]byte(object), k)), Object: object, Key: k})
	}
}

// bytes returns the bytes of s, read so far.
func (p *parser) bytes(s span) []byte {
	if s.off >= 0 {
		return p.src[s.off : s.off+s.n]
	}
	o := -s.off - 1
	return p.esc[o : o+s.n]
}

// text returns the string of s: a slice of the document's copy, or a new
// string for an unescaped one.
func (p *parser) text(s span) string {
	if s.off >= 0 {
		return p.str[s.off : s.off+s.n]
	}
	return string(p.bytes(s))
}

// equal reports whether the strings of a and b are equal.
func (p *parser) equal(a, b span) bool { return string(p.bytes(a)) == string(p.bytes(b)) }

// complete takes the value at node i, just read, into its container (the
// innermost open one, none for the outermost value) and returns the state
// that follows.
func (p *parser) complete(stack []frame, i int32) int {
	if len(stack) == 0 {
		return wantEOF
	}
	f := &stack[len(stack)-1]
	c := &p.nodes[f.node]
	if c.Kind == ObjectNode {
		switch {
		case f.dup:
			p.nodes[i].Kind = UnreadableNode
		case f.keys != nil:
			f.keys[p.text(f.key)] = i
		}
	}
	c.Len++
	return wantCommaOrEnd
}

// unquote returns the span of the string that the string token raw at byte
// offset off stands for, and true: within the document when it has no
// escape, else in p.esc, unescaped. For an unpaired UTF-16 surrogate escape it records
// the refusal (p.refuse) and returns false, with U+FFFD in its place.
// isValue tells whether raw is a value (its path ends in its key or index)
// or a key (its path is its object's).
func (p *parser) unquote(stack []frame, off int, raw []byte, isValue bool) (span, bool) {
	inner := raw[1 : len(raw)-1]
	if p.tok.Kind() == segjson.Unescaped || bytes.IndexByte(inner, '\\') < 0 {
		return span{int32(off + 1), int32(len(inner))}, true
	}
	// The tokenizer has checked the escapes' syntax: a backslash is followed
	// by one of "\/bfnrtu, and \u by four hex digits.
	start := len(p.esc)
	buf := p.esc
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
				p.refuse(&Refusal{Kind: UnpairedSurrogate, Path: p.path(stack, isValue),
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
	p.esc = buf
	return span{-int32(start) - 1, int32(len(buf) - start)}, ok
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
func (p *parser) path(stack []frame, withLast bool) string {
	var b []byte
	n := len(stack)
	if !withLast {
		n--
	}
	for i := range n {
		f := &stack[i]
		if c := &p.nodes[f.node]; c.Kind == ObjectNode {
			b = AppendKey(b, p.text(f.key))
		} else {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(c.Len), 10)
			b = append(b, ']')
		}
	}
	return string(b)
}

// AppendKey appends key to the JSON path b, as Refusal's paths are
// written: ".key" (no dot at the start) for a plain name
// ([A-Za-z0-9_-]+), else `["key"]` (Go-quoted).
func AppendKey(b []byte, key string) []byte {
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
