package projection

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// notATenant is the reason given for a name that ReservedSchema reports.
const notATenant = "must name a tenant, not one of PostgreSQL's own schemas (public, information_schema, pg_*)"

// validIdentifier reports whether s is a PostgreSQL identifier this package
// accepts: ^[a-z_][a-z0-9_]{0,62}$, the tenantSchema pattern of SPEC §3,
// applied to every name that reaches SQL. It is a lowercase identifier of
// at most 63 bytes (NAMEDATALEN-1) that never needs case folding. Names
// that pass are still quoted with pgx.Identifier; the rule keeps wire input
// to names an operator can type.
func validIdentifier(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	if c := s[0]; !(c >= 'a' && c <= 'z' || c == '_') {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ReservedSchema reports whether s is a schema name that never names a
// tenant (SPEC §3): "public", every database's default schema;
// "information_schema", the SQL standard's catalog views; and any name
// starting with "pg_", which PostgreSQL reserves for its own schemas
// (pg_catalog, pg_toast, pg_temp_N, pg_toast_temp_N; CREATE SCHEMA refuses
// such names, see the PostgreSQL documentation of CREATE SCHEMA).
func ReservedSchema(s string) bool {
	return s == "public" || s == "information_schema" || strings.HasPrefix(s, "pg_")
}

// ValidTenantSchema reports whether s can name a tenant schema (SPEC §3): it
// matches ^[a-z_][a-z0-9_]{0,62}$ and is not one of PostgreSQL's own schemas
// (ReservedSchema). An operator may narrow the names further with
// TenantSchemas.
func ValidTenantSchema(s string) bool { return validIdentifier(s) && !ReservedSchema(s) }

// tenantSchemaError returns nil when ValidTenantSchema(s), else an error
// saying why: `tenant schema "Acme" is not a valid identifier (want
// ^[a-z_][a-z0-9_]{0,62}$)` or `tenant schema "public" must name a tenant,
// not one of PostgreSQL's own schemas (public, information_schema, pg_*)`.
func tenantSchemaError(s string) error {
	switch {
	case !validIdentifier(s):
		return fmt.Errorf("tenant schema %q is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$)", s)
	case ReservedSchema(s):
		return fmt.Errorf("tenant schema %q %s", s, notATenant)
	}
	return nil
}

// TenantSchemas is the set of tenant schema names accepted: those of
// ValidTenantSchema, narrowed by an operator's pattern
// (`projection-worker --tenant-schema-pattern`). A nil *TenantSchemas
// narrows nothing: it accepts every name ValidTenantSchema accepts. It is
// safe for concurrent use.
type TenantSchemas struct {
	pattern string         // as given to NewTenantSchemas
	re      *regexp.Regexp // ^(?:pattern)$
}

// NewTenantSchemas returns the set of the valid tenant schema names that
// match pattern, a Go RE2 regular expression (package regexp) that must
// match the whole name: it is anchored, so "acme_[a-z0-9_]+" accepts
// acme_prod but not old_acme_prod. The pattern only narrows: PostgreSQL's
// own schemas stay refused even when it matches them. An empty pattern
// returns nil (no narrowing). It returns the regexp package's error when
// pattern does not compile, and an error wrapping ErrNoTenantSchema when
// it matches no valid tenant schema (matchesSomeTenant): "public",
// "pg_.*", "(?i)pg_.*", "Acme_.*", "acme-.*", "[A-Z]+", "a{64}" (new-user
// trials: such a pattern was accepted, and then every event was
// dead-lettered).
func NewTenantSchemas(pattern string) (*TenantSchemas, error) {
	if pattern == "" {
		return nil, nil
	}
	alone, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	if err := matchesSomeTenant(alone); err != nil {
		return nil, err
	}
	// pattern compiles alone, so it compiles inside a group.
	re, err := regexp.Compile("^(?:" + pattern + ")$")
	if err != nil {
		return nil, err
	}
	return &TenantSchemas{pattern: pattern, re: re}, nil
}

// ErrNoTenantSchema marks a tenant schema pattern that matches no valid
// tenant schema (NewTenantSchemas).
var ErrNoTenantSchema = errors.New("it matches no valid tenant schema")

// matchesSomeTenant returns an error wrapping ErrNoTenantSchema when re
// matches no valid tenant schema as a whole: every match of re is, or
// starts with, a literal text that no valid tenant schema is or starts
// with (said as such), or someTenantMatches finds no valid name it
// matches; nil when it matches one, or when the search cannot tell.
func matchesSomeTenant(re *regexp.Regexp) error {
	prefix, complete := re.LiteralPrefix()
	switch {
	case prefix == "":
	case complete:
		if err := tenantSchemaError(prefix); err != nil {
			return fmt.Errorf("%w: the only name it matches is %q, and %w", ErrNoTenantSchema, prefix, err)
		}
	case len(prefix) > 63 || !validIdentifier(prefix[:min(len(prefix), 63)]):
		return fmt.Errorf("%w: every name it matches starts with %q, and a tenant schema matches ^[a-z_][a-z0-9_]{0,62}$", ErrNoTenantSchema, prefix)
	case strings.HasPrefix(prefix, "pg_"):
		return fmt.Errorf("%w: every name it matches starts with %q, and a tenant schema %s", ErrNoTenantSchema, prefix, notATenant)
	}
	if match, sure := someTenantMatches("^(?:" + re.String() + ")$"); sure && !match {
		return fmt.Errorf("%w: no name that matches ^[a-z_][a-z0-9_]{0,62}$ and is not public, information_schema or pg_* matches it", ErrNoTenantSchema)
	}
	return nil
}

// maxPatternStates bounds someTenantMatches' search.
const maxPatternStates = 1 << 16

// someTenantMatches reports whether the regular expression anchored
// matches a valid tenant schema (ValidTenantSchema): it runs the
// expression's program (regexp/syntax) over every name of
// ^[a-z_][a-z0-9_]{0,62}$ at once, a breadth-first search of the sets of
// instructions the program can be at after each character, and sets
// apart the names that are reserved (ReservedSchema). sure is false when
// it cannot tell: the expression does not parse, or the search passed
// maxPatternStates.
func someTenantMatches(anchored string) (match, sure bool) {
	parsed, err := syntax.Parse(anchored, syntax.Perl)
	if err != nil {
		return false, false
	}
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		return false, false
	}
	// closure adds to out the instructions reachable from pcs without a
	// character, in the context of the empty-width assertions ctx.
	closure := func(pcs []uint32, ctx syntax.EmptyOp) []uint32 {
		seen := map[uint32]bool{}
		var out []uint32
		stack := slices.Clone(pcs)
		for len(stack) > 0 {
			pc := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[pc] {
				continue
			}
			seen[pc] = true
			switch in := &prog.Inst[pc]; in.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				stack = append(stack, in.Out, in.Arg)
			case syntax.InstCapture, syntax.InstNop:
				stack = append(stack, in.Out)
			case syntax.InstEmptyWidth:
				if syntax.EmptyOp(in.Arg)&^ctx == 0 {
					stack = append(stack, in.Out)
				}
			case syntax.InstFail:
			default: // a rune or Match
				out = append(out, pc)
			}
		}
		slices.Sort(out)
		return out
	}
	// reserved follows a name's reservedness as its characters come: the
	// name itself while it may still become public or information_schema
	// or start with pg_, "pg_" once it has, "-" once it cannot.
	reserved := func(sofar string, c rune) string {
		if sofar == "pg_" || sofar == "-" {
			return sofar
		}
		next := sofar + string(c)
		if strings.HasPrefix("public", next) || strings.HasPrefix("information_schema", next) || strings.HasPrefix("pg_", next) {
			return next
		}
		return "-"
	}
	type state struct {
		pcs      []uint32
		n        int    // characters so far
		reserved string // reserved(...) of them
	}
	key := func(st state) string {
		return fmt.Sprint(st.pcs, st.n, st.reserved)
	}
	seen := map[string]bool{}
	queue := []state{{pcs: []uint32{uint32(prog.Start)}, reserved: ""}}
	for len(queue) > 0 {
		st := queue[0]
		queue = queue[1:]
		prev := rune(-1)
		if st.n > 0 {
			prev = 'a' // every character of a tenant schema is a word character
		}
		if st.n > 0 && st.reserved != "public" && st.reserved != "information_schema" && st.reserved != "pg_" {
			for _, pc := range closure(st.pcs, syntax.EmptyOpContext(prev, -1)) {
				if prog.Inst[pc].Op == syntax.InstMatch {
					return true, true
				}
			}
		}
		if st.n == 63 {
			continue
		}
		here := closure(st.pcs, syntax.EmptyOpContext(prev, 'a'))
		for _, c := range "abcdefghijklmnopqrstuvwxyz_0123456789" {
			if st.n == 0 && c >= '0' && c <= '9' {
				continue
			}
			var next []uint32
			for _, pc := range here {
				if in := &prog.Inst[pc]; in.Op != syntax.InstMatch && in.MatchRune(c) && !slices.Contains(next, in.Out) {
					next = append(next, in.Out)
				}
			}
			if len(next) == 0 {
				continue
			}
			slices.Sort(next)
			ns := state{pcs: next, n: st.n + 1, reserved: reserved(st.reserved, c)}
			if k := key(ns); !seen[k] {
				if len(seen) >= maxPatternStates {
					return false, false
				}
				seen[k] = true
				queue = append(queue, ns)
			}
		}
	}
	return false, true
}

