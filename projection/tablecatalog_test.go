package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestParseCatalogType reads the types as format_type spells them: the
// kind of the base type and the modifier the checks use; a type the checks
// do not know, or a modifier they cannot read, is not known.
func TestParseCatalogType(t *testing.T) {
	tests := []struct {
		typ  string
		want catalogColumn
	}{
		{"integer", catalogColumn{typ: "integer", kind: kindInteger, known: true}},
		{"smallint", catalogColumn{typ: "smallint", kind: kindSmallint, known: true}},
		{"bigint", catalogColumn{typ: "bigint", kind: kindBigint, known: true}},
		{"numeric", catalogColumn{typ: "numeric", kind: kindNumeric, known: true}},
		{"numeric(10,2)", catalogColumn{typ: "numeric(10,2)", kind: kindNumeric, known: true, precision: 10, scale: 2}},
		{"numeric(3,-2)", catalogColumn{typ: "numeric(3,-2)", kind: kindNumeric, known: true, precision: 3, scale: -2}},
		{"character varying(20)", catalogColumn{typ: "character varying(20)", kind: kindText, known: true, length: 20}},
		{"character varying", catalogColumn{typ: "character varying", kind: kindText, known: true}},
		{"character(1)", catalogColumn{typ: "character(1)", kind: kindText, known: true, length: 1}},
		{"text", catalogColumn{typ: "text", kind: kindText, known: true}},
		{"double precision", catalogColumn{typ: "double precision", kind: kindDouble, known: true}},
		{"real", catalogColumn{typ: "real", kind: kindReal, known: true}},
		{"timestamp with time zone", catalogColumn{typ: "timestamp with time zone", kind: kindTimestamptz, known: true}},
		{"timestamp(3) with time zone", catalogColumn{typ: "timestamp(3) with time zone"}},
		{"timestamp without time zone", catalogColumn{typ: "timestamp without time zone"}},
		{"inet", catalogColumn{typ: "inet"}},
		{"numeric(x,2)", catalogColumn{typ: "numeric(x,2)"}},
		{`"my type"`, catalogColumn{typ: `"my type"`}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, parseCatalogType(tt.typ), cmp.AllowUnexported(catalogColumn{})); diff != "" {
			t.Errorf("parseCatalogType(%q) (-want +got):\n%s", tt.typ, diff)
		}
	}
}

// typeCheckTest is a value of a column of the definition's type def, as
// Plan sends it, stored in a column of the table's type table: whether
// PostgreSQL refuses it. approx marks a value the check calls refused
// although PostgreSQL takes it (within one unit of an integer type's
// limit, read as a float): it costs a statement, never a dead letter.
type typeCheckTest struct {
	def, table, value string
	refused, approx   bool
}

func typeCheckTests() []typeCheckTest {
	return []typeCheckTest{
		{"bigint", "integer", "2147483647", false, false},
		{"bigint", "integer", "2147483648", true, false},
		{"bigint", "integer", "-2147483648", false, false},
		{"bigint", "integer", "-2147483649", true, false},
		{"bigint", "integer", " 12 ", false, false},
		{"integer", "smallint", "32767", false, false},
		{"integer", "smallint", "32768", true, false},
		{"bigint", "smallint", "-40000", true, false},
		{"numeric", "integer", "2147483647.4", false, false},
		{"numeric", "integer", "2147483647.5", true, false},
		{"numeric", "integer", "-2147483648.5", true, false},
		{"numeric", "integer", "1.5", false, false},
		{"numeric", "integer", "1e10", true, false},
		{"numeric", "integer", "NaN", true, false},
		{"numeric", "bigint", "9223372036854775807", true, true},
		{"double precision", "integer", "2147483647.5", true, false},
		{"double precision", "integer", "2147483646.5", false, false},
		{"double precision", "integer", "-2147483648.5", false, false},
		{"double precision", "integer", "Infinity", true, false},
		{"real", "integer", "2147483647", true, false},
		{"real", "integer", "2147483520", false, false},
		{"bigint", "numeric(5,2)", "999", false, false},
		{"bigint", "numeric(5,2)", "1000", true, false},
		{"numeric", "numeric(5,2)", "999.994", false, false},
		{"numeric", "numeric(5,2)", "999.995", true, false},
		{"numeric", "numeric(5,2)", "-999.995", true, false},
		{"numeric", "numeric(5,2)", "0.001", false, false},
		{"numeric", "numeric(5,2)", "00012345e-2", false, false},
		{"numeric", "numeric(5,2)", "1e3", true, false},
		{"numeric", "numeric(5,2)", ".0000000000000000000001", false, false},
		{"numeric", "numeric(5,2)", "NaN", false, false},
		{"numeric", "numeric(5,2)", "Infinity", true, false},
		{"numeric", "numeric(3,3)", "0.9994", false, false},
		{"numeric", "numeric(3,3)", "0.9995", true, false},
		{"numeric", "numeric(3,0)", "999.4", false, false},
		{"numeric", "numeric(3,0)", "999.5", true, false},
		{"numeric", "real", "3e38", false, false},
		{"numeric", "real", "1e39", true, false},
		{"numeric", "real", "1e-50", true, false},
		{"double precision", "real", "1e39", true, false},
		{"numeric", "double precision", "1e308", false, false},
		{"numeric", "double precision", "1e309", true, false},
		{"text", "character varying(3)", "abc", false, false},
		{"text", "character varying(3)", "abcd", true, false},
		{"text", "character varying(3)", "abc  ", false, false},
		{"text", "character varying(3)", "ab d", true, false},
		{"text", "character varying(3)", "äöü", false, false},
		{"text", "character varying(3)", "äöüß", true, false},
		{"text", "character(2)", "ab ", false, false},
		{"text", "character(2)", "abc", true, false},
	}
}

