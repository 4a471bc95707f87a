package projection

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/go-cmp/cmp"
)

// costExprs are derives of the definition files in testdata, examples and
// internal/bench, and expressions whose cost depends on the data (string,
// list and map sizes), which must keep the runtime cost limit.
var costExprs = []string{
	"payload.points / payload.games",
	"has(payload.games) ? payload.points / payload.games : null",
	"has(payload.games) && payload.games != 0 && has(payload.points) ? double(payload.points) / double(payload.games) : dyn(null)",
	`payload.?tier.orValue("free")`,
	"has(payload.stars) ? payload.stars : null",
	"payload.?required.orValue(null)",
	"double(payload.?n_int.orValue(0)) / 4.0",
	`{"k": [1, 2.5, "x", null], "n": payload.?n_int.orValue(0), "at": timestamp("2024-06-25T16:00:00.5Z")}`,
	"event.sequenceNumber",
	"event.extra.region + '-' + event.forkId",
	"payload.s + payload.s",
	"payload.s.upperAscii()",
	"payload.l.map(x, payload.l.map(y, [x, y]))",
	"payload.l.exists(x, x == 'a')",
	"size(payload.m) > 1",
	"[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, a+b+c+d+e+f > 0))))))",
}

// TestDeriveCountsCostOnlyWhereTheLimitIsReachable checks that
// compileDerive leaves out the runtime cost count exactly for the
// expressions whose estimated worst case is within deriveCostLimit, and
// that the estimate bounds what the count finds on sample events (so that
// leaving it out cannot let an expression pass the limit).
func TestDeriveCountsCostOnlyWhereTheLimitIsReachable(t *testing.T) {
	env, err := deriveEnv()
	if err != nil {
		t.Fatal(err)
	}
	long := make([]any, 50)
	for i := range long {
		long[i] = json.Number("7")
	}
	events := []*Event{
		hotEvent(t, hotFollowed),
		hotEvent(t, hotRated),
		eventOf(t, map[string]any{"eventType": "E", "entityId": "e", "forkId": "f", "tenantSchema": "s", "irVersion": "",
			"sequenceNumber": json.Number("3"), "ts": json.Number("5"),
			"extra": map[string]any{"region": "eu"},
			"payload": map[string]any{"points": json.Number("10"), "games": json.Number("4"), "stars": json.Number("5"),
				"n_int": json.Number("8"), "required": json.Number("1"), "s": "some text", "l": long,
				"m": map[string]any{"a": nil, "b": true}}}),
	}
	var limited int
	for _, expr := range costExprs {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", expr, iss.Err())
		}
		est, err := env.EstimateCost(ast, unknownSizes{})
		if err != nil {
			t.Fatalf("%s: estimate: %v", expr, err)
		}
		counted, err := env.Program(ast, cel.CostLimit(deriveCostLimit))
		if err != nil {
			t.Fatal(err)
		}
		prg, err := compileDerive(expr)
		if err != nil {
			t.Fatal(err)
		}
		reachable := est.Max > deriveCostLimit
		if reachable {
			limited++
		}
		for _, ev := range events {
			_, det, _ := counted.Eval(deriveVars(ev))
			if c := det.ActualCost(); c == nil || !reachable && *c > est.Max {
				t.Errorf("%s: cost %v beyond the estimate %d", expr, c, est.Max)
			}
			_, det, _ = prg.Eval(deriveVars(ev))
			if got := det.ActualCost() != nil; got != reachable {
				t.Errorf("%s (estimate %d..%d): cost counted %v, want %v", expr, est.Min, est.Max, got, reachable)
			}
		}
	}
	if limited < 5 || limited == len(costExprs) {
		t.Errorf("%d of %d expressions keep the cost limit: the sample does not test both sides", limited, len(costExprs))
	}
}

