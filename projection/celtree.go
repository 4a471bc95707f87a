package projection

import (
	"reflect"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// treeValue returns node i of an event tree, the member key of the object
// parent, as a CEL value: an object as a *treeObject, read in place; a
// string, bool or null as CEL's; a number as numberValue converts it, its
// range error naming its path (numberRangeError); an array as a list of
// the values treeAdapter adapts, built anew.
func treeValue(t *jsonstrict.Tree, i int32, parent *treeObject, key string) ref.Val {
	switch t.Nodes[i].Kind {
	case jsonstrict.ObjectNode:
		return &treeObject{t: t, i: i, parent: parent, key: key}
	case jsonstrict.StringNode:
		return types.String(t.Text(i))
	case jsonstrict.NumberNode:
		v := numberValue(t.Text(i))
		if types.IsError(v) {
			return types.WrapErr(&numberRangeError{path: parent.memberPath(key), text: t.Text(i)})
		}
		return v
	case jsonstrict.TrueNode:
		return types.True
	case jsonstrict.FalseNode:
		return types.False
	case jsonstrict.NullNode:
		return types.NullValue
	}
	return treeAdapter{}.NativeToValue(t.Any(i))
}

// numberRangeError is errNumberRange for the number text at path.
type numberRangeError struct{ path, text string }

// Error returns `<path>: "<text>": ` and errNumberRange's text.
func (e *numberRangeError) Error() string {
	return e.path + ": " + quoteValue(e.text) + ": " + errNumberRange.Error()
}

func (e *numberRangeError) Unwrap() error { return errNumberRange }

// treeObject is an object of an event tree as a CEL map (traits.Mapper)
// with string keys. The lookups a derive makes most (a field, has(), an
// optional field, size) read the tree in place; the other operations
// (iteration, equality, conversion) act on the object built as a
// map[string]any (Tree.Any), as types.NewStringInterfaceMap with
// treeAdapter, so that they behave exactly as CEL's own maps.
type treeObject struct {
	t *jsonstrict.Tree
	i int32
	// The object is the member key of parent, or, with no parent, the
	// variable name ("payload", "event").
	parent *treeObject
	key    string
	name   string
	m      traits.Mapper // built on first use
}

// memberPath returns the path of o's member key: "payload.points",
// `event["a b"]`; key alone for a nil o.
func (o *treeObject) memberPath(key string) string {
	if o == nil {
		return key
	}
	return string(jsonstrict.AppendKey(o.appendPath(nil), key))
}

func (o *treeObject) appendPath(b []byte) []byte {
	if o.parent == nil {
		return append(b, o.name...)
	}
	return jsonstrict.AppendKey(o.parent.appendPath(b), o.key)
}

// mapper returns the object as CEL's map of its map[string]any tree.
func (o *treeObject) mapper() traits.Mapper {
	if o.m == nil {
		m, _ := o.t.Any(o.i).(map[string]any)
		o.m = types.NewStringInterfaceMap(treeAdapter{}, m)
	}
	return o.m
}

// Find returns the value of key and true, nil and false when the object
// has no such key; for a key that is not a string, what CEL's map returns.
func (o *treeObject) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		return o.mapper().Find(key)
	}
	j, ok := o.t.Member(o.i, string(k))
	if !ok {
		return nil, false
	}
	return treeValue(o.t, j, o, string(k)), true
}

// Get returns the value of key, or CEL's error for a missing key.
func (o *treeObject) Get(key ref.Val) ref.Val {
	if v, found := o.Find(key); found {
		return v
	}
	return o.mapper().Get(key)
}

// Contains reports whether key is one of the object's keys.
func (o *treeObject) Contains(key ref.Val) ref.Val {
	if _, ok := key.(types.String); !ok {
		return o.mapper().Contains(key)
	}
	_, found := o.Find(key)
	return types.Bool(found)
}

// Size returns the number of members (an event object has no duplicate
// key: DecodeEvent refuses it).
func (o *treeObject) Size() ref.Val { return types.Int(o.t.Nodes[o.i].Len) }

func (o *treeObject) Iterator() traits.Iterator { return o.mapper().Iterator() }

func (o *treeObject) ConvertToNative(typeDesc reflect.Type) (any, error) {
	return o.mapper().ConvertToNative(typeDesc)
}

func (o *treeObject) ConvertToType(typeVal ref.Type) ref.Val {
	return o.mapper().ConvertToType(typeVal)
}

func (o *treeObject) Equal(other ref.Val) ref.Val { return o.mapper().Equal(other) }

func (o *treeObject) Type() ref.Type { return types.MapType }

func (o *treeObject) Value() any { return o.mapper().Value() }
