package projection

import (
	"cmp"
	"errors"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// checkExpr is a table's CHECK constraint as pg_get_expr prints it, parsed
// (parseCheckExpr) so that Go can tell, before a COPY, which upserts the
// constraint refuses: those go to statements (rowCheck), as upserts that
// the table's column types refuse do, rather than failing their COPY
// group (issue 11: a CHECK refusing 1% of the rows cost 10% of the
// throughput). It reads the subset that CHECKs on a projection's columns
// mostly use:
//   - comparisons (=, <>, <, <=, >, >=) of a column of an integer type or
//     of unconstrained numeric with a number or another such column, and
//     = and <> of a text or character varying column with a text or
//     another such column (ordering text depends on the collation, so <
//     and > on text are not read);
//   - x op ANY (ARRAY[...]) and x op ALL (ARRAY[...]) of such literals
//     (IN and NOT IN as pg_get_expr prints them);
//   - x IS NULL, x IS NOT NULL, AND, OR, NOT and parentheses;
//   - the casts pg_get_expr prints: '-5'::integer, (0)::numeric,
//     'a'::text on literals; (stars)::numeric, (n)::bigint, (v)::text on
//     columns, where they lose nothing.
//
// Anything else (a function, arithmetic, a cast that rounds) is not
// parsed or not bound (boundCheck), and PostgreSQL alone evaluates that constraint
// (checkPredicate). The result is only a hint, as the rest of the
// catalog's: an upsert called refused is applied by its own statement,
// and one called valid that PostgreSQL refuses still fails its group,
// which is then isolated. Evaluation follows SQL's three-valued logic,
// and only false refuses (a CHECK takes NULL).
type checkExpr struct {
	root *checkNode
	cols []string // the columns read, by slot (checkNode.slot)
}

// checkOp is what a checkNode is.
type checkOp uint8

const (
	chkColumn    checkOp = iota // a column's value: slot, cast
	chkNumber                   // a number literal: num, small, isSmall
	chkText                     // a text literal: text
	chkCompare                  // kids[0] cmp kids[1]
	chkAny                      // kids[0] cmp ANY (kids[1:])
	chkAll                      // kids[0] cmp ALL (kids[1:])
	chkAnd                      // every kid
	chkOr                       // any kid
	chkNot                      // not kids[0]
	chkIsNull                   // kids[0] (a column) IS NULL
	chkIsNotNull                // kids[0] (a column) IS NOT NULL
)

// checkNode is a node of a checkExpr.
type checkNode struct {
	op      checkOp
	cmp     string // chkCompare, chkAny, chkAll: =, <>, <, <=, >, >=
	slot    int    // chkColumn: index into checkExpr.cols
	cast    string // chkColumn: the type it is cast to, "" for none
	num     *big.Rat
	small   int64 // chkNumber: the value, when isSmall
	isSmall bool  // chkNumber: an integer within int64
	text    string
	kids    []*checkNode
}

// tri is a truth value of SQL's three-valued logic; triUnknown also
// stands for a value Go does not read (a text an integer column's cast
// would take in a form Go does not parse), which refuses nothing.
type tri uint8

const (
	triUnknown tri = iota
	triFalse
	triTrue
)

// errCheckUnread is parseCheckExpr's error for an expression outside the
// subset it reads.
var errCheckUnread = errors.New("not a CHECK expression Go evaluates")

// parseCheckExpr parses expr, a CHECK constraint's expression as
// pg_get_expr prints it. It returns errCheckUnread (wrapped, with where)
// for anything outside checkExpr's subset.
func parseCheckExpr(expr string) (*checkExpr, error) {
	toks, err := checkTokens(expr)
	if err != nil {
		return nil, err
	}
	p := &checkParser{toks: toks, e: &checkExpr{}}
	root, err := p.or()
	if err != nil {
		return nil, err
	}
	if p.i != len(p.toks) {
		return nil, p.unread()
	}
	if !isBool(root) {
		return nil, p.unread()
	}
	p.e.root = root
	return p.e, nil
}

// checkToken is a token of a CHECK expression: kind 'w' a bare word, 'i'
// a quoted identifier, 'n' a number, 's' a text literal, 'o' an operator
// or punctuation (text holds it).
type checkToken struct {
	kind byte
	text string
}

// checkTokens splits expr into tokens.
func checkTokens(expr string) ([]checkToken, error) {
	var toks []checkToken
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == '[' || c == ']' || c == ',':
			toks = append(toks, checkToken{'o', expr[i : i+1]})
			i++
		case c == ':' && strings.HasPrefix(expr[i:], "::"):
			toks = append(toks, checkToken{'o', "::"})
			i += 2
		case c == '<' || c == '>' || c == '=' || c == '!':
			j := i + 1
			if j < len(expr) && (expr[j] == '=' || c == '<' && expr[j] == '>') {
				j++
			}
			op := expr[i:j]
			if op == "!=" {
				op = "<>"
			}
			if op == "!" {
				return nil, errCheckUnread
			}
			toks = append(toks, checkToken{'o', op})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			j := i
			for j < len(expr) && (expr[j] >= '0' && expr[j] <= '9' || expr[j] == '.' ||
				(expr[j] == 'e' || expr[j] == 'E') ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E')) {
				j++
			}
			toks = append(toks, checkToken{'n', expr[i:j]})
			i = j
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(expr) {
					return nil, errCheckUnread
				}
				if expr[j] == c {
					if j+1 < len(expr) && expr[j+1] == c {
						b.WriteByte(c)
						j += 2
						continue
					}
					break
				}
				b.WriteByte(expr[j])
				j++
			}
			kind := byte('s')
			if c == '"' {
				kind = 'i'
			}
			toks = append(toks, checkToken{kind, b.String()})
			i = j + 1
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] == '$' || expr[j] >= 'a' && expr[j] <= 'z' ||
				expr[j] >= 'A' && expr[j] <= 'Z' || expr[j] >= '0' && expr[j] <= '9' || expr[j] >= 0x80) {
				j++
			}
			toks = append(toks, checkToken{'w', expr[i:j]})
			i = j
		default:
			return nil, errCheckUnread // another operator: +, -, ~, ||, ...
		}
	}
	return toks, nil
}

