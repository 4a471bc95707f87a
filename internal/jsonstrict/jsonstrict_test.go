package jsonstrict

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseStrictDocuments(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want any
	}{
		{"object", ` {"a":1,"b":[true,false,null],"c":{"d":"e"}} `,
			map[string]any{"a": json.Number("1"), "b": []any{true, false, nil}, "c": map[string]any{"d": "e"}}},
		{"numbers kept exact", `[9007199254740993,1e400,-0,12345678901234567890.5]`,
			[]any{json.Number("9007199254740993"), json.Number("1e400"), json.Number("-0"), json.Number("12345678901234567890.5")}},
		{"escapes and a surrogate pair", `{"s":"\u00e9\ud83d\ude00\n\"\\\/\u0000"}`, map[string]any{"s": "é😀\n\"\\/\x00"}},
		{"same key in different objects", `{"a":{"a":1},"b":[{"a":1},{"a":2}]}`,
			map[string]any{"a": map[string]any{"a": json.Number("1")}, "b": []any{map[string]any{"a": json.Number("1")}, map[string]any{"a": json.Number("2")}}}},
		{"keys equal only as written", `{"a":1,"\u0062":2}`, map[string]any{"a": json.Number("1"), "b": json.Number("2")}},
		{"scalar", `"x"`, "x"},
		{"nesting at MaxDepth", strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.want != nil {
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("tree (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestParseRefusesWhatStrictParsersMayReadDifferently(t *testing.T) {
	deep := `{"a":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`
	tests := []struct {
		name string
		doc  string
		want Refusal
		// tree is the tree of what can be read, nil when not checked.
		tree any
	}{
		{"duplicate key", `{"a":1,"a":2,"b":3}`, Refusal{Kind: DuplicateKey, Path: "a", Key: "a"},
			map[string]any{"a": Unreadable{}, "b": json.Number("3")}},
		{"duplicate key after unescaping", `{"x":{"a":1,"\u0061":2}}`, Refusal{Kind: DuplicateKey, Path: "x.a", Object: "x", Key: "a"}, nil},
		{"duplicate key that is not a plain name", `{"l":[{"a.b":1,"a.b":1}]}`,
			Refusal{Kind: DuplicateKey, Path: `l[0]["a.b"]`, Object: "l[0]", Key: "a.b"}, nil},
		{"unpaired high surrogate", `{"s":"a\ud800b"}`, Refusal{Kind: UnpairedSurrogate, Path: "s", Escape: `\ud800`, Offset: 8},
			map[string]any{"s": Unreadable{}}},
		{"lone low surrogate in an array", `{"l":["ok","\udc00"]}`, Refusal{Kind: UnpairedSurrogate, Path: "l[1]", Escape: `\udc00`, Offset: 13}, nil},
		{"high surrogate before a non-surrogate", `{"s":"\ud83d\u0041"}`, Refusal{Kind: UnpairedSurrogate, Path: "s", Escape: `\ud83d`, Offset: 7}, nil},
		{"surrogate in a key", `{"o":{"\uDFFF":1}}`, Refusal{Kind: UnpairedSurrogate, Path: "o", Escape: `\uDFFF`, Offset: 8}, nil},
		{"too deep", deep, Refusal{Kind: TooDeep, Path: "a", Offset: 131}, nil},
		{"first reason wins", `{"s":"\ud800","a":1,"a":2}`, Refusal{Kind: UnpairedSurrogate, Path: "s", Escape: `\ud800`, Offset: 7}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tree, err := Parse([]byte(tt.doc))
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("Parse error = %v (%T), want a *Refusal", err, err)
			}
			if diff := cmp.Diff(tt.want, *r); diff != "" {
				t.Errorf("refusal (-want +got):\n%s", diff)
			}
			if tree == nil {
				t.Errorf("no tree with the refusal")
			}
			if tt.tree != nil {
				if diff := cmp.Diff(tt.tree, tree); diff != "" {
					t.Errorf("tree (-want +got):\n%s", diff)
				}
			}
			if IsObject([]byte(tt.doc)) {
				t.Errorf("IsObject = true for a refused document")
			}
		})
	}
}

func TestParseRejectsWhatIsNotJSON(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"empty", ``, "not valid JSON: unexpected end of JSON input at byte 0"},
		{"garbage", `garbage`, "not valid JSON: invalid character 'g' looking for beginning of value at byte 1"},
		{"trailing value", `{}{}`, "not valid JSON: invalid character '{' after top-level value at byte 3"},
		{"trailing comma", `{"a":1,}`, "not valid JSON: invalid character '}' looking for beginning of object key string at byte 8"},
		{"missing colon", `{"a" 1}`, "not valid JSON: invalid character '1' after object key at byte 6"},
		{"mismatched brackets", `{"a":[}`, "not valid JSON: invalid character '}' looking for beginning of value at byte 7"},
		{"too deep for encoding/json", strings.Repeat("[", 10001), "not valid JSON: invalid character '[' exceeded max depth at byte 10001"},
		{"invalid UTF-8", "{\"s\":\"\xff\"}", "not valid UTF-8: invalid byte 0xff at byte 7"},
		{"UTF-8 encoded surrogate", "{\"s\":\"\xed\xa0\x80\"}", "not valid UTF-8: invalid byte 0xed at byte 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tree, err := Parse([]byte(tt.doc))
			if err == nil || tree != nil {
				t.Fatalf("Parse = %v, %v; want no tree and an error", tree, err)
			}
			var se *SyntaxError
			var ue *UTF8Error
			if !errors.As(err, &se) && !errors.As(err, &ue) {
				t.Errorf("error %v (%T) is neither a *SyntaxError nor a *UTF8Error", err, err)
			}
			if err.Error() != tt.want {
				t.Errorf("error %q, want %q", err, tt.want)
			}
		})
	}
}

func TestIsObject(t *testing.T) {
	for doc, want := range map[string]bool{
		`{}`:               true,
		" {\"a\":[1]}\n":   true,
		`[]`:               false,
		`null`:             false,
		`"{}"`:             false,
		``:                 false,
		`{"a":1,"a":1}`:    false,
		`{"a":"\ud800"}`:   false,
		"{\"a\":\"\xff\"}": false,
		`{"a":1`:           false,
	} {
		if got := IsObject([]byte(doc)); got != want {
			t.Errorf("IsObject(%q) = %v, want %v", doc, got, want)
		}
	}
}

func TestRefusalError(t *testing.T) {
	for _, tt := range []struct {
		r    Refusal
		want string
	}{
		{Refusal{Kind: DuplicateKey, Path: "a", Key: "a"}, `a: duplicate key "a"`},
		{Refusal{Kind: DuplicateKey, Path: "p.a", Object: "p", Key: "a"}, `p.a: duplicate key "a" in p`},
		{Refusal{Kind: UnpairedSurrogate, Path: "s", Escape: `\ud800`, Offset: 7}, `s: unpaired UTF-16 surrogate escape \ud800 in a string at byte 7`},
		{Refusal{Kind: TooDeep, Path: "a", Offset: 131}, `a: nests deeper than 126 levels at byte 131`},
	} {
		if got := tt.r.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}