// Pattern returns the pattern given to NewTenantSchemas, "" for nil.
func (t *TenantSchemas) Pattern() string {
	if t == nil {
		return ""
	}
	return t.pattern
}

// Check returns nil when s is in the set, else a *ValidationError for field
// tenantSchema (permanent, see retry.Classify) whose reason says why: s does
// not match ^[a-z_][a-z0-9_]{0,62}$ or is longer than 63 bytes, is one of
// PostgreSQL's own schemas (ReservedSchema), or does not match the
// pattern.
func (t *TenantSchemas) Check(s string) error {
	reason := ""
	switch {
	case len(s) > 63:
		reason = "must be at most 63 bytes (a PostgreSQL identifier), got " + strconv.Itoa(len(s))
	case !validIdentifier(s):
		reason = "must match ^[a-z_][a-z0-9_]{0,62}$ (a lowercase PostgreSQL identifier), got " + quoteValue(s)
	case ReservedSchema(s):
		reason = notATenant + ", got " + quoteValue(s)
	case t != nil && !t.re.MatchString(s):
		reason = fmt.Sprintf("must match the tenant schema pattern %q (the whole name), got %s", t.pattern, quoteValue(s))
	default:
		return nil
	}
	return &ValidationError{Field: "tenantSchema", Reason: reason}
}

// DecodeEvent decodes and validates value as the package-level DecodeEvent
// does, and refuses, as a *ValidationError for field tenantSchema, an
// event whose tenant schema is not in t (Check). A nil t applies SPEC §3
// alone.
func (t *TenantSchemas) DecodeEvent(value []byte) (*Event, error) {
	return decodeEvent(value, t, nil, nil)
}

// decodeRecord is DecodeEvent of a fetched record's value, which the
// event's strings share (decodeEvent's shared), its tree's nodes taken
// from slab (the batch's): value must not change while the event is in
// use. The Kafka client gives each fetched batch memory of its own, never
// reused (the worker sets no kgo.WithPools). The event type and tenant
// schema are copies, kept's (nil: a copy each).
func (t *TenantSchemas) decodeRecord(value []byte, slab *jsonstrict.NodeSlab, kept *keptStrings) (*Event, error) {
	return decodeEvent(value, t, slab, kept)
}
