package projection

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestCopyGroupsOneRowPerPrimaryKey checks copyGroups' grouping: one group
// per projection and tenant schema, one pair per primary key (the newest
// sequence number, the later record on a tie), keys told apart value by
// value ("a"+"bc" is not "ab"+"c").
func TestCopyGroupsOneRowPerPrimaryKey(t *testing.T) {
	tps := hotProjections(t, hotDefinitions[0].path)
	ratings := tps[2]
	planFor := func(user, artist string, seq int) pair {
		t.Helper()
		v := strings.NewReplacer(`"user-0054321"`, `"`+user+`"`, `"artist-011111"`, `"`+artist+`"`,
			`"sequenceNumber":3`, `"sequenceNumber":`+strconv.Itoa(seq)).Replace(hotRated)
		ev := hotEvent(t, v)
		st, err := ratings.Plan(ev)
		if err != nil {
			t.Fatal(err)
		}
		return pair{d: &decoded{ev: ev}, h: ratings, stmt: st}
	}
	planned := []pair{
		planFor("bc", "a", 1),
		planFor("c", "ab", 2),
		planFor("bc", "a", 5), // newer: replaces the first
		planFor("bc", "a", 4), // older than the one kept
		planFor("c", "ab", 2), // a tie: the later record
	}
	groups, rest := copyGroups(planned, 1)
	if len(groups) != 1 || len(rest) != 0 {
		t.Fatalf("copyGroups: %d groups, %d left; want 1, 0", len(groups), len(rest))
	}
	g := groups[0]
	if g.n != 5 || len(g.all) != 5 || len(g.pairs) != 2 {
		t.Fatalf("group: n %d, all %d, pairs %d; want 5, 5, 2", g.n, len(g.all), len(g.pairs))
	}
	if g.pairs[0].stmt.Args[len(ratings.cols)] != "5" || g.pairs[1].d != planned[4].d {
		t.Errorf("kept %v and %v, want the pair of sequence 5 and the last record of the tie", g.pairs[0].stmt.Args, g.pairs[1].stmt.Args)
	}
}

// TestCheckCoverageRefusesAReportThatMissesRows: isolateSQL's report must
// cover every upsert once, a refused range being one upsert; anything else
// is an error (the caller then leaves the groups to statements) rather
// than a row silently skipped.
func TestCheckCoverageRefusesAReportThatMissesRows(t *testing.T) {
	r := func(k rangeKind, lo, hi int) isolatedRange { return isolatedRange{kind: k, lo: lo, hi: hi} }
	tests := []struct {
		name   string
		ranges []isolatedRange
		ok     bool
	}{
		{"all applied", []isolatedRange{r(rangeApplied, 0, 10)}, true},
		{"split", []isolatedRange{r(rangeApplied, 0, 4), r(rangeRefused, 4, 5), r(rangeStatement, 5, 8), r(rangeApplied, 8, 10)}, true},
		{"gap", []isolatedRange{r(rangeApplied, 0, 4), r(rangeApplied, 5, 10)}, false},
		{"overlap", []isolatedRange{r(rangeApplied, 0, 6), r(rangeApplied, 5, 10)}, false},
		{"short", []isolatedRange{r(rangeApplied, 0, 9)}, false},
		{"beyond", []isolatedRange{r(rangeApplied, 0, 11)}, false},
		{"refused range of two", []isolatedRange{r(rangeApplied, 0, 8), r(rangeRefused, 8, 10)}, false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		if err := checkCoverage(tt.ranges, 10); (err == nil) != tt.ok {
			t.Errorf("%s: checkCoverage = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}

// TestIsolateSQLStartsFromThePartsOfAGroupKnownRefused: a group that
// PostgreSQL has just refused as a whole (or whose last group it refused)
// is isolated from its parts (copyParts): the whole range, known to fail,
// is not upserted again. With rows that all apply, the report holds each
// part, applied; a group not known to fail is upserted whole, once.
func TestIsolateSQLStartsFromThePartsOfAGroupKnownRefused(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	defs, err := LoadDefinitions(hotDefinitions[0].path)
	if err != nil {
		t.Fatal(err)
	}
	ratings := hotProjections(t, hotDefinitions[0].path)[2]
	schema := pgtest.NewSchemaName(t)
	if err := Migrate(ctx, pool, defs, schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	const n, minRows = 64, 16
	for _, tt := range []struct {
		name      string
		fromParts bool
		want      int // ranges reported, each applied
	}{
		{"known refused", true, copyParts(n, minRows)},
		{"not known to fail", false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			tmp := ratings.copyTable() + "_r"
			if _, err := tx.Exec(ctx, ratings.copyCreateSQL(tmp, true)); err != nil {
				t.Fatal(err)
			}
			cols := []string{}
			for _, c := range ratings.cols {
				cols = append(cols, c.name)
			}
			cols = append(cols, seqColumn, rangeColumn)
			rows := make([][]any, n)
			for i := range rows {
				v := strings.NewReplacer(`"user-0054321"`, `"user-`+strconv.Itoa(i)+`"`).Replace(hotRated)
				st, err := ratings.Plan(hotEvent(t, v))
				if err != nil {
					t.Fatal(err)
				}
				rows[i] = append(append([]any{}, st.Args[:len(ratings.cols)+1]...), int64(i))
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{tmp}, cols, pgx.CopyFromRows(rows)); err != nil {
				t.Fatal(err)
			}
			ranges, err := isolate(ctx, tx, ratings.isolateSQL(schema, tmp, n, minRows, tt.fromParts))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkCoverage(ranges, n); err != nil {
				t.Fatal(err)
			}
			var affected int64
			for _, r := range ranges {
				if r.kind != rangeApplied {
					t.Errorf("range [%d, %d) %s: %v", r.lo, r.hi, r.kind, r.err)
				}
				affected += r.affected
			}
			if len(ranges) != tt.want || affected != n {
				t.Errorf("%d ranges upserting %d rows, want %d ranges, %d rows", len(ranges), affected, tt.want, n)
			}
		})
	}
}

// TestRefusedMarksAreBounded: a partition keeps at most maxRefusedMarks
// marks, whatever number of tenant schemas had a row refused; a clean
// isolation clears its mark.
func TestRefusedMarksAreBounded(t *testing.T) {
	tp := hotProjections(t, hotDefinitions[0].path)[0]
	var m refusedMarks
	groups := make([]*copyGroup, 3*maxRefusedMarks)
	for i := range groups {
		groups[i] = newCopyGroup(tp, "tenant_"+strconv.Itoa(i))
		m = m.set(groups[i], true)
		if !m.has(groups[i]) {
			t.Fatalf("mark %d not set", i)
		}
	}
	if len(m) != maxRefusedMarks {
		t.Errorf("%d marks kept, want at most %d", len(m), maxRefusedMarks)
	}
	last := groups[len(groups)-1]
	m = m.set(last, false)
	if m.has(last) || len(m) != maxRefusedMarks-1 {
		t.Errorf("a clean isolation left its mark (%d marks)", len(m))
	}
}