// checkParser parses tokens into a checkExpr (recursive descent).
type checkParser struct {
	toks []checkToken
	i    int
	e    *checkExpr
}

func (p *checkParser) unread() error {
	if p.i < len(p.toks) {
		return errors.Join(errCheckUnread, errors.New("at "+strconv.Quote(p.toks[p.i].text)))
	}
	return errors.Join(errCheckUnread, errors.New("at its end"))
}

// keyword reports whether the next token is the bare word kw (any case),
// taking it when it is.
func (p *checkParser) keyword(kw string) bool {
	if p.isKeyword(kw) {
		p.i++
		return true
	}
	return false
}

// punct reports whether the next token is the operator or punctuation s,
// taking it when it is.
func (p *checkParser) punct(s string) bool {
	if p.i < len(p.toks) && p.toks[p.i].kind == 'o' && p.toks[p.i].text == s {
		p.i++
		return true
	}
	return false
}

// isBool reports whether n is a truth value rather than a value.
func isBool(n *checkNode) bool { return n.op >= chkCompare }

func (p *checkParser) or() (*checkNode, error) {
	return p.chain("OR", chkOr, p.and)
}

func (p *checkParser) and() (*checkNode, error) {
	return p.chain("AND", chkAnd, p.not)
}

// chain parses next (kw next)*, each a truth value, as one node of op.
func (p *checkParser) chain(kw string, op checkOp, next func() (*checkNode, error)) (*checkNode, error) {
	n, err := next()
	if err != nil {
		return nil, err
	}
	if !p.isKeyword(kw) {
		return n, nil
	}
	out := &checkNode{op: op, kids: []*checkNode{n}}
	for p.keyword(kw) {
		k, err := next()
		if err != nil {
			return nil, err
		}
		out.kids = append(out.kids, k)
	}
	for _, k := range out.kids {
		if !isBool(k) {
			return nil, p.unread()
		}
	}
	return out, nil
}

// isKeyword reports whether the next token is the bare word kw, without
// taking it.
func (p *checkParser) isKeyword(kw string) bool {
	return p.i < len(p.toks) && p.toks[p.i].kind == 'w' && strings.EqualFold(p.toks[p.i].text, kw)
}

func (p *checkParser) not() (*checkNode, error) {
	if !p.keyword("NOT") {
		return p.compare()
	}
	n, err := p.not()
	if err != nil {
		return nil, err
	}
	if !isBool(n) {
		return nil, p.unread()
	}
	return &checkNode{op: chkNot, kids: []*checkNode{n}}, nil
}

// compareOps are the comparisons read.
var compareOps = []string{"=", "<>", "<", "<=", ">", ">="}

