package projection

// CEL notes for derive columns (SPEC §4).
//
// A derive expression sees two variables, both map(string, dyn): event, the
// whole event object (eventType, entityId, ..., ts, payload and any unknown
// fields), and payload, the same as event.payload. JSON numbers become CEL
// int when they are integers that fit int64, else double (only for CEL: from
// columns keep the exact text); JSON null is CEL null. Optional syntax
// (payload.?x.orValue(null)), heterogeneous numeric comparisons and the
// cel-go strings and math extensions are enabled. A conditional whose other
// branch has a static type needs dyn(null) for NULL: `x > 0 ? 'yes' : dyn(null)`.
//
// The result is stored like a from value: null (or an empty optional) gives
// NULL, int and uint their decimal text, double its shortest round-trip text
// (exponent form such as 1e+21 for large values; NaN and ±Infinity as
// PostgreSQL spells them), string and bool as they are,
// timestamp as RFC 3339 in UTC, and lists and maps (with string keys) only into
// jsonb columns. A runtime error (division by zero, no such key, no matching
// overload, the cost limit) is permanent: the same event can never succeed.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
	"github.com/google/cel-go/parser"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// deriveCostLimit bounds the work of one derive evaluation (cel-go cost
// units, roughly one per operation or per element visited), so that a
// hostile expression such as nested comprehensions over a large payload list
// cannot spin. Field arithmetic costs a handful of units.
const deriveCostLimit = 1_000_000

// deriveEnv is the CEL environment of derive expressions. It is immutable and
// safe for concurrent use.
var deriveEnv = sync.OnceValues(func() (*cel.Env, error) {
	dynMap := cel.MapType(cel.StringType, cel.DynType)
	return cel.NewEnv(
		cel.CustomTypeAdapter(treeAdapter{}),
		cel.Variable("event", dynMap),
		cel.Variable("payload", dynMap),
		cel.OptionalTypes(),
		cel.CrossTypeNumericComparisons(true),
		ext.Strings(),
		ext.Math(),
		// A literal argument that fails every evaluation (matches('('),
		// duration('1x'), timestamp('x')) is refused at load, not
		// dead-lettered with every event (new-user trial).
		cel.ASTValidators(cel.ValidateRegexLiterals(), cel.ValidateDurationLiterals(), cel.ValidateTimestampLiterals()),
	)
})

// maxQuotedExpr is the longest derive expression an error quotes whole.
const maxQuotedExpr = 200

// quoteExpr is expr quoted for an error: whole up to maxQuotedExpr bytes,
// else its start and its length (new-user trial: a 40 KB expression nested
// too deeply was echoed whole).
func quoteExpr(expr string) string {
	if len(expr) <= maxQuotedExpr {
		return strconv.Quote(expr)
	}
	cut := maxQuotedExpr
	for cut > 0 && !utf8.RuneStart(expr[cut]) {
		cut--
	}
	return strconv.Quote(expr[:cut]) + fmt.Sprintf("… (%d bytes)", len(expr))
}

// derivePrg is a compiled derive expression. It is safe for concurrent use.
type derivePrg struct {
	cel.Program
	ast *cel.Ast
	// constant: the expression reads no event field, and gives value (as
	// fromCEL converts it) for every event; false too when fromCEL
	// refuses that value.
	constant bool
	value    any
	// traced is Program with every sub-expression's value kept
	// (cel.OptTrackState), made on the first error it explains.
	traced func() (cel.Program, error)
}

