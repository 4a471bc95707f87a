package jsonstrict

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// wideObject returns an object of n members "k0": 0 ... "k<n-1>": n-1, with
// extra appended to its members.
func wideObject(n int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"w":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	b.WriteString(extra)
	b.WriteString(`}}`)
	return b.String()
}

// TestParseTreeFindsDuplicatesInWideObjects checks duplicate keys on both
// sides of linearKeys, where the parser stops comparing keys and builds a
// map of them, including a key written with escapes.
func TestParseTreeFindsDuplicatesInWideObjects(t *testing.T) {
	for _, n := range []int{linearKeys - 1, linearKeys, linearKeys + 1, 3 * linearKeys} {
		for _, tt := range []struct{ name, extra, key string }{
			{"first key again", `,"k0":"x"`, "k0"},
			{"last key again", fmt.Sprintf(`,"k%d":"x"`, n-1), fmt.Sprintf("k%d", n-1)},
			{"escaped key again", `,"\u006b1":{"deep":[1]}`, "k1"},
		} {
			t.Run(fmt.Sprintf("%d members/%s", n, tt.name), func(t *testing.T) {
				tree, err := Parse([]byte(wideObject(n, tt.extra)))
				var r *Refusal
				if !errors.As(err, &r) || r.Kind != DuplicateKey || r.Key != tt.key || r.Object != "w" || r.Path != "w."+tt.key {
					t.Fatalf("Parse error = %v (%+v), want duplicate key %q in w", err, r, tt.key)
				}
				w := tree.(map[string]any)["w"].(map[string]any)
				if len(w) != n || w[tt.key] != (Unreadable{}) {
					t.Errorf("w has %d keys, %q = %v; want %d keys and Unreadable", len(w), tt.key, w[tt.key], n)
				}
				if w["k2"] != json.Number("2") {
					t.Errorf("k2 = %v, want 2", w["k2"])
				}
			})
		}
		t.Run(fmt.Sprintf("%d members/no duplicate", n), func(t *testing.T) {
			tree, err := Parse([]byte(wideObject(n, `,"K0":0,"k0 ":0`)))
			if err != nil {
				t.Fatal(err)
			}
			if w := tree.(map[string]any)["w"].(map[string]any); len(w) != n+2 {
				t.Errorf("w has %d keys, want %d", len(w), n+2)
			}
		})
	}
}

// TestTreeReadsInPlace checks Member, Element, Key, Text and Any against
// the document, with escaped and unescaped strings side by side, for
// ParseTree and ParseTreeShared; and that ParseTree's strings are its own
// copy (the document changed after it leaves them as they were) where
// ParseTreeShared's are the document's.
func TestTreeReadsInPlace(t *testing.T) {
	for _, tt := range []struct {
		name   string
		parse  func([]byte) (*Tree, error)
		shared bool
	}{{"ParseTree", ParseTree, false}, {"ParseTreeShared", ParseTreeShared, true}} {
		t.Run(tt.name, func(t *testing.T) {
			doc := []byte(`{"a":{"x":"pl\u0061in","y\n":[10,"t\tab",{"z":null}]},"b":true,"c":-1.5e3,"d":[],"e":"abc"}`)
			tree, err := tt.parse(doc)
			if err != nil {
				t.Fatal(err)
			}
			readsInPlace(t, tree)
			e, _ := tree.Member(0, "e")
			copy(doc[len(doc)-5:], "xyz")
			want := "abc"
			if tt.shared {
				want = "xyz"
			}
			if got := tree.Text(e); got != want {
				t.Errorf("e after the document's "+`"abc"`+" became "+`"xyz"`+": %q, want %q", got, want)
			}
		})
	}
}

func readsInPlace(t *testing.T, tree *Tree) {
	t.Helper()
	a, ok := tree.Member(0, "a")
	if !ok || tree.Key(a) != "a" || tree.Nodes[a].Kind != ObjectNode || tree.Nodes[a].Len != 2 {
		t.Fatalf("Member(0, a) = %d, %v", a, ok)
	}
	x, _ := tree.Member(a, "x")
	if tree.Text(x) != "plain" || tree.Nodes[x].Kind != StringNode {
		t.Errorf("a.x = %q (kind %d), want plain", tree.Text(x), tree.Nodes[x].Kind)
	}
	y, ok := tree.Member(a, "y\n")
	if !ok || tree.Nodes[y].Kind != ArrayNode || tree.Nodes[y].Len != 3 {
		t.Fatalf(`Member(a, "y\n") = %d, %v`, y, ok)
	}
	if e, ok := tree.Element(y, 1); !ok || tree.Text(e) != "t\tab" {
		t.Errorf("a.y[1] = %q, %v", tree.Text(e), ok)
	}
	e2, _ := tree.Element(y, 2)
	if z, ok := tree.Member(e2, "z"); !ok || tree.Nodes[z].Kind != NullNode {
		t.Errorf("a.y[2].z = %d, %v", z, ok)
	}
	if _, ok := tree.Element(y, 3); ok {
		t.Error("a.y[3] found")
	}
	if _, ok := tree.Member(y, "x"); ok {
		t.Error("Member of an array found something")
	}
	if c, _ := tree.Member(0, "c"); tree.Text(c) != "-1.5e3" || tree.Nodes[c].Kind != NumberNode {
		t.Errorf("c = %q, want the number's text", tree.Text(c))
	}
	if got := tree.Nodes[0].End; got != int32(len(tree.Nodes)) {
		t.Errorf("root's End = %d, want %d", got, len(tree.Nodes))
	}
	want := map[string]any{
		"a": map[string]any{"x": "plain", "y\n": []any{json.Number("10"), "t\tab", map[string]any{"z": nil}}},
		"b": true, "c": json.Number("-1.5e3"), "d": []any{}, "e": "abc",
	}
	if diff := cmp.Diff(want, tree.Any(0)); diff != "" {
		t.Errorf("Any(0) (-want +got):\n%s", diff)
	}
	tree.SetString(x, "a\xffb")
	if tree.Text(x) != "a\xffb" || tree.Text(e2-1) != "t\tab" {
		t.Errorf("after SetString: a.x = %q, a.y[1] = %q", tree.Text(x), tree.Text(e2-1))
	}
}