// TestTypeCheckRefusesWhatTheTableRefuses checks typeCheck value by value
// (the cases TestTypeCheckAgreesWithPostgres sends to PostgreSQL), and
// that it checks nothing where the table takes every value the definition
// lets through or where it does not know the pair.
func TestTypeCheckRefusesWhatTheTableRefuses(t *testing.T) {
	for _, tt := range typeCheckTests() {
		check := typeCheck(kindOf(tt.def), parseCatalogType(tt.table))
		if check == nil {
			t.Errorf("%s into %s: no check", tt.def, tt.table)
			continue
		}
		if got := check(tt.value); got != tt.refused {
			t.Errorf("%s %q into %s: refused %v, want %v", tt.def, tt.value, tt.table, got, tt.refused)
		}
	}
	for _, pair := range [][2]string{
		{"bigint", "bigint"}, {"integer", "bigint"}, {"smallint", "integer"}, {"integer", "numeric"},
		{"text", "text"}, {"text", "character varying"}, {"timestamptz", "timestamp with time zone"},
		{"text", "inet"}, {"text", "integer"}, {"double precision", "numeric(5,2)"}, {"integer", "real"},
		{"uuid", "character varying(3)"},
	} {
		if typeCheck(kindOf(pair[0]), parseCatalogType(pair[1])) != nil {
			t.Errorf("%s into %s: a check, want none", pair[0], pair[1])
		}
	}
}

// TestTypeCheckAgreesWithPostgres stores every value of
// TestTypeCheckRefusesWhatTheTableRefuses as an upsert does (cast to the
// definition's type, assigned to a column of the table's type): PostgreSQL
// refuses exactly the values the check refuses, but for the approximate
// ones, which it takes.
func TestTypeCheckAgreesWithPostgres(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, tt := range typeCheckTests() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "CREATE TEMP TABLE causet_type_check (c "+tt.table+") ON COMMIT DROP"); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, "INSERT INTO causet_type_check (c) SELECT $1::text::"+tt.def, tt.value)
			return err
		})
		if want := tt.refused && !tt.approx; (err != nil) != want {
			t.Errorf("%s %q into %s: PostgreSQL says %v, want refused %v", tt.def, tt.value, tt.table, err, want)
		}
	}
}