// compileDerive compiles a derive expression into a program that is safe
// for concurrent use. Errors give line:column and CEL's message, which names
// the function or operator and the argument types of a call no overload
// accepts (found no matching overload for '_+_' applied to '(int, string)').
//
// The program counts its cost as it runs, and stops at deriveCostLimit,
// unless cel-go's static estimate of its worst case (every list, map and
// string of unknown size taken at the largest size there is) is within the
// limit: then it cannot reach the limit, and runs without the count, which
// costs more than field arithmetic itself.
func compileDerive(expr string) (*derivePrg, error) {
	env, err := deriveEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		var msgs []string
		for _, e := range iss.Errors() {
			msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, e.Message))
		}
		return nil, fmt.Errorf("%s does not compile: %s", quoteExpr(expr), strings.Join(msgs, "; "))
	}
	// A result kind no column takes (docs/definitions.md, "Conversion
	// rules"), when the type checker knows it already: refused now, not at
	// every event.
	if kind, ok := map[types.Kind]string{types.BytesKind: "bytes", types.DurationKind: "duration", types.TypeKind: "type"}[ast.OutputType().Kind()]; ok {
		return nil, fmt.Errorf("%s returns a %s, which no column takes (want null, int, uint, double, string, bool, timestamp, a list or a map)", quoteExpr(expr), kind)
	}
	opts := []cel.ProgramOption{}
	if est, err := env.EstimateCost(ast, unknownSizes{}); err != nil || est.Max > deriveCostLimit {
		opts = append(opts, cel.CostLimit(deriveCostLimit))
	}
	prg, err := env.Program(ast, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", quoteExpr(expr), err)
	}
	d := &derivePrg{Program: prg, ast: ast, constant: constant(ast)}
	if d.constant {
		// It reads no field of the event: what it gives, or fails with,
		// it gives for every event (new-user trial: derive '1/0' was
		// taken, and every event would have been dead-lettered).
		out, _, err := prg.Eval(cel.NoVars())
		if err != nil {
			return nil, fmt.Errorf("%s reads no event field and fails: %v: every event would be dead-lettered", quoteExpr(expr), err)
		}
		// A value no column takes (a map of int keys, bytes in a list): the
		// same for every event too (new-user trial: derive "{1: 'a'}"
		// into jsonb was taken, and every event dead-lettered).
		if d.value, err = fromCEL(out, nil); err != nil {
			return nil, fmt.Errorf("%s reads no event field and gives a value no column takes: %v: every event would be dead-lettered", quoteExpr(expr), err)
		}
	}
	d.traced = sync.OnceValues(func() (cel.Program, error) {
		return env.Program(ast, append(opts, cel.EvalOptions(cel.OptTrackState))...)
	})
	return d, nil
}

// constant reports whether the checked expression refers to no variable
// (no event field): its result is the same for every event.
func constant(ast *cel.Ast) bool {
	for _, r := range ast.NativeRep().ReferenceMap() {
		if r.Name != "" {
			return false
		}
	}
	return true
}

// neverFits returns why no result of d can be stored in a column of kind
// k (type typ), when the type checker knows d's result type and every value
// of that type is refused alike (checkValue, on one value of the type as
// fromCEL converts it): a bool into a number, timestamp or uuid column, a
// timestamp into anything but timestamptz, date and text, a list or a map
// into anything but jsonb, a number into a uuid column. "" otherwise: a
// dyn, string or null result, or a number some values of which fit.
func (d *derivePrg) neverFits(expr string, k colKind, typ string, notNull bool) string {
	if why := d.typeNeverFits(expr, k, typ); why != "" || !d.constant {
		return why
	}
	// Its one value, checked as each event's would be (fourth new-user
	// trial: '"abc"' into bigint, '100000' into smallint, null into a
	// notNull column were taken).
	switch why := checkValue(k, typ, d.value); {
	case d.value == nil && notNull:
		return fmt.Sprintf("%s is always null, and the column is notNull (or in the primary key): every event would be dead-lettered", quoteExpr(expr))
	case d.value != nil && why != "":
		return fmt.Sprintf("%s always gives %s, and %s: every event would be dead-lettered", quoteExpr(expr), describeJSON(d.value), why)
	}
	return ""
}

// typeNeverFits is neverFits by d's result type alone.
func (d *derivePrg) typeNeverFits(expr string, k colKind, typ string) string {
	// A JSON object's keys are strings: a map whose keys the type checker
	// knows are of another type fits no column, whether it is the result
	// or inside it (new-user trials: "{1: 'a', 2: payload.?name...}" and
	// "{'a': {1: payload.?name...}}" were taken).
	out := d.ast.OutputType()
	if key := nonStringMapKey(out); key != nil {
		if out.Kind() == types.MapKind && out.Parameters()[0] == key {
			return fmt.Sprintf("%s returns a map of %s keys, and a JSON object's keys are strings: every event would be dead-lettered", quoteExpr(expr), key.String())
		}
		return fmt.Sprintf("%s returns %s, which holds a map of %s keys, and a JSON object's keys are strings: every event would be dead-lettered", quoteExpr(expr), out.String(), key.String())
	}
	var v any
	name := ""
	switch out.Kind() {
	case types.BoolKind:
		v, name = true, "bool"
	case types.TimestampKind:
		v, name = time.Unix(0, 0).UTC(), "timestamp"
	case types.ListKind:
		v, name = []any{}, "list"
	case types.MapKind:
		v, name = map[string]any{}, "map"
	case types.IntKind, types.UintKind, types.DoubleKind:
		if k != kindUUID { // which numbers fit depends on the value
			return ""
		}
		v, name = json.Number("0"), d.ast.OutputType().String()
	default:
		return ""
	}
	why := checkValue(k, typ, v)
	if why == "" {
		return ""
	}
	return fmt.Sprintf("%s returns %s, and %s: every event would be dead-lettered", quoteExpr(expr), article(name), why)
}

