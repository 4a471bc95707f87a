package projection

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCopyGroupHalvesKeepSupersededUpserts checks that a group's halves
// hold every upsert of the group, each half its newest per key: an upsert
// superseded in the group by one in the other half is sent again.
func TestCopyGroupHalvesKeepSupersededUpserts(t *testing.T) {
	_, tps := tblProjections(t)
	p := tps["artist_followers"]
	var planned []pair
	for i, u := range []string{"u1", "u2", "u3", "u1", "u2", "u4"} { // seq = i+1
		ev := tblEvent(t, "tenant_a", "ARTIST_FOLLOWED", int64(i+1), 1719331200000,
			fmt.Sprintf(`{"user_id":%q,"artist_id":"a","points":1,"games":1}`, u))
		st, err := p.Plan(ev)
		if err != nil {
			t.Fatal(err)
		}
		planned = append(planned, pair{d: &decoded{idx: i, ev: ev}, h: p, stmt: st})
	}
	groups, rest := copyGroups(planned, 1)
	if len(groups) != 1 || len(rest) != 0 {
		t.Fatalf("copyGroups = %d groups, %d statements; want 1, 0", len(groups), len(rest))
	}
	seqs := func(prs []pair) []int64 {
		var out []int64
		for _, pr := range prs {
			out = append(out, pr.d.ev.SequenceNumber)
		}
		return out
	}
	g := groups[0]
	if diff := cmp.Diff([]int64{4, 5, 3, 6}, seqs(g.pairs)); diff != "" {
		t.Errorf("group's newest per key (-want +got):\n%s", diff)
	}
	a, b := g.halves()
	if diff := cmp.Diff([]int64{1, 2, 3}, seqs(a.pairs)); diff != "" {
		t.Errorf("first half (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{4, 5, 6}, seqs(b.pairs)); diff != "" {
		t.Errorf("second half (-want +got):\n%s", diff)
	}
	if a.n+b.n != g.n || len(a.all)+len(b.all) != len(g.all) {
		t.Errorf("halves hold %d+%d upserts, want %d", a.n, b.n, g.n)
	}
}
