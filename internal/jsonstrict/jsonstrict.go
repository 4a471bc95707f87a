// Package jsonstrict reads a JSON document in one pass and says whether
// every strict JSON parser reads it as the same document. The projection
// event decoder (projection.DecodeEvent) builds its tree with it, and the
// dead-letter code (dlq.NewRecord) asks it whether a record value can be
// embedded verbatim in a dead letter's originalEvent (SPEC §3 and §6), so
// that both apply one set of rules.
//
// A document is strict when it is valid UTF-8 and valid JSON (RFC 8259,
// whitespace around the value allowed) and has no duplicate key in any
// object (after unescaping), no unpaired UTF-16 surrogate escape in any
// string (encoding/json silently reads "\ud800" as U+FFFD, jq 1.6 refuses
// it) and at most MaxDepth levels of nesting. Numbers are kept as their
// exact text (json.Number) and never converted to float64; JSON sets them
// no range (RFC 8259 §6), so any valid number is strict.
//
// Not to be confused with internal/jqcheck, a test helper that runs jq
// and encoding/json over a finished document.
package jsonstrict

import (
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// MaxDepth is the deepest nesting of objects and arrays a strict document
// may have, the outermost value counting as level 1: 126. A dead letter
// embeds the document one level down, and 127 levels are what serde_json's
// default recursion limit (128) accepts, the smallest among common strict
// parsers (jq 1.6 stops after 256, Python's json near 1000, encoding/json
// after 10000).
const MaxDepth = 126

// maxParseDepth is where Parse stops reading a document as not JSON:
// encoding/json's own limit. Between MaxDepth and it, the document is read
// on (so that what is readable is kept) and refused.
const maxParseDepth = 10000

// Unreadable stands, in the tree of a refused document, for a value that
// cannot be read unambiguously: a string with an unpaired surrogate escape,
// or the value of a key that appears twice in its object (neither value is
// the one). It never appears in the tree of a strict document.
type Unreadable struct{}

// Kind says why a document that is JSON is not strict.
type Kind uint8

// The reasons a JSON document is refused.
const (
	// DuplicateKey: an object has the same key twice, after unescaping.
	DuplicateKey Kind = iota + 1
	// UnpairedSurrogate: a string or key has a high surrogate escape
	// (\ud800-\udbff) not followed by an escaped low one (\udc00-\udfff),
	// or a low one alone.
	UnpairedSurrogate
	// TooDeep: objects and arrays nest more than MaxDepth levels.
	TooDeep
)

// Refusal reports the first reason a JSON document is not strict. Paths
// are JSON paths: "payload", "payload.items[2].id", `payload["a.b"]` for a
// key that is not a plain name ([A-Za-z0-9_-]+), "" for the document
// itself.
type Refusal struct {
	Kind Kind
	// Path is where the document is refused: for DuplicateKey the member
	// whose key repeats (Object plus Key); for UnpairedSurrogate the string
	// (for a key, its object); for TooDeep the member or element of the
	// outermost value that holds the excess nesting.
	Path string
	// Object is, for DuplicateKey, the path of the object with the repeated
	// key.
	Object string
	// Key is, for DuplicateKey, the repeated key, unescaped.
	Key string
	// Escape is, for UnpairedSurrogate, the escape as written ("\ud800").
	Escape string
	// Offset is the byte, counted from 1, of the escape's backslash
	// (UnpairedSurrogate) or of the bracket that opens the level beyond
	// MaxDepth (TooDeep); 0 for DuplicateKey.
	Offset int
}

// Error returns the reason, after "<path>: " when Path is not "".
func (r *Refusal) Error() string {
	var reason string
	switch r.Kind {
	case DuplicateKey:
		reason = "duplicate key " + strconv.Quote(r.Key)
		if r.Object != "" {
			reason += " in " + r.Object
		}
	case UnpairedSurrogate:
		reason = "unpaired UTF-16 surrogate escape " + r.Escape + " in a string at byte " + strconv.Itoa(r.Offset)
	case TooDeep:
		reason = "nests deeper than " + strconv.Itoa(MaxDepth) + " levels at byte " + strconv.Itoa(r.Offset)
	default:
		reason = "refused"
	}
	if r.Path == "" {
		return reason
	}
	return r.Path + ": " + reason
}

// SyntaxError reports a document that is not JSON.
type SyntaxError struct {
	// Msg is encoding/json's description of the error ("invalid character
	// 'g' looking for beginning of value", "unexpected end of JSON input"),
	// "" when it has none.
	Msg string
	// Offset is encoding/json's json.SyntaxError.Offset (the bytes read
	// before the error) or, when Msg is "", the byte where Parse stopped.
	Offset int64
}

// Error returns "not valid JSON: <msg> at byte <offset>", or "not valid
// JSON at byte <offset>" when Msg is "".
func (e *SyntaxError) Error() string {
	if e.Msg == "" {
		return "not valid JSON at byte " + strconv.FormatInt(e.Offset, 10)
	}
	return "not valid JSON: " + e.Msg + " at byte " + strconv.FormatInt(e.Offset, 10)
}

// UTF8Error reports a document that is not valid UTF-8.
type UTF8Error struct {
	// Offset is the first invalid byte's position, counted from 1.
	Offset int
	// Byte is that byte.
	Byte byte
}

// Error returns "not valid UTF-8: invalid byte 0x<hex> at byte <offset>".
func (e *UTF8Error) Error() string {
	return "not valid UTF-8: invalid byte 0x" + strconv.FormatUint(uint64(e.Byte), 16) + " at byte " + strconv.Itoa(e.Offset)
}

// Parse reads doc, once, into a tree of map[string]any (objects), []any
// (arrays), string, json.Number (numbers, their exact text), bool and nil.
// It is ParseTree's result as such values (Tree.Any).
//
//   - For a strict document it returns the tree and nil.
//   - For a document that is JSON but not strict it returns the tree of
//     what can be read, with Unreadable in place of the values that cannot
//     (see Unreadable), and a *Refusal for the first reason met in reading
//     order; the rest of the document is still read and checked for syntax.
//   - Otherwise it returns nil and a *UTF8Error (doc is not valid UTF-8)
//     or a *SyntaxError (doc is not JSON, nests more than 10000 levels,
//     encoding/json's limit, or is empty).
//
// The strings in the tree share one copy of doc, so keeping any of them
// keeps that copy alive; doc itself is neither kept nor modified.
func Parse(doc []byte) (any, error) {
	t, err := ParseTree(doc)
	if t == nil {
		return nil, err
	}
	return t.Any(0), err
}

// ParseTree reads doc, once, into a Tree; its results are Parse's, with
// the tree as nodes (nil for a document that is not JSON or not UTF-8).
// Reading a document into nodes takes an allocation for the nodes (which
// hold no pointers), one for the copy of doc and, when strings hold
// escapes, one for their unescaped text, where Parse's maps and boxed
// values take one or more per value.
func ParseTree(doc []byte) (*Tree, error) { return parseTree(doc, string(doc), nil) }

// ParseTreeShared is ParseTree without the copy of doc: the tree's strings
// are spans of doc itself. doc must not be modified while the tree, or any
// string taken from it, is in use; a string kept longer (a map key, a
// metric label) keeps all of doc's memory alive, so clone it
// (strings.Clone). For a Kafka record's value, which the client never
// reuses and the worker never modifies, it saves the copy: about 430 bytes
// allocated and copied for a 430-byte event, 14 % of the worker's
// allocations per event.
func ParseTreeShared(doc []byte) (*Tree, error) {
	return parseTree(doc, unsafe.String(unsafe.SliceData(doc), len(doc)), nil)
}

// NodeSlab hands out the nodes of several trees from one allocation: the
// trees of a batch of records, parsed one after another, take one array
// of slabNodes nodes (28 KiB) per 40 or so events of 430 bytes instead of
// an array each, sized to what they use instead of initialNodes' guess.
// A tree keeps its whole slab alive (Node holds no pointer, so the
// garbage collector does not scan it): a tree kept beyond its batch is to
// be detached (Tree.Detached). The zero NodeSlab is ready; it is not safe
// for concurrent use.
type NodeSlab struct{ free []Node }

// slabNodes is the size of a NodeSlab's arrays, in nodes.
const slabNodes = 1024

// ParseTreeShared is the package's ParseTreeShared with the tree's nodes
// taken from s.
func (s *NodeSlab) ParseTreeShared(doc []byte) (*Tree, error) {
	return parseTree(doc, unsafe.String(unsafe.SliceData(doc), len(doc)), s)
}

// parseTree is ParseTree of doc, whose text str is (a copy of doc or doc
// itself), with its nodes from slab when not nil.
func parseTree(doc []byte, str string, slab *NodeSlab) (*Tree, error) {
	if !utf8.Valid(doc) {
		return nil, utf8Error(doc)
	}
	p := parser{src: doc, str: str}
	if slab != nil {
		if need := initialNodes(len(doc)); cap(slab.free) < need {
			slab.free = make([]Node, 0, max(slabNodes, need))
		}
		p.nodes = slab.free[:0]
	}
	if err := p.parse(); err != nil {
		return nil, err // the slab's room is left to the next document
	}
	if slab != nil {
		if cap(p.nodes) == cap(slab.free) {
			// Read within the slab's room (a denser document than
			// initialNodes expects may have outgrown it into an array
			// of its own): the room after its nodes is the next tree's.
			slab.free = slab.free[len(p.nodes):len(p.nodes)]
		}
		p.nodes = p.nodes[:len(p.nodes):len(p.nodes)] // nothing appends into another tree's nodes
	}
	t := &Tree{Nodes: p.nodes, src: p.str, esc: string(p.esc)}
	if p.refused != nil {
		return t, p.refused
	}
	return t, nil
}

// IsObject reports whether doc is a strict document (see Parse) whose value
// is an object: what a dead letter may embed verbatim.
func IsObject(doc []byte) bool {
	t, err := ParseTree(doc)
	return err == nil && t.Nodes[0].Kind == ObjectNode
}

func utf8Error(doc []byte) error {
	i := 0
	for i < len(doc) {
		r, size := utf8.DecodeRune(doc[i:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		i += size
	}
	return &UTF8Error{Offset: i + 1, Byte: doc[i]}
}
