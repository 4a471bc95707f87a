package jsonstrict

import (
	"encoding/json"
	"slices"
)

// NodeKind says what value a Node is.
type NodeKind uint8

// The kinds of node in a Tree.
const (
	NullNode NodeKind = iota
	FalseNode
	TrueNode
	NumberNode // Text is the number's exact text
	StringNode // Text is the string, unescaped
	ObjectNode
	ArrayNode
	// UnreadableNode stands for a value that cannot be read unambiguously
	// (see Unreadable): a string with an unpaired surrogate escape, or
	// either value of a key that appears twice in its object. A container
	// marked so keeps its nodes, so that End still skips them.
	UnreadableNode
)

// Node is one value of a Tree. The nodes of a container follow it, in
// document order, each member or element followed by its own nodes; End
// is the index just past the last of them, so the next sibling of node i
// is at Nodes[i].End. A Node holds no pointer (its strings are spans of
// the Tree's text), so the garbage collector never scans a tree's nodes.
type Node struct {
	// key is the member's key (in an object); text is a string's text, a
	// number's, or a container's text in the document, its delimiters
	// included.
	key, text span
	// End is the index of the first node after this one's subtree.
	End int32
	// Len is an object's member count (duplicates included) or an array's
	// element count.
	Len  int32
	Kind NodeKind
}

// span is a string of a Tree: bytes [off, off+n) of the document when off
// ≥ 0, else bytes [-off-1, -off-1+n) of the unescaped strings.
type span struct{ off, n int32 }

// Tree is a document read by ParseTree: Nodes[0] is the outermost value.
type Tree struct {
	Nodes []Node
	src   string // a copy of the document
	esc   string // the strings that hold escapes, unescaped, one after another
	// edited: SetString changed a node, so a container's text in the
	// document may no longer be its value (Raw).
	edited bool
}

// str returns the string of s.
func (t *Tree) str(s span) string {
	if s.off >= 0 {
		return t.src[s.off : s.off+s.n]
	}
	o := -s.off - 1
	return t.esc[o : o+s.n]
}

// Detached returns a copy of t that shares no memory with t's document
// (ParseTreeShared's) or the NodeSlab of its nodes: the nodes copied, the
// text read from doc, which must hold the same bytes as t's document (a
// copy of it). It panics when doc's length is not the document's.
func (t *Tree) Detached(doc string) *Tree {
	if len(doc) != len(t.src) {
		panic("jsonstrict: Tree.Detached given a document of another length")
	}
	return &Tree{Nodes: slices.Clone(t.Nodes), src: doc, esc: t.esc, edited: t.edited}
}

// Key returns node i's key, unescaped, when its parent is an object; ""
// otherwise. It shares the tree's copy of the document.
func (t *Tree) Key(i int32) string { return t.str(t.Nodes[i].key) }

// Text returns node i's string, unescaped, or its number's exact text; ""
// for other kinds. It shares the tree's copy of the document.
func (t *Tree) Text(i int32) string {
	if k := t.Nodes[i].Kind; k == ObjectNode || k == ArrayNode {
		return ""
	}
	return t.str(t.Nodes[i].text)
}

// Raw returns the text of the object or array at node i as the document
// has it, from its opening to its closing delimiter (whitespace, escapes
// and member order as written), and true; "" and false when node i is
// not an object or array, or the tree was changed (SetString). It shares
// the tree's copy of the document. A container that holds an
// UnreadableNode is returned too: its text is JSON, but not one value.
func (t *Tree) Raw(i int32) (string, bool) {
	n := &t.Nodes[i]
	if t.edited || n.Kind != ObjectNode && n.Kind != ArrayNode {
		return "", false
	}
	return t.src[n.text.off : n.text.off+n.text.n], true
}

// SetString makes node i the string s, as no document the parser accepts
// could (invalid UTF-8): for tests of what is done with such a value.
func (t *Tree) SetString(i int32, s string) {
	t.Nodes[i].Kind = StringNode
	t.Nodes[i].text = span{off: -int32(len(t.esc)) - 1, n: int32(len(s))}
	t.esc += s
	t.edited = true
}

// Member returns the index of the member key of the object at node i, and
// true; or 0 and false when the object has no such member or i is not an
// object. With a duplicate key (a refused document) it returns the first,
// which is an UnreadableNode.
func (t *Tree) Member(i int32, key string) (int32, bool) {
	n := &t.Nodes[i]
	if n.Kind != ObjectNode {
		return 0, false
	}
	for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
		if k := t.Nodes[j].key; int(k.n) == len(key) && t.str(k) == key {
			return j, true
		}
	}
	return 0, false
}

// Element returns the index of element e of the array at node i, and
// true; or 0 and false when e is out of range or i is not an array.
func (t *Tree) Element(i int32, e int) (int32, bool) {
	n := &t.Nodes[i]
	if n.Kind != ArrayNode || e < 0 || e >= int(n.Len) {
		return 0, false
	}
	j := i + 1
	for ; e > 0; e-- {
		j = t.Nodes[j].End
	}
	return j, true
}

// Any returns the value of node i as Parse's tree: map[string]any,
// []any, string, json.Number, bool, nil or Unreadable. Containers are
// built anew on each call.
func (t *Tree) Any(i int32) any {
	n := &t.Nodes[i]
	switch n.Kind {
	case NullNode:
		return nil
	case FalseNode:
		return false
	case TrueNode:
		return true
	case NumberNode:
		return json.Number(t.str(n.text))
	case StringNode:
		return t.str(n.text)
	case ObjectNode:
		m := make(map[string]any, n.Len)
		for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
			m[t.str(t.Nodes[j].key)] = t.Any(j)
		}
		return m
	case ArrayNode:
		a := make([]any, 0, n.Len)
		for j, k := i+1, int32(0); k < n.Len; j, k = t.Nodes[j].End, k+1 {
			a = append(a, t.Any(j))
		}
		return a
	}
	return Unreadable{}
}