func (p *checkParser) compare() (*checkNode, error) {
	left, err := p.primary()
	if err != nil {
		return nil, err
	}
	if p.keyword("IS") {
		op := chkIsNull
		if p.keyword("NOT") {
			op = chkIsNotNull
		}
		if !p.keyword("NULL") || left.op != chkColumn {
			return nil, p.unread()
		}
		return &checkNode{op: op, kids: []*checkNode{left}}, nil
	}
	if p.i >= len(p.toks) || p.toks[p.i].kind != 'o' || !slices.Contains(compareOps, p.toks[p.i].text) {
		return left, nil
	}
	cmp := p.toks[p.i].text
	p.i++
	if isBool(left) {
		return nil, p.unread()
	}
	switch {
	case p.keyword("ANY") || p.keyword("ALL"):
		op := chkAny
		if strings.EqualFold(p.toks[p.i-1].text, "ALL") {
			op = chkAll
		}
		if !p.punct("(") || !p.keyword("ARRAY") || !p.punct("[") {
			return nil, p.unread()
		}
		n := &checkNode{op: op, cmp: cmp, kids: []*checkNode{left}}
		for {
			v, err := p.primary()
			if err != nil {
				return nil, err
			}
			if v.op != chkNumber && v.op != chkText {
				return nil, p.unread()
			}
			n.kids = append(n.kids, v)
			if !p.punct(",") {
				break
			}
		}
		if !p.punct("]") || !p.punct(")") {
			return nil, p.unread()
		}
		return n, nil
	}
	right, err := p.primary()
	if err != nil {
		return nil, err
	}
	if isBool(right) {
		return nil, p.unread()
	}
	return &checkNode{op: chkCompare, cmp: cmp, kids: []*checkNode{left, right}}, nil
}

// primary parses a parenthesised expression, a column, or a literal, and
// the casts after it.
func (p *checkParser) primary() (*checkNode, error) {
	if p.i >= len(p.toks) {
		return nil, p.unread()
	}
	var n *checkNode
	switch t := p.toks[p.i]; {
	case t.kind == 'o' && t.text == "(":
		p.i++
		var err error
		if n, err = p.or(); err != nil {
			return nil, err
		}
		if !p.punct(")") {
			return nil, p.unread()
		}
	case t.kind == 'n':
		p.i++
		var ok bool
		if n, ok = numberNode(t.text); !ok {
			return nil, p.unread()
		}
	case t.kind == 's':
		p.i++
		n = &checkNode{op: chkText, text: t.text}
	case t.kind == 'i', t.kind == 'w' && !reservedCheckWord(t.text):
		p.i++
		name := t.text
		if t.kind == 'w' {
			name = strings.ToLower(name) // PostgreSQL folds bare names
		}
		slot := slices.Index(p.e.cols, name)
		if slot < 0 {
			slot = len(p.e.cols)
			p.e.cols = append(p.e.cols, name)
		}
		n = &checkNode{op: chkColumn, slot: slot}
	default:
		return nil, p.unread()
	}
	for p.punct("::") {
		typ := p.typeName()
		var ok bool
		if n, ok = castNode(n, typ); !ok {
			return nil, p.unread()
		}
	}
	return n, nil
}

// typeName reads the bare words of a type name after ::, such as
// "character varying"; "" when there is none or it has a modifier.
func (p *checkParser) typeName() string {
	var words []string
	for p.i < len(p.toks) && p.toks[p.i].kind == 'w' && !reservedCheckWord(p.toks[p.i].text) {
		words = append(words, strings.ToLower(p.toks[p.i].text))
		p.i++
	}
	if p.i < len(p.toks) && (p.toks[p.i].text == "(" || p.toks[p.i].text == "[") {
		return "" // a modifier or an array type: not read
	}
	return strings.Join(words, " ")
}

// reservedCheckWord reports whether w is a word of the grammar rather than
// a name.
func reservedCheckWord(w string) bool {
	switch strings.ToUpper(w) {
	case "AND", "OR", "NOT", "IS", "NULL", "ANY", "ALL", "ARRAY", "TRUE", "FALSE", "SOME":
		return true
	}
	return false
}

// numberNode returns the number literal s, false when it is not decimal
// syntax (digits, a point, an exponent).
func numberNode(s string) (*checkNode, bool) {
	r, ok := parseDecimal(s)
	if !ok {
		return nil, false
	}
	n := &checkNode{op: chkNumber, num: r}
	if r.IsInt() && r.Num().IsInt64() {
		n.small, n.isSmall = r.Num().Int64(), true
	}
	return n, true
}

