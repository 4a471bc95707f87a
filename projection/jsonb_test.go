package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/internal/pgtest"
)

// encodingJSONText is what jsonbText must return: encoding/json's Encoder
// with SetEscapeHTML(false), without the trailing newline.
func encodingJSONText(v any) (string, error) {
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// checkJSONBText fails t unless jsonbText(v) is encoding/json's text of v,
// or both refuse v.
func checkJSONBText(t *testing.T, v any) {
	t.Helper()
	want, wantErr := encodingJSONText(v)
	got, err := jsonbText(v)
	if (err != nil) != (wantErr != nil) || got != want {
		t.Errorf("jsonbText(%#v) = %q, %v; encoding/json: %q, %v", v, got, err, want, wantErr)
	}
}

// jsonbSeeds are JSON documents and strings for the jsonbText tests:
// events of the worker's tests and benchmarks, every escape encoding/json
// writes, invalid UTF-8, and numbers valid and not.
var jsonbSeeds = []string{
	specExampleEvent, hotFollowed, hotRated,
	testEventJSON(map[string]string{"payload": `{"big":9007199254740993,"dec":12345678901234567890.123456789,"l":[1,{"a":[]},null,true]}`}),
	testEventJSON(map[string]string{"payload": `{"esc":"\u00e9\ud83d\ude00\n\"\\\/","k":"\u006b","\u2028":"\u2029<>&"}`}),
	`{"b":1,"a":{"z":[],"y":{},"x":[[{"é":"\u0000\u001f\u007f\b\f\n\r\t"}]]},"A":false,"":null}`,
	`{"k01":1,"k02":2,"k03":3,"k04":4,"k05":5,"k06":6,"k07":7,"k08":8,"k09":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k18":18}`,
	`[-0,0.5,1e3,1E-3,-1.5e+300,123456789012345678901234567890]`,
	"a\xffb\xc3", "\xed\xa0\x80", "tab\there", `quote"back\slash`, "",
	"0", "-0", "01", "-", "1.", ".5", "1e", "1e+", "+1", "NaN", "1_000", "0x1F", " 1",
}

// TestJSONBTextMatchesEncodingJSON checks jsonbText against encoding/json
// on documents, on every seed as a string value, and on every seed as a
// json.Number (encoding/json refuses the ones that are not JSON numbers;
// jsonbText must too).
func TestJSONBTextMatchesEncodingJSON(t *testing.T) {
	for _, s := range jsonbSeeds {
		if tree, err := jsonstrict.Parse([]byte(s)); err == nil {
			checkJSONBText(t, tree)
		}
		checkTreeNodeJSONB(t, s)
		checkJSONBText(t, s)
		checkJSONBText(t, json.Number(s))
		checkJSONBText(t, []any{s, map[string]any{s: json.Number(s)}})
	}
	for c := range 256 {
		checkJSONBText(t, string([]byte{'x', byte(c), 'y'}))
	}
	// A derive's list may hold a CEL timestamp: encoding/json writes it.
	checkJSONBText(t, []any{time.Date(2024, 6, 25, 16, 0, 0, 5e8, time.UTC), json.Number("1")})
}

// FuzzJSONBText compares jsonbText with encoding/json on the tree of any
// strict JSON document, and on the input as a string and as a json.Number.
func FuzzJSONBText(f *testing.F) {
	for _, s := range jsonbSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if tree, err := jsonstrict.Parse([]byte(s)); err == nil {
			checkJSONBText(t, tree)
		}
		checkTreeNodeJSONB(t, s)
		checkJSONBText(t, s)
		checkJSONBText(t, json.Number(s))
	})
}

// checkTreeNodeJSONB checks that an object or array read in place from the
// tree of the strict document doc (a *treeNode, as lookupPath returns it)
// gets the JSON text and the jsonb check of the same value built as
// map[string]any or []any.
func checkTreeNodeJSONB(t *testing.T, doc string) {
	t.Helper()
	tree, err := jsonstrict.ParseTree([]byte(doc))
	if err != nil {
		return
	}
	for i := range int32(len(tree.Nodes)) {
		if k := tree.Nodes[i].Kind; k != jsonstrict.ObjectNode && k != jsonstrict.ArrayNode {
			continue
		}
		node, built := &treeNode{tree, i}, tree.Any(i)
		got, err := jsonbText(node)
		want, werr := jsonbText(built)
		if got != want || (err == nil) != (werr == nil) {
			t.Fatalf("node %d of %q: jsonbText = %q, %v; of the built value %q, %v", i, doc, got, err, want, werr)
		}
		// A map's first refusal depends on its iteration order: compare
		// whether both refuse.
		if r, rb := checkJSONB(node), checkJSONB(built); (r == "") != (rb == "") {
			t.Fatalf("node %d of %q: checkJSONB = %q; of the built value %q", i, doc, r, rb)
		}
		if jt, jb := jsonType(node), jsonType(built); jt != jb {
			t.Fatalf("node %d of %q: jsonType = %q; of the built value %q", i, doc, jt, jb)
		}
	}
}