// nonStringMapKey returns the key type of the first map in t (t itself,
// or the type of its list elements, map values or optional value, at any
// depth) whose keys the type checker knows are not strings, or nil when
// there is none (dyn keys may be strings: they are checked at each event).
func nonStringMapKey(t *types.Type) *types.Type {
	params := t.Parameters()
	switch t.Kind() {
	case types.MapKind:
		if len(params) != 2 {
			return nil
		}
		if k := params[0].Kind(); k != types.StringKind && k != types.DynKind && k != types.AnyKind {
			return params[0]
		}
		return nonStringMapKey(params[1])
	case types.ListKind, types.OpaqueKind: // an optional's value too
		for _, p := range params {
			if key := nonStringMapKey(p); key != nil {
				return key
			}
		}
	}
	return nil
}

// explainOverload returns err, cel-go's "no such overload" of evaluating d
// on vars, with the call it failed at: "no such overload: operator + applied
// to (string, int) at 1:11" (a function: "function size applied to (int)").
// cel-go's runtime error does not say which call failed (its expression id
// is unreliable: cel-go labels one shared error value with the first id it
// fails at), so d is evaluated again keeping every value, and the call is
// the one whose value is that error while none of its arguments' is. It
// returns err unchanged when it cannot tell more.
func (d *derivePrg) explainOverload(err error, vars *deriveActivation) error {
	traced, terr := d.traced()
	if terr != nil {
		return err
	}
	_, det, _ := traced.Eval(vars)
	if det == nil || det.State() == nil {
		return err
	}
	state := det.State()
	failed := func(id int64) bool {
		v, ok := state.Value(id)
		return ok && types.IsError(v)
	}
	native := d.ast.NativeRep()
	for _, e := range celast.MatchDescendants(celast.NavigateAST(native), celast.KindMatcher(celast.CallKind)) {
		v, ok := state.Value(e.ID())
		if !ok || !isNoSuchOverload(asError(v)) {
			continue
		}
		call := e.AsCall()
		args := call.Args()
		if call.IsMemberFunction() {
			args = append([]celast.Expr{call.Target()}, args...)
		}
		if slices.ContainsFunc(args, func(a celast.Expr) bool { return failed(a.ID()) }) {
			continue // the error comes from an argument
		}
		names := make([]string, len(args))
		for i, a := range args {
			names[i] = "?"
			if v, ok := state.Value(a.ID()); ok && v != nil {
				names[i] = v.Type().TypeName()
			}
		}
		what := "function " + call.FunctionName()
		if op, ok := operators.FindReverse(call.FunctionName()); ok && op != "" {
			what = "operator " + op
		}
		loc := native.SourceInfo().GetStartLocation(e.ID())
		oe := &overloadError{err: err, call: what, argTypes: names, line: loc.Line(), column: loc.Column() + 1}
		if src, uerr := parser.Unparse(e, native.SourceInfo()); uerr == nil {
			oe.expr = src // names the fields the call read
		}
		return oe
	}
	return err
}

// asError returns v as an error when it is a CEL error value, else nil.
func asError(v ref.Val) error {
	if e, ok := v.(*types.Err); ok {
		return e
	}
	return nil
}

// overloadError is a "no such overload" error with the call it failed at.
type overloadError struct {
	err          error
	call         string   // "operator +", "function size"
	argTypes     []string // CEL type names, target first; "?" if unknown
	line, column int      // 1-based
	expr         string   // the call as CEL prints it ("payload.points / payload.games"); "" unknown
}