// castNode applies the cast ::typ to n, false when the cast is not one
// checkExpr reads: a literal to an integer type (an integer of its range),
// to numeric, or (a text) to text or character varying; a column to
// numeric, bigint, text or character varying (checked against the
// column's type by bind).
func castNode(n *checkNode, typ string) (*checkNode, bool) {
	switch n.op {
	case chkNumber, chkText:
		num := n
		if n.op == chkText {
			if typ == "text" || typ == "character varying" {
				return n, true
			}
			var ok bool
			if num, ok = numberNode(strings.TrimSpace(n.text)); !ok {
				return nil, false
			}
		}
		switch typ {
		case "numeric":
			return num, true
		case "smallint", "integer", "bigint":
			bits := intBits(kindOf(typ))
			if !num.isSmall || bits < 64 && (num.small >= 1<<(bits-1) || num.small < -(1<<(bits-1))) {
				return nil, false
			}
			return num, true
		}
		return nil, false
	case chkColumn:
		if n.cast != "" {
			return nil, false
		}
		switch typ {
		case "numeric", "bigint", "text", "character varying":
			return &checkNode{op: chkColumn, slot: n.slot, cast: typ}, true
		}
	}
	return nil, false
}

// parseDecimal parses s, [+-]digits[.digits][e[+-]digits] (digits on at
// least one side of the point), exactly; false for anything else (NaN,
// Infinity, PostgreSQL 16's 0x and 1_000 forms).
func parseDecimal(s string) (*big.Rat, bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		digits++
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			digits++
		}
	}
	if digits == 0 {
		return nil, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			exp++
		}
		if exp == 0 || exp > 3 {
			return nil, false // no exponent, or one too large to expand cheaply
		}
	}
	if i != len(s) {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

// colDomain is what a column of a bound check holds.
type colDomain uint8

const (
	domInteger colDomain = iota + 1 // an integer type
	domNumeric                      // unconstrained numeric
	domText                         // text or character varying(n)
)

// boundCheck is a checkExpr bound to a table projection's columns: for
// each slot, the index into an upsert's arguments and what it holds.
type boundCheck struct {
	e      *checkExpr
	args   []int
	domain []colDomain
	length []int // character varying(n): n; 0 none
}

// bind binds e to p's columns as the table has them (cols), false when a
// column it reads is not one of p's, or its type (the table's, and the
// definition's that Plan writes it from) is not one the comparisons read,
// or the expression compares values of different domains.
func (e *checkExpr) bind(p *TableProjection, cols map[string]catalogColumn) (*boundCheck, bool) {
	b := &boundCheck{e: e, args: make([]int, len(e.cols)), domain: make([]colDomain, len(e.cols)), length: make([]int, len(e.cols))}
	for s, name := range e.cols {
		i := slices.IndexFunc(p.cols, func(c column) bool { return c.name == name })
		cat, ok := cols[name]
		if i < 0 || !ok || !cat.known {
			return nil, false
		}
		def := p.cols[i].kind
		switch {
		case intBits(cat.kind) > 0 && (intBits(def) > 0 || def == kindNumeric):
			b.domain[s] = domInteger
		case cat.kind == kindNumeric && cat.precision == 0 && (intBits(def) > 0 || def == kindNumeric):
			b.domain[s] = domNumeric
		case cat.kind == kindText && def == kindText && (cat.typ == "text" || strings.HasPrefix(cat.typ, "character varying")):
			b.domain[s], b.length[s] = domText, cat.length
		default:
			return nil, false
		}
		b.args[s] = i
	}
	if !b.typed(e.root) {
		return nil, false
	}
	return b, true
}

// typed reports whether every comparison under n compares values of one
// domain (numbers with numbers, texts with texts, = and <> only for
// texts) and every column cast loses nothing.
func (b *boundCheck) typed(n *checkNode) bool {
	switch n.op {
	case chkColumn:
		switch d := b.domain[n.slot]; n.cast {
		case "":
			return true
		case "numeric":
			return d == domInteger || d == domNumeric
		case "bigint":
			return d == domInteger
		default: // text, character varying
			return d == domText
		}
	case chkNumber, chkText:
		return true
	case chkCompare, chkAny, chkAll:
		text := b.isText(n.kids[0])
		for _, k := range n.kids {
			if !b.typed(k) || b.isText(k) != text {
				return false
			}
		}
		return !text || n.cmp == "=" || n.cmp == "<>"
	}
	for _, k := range n.kids {
		if !b.typed(k) {
			return false
		}
	}
	return true
}

// isText reports whether the value n is a text.
func (b *boundCheck) isText(n *checkNode) bool {
	if n.op == chkColumn {
		return b.domain[n.slot] == domText
	}
	return n.op == chkText
}

// refuses reports whether the constraint is false for the upsert with
// arguments args (as Plan sends them: text or nil).
func (b *boundCheck) refuses(args []any) bool { return b.eval(b.e.root, args) == triFalse }

// eval evaluates the truth value n on args.
func (b *boundCheck) eval(n *checkNode, args []any) tri {
	switch n.op {
	case chkAnd, chkOr:
		// AND is false when any kid is, OR true when any kid is.
		decide, other := triFalse, triTrue
		if n.op == chkOr {
			decide, other = triTrue, triFalse
		}
		out := other
		for _, k := range n.kids {
			switch b.eval(k, args) {
			case decide:
				return decide
			case triUnknown:
				out = triUnknown
			}
		}
		return out
	case chkNot:
		switch b.eval(n.kids[0], args) {
		case triTrue:
			return triFalse
		case triFalse:
			return triTrue
		}
		return triUnknown
	case chkIsNull, chkIsNotNull:
		null := args[b.args[n.kids[0].slot]] == nil
		if null == (n.op == chkIsNull) {
			return triTrue
		}
		return triFalse
	case chkCompare:
		return b.compare(n.cmp, n.kids[0], n.kids[1], args)
	case chkAny, chkAll:
		// op ANY is an OR of the comparisons, op ALL an AND.
		decide, other := triTrue, triFalse
		if n.op == chkAll {
			decide, other = triFalse, triTrue
		}
		out := other
		for _, k := range n.kids[1:] {
			switch b.compare(n.cmp, n.kids[0], k, args) {
			case decide:
				return decide
			case triUnknown:
				out = triUnknown
			}
		}
		return out
	}
	return triUnknown
}

// cmpValue is a value of a comparison: a number (small when isSmall,
// else num) or a text.
type cmpValue struct {
	ok      bool // false: NULL, or not read
	isSmall bool
	small   int64
	num     *big.Rat
	text    string
}

// value returns the value of n on args.
func (b *boundCheck) value(n *checkNode, args []any) cmpValue {
	switch n.op {
	case chkNumber:
		return cmpValue{ok: true, isSmall: n.isSmall, small: n.small, num: n.num}
	case chkText:
		return cmpValue{ok: true, text: n.text}
	}
	s, isText := args[b.args[n.slot]].(string)
	if !isText {
		return cmpValue{} // NULL
	}
	switch b.domain[n.slot] {
	case domInteger:
		v, err := strconv.ParseInt(pgTrim(s), 10, 64)
		return cmpValue{ok: err == nil, isSmall: true, small: v}
	case domNumeric:
		r, ok := parseDecimal(pgTrim(s))
		return cmpValue{ok: ok, num: r}
	}
	if l := b.length[n.slot]; l > 0 && len(s) > l {
		return cmpValue{} // maybe trailing spaces the column cuts: not read
	}
	return cmpValue{ok: true, text: s}
}

// compare evaluates l op r on args.
func (b *boundCheck) compare(op string, l, r *checkNode, args []any) tri {
	lv, rv := b.value(l, args), b.value(r, args)
	if !lv.ok || !rv.ok {
		return triUnknown
	}
	var c int
	switch {
	case b.isText(l):
		c = strings.Compare(lv.text, rv.text) // = and <> only (typed)
	case lv.isSmall && rv.isSmall:
		c = cmp.Compare(lv.small, rv.small)
	default:
		c = lv.rat().Cmp(rv.rat())
	}
	var ok bool
	switch op {
	case "=":
		ok = c == 0
	case "<>":
		ok = c != 0
	case "<":
		ok = c < 0
	case "<=":
		ok = c <= 0
	case ">":
		ok = c > 0
	case ">=":
		ok = c >= 0
	}
	if ok {
		return triTrue
	}
	return triFalse
}

// rat returns the number v as a *big.Rat.
func (v cmpValue) rat() *big.Rat {
	if v.isSmall {
		return new(big.Rat).SetInt64(v.small)
	}
	return v.num
}
