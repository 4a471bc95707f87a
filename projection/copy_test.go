package projection

import (
	"strconv"
	"strings"
	"testing"
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