// Error returns "no such overload: <call> applied to (<types>) at
// <line>:<column>", then " in <expr>" when the call's text is known.
func (e *overloadError) Error() string {
	msg := fmt.Sprintf("no such overload: %s applied to (%s) at %d:%d", e.call, strings.Join(e.argTypes, ", "), e.line, e.column)
	if e.expr != "" {
		msg += " in " + e.expr
	}
	return msg
}

func (e *overloadError) Unwrap() error { return e.err }

// isNoSuchOverload reports whether err is cel-go's runtime error for a call
// no overload accepts. cel-go gives it no code, only its text, which starts
// "no such overload" ("no such overload: size" for some calls); its own
// Err.Is compares texts too.
func isNoSuchOverload(err error) bool {
	var celErr *types.Err
	return errors.As(err, &celErr) && strings.HasPrefix(celErr.Error(), errNoSuchOverload.Error())
}

// unknownSizes is the checker.CostEstimator of compileDerive: it knows
// nothing, so cel-go takes every size at its maximum and every call at its
// own estimate.
type unknownSizes struct{}

func (unknownSizes) EstimateSize(checker.AstNode) *checker.SizeEstimate { return nil }

func (unknownSizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// deriveVars returns a CEL activation for ev (see deriveActivation.reset).
func deriveVars(ev *Event) *deriveActivation {
	a := &deriveActivation{}
	a.reset(ev)
	return a
}

// deriveActivation implements cel-go's interpreter.Activation: payload at
// once, as the event tree's object read in place (treeObject), and event
// (the top level of the event, its typed fields authoritative) built on
// first use, since most derives read only payload. Values are converted
// when read (treeValue, treeAdapter). An activation serves one Plan call at a time; it is not safe
// for concurrent use. TableProjection reuses them (reset), keeping the
// event map's room.
type deriveActivation struct {
	ev      *Event
	payload ref.Val        // the payload object (a *treeObject), or an empty map
	event   map[string]any // built when eventOK; kept empty for reuse
	eventOK bool
	obj     treeObject // payload's, when it is one: no allocation per event
}

// reset makes a the activation of ev, or, with a nil ev, one that holds
// nothing of the last event (for a pool).
func (a *deriveActivation) reset(ev *Event) {
	clear(a.event)
	a.ev, a.payload, a.eventOK, a.obj = ev, nil, false, treeObject{}
	switch {
	case ev == nil:
	case ev.tree == nil:
		a.payload = types.NewStringInterfaceMap(treeAdapter{}, map[string]any{})
	default:
		a.obj = treeObject{t: ev.tree, i: ev.payload, name: "payload"}
		a.payload = &a.obj
	}
}

func (a *deriveActivation) ResolveName(name string) (any, bool) {
	switch name {
	case "payload":
		return a.payload, true
	case "event":
		if !a.eventOK {
			ev := a.ev
			if a.event == nil {
				a.event = make(map[string]any, 16)
			}
			if t := ev.tree; t != nil {
				root := &treeObject{t: t, name: "event"}
				for j, k := int32(1), int32(0); k < t.Nodes[0].Len; j, k = t.Nodes[j].End, k+1 {
					a.event[t.Key(j)] = treeValue(t, j, root, t.Key(j))
				}
			}
			a.event["eventType"] = ev.EventType
			a.event["entityId"] = ev.EntityID
			a.event["forkId"] = ev.ForkID
			a.event["tenantSchema"] = ev.TenantSchema
			a.event["irVersion"] = ev.IRVersion
			a.event["sequenceNumber"] = ev.SequenceNumber
			a.event["ts"] = ev.TS
			a.event["payload"] = a.payload
			a.eventOK = true
		}
		return a.event, true
	}
	return nil, false
}

func (a *deriveActivation) Parent() interpreter.Activation { return nil }

// treeAdapter adapts event-tree values for CEL as they are read: a
// json.Number becomes int when it is an integer that fits int64, else
// double; maps and lists are wrapped, not copied. Everything else goes to
// CEL's default adapter.
type treeAdapter struct{}

func (a treeAdapter) NativeToValue(v any) ref.Val {
	switch x := v.(type) {
	case json.Number:
		return numberValue(string(x))
	case map[string]any:
		return types.NewStringInterfaceMap(a, x)
	case []any:
		return types.NewDynamicList(a, x)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

// numberValue is the CEL value of the JSON number text s: int when it is
// an integer that fits int64, else double; an error (errNumberRange) when
// it is beyond float64's range, or so close to 0 that it would read as 0
// (1e-400), as PostgreSQL's double precision refuses both.
func numberValue(s string) ref.Val {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return types.Int(i)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || (f == 0 && nonzeroMantissa(s)) { // not ±Inf or 0: an error
		return types.WrapErr(errNumberRange)
	}
	return types.Double(f)
}

// nonzeroMantissa reports whether the JSON number s has a digit other than
// 0 before its exponent.
func nonzeroMantissa(s string) bool {
	for i := 0; i < len(s) && s[i] != 'e' && s[i] != 'E'; i++ {
		if s[i] >= '1' && s[i] <= '9' {
			return true
		}
	}
	return false
}

// evalDerive evaluates prg and returns its result as an event tree value
// (nil, string, bool, json.Number, time.Time, map[string]any, []any).
// A "no such overload" error names the call and its argument types
// (explainOverload).
func evalDerive(prg *derivePrg, vars *deriveActivation) (any, error) {
	out, _, err := prg.Eval(vars)
	if err != nil {
		var ce interpreter.EvalCancelledError
		switch {
		case isNoSuchOverload(err):
			err = prg.explainOverload(err, vars)
		case errors.As(err, &ce) && ce.Cause == interpreter.CostLimitExceeded:
			// cel-go's text names no limit: the error says which.
			err = fmt.Errorf("%w (an evaluation may cost at most %d CEL cost units, about one per operation or element visited: docs/definitions.md)", err, deriveCostLimit)
		}
		return nil, err
	}
	return fromCEL(out, &inexactNumbers{ev: vars.ev})
}

// fromCEL converts a CEL result of a derive to an event tree value. A
// double is written as its shortest text, or, when it is the double CEL
// read a number of the derive's event as and that text is not the number,
// as that number's text (inexactNumbers; nil for a derive that reads no
// event field).
func fromCEL(v ref.Val, ev *inexactNumbers) (any, error) {
	switch x := v.(type) {
	case *types.Err: // an element of a list or map: a number beyond range
		return nil, x
	case types.Null:
		return nil, nil
	case *types.Optional:
		if !x.HasValue() {
			return nil, nil
		}
		return fromCEL(x.GetValue(), ev)
	case types.Bool:
		return bool(x), nil
	case types.String:
		return string(x), nil
	case types.Int:
		return json.Number(strconv.FormatInt(int64(x), 10)), nil
	case types.Uint:
		return json.Number(strconv.FormatUint(uint64(x), 10)), nil
	case types.Double:
		f := float64(x)
		switch {
		case math.IsNaN(f):
			return "NaN", nil
		case math.IsInf(f, 1):
			return "Infinity", nil
		case math.IsInf(f, -1):
			return "-Infinity", nil
		}
		if n, err := ev.text(f); n != "" || err != nil {
			return json.Number(n), err
		}
		return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), nil
	case types.Timestamp:
		return x.Time.UTC(), nil
	case traits.Lister:
		n, ok := x.Size().(types.Int)
		if !ok {
			return nil, fmt.Errorf("list of unknown size")
		}
		l := make([]any, 0, int(n))
		for i := types.Int(0); i < n; i++ {
			e, err := fromCEL(x.Get(i), ev)
			if err != nil {
				return nil, err
			}
			l = append(l, e)
		}
		return l, nil
	case traits.Mapper:
		m := map[string]any{}
		for it := x.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("map key %v is %s, not a string", k, article(celTypeWord(k.Type().TypeName())))
			}
			e, err := fromCEL(x.Get(k), ev)
			if err != nil {
				return nil, err
			}
			m[string(ks)] = e
		}
		return m, nil
	}
	return nil, fmt.Errorf("result of type %s cannot be stored", celTypeWord(v.Type().TypeName()))
}