// TestNodeSlabTreesKeepTheirNodes parses documents one after another from
// one NodeSlab, as the worker parses a batch: small ones that share its
// arrays, one denser than initialNodes expects (its nodes outgrow the
// room into an array of their own), one larger than a whole slab, one
// refused (a duplicate key: its tree is kept) and invalid ones (their
// room left to the next); then checks every tree kept against ParseTree
// of its document, so that no tree's nodes were written over by a later
// one's.
func TestNodeSlabTreesKeepTheirNodes(t *testing.T) {
	var docs []string
	for i := range 200 {
		switch {
		case i%50 == 7:
			docs = append(docs, `{"dense":[`+strings.Repeat("1,", 300)+`1]}`)
		case i%50 == 13:
			docs = append(docs, wideObject(2*slabNodes, ""))
		case i%50 == 21:
			docs = append(docs, `{"a":1,"a":2,"b":[true]}`)
		case i%50 == 33:
			docs = append(docs, `{"truncated":[1,2`)
		case i%50 == 34:
			docs = append(docs, "{\"bad\":\"\xff\"}")
		default:
			docs = append(docs, fmt.Sprintf(`{"eventType":"T%d","payload":{"n":%d,"s":"x\ty","list":[%d,{"k":null}]}}`, i, i, i))
		}
	}
	var slab NodeSlab
	trees := make([]*Tree, len(docs))
	for i, d := range docs {
		tree, err := slab.ParseTreeShared([]byte(d))
		want, wantErr := ParseTree([]byte(d))
		if (err == nil) != (wantErr == nil) || (tree == nil) != (want == nil) {
			t.Fatalf("doc %d: NodeSlab: %v, %v; ParseTree: %v, %v", i, tree != nil, err, want != nil, wantErr)
		}
		trees[i] = tree
	}
	kept := 0
	for i, tree := range trees {
		if tree == nil {
			continue
		}
		kept++
		want, _ := ParseTree([]byte(docs[i]))
		if diff := cmp.Diff(want.Any(0), tree.Any(0)); diff != "" {
			t.Errorf("doc %d changed after later documents (-ParseTree +NodeSlab):\n%s", i, diff)
		}
		if len(tree.Nodes) != cap(tree.Nodes) {
			t.Errorf("doc %d: %d nodes with room for %d: a later tree could be appended into it", i, len(tree.Nodes), cap(tree.Nodes))
		}
	}
	if kept != 192 {
		t.Errorf("%d trees kept, want 192 (8 documents invalid)", kept)
	}
}

// TestTreeRaw checks Raw: each object's and array's text as the document
// has it (whitespace, escapes, member order), nothing for other nodes or
// an edited tree, and the same spans in a detached tree.
func TestTreeRaw(t *testing.T) {
	doc := " {\"b\" : [1, {\"x\":\"\\u00e9\"} ,[]], \"a\":{ } ,\"s\":\"{}\", \"n\":-1.50e3}\n"
	tree, err := ParseTree([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range tree.Nodes {
		raw, ok := tree.Raw(int32(i))
		if k := tree.Nodes[i].Kind; ok != (k == ObjectNode || k == ArrayNode) {
			t.Errorf("node %d (kind %d): Raw ok = %v", i, k, ok)
		}
		if ok {
			got = append(got, raw)
			if tree.Text(int32(i)) != "" {
				t.Errorf("node %d: Text = %q, want \"\" for a container", i, tree.Text(int32(i)))
			}
		}
	}
	want := []string{
		"{\"b\" : [1, {\"x\":\"\\u00e9\"} ,[]], \"a\":{ } ,\"s\":\"{}\", \"n\":-1.50e3}",
		"[1, {\"x\":\"\\u00e9\"} ,[]]",
		"{\"x\":\"\\u00e9\"}",
		"[]",
		"{ }",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Raw of the containers (-want +got):\n%s", diff)
	}
	if d, _ := tree.Raw(0); d != strings.TrimSpace(doc) {
		t.Errorf("Raw(0) = %q", d)
	}
	detached := tree.Detached(strings.Clone(doc))
	if d, ok := detached.Raw(1); !ok || d != want[1] {
		t.Errorf("detached Raw(1) = %q, %v; want %q", d, ok, want[1])
	}
	j, _ := tree.Member(0, "s")
	tree.SetString(j, "edited")
	if d, ok := tree.Raw(0); ok || d != "" {
		t.Errorf("Raw(0) after SetString = %q, %v; want \"\", false", d, ok)
	}
}