// TestJSONBTextAllocations checks that the JSON text of an event's small
// object costs one allocation, the string returned: no reflection, no key
// slice, no buffer.
func TestJSONBTextAllocations(t *testing.T) {
	ev := hotEvent(t, hotFollowed)
	for name, device := range map[string]any{
		"read in place": lookupPath(ev, []string{"payload", "device"}),
		"built":         ev.Payload()["device"],
	} {
		if _, ok := device.(*treeNode); ok != (name == "read in place") {
			t.Fatalf("%s: payload.device is a %T", name, device)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = jsonbText(device) }); n != 1 {
			t.Errorf("jsonbText of payload.device %s: %v allocations, want 1", name, n)
		}
	}
}

// TestPlanSendsAJSONBValueAsTheRecordWritesIt checks Plan's argument for a
// jsonb column that is not a primary key column, given an object or array:
// the record's own text of it (jsonbRaw), which PostgreSQL reads as the
// same jsonb as jsonbText's; the same refusals as the general path (a NUL
// character, a number out of numeric's range); and a key column's value
// still in jsonbText's spelling (numbers canonical), its tombstone's.
func TestPlanSendsAJSONBValueAsTheRecordWritesIt(t *testing.T) {
	_, tps := keyProjections(t, `irVersion: v42
projections:
  - name: jv
    table: jv
    primaryKey: [u, k]
    columns:
      u: { type: text, from: payload.u }
      k: { type: jsonb, from: payload.k }
      d: { type: jsonb, from: payload.d }
      e: { type: jsonb, from: payload.l.1 }
    events: { J_UP: upsert }
`)
	p := tps[0]
	pool := pgtest.Pool(t)
	ctx := context.Background()
	values := []string{
		`{ "b" : [1, 2.50, -0, 1e3, 1E-3, 123456789012345678901234567890] , "a":{} }`,
		`{"esc":"\u00e9\ud83d\ude00\n\"\\\/","k":"\u006b","\u2028":"\u2029<>&","é":"\u001f\u007f\b\f\r\t"}`,
		`[ ]`, `[null, true, false, {"z": [[{}]]}]`,
		`{"big":9007199254740993,"dec":12345678901234567890.123456789,"l":[1,{"a":[]},null,true]}`,
	}
	for _, v := range values {
		payload := `{"u":"a","k":` + v + `,"d":` + v + `,"l":[0,` + v + `]}`
		ev := tblEvent(t, "s", "J_UP", 1, 1719331200000, payload)
		st, err := p.Plan(ev)
		if err != nil {
			t.Fatalf("Plan of %s: %v", v, err)
		}
		tree, err := jsonstrict.ParseTree([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		canonical, err := jsonbText(&treeNode{tree, 0})
		if err != nil {
			t.Fatal(err)
		}
		if key := canonicalJSONNumbers(canonical); st.Args[1] != key {
			t.Errorf("key column k of %s: %q, want jsonbText's %q", v, st.Args[1], key)
		}
		for _, i := range []int{2, 3} {
			if st.Args[i] != v {
				t.Errorf("column %s of %s: %q, want the record's text", p.cols[i].name, v, st.Args[i])
			}
		}
		var same bool
		if err := pool.QueryRow(ctx, "SELECT $1::jsonb = $2::jsonb", st.Args[2], canonical).Scan(&same); err != nil || !same {
			t.Errorf("PostgreSQL: %s::jsonb = %s::jsonb is %v, %v; want true", st.Args[2], canonical, same, err)
		}
	}
	for _, tc := range []struct{ value, reason string }{
		{`{"a":["\u0000"]}`, `a string with a NUL character (\u0000) cannot be stored in a jsonb column`},
		{`{"a\u0000":1}`, `a key with a NUL character (\u0000) cannot be stored in a jsonb column`},
		{`[1e1000000]`, `numeric`},
	} {
		ev := tblEvent(t, "s", "J_UP", 1, 1719331200000, `{"u":"a","k":1,"d":`+tc.value+`}`)
		_, err := p.Plan(ev)
		if err == nil || !strings.Contains(err.Error(), "column d") || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Plan of d = %s: %v, want a refusal of column d naming %q", tc.value, err, tc.reason)
		}
	}
}