// inexactNumbers are the numbers of a derive's event that CEL reads as a
// double whose text is not the number (readInexactly): an integer beyond
// int64 (12345678901234567890, read as 1.2345678901234567e+19) or one with
// more significant digits than a double holds (123456789.123456789123).
// They are read from the event's tree once, at the first double of the
// derive's result.
type inexactNumbers struct {
	ev      *Event
	read    bool
	byValue map[float64][]string // the texts of the numbers read as each double
}

// text returns the text of the event's number that CEL read as the double
// f without f's text being it, so that a derive that passes such a number
// through (`has(payload.x) ? payload.x : dyn(null)`, an object into jsonb)
// stores it as sent, as a from path does: SPEC §3, numbers are never
// round-tripped through float64 (definitions trial: a numeric column
// stored 12345678901234567000). It returns "" when no number of the event
// is read so as f (f computed, or read exactly), and an error when two
// numbers of different values are: which one the result is cannot be told.
func (x *inexactNumbers) text(f float64) (string, error) {
	if x == nil || x.ev == nil || x.ev.tree == nil {
		return "", nil
	}
	if !x.read {
		x.read = true
		t := x.ev.tree
		for i := range t.Nodes {
			if t.Nodes[i].Kind != jsonstrict.NumberNode {
				continue
			}
			if s := t.Text(int32(i)); readInexactly(s) {
				g, _ := strconv.ParseFloat(s, 64)
				if x.byValue == nil {
					x.byValue = map[float64][]string{}
				}
				x.byValue[g] = append(x.byValue[g], s)
			}
		}
	}
	texts := x.byValue[f]
	for _, s := range texts[min(1, len(texts)):] {
		if !sameNumber(texts[0], s) {
			return "", fmt.Errorf("result %s: the event's numbers %s and %s both read as this CEL double, which holds neither exactly, so which one it is cannot be told (read the number with from, or as a string)",
				strconv.FormatFloat(f, 'g', -1, 64), shortenValue(texts[0]), shortenValue(s))
		}
	}
	if len(texts) == 0 {
		return "", nil
	}
	return texts[0], nil
}