// TestPlanReusesActivations plans events one after another with derives
// over event and payload: each statement holds its own event's values
// (an activation taken again holds nothing of the last event), and an
// activation is reused, not allocated, once the pool has one.
func TestPlanReusesActivations(t *testing.T) {
	p := inlineProjection(t, `seq:   { type: bigint, derive: "event.sequenceNumber * 10" }
      extra: { type: text,   derive: "event.?extra.orValue('none')" }
      pts:   { type: bigint, derive: "payload.?points.orValue(-1)" }`)
	for i, tc := range []struct {
		value string
		want  []any
	}{
		{`{"eventType":"E","entityId":"a","forkId":"f","tenantSchema":"t","irVersion":"","sequenceNumber":1,"ts":0,"extra":"x","payload":{"points":5}}`, []any{"a", "10", "x", "5"}},
		{`{"eventType":"E","entityId":"b","forkId":"f","tenantSchema":"t","irVersion":"","sequenceNumber":2,"ts":0,"payload":{}}`, []any{"b", "20", "none", "-1"}},
		{`{"eventType":"E","entityId":"c","forkId":"f","tenantSchema":"t","irVersion":"","sequenceNumber":3,"ts":0,"extra":"z","payload":{"points":7}}`, []any{"c", "30", "z", "7"}},
	} {
		st, err := p.Plan(hotEvent(t, tc.value))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, st.Args[:4]); diff != "" {
			t.Errorf("event %d: args (-want +got):\n%s", i, diff)
		}
	}
	ev := hotEvent(t, `{"eventType":"E","entityId":"a","forkId":"f","tenantSchema":"t","irVersion":"","sequenceNumber":1,"ts":0,"payload":{"points":5}}`)
	taken := 0
	for range 100 {
		if a, _ := p.vars.Get().(*deriveActivation); a != nil {
			taken++
			p.vars.Put(a)
		}
		if _, err := p.Plan(ev); err != nil {
			t.Fatal(err)
		}
	}
	if taken == 0 {
		t.Error("no activation was ever back in the pool after Plan")
	}
}

// TestDeriveOfAResultKindNoColumnTakesIsRefusedAtLoad: a derive whose
// result the type checker knows to be bytes, a duration or a type is
// refused when the definitions load, naming the kind (new-user trial: it
// passed validate and failed every event); one typed dyn is checked per
// event (TestEvalDerive).
func TestDeriveOfAResultKindNoColumnTakesIsRefusedAtLoad(t *testing.T) {
	for expr, kind := range map[string]string{"b'abc'": "bytes", "duration('1s')": "duration", "type(1)": "type"} {
		_, err := compileDerive(expr)
		if err == nil || !strings.Contains(err.Error(), "returns a "+kind) || !strings.Contains(err.Error(), "which no column takes") {
			t.Errorf("compileDerive(%q) = %v, want an error naming %s", expr, err, kind)
		}
	}
	for _, expr := range []string{"dyn(payload.a)", "payload.a", "timestamp('2024-01-01T00:00:00Z')", "[1, 'a']", "{'k': 1}", "null"} {
		if _, err := compileDerive(expr); err != nil {
			t.Errorf("compileDerive(%q) = %v, want it compiled", expr, err)
		}
	}
	// Typed dyn, or a list or map of such values: known when it runs, and
	// for an expression that reads no event field that is at load
	// (new-user trial: "{1: 'a'}" was taken, and every event
	// dead-lettered).
	for _, expr := range []string{"dyn(b'x')", "{1: 2}", "[duration('1s')]"} {
		if _, err := compileDerive(expr); err == nil || !strings.Contains(err.Error(), "reads no event field and gives a value no column takes") {
			t.Errorf("compileDerive(%q) = %v, want it refused as a value no column takes", expr, err)
		}
	}
}