// TestRowCheckRefusesNullOnlyWhereTheTableIsStricter: a NULL is suspect
// for a column NOT NULL in the table but nullable in the definition; a
// column the table lacks, or one the table takes as the definition says,
// is not checked, and a table no stricter than its definition gives no
// check at all.
func TestRowCheckRefusesNullOnlyWhereTheTableIsStricter(t *testing.T) {
	ratings := hotProjections(t, hotDefinitions[0].path)[2] // artist_id, user_id, stars, review, rated_at
	same := map[string]catalogColumn{
		"artist_id": {typ: "text", known: true, notNull: true},
		"user_id":   {typ: "text", known: true, notNull: true},
		"stars":     {typ: "integer", kind: kindInteger, known: true, notNull: true},
		"review":    {typ: "text", known: true},
	}
	if rc := newRowCheck(ratings, same); rc != nil {
		t.Errorf("a table no stricter than its definition: checks %+v, want none", rc.cols)
	}
	stricter := map[string]catalogColumn{}
	for k, v := range same {
		stricter[k] = v
	}
	stricter["review"] = catalogColumn{typ: "text", known: true, notNull: true}
	stricter["stars"] = parseCatalogType("smallint")
	rc := newRowCheck(ratings, stricter)
	if rc == nil {
		t.Fatal("review NOT NULL, stars smallint: no check")
	}
	args := func(stars, review any) []any { return []any{"a", "u", stars, review, nil, "1", "artist_ratings"} }
	for _, tt := range []struct {
		args []any
		want bool
	}{
		{args("4", "good"), false},
		{args("4", nil), true},
		{args("40000", "good"), true},
		{args("32767", "good"), false},
	} {
		if got := rc.refuses(tt.args); got != tt.want {
			t.Errorf("refuses(%v) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

// TestCopyGroupsLeavesSuspectKeysToStatements: every upsert of a primary
// key with an upsert the table would refuse leaves the COPY group for
// statements, in batch order: the older upsert of a key whose newer one is
// suspect is not skipped (as the group's newest-per-key rule would skip
// it), and the newer of a key whose older one is suspect is applied after
// it. The other keys stay in the group; a group left too small goes to
// statements whole; the check is asked only for groups of at least
// minRows upserts.
func TestCopyGroupsLeavesSuspectKeysToStatements(t *testing.T) {
	ratings := hotProjections(t, hotDefinitions[0].path)[2]
	planFor := func(schema, user string, seq int, stars string) pair {
		t.Helper()
		ev := hotEvent(t, fmt.Sprintf(`{"eventType":"ARTIST_RATED","entityId":%q,"forkId":"production","tenantSchema":%q,`+
			`"irVersion":"v42","sequenceNumber":%d,"ts":1772366400014,"payload":{"user_id":%q,"artist_id":"a","stars":%s}}`,
			user, schema, seq, user, stars))
		st, err := ratings.Plan(ev)
		if err != nil {
			t.Fatal(err)
		}
		return pair{d: &decoded{ev: ev}, h: ratings, stmt: st}
	}
	planned := []pair{
		planFor("big", "u1", 1, "1"),
		planFor("big", "u2", 1, "40000"), // suspect, older
		planFor("big", "u3", 1, "3"),
		planFor("big", "u1", 2, "40000"), // suspect, newer: u1's older upsert must not be skipped
		planFor("big", "u2", 2, "2"),     // newer than a suspect one
		planFor("big", "u4", 1, "4"),
		planFor("small", "u1", 1, "40000"), // a group below minRows: never checked
		planFor("small", "u2", 1, "5"),
		planFor("big", "u5", 1, "5"),
	}
	var asked []string
	check := func(g *copyGroup) *rowCheck {
		asked = append(asked, g.schema)
		return newRowCheck(g.p, map[string]catalogColumn{"stars": parseCatalogType("smallint")})
	}
	groups, rest, suspects := copyGroupsChecked(planned, 3, check)
	if diff := cmp.Diff([]string{"big"}, asked); diff != "" {
		t.Errorf("groups checked (-want +got):\n%s", diff)
	}
	if len(groups) != 1 {
		t.Fatalf("%d groups, want 1", len(groups))
	}
	g := groups[0]
	if diff := cmp.Diff([]string{"big u3@1", "big u4@1", "big u5@1"}, pairNames(g.all)); diff != "" || g.n != 3 || len(g.pairs) != 3 {
		t.Errorf("group: n %d, pairs %d, upserts (-want +got):\n%s", g.n, len(g.pairs), diff)
	}
	if diff := cmp.Diff([]string{"small u1@1", "small u2@1"}, pairNames(rest)); diff != "" {
		t.Errorf("left to statements, in batch order (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"big u1@1", "big u2@1", "big u1@2", "big u2@2"}, pairNames(suspects)); diff != "" {
		t.Errorf("suspect keys' upserts, in batch order (-want +got):\n%s", diff)
	}

	// The same batch without a check: one group of 6 keys, nothing left but the small group.
	groups, rest, suspects = copyGroupsChecked(planned, 3, nil)
	if len(groups) != 1 || groups[0].n != 7 || len(rest) != 2 || len(suspects) != 0 {
		t.Errorf("without a check: %d groups, %d upserts, %d left, %d suspect; want 1, 7, 2, 0", len(groups), groups[0].n, len(rest), len(suspects))
	}

	// A group whose suspect keys leave it below minRows goes whole to
	// statements, its suspect keys apart.
	groups, rest, suspects = copyGroupsChecked(planned[:5], 3, check)
	if len(groups) != 0 || len(rest) != 1 || len(suspects) != 4 {
		t.Errorf("a group left too small: %d groups, %d left, %d suspect; want 0, 1, 4", len(groups), len(rest), len(suspects))
	}
}

// pairNames names pairs "<tenant schema> <entity>@<sequence number>".
func pairNames(pairs []pair) []string {
	var out []string
	for _, p := range pairs {
		out = append(out, fmt.Sprintf("%s %s@%d", p.d.ev.TenantSchema, p.d.ev.EntityID, p.d.ev.SequenceNumber))
	}
	return out
}

// countingQuerier counts the catalog lookups and fails them while err is
// set.
type countingQuerier struct {
	catalogQuerier
	n   int
	err error
}

func (q *countingQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sql == catalogColumnsSQL { // a lookup's first query
		q.n++
	}
	if q.err != nil {
		return nil, q.err
	}
	return q.catalogQuerier.Query(ctx, sql, args...)
}

// TestTableCatalogCachesTheColumns reads a table's columns from
// PostgreSQL's catalog once per TTL: the types as format_type spells them,
// NOT NULL; a table that does not exist is known to have no columns; a
// lookup that fails is no knowledge, not kept; an apply error of class 42
// on the table (through batchFailure) drops its entry, another class
// does not; the cache holds at most its bound.
func TestTableCatalogCachesTheColumns(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := pgtest.NewSchemaName(t)
	tbl := pgx.Identifier{schema, "Ratings"}.Sanitize()
	for _, sql := range []string{
		"CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize(),
		"CREATE TABLE " + tbl + ` (id text PRIMARY KEY, stars smallint NOT NULL, price numeric(5,2), "Note" character varying(20), gone int)`,
		"ALTER TABLE " + tbl + " DROP COLUMN gone",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	q := &countingQuerier{catalogQuerier: pool}
	c := &tableCatalog{db: q, log: slog.New(slog.DiscardHandler), ttl: time.Hour, max: 2, tables: map[catalogKey]catalogEntry{}}
	want := map[string]catalogColumn{
		"id":    {typ: "text", known: true, notNull: true},
		"stars": {typ: "smallint", kind: kindSmallint, known: true, notNull: true},
		"price": {typ: "numeric(5,2)", kind: kindNumeric, known: true, precision: 5, scale: 2},
		"Note":  {typ: "character varying(20)", known: true, length: 20},
	}
	if diff := cmp.Diff(want, c.columns(ctx, schema, "Ratings"), cmp.AllowUnexported(catalogColumn{})); diff != "" {
		t.Errorf("columns (-want +got):\n%s", diff)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE "+tbl+" ALTER COLUMN stars TYPE integer"); err != nil {
		t.Fatal(err)
	}
	if got := c.columns(ctx, schema, "Ratings")["stars"].typ; got != "smallint" || q.n != 1 {
		t.Errorf("second read: stars %s after %d lookups; want smallint (cached) after 1", got, q.n)
	}
	if got := c.columns(ctx, schema, "missing"); got == nil || len(got) != 0 {
		t.Errorf("a missing table: %v, want no columns", got)
	}

	// An apply error on the table: class 42 drops the entry, class 22 does not.
	p := &TableProjection{def: ProjectionDef{Name: "ratings", Table: "Ratings"}}
	w := &Worker{cfg: Config{Metrics: &Metrics{}}, catalog: c}
	d := &decoded{ev: &Event{EventType: "RATED", TenantSchema: schema}}
	w.batchFailure(ctx, pair{d: d, h: p}, &pgconn.PgError{Code: "22003"})
	if got := c.columns(ctx, schema, "Ratings")["stars"].typ; got != "smallint" {
		t.Errorf("after a 22003: stars %s, want smallint (kept)", got)
	}
	w.batchFailure(ctx, pair{d: d, h: p}, fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42703"}))
	if got := c.columns(ctx, schema, "Ratings")["stars"].typ; got != "integer" {
		t.Errorf("after a 42703: stars %s, want integer (read again)", got)
	}

	// A failed lookup: nothing known, nothing kept.
	q.err = errors.New("connection refused")
	before := q.n
	if got := c.columns(ctx, schema, "other"); got != nil {
		t.Errorf("a failed lookup: %v, want nil", got)
	}
	if got := c.columns(ctx, schema, "other"); got != nil || q.n != before+2 {
		t.Errorf("a failed lookup again: %v after %d lookups, want nil after 2 (not kept)", got, q.n-before)
	}
	q.err = nil
	for _, table := range []string{"a", "b", "c", "d"} {
		c.columns(ctx, schema, table)
	}
	if len(c.tables) > c.max {
		t.Errorf("the cache holds %d tables, more than its bound %d", len(c.tables), c.max)
	}
	c.ttl = 0 // every entry expired
	before = q.n
	c.columns(ctx, schema, "d")
	if q.n != before+1 {
		t.Errorf("an expired entry: %d lookups, want 1", q.n-before)
	}
}

// TestCopyGroupFailingWithClass42DropsTheCatalogEntry: a COPY group whose
// upsert fails with a class 42 error (a column the definition has and the
// table lost: 42703) drops what the catalog cache knows of the table, so
// that the next COPY group reads it again.
func TestCopyGroupFailingWithClass42DropsTheCatalogEntry(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := pgtest.NewSchemaName(t)
	defs, err := LoadDefinitions(hotDefinitions[0].path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool, defs, schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	if _, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "artist_ratings"}.Sanitize()+" DROP COLUMN review"); err != nil {
		t.Fatal(err)
	}
	ratings := hotProjections(t, hotDefinitions[0].path)[2]
	ev := hotEvent(t, strings.Replace(hotRated, `"bench_tenant"`, `"`+schema+`"`, 1))
	st, err := ratings.Plan(ev)
	if err != nil {
		t.Fatal(err)
	}
	q := &countingQuerier{catalogQuerier: pool}
	c := &tableCatalog{db: q, log: slog.New(slog.DiscardHandler), ttl: time.Hour, max: 8, tables: map[catalogKey]catalogEntry{}}
	c.columns(ctx, schema, "artist_ratings")
	w := &Worker{cfg: Config{Metrics: &Metrics{}}, log: slog.New(slog.DiscardHandler), begin: pool, catalog: c}
	groups, _ := copyGroups([]pair{{d: &decoded{ev: ev}, h: ratings, stmt: st}}, 1)
	left, failures, err := (&partition{w: w}).execCopy(ctx, groups)
	if err != nil || len(left) != 1 || len(failures) != 0 {
		t.Fatalf("execCopy: %d pairs left to statements, %d failures, error %v; want the group's pair left to statements", len(left), len(failures), err)
	}
	c.columns(ctx, schema, "artist_ratings")
	if q.n != 2 {
		t.Errorf("%d catalog lookups, want 2 (the entry dropped after the 42703)", q.n)
	}
}

// TestReadmeStatesTheCatalogCacheBounds: the README gives the catalog
// cache's TTL and bound as the code has them.
func TestReadmeStatesTheCatalogCacheBounds(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	want := fmt.Sprintf("keeps them %d s (at most %d tables per worker;", int(catalogTTL/time.Second), maxCatalogTables)
	if !strings.Contains(readme, want) {
		t.Errorf("README.md does not say %q", want)
	}
}

// TestCheckPredicateEvaluatesOnlyTheChecksOfTheProjectionsColumns: a
// CHECK constraint that reads a column the projection does not write (the
// table fills it) is left out; the others are evaluated together on the
// temporary table's row src, each column cast to the table's type, named
// as the table names it; no constraint left gives no predicate.
func TestCheckPredicateEvaluatesOnlyTheChecksOfTheProjectionsColumns(t *testing.T) {
	ratings := hotProjections(t, hotDefinitions[0].path)[2] // artist_ratings: user_id, artist_id, stars, review...
	cols := map[string]catalogColumn{}
	for _, c := range ratings.cols {
		cols[c.name] = parseCatalogType("text")
	}
	cols["stars"] = parseCatalogType("smallint")
	cols["other"] = parseCatalogType("integer")
	checks := []catalogCheck{
		{expr: "((stars >= 1) AND (stars <= 5))", cols: []string{"stars"}},
		{expr: "(other > 0)", cols: []string{"other"}},
		{expr: "(length(user_id) < 10)", cols: []string{"user_id"}},
	}
	pred := ratings.checkPredicate(checks, cols)
	want := `(SELECT (((stars >= 1) AND (stars <= 5))) AND ((length(user_id) < 10)) FROM (SELECT src."stars"::smallint AS "stars", src."user_id"::text AS "user_id") AS _causet_chk)`
	if pred != want {
		t.Errorf("predicate\n%s\nwant\n%s", pred, want)
	}
	if pred := ratings.checkPredicate(checks[1:2], cols); pred != "" {
		t.Errorf("only a check of another column: %q, want none", pred)
	}
}