// readInexactly reports whether CEL reads the JSON number s as a double
// (numberValue: not an integer that fits int64) whose shortest text,
// which fromCEL writes, is not s's value: 18446744073709551616 (2⁶⁴) is a
// double, but its text 1.8446744073709552e+19 is another number. A number
// of at most 15 significant digits is never read inexactly: its double's
// shortest text has its value (DBL_DIG).
func readInexactly(s string) bool {
	digits, leading := 0, true
	for i := 0; i < len(s) && s[i] != 'e' && s[i] != 'E'; i++ {
		switch c := s[i]; {
		case c == '0' && leading:
		case c >= '0' && c <= '9':
			leading = false
			digits++
		}
	}
	if digits <= 15 {
		return false
	}
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return false // an int
	}
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && !sameNumber(s, strconv.FormatFloat(f, 'g', -1, 64))
}

// sameNumber reports whether the JSON numbers a and b have one value
// (1e20 and 100000000000000000000).
func sameNumber(a, b string) bool {
	x, okx := new(big.Rat).SetString(a)
	y, oky := new(big.Rat).SetString(b)
	return okx && oky && x.Cmp(y) == 0
}

// celTypeWord is a CEL type name as the docs call it: "duration" and
// "timestamp" for the protobuf types behind them (third new-user trial:
// "result of type google.protobuf.Duration").
func celTypeWord(name string) string {
	switch name {
	case "google.protobuf.Duration":
		return "duration"
	case "google.protobuf.Timestamp":
		return "timestamp"
	}
	return name
}

// errNumberRange is the CEL error of a JSON number beyond float64's range
// (1e400), or nonzero and nearer 0 than its smallest (1e-400): CEL has no
// value for it, and ±Infinity or 0 would be a different number.
var errNumberRange = errors.New("number beyond the range of a CEL double (±1.8e308; nonzero nearer 0 than 4.9e-324)")

// errNoSuchOverload is cel-go's error for a function or operator given
// types it has no overload for (double + int); see isNoSuchOverload.
var errNoSuchOverload = types.NoSuchOverloadErr().(error)