// TestDeriveReadsTheTreeAsCELMaps checks that payload read in place from
// the event's tree (treeObject) gives every derive the result, or the
// error, that the same payload built as map[string]any gives as CEL's own
// map.
func TestDeriveReadsTheTreeAsCELMaps(t *testing.T) {
	ev := eventOf(t, map[string]any{
		"eventType": "E", "entityId": "e", "forkId": "f", "tenantSchema": "s", "irVersion": "", "sequenceNumber": json.Number("1"), "ts": json.Number("2"),
		"payload": map[string]any{
			"i": json.Number("7"), "f": json.Number("2.5"), "huge": json.Number("1e400"), "s": "x", "b": true, "n": nil,
			"l": []any{json.Number("1"), map[string]any{"a": "b"}},
			"m": map[string]any{"a": nil, "b": true},
			"o": map[string]any{"p": map[string]any{"q": json.Number("3")}},
			"":  "empty key",
		},
	})
	exprs := []string{
		"size(payload)", "'i' in payload", "'zz' in payload", "has(payload.s)", "has(payload.zz)", "has(payload.o.p)",
		"payload.exists(k, k == 's')", "payload.all(k, k != 'zz')", "payload.map(k, k).size()", "payload.filter(k, k.startsWith('h'))",
		"payload == payload", "payload.m == {'a': null, 'b': true}", "payload.m != {'a': null}", "payload.m", "payload.o",
		"payload.o.p.q + 1", "payload.l[1].a", "payload.l", "payload.?o.?p.?q.orValue(0)", "payload.?o.?zz.?q.orValue(0)",
		"payload['s']", "payload['']", "dyn(payload)[1]", "1 in dyn(payload)", "payload.zz", "payload.o.zz", "payload.huge", "payload.i + payload.f",
		"type(payload) == map", "type(payload.o) == map", "dyn(payload).size()", "string(payload.i)", "payload.m.b && payload.b",
		"event.payload.i", "event.payload == payload", "{'x': payload.o}", "[payload.m, payload.o.p]",
	}
	for _, expr := range exprs {
		t.Run(expr, func(t *testing.T) {
			prg, err := compileDerive(expr)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			tree := deriveVars(ev)
			if _, ok := tree.payload.(*treeObject); !ok {
				t.Fatalf("payload is a %T, want the tree read in place", tree.payload)
			}
			built := &deriveActivation{ev: ev, payload: types.NewStringInterfaceMap(treeAdapter{}, ev.Payload())}
			got, err := evalDerive(prg, tree)
			want, werr := evalDerive(prg, built)
			// A number out of range read from the tree names its path
			// before the built map's error.
			if (err == nil) != (werr == nil) || (err != nil && !strings.HasSuffix(err.Error(), werr.Error())) {
				t.Fatalf("error %v; with the built map %v", err, werr)
			}
			if errors.Is(werr, errNumberRange) && !strings.HasPrefix(err.Error(), `payload.huge: "1e400": `) {
				t.Errorf("error %v does not name payload.huge", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("result (-built map +tree):\n%s", diff)
			}
		})
	}
}

// TestDeriveErrorNamesTheNumberItRead checks that a derive reading a
// number CEL cannot hold (beyond float64, or nonzero and read as 0) names
// that number's path, wherever it is, and never another number of the
// event (new-user trial: double(payload.f) named payload.aa, which sorts
// first; event.extra was named payload.big; a map holding one gave
// "result of type error cannot be stored"; 1e-400 was read as 0).
func TestDeriveErrorNamesTheNumberItRead(t *testing.T) {
	tests := []struct {
		name, expr, extra, payload string
		want                       string // the error's start; "" when no path may be named
	}{
		{"the number read, not the first in key order", "double(payload.f)", "", `{"aa":1e400,"f":1e400}`, `payload.f: "1e400": `},
		{"a top-level member", "string(event.extra)", `,"extra":1e400`, `{"big":1e400}`, `event.extra: "1e400": `},
		{"nested, in a map returned", "payload.o", "", `{"o":{"k":"s","n":1e400}}`, `payload.o.n: "1e400": `},
		{"a key that is not a plain name", "payload['a b'].n + 1.0", "", `{"a b":{"n":-2e308}}`, `payload["a b"].n: "-2e308": `},
		{"nonzero read as 0", "double(payload.tiny) * 2.0", "", `{"tiny":1e-400}`, `payload.tiny: "1e-400": `},
		{"in a list, the only one", "payload.l", "", `{"l":[1,1e400]}`, `payload.l[1]: "1e400": `},
		{"in a list, one of two: no guess", "payload.l", "", `{"l":[1e400],"m":1e400}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(`{"eventType":"E","entityId":"e","forkId":"f","tenantSchema":"s","irVersion":"",` +
				`"sequenceNumber":1,"ts":2` + tt.extra + `,"payload":` + tt.payload + `}`))
			if err != nil {
				t.Fatal(err)
			}
			prg, err := compileDerive(tt.expr)
			if err != nil {
				t.Fatal(err)
			}
			_, err = evalDerive(prg, deriveVars(ev))
			if err == nil {
				t.Fatal("no error")
			}
			err = deriveError(err, ev)
			if !errors.Is(err, errNumberRange) {
				t.Fatalf("error %v is not errNumberRange", err)
			}
			if tt.want == "" {
				if err.Error() != errNumberRange.Error() {
					t.Errorf("error %q names a path", err)
				}
			} else if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error %q, want it to start with %q", err, tt.want)
			}
		})
	}
	// A number close to 0 that is 0, or that a double holds, is read.
	for _, n := range []string{"0e-400", "-0.000e5", "4.9e-324", "1e-300"} {
		if v := numberValue(n); types.IsError(v) {
			t.Errorf("numberValue(%s) = %v", n, v)
		}
	}
}