// deriveError adds to a derive's evaluation error err the event's number
// that explains it, if one does: a number beyond float64's range (1e400,
// 1e-400), or, for a missing overload, an integer beyond int64 that CEL
// reads as a double (99999999999999999999 + 1 is double + int). A number
// read from an object names its own path already (numberRangeError);
// otherwise (an element of a list, a call's arguments) the path is named
// only when one number of the event matches, never a guess among several.
func deriveError(err error, ev *Event) error {
	var nre *numberRangeError
	switch {
	case errors.As(err, &nre):
	case errors.Is(err, errNumberRange):
		if path, n := onlyNumber(ev, beyondDouble); path != "" {
			return fmt.Errorf("%s: %s: %w", path, quoteValue(n), err)
		}
	case isNoSuchOverload(err):
		var oe *overloadError
		// With a double in the call (or types unknown), an integer beyond
		// int64 read as one is likely the cause.
		if !errors.As(err, &oe) || slices.Contains(oe.argTypes, "double") {
			if path, n := onlyNumber(ev, beyondInt64); path != "" {
				return fmt.Errorf("%w (%s is %s, an integer beyond int64, which CEL reads as a double)", err, path, shortenValue(n))
			}
		}
		if oe != nil {
			if notes := payloadNotes(ev, oe.expr); notes != "" {
				return fmt.Errorf("%w (%s)", err, notes)
			}
		}
	}
	return err
}

// payloadPathRE matches a payload field read in a derive's call text
// (overloadError.expr): payload.games, payload.a.b, payload.tags[0].
var payloadPathRE = regexp.MustCompile(`\bpayload(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])+`)

// payloadNotes returns what ev holds at each payload path the call text
// expr reads, as `payload.games is "2", a JSON string; payload.points is
// absent`, so that a call no overload accepts names the field of the wrong
// type (new-user trial: "operator / applied to (int, string)" left it to
// be guessed); "" when expr reads none. A method's name after a path
// (payload.n.startsWith(...)) is not part of it.
func payloadNotes(ev *Event, expr string) string {
	var notes []string
	seen := map[string]bool{}
	for _, m := range payloadPathRE.FindAllStringIndex(expr, -1) {
		path := expr[m[0]:m[1]]
		if m[1] < len(expr) && expr[m[1]] == '(' {
			i := strings.LastIndexByte(path, '.')
			if i <= len("payload") {
				continue
			}
			path = path[:i] // the method's receiver
		}
		if seen[path] {
			continue
		}
		seen[path] = true
		segs := strings.Split(strings.NewReplacer("[", ".", "]", "").Replace(path), ".")
		if _, _, ok := payloadNode(ev, segs); !ok {
			notes = append(notes, path+" is absent")
			continue
		}
		switch v := lookupPath(ev, segs).(type) {
		case string:
			notes = append(notes, path+" is "+quoteValue(v)+", a JSON string")
		case json.Number:
			notes = append(notes, path+" is "+shortenValue(string(v))+", a JSON number")
		default:
			notes = append(notes, path+" is a JSON "+jsonType(v))
		}
	}
	return strings.Join(notes, "; ")
}

// onlyNumber returns the path and text of the number of ev for which match
// reports true when there is exactly one, else "": payload's as
// "payload...", the other members' as "event...".
func onlyNumber(ev *Event, match func(string) bool) (string, string) {
	var path, n string
	found := 0
	for k, v := range ev.Fields() {
		p := "payload"
		if k != "payload" {
			p = string(jsonstrict.AppendKey([]byte("event"), k))
		}
		found += findNumbers(v, p, match, &path, &n)
	}
	if found != 1 {
		return "", ""
	}
	return path, n
}

// beyondDouble reports whether the JSON number n is one CEL cannot read
// (numberValue): beyond float64's range, or nonzero and read as 0.
func beyondDouble(n string) bool { return types.IsError(numberValue(n)) }

// beyondInt64 reports whether the JSON number n is an integer (no fraction,
// no exponent) beyond int64's range.
func beyondInt64(n string) bool {
	if strings.ContainsAny(n, ".eE") {
		return false
	}
	_, err := strconv.ParseInt(n, 10, 64)
	return err != nil
}

// findNumbers counts the numbers in v for which match reports true, and
// sets *path and *n to the last one's path (from path) and text.
func findNumbers(v any, path string, match func(string) bool, foundPath, n *string) int {
	switch x := v.(type) {
	case json.Number:
		if match(string(x)) {
			*foundPath, *n = path, string(x)
			return 1
		}
	case map[string]any:
		found := 0
		for k, e := range x {
			found += findNumbers(e, string(jsonstrict.AppendKey([]byte(path), k)), match, foundPath, n)
		}
		return found
	case []any:
		found := 0
		for i, e := range x {
			found += findNumbers(e, path+"["+strconv.Itoa(i)+"]", match, foundPath, n)
		}
		return found
	}
	return 0
}
