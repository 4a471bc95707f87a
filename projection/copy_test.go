package projection

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestCopyGroupPairsAndWithout: a group that holds no primary key twice
// keeps one array for pairs and all, one that does keeps two; removing
// upserts by key (without, as a suspect key is) leaves both right in
// either case, in batch order.
func TestCopyGroupPairsAndWithout(t *testing.T) {
	tps := hotProjections(t, hotDefinitions[0].path)
	ratings := tps[2]
	user := slices.IndexFunc(ratings.cols, func(c column) bool { return c.name == "user_id" })
	users := func(g *copyGroup, pairs []pair) []string {
		var out []string
		for _, p := range pairs {
			out = append(out, fmt.Sprint(p.stmt.Args[user]))
		}
		return out
	}
	for _, tt := range []struct {
		name             string
		users            []int
		shared           bool
		wantAll, wantKey []string // after without user-2
	}{
		{"each key once", []int{1, 2, 3, 4}, true, []string{"user-1", "user-3", "user-4"}, []string{"user-1", "user-3", "user-4"}},
		{"a key twice", []int{1, 2, 3, 1, 2, 4}, false, []string{"user-1", "user-3", "user-1", "user-4"}, []string{"user-1", "user-3", "user-4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := ratingsGroup(t, ratings, "tenant_a", len(tt.users), func(i int) int { return tt.users[i] }, nil)
			if g.sharesPairs() != tt.shared {
				t.Fatalf("sharesPairs = %v, want %v (all %d, pairs %d)", g.sharesPairs(), tt.shared, len(g.all), len(g.pairs))
			}
			checkKeyIndex(t, g)
			removed := g.without(g.keysOf([]int{int(g.key[1])})) // user-2's
			if got := users(g, removed); len(got) != len(tt.users)-len(tt.wantAll) || slices.ContainsFunc(got, func(u string) bool { return u != "user-2" }) {
				t.Errorf("removed %v, want every upsert of user-2", got)
			}
			if got := users(g, g.all); !slices.Equal(got, tt.wantAll) {
				t.Errorf("all = %v, want %v", got, tt.wantAll)
			}
			if got := users(g, g.pairs); !slices.Equal(got, tt.wantKey) {
				t.Errorf("pairs = %v, want %v", got, tt.wantKey)
			}
			if g.n != len(tt.wantAll) {
				t.Errorf("n = %d, want %d", g.n, len(tt.wantAll))
			}
			checkKeyIndex(t, g)
		})
	}
}

// checkKeyIndex fails t unless g.key gives, for each upsert of g.all, the
// upsert of g.pairs with its primary key.
func checkKeyIndex(t *testing.T, g *copyGroup) {
	t.Helper()
	if len(g.key) != len(g.all) {
		t.Fatalf("%d key indexes for %d upserts", len(g.key), len(g.all))
	}
	for j, pr := range g.all {
		k := int(g.key[j])
		if k < 0 || k >= len(g.pairs) {
			t.Fatalf("upsert %d: key index %d out of %d keys", j, k, len(g.pairs))
		}
		if got, want := appendKeyText(nil, g.p, g.pairs[k].stmt.Args), appendKeyText(nil, g.p, pr.stmt.Args); string(got) != string(want) {
			t.Errorf("upsert %d: key index %d names key %q, want %q", j, k, got, want)
		}
	}
}

// TestKeyIndexTellsKeysOfOneHashApart: a primary key whose hash another
// key of the group holds (made here by hand: 64-bit hashes of real keys do
// not meet) is found by its text, and is not taken for the other key.
func TestKeyIndexTellsKeysOfOneHashApart(t *testing.T) {
	tps := hotProjections(t, hotDefinitions[0].path)
	ratings := tps[2]
	g := ratingsGroup(t, ratings, "tenant_a", 2, nil, nil) // user-0, user-1
	x := newKeyIndex(2)
	defer x.release()
	k0 := appendKeyText(nil, ratings, g.pairs[0].stmt.Args)
	k1 := appendKeyText(nil, ratings, g.pairs[1].stmt.Args)
	x.slots[keySlot{g, maphash.Bytes(x.seed, k1)}] = 0 // k1's hash, k0's upsert
	if _, ok := x.findOrPut(g, k1, g.pairs[:1]); ok {
		t.Fatal("found user-1 at user-0's upsert")
	}
	if i, ok := x.findOrPut(g, k1, g.pairs); !ok || i != 1 {
		t.Errorf("find user-1 = %d, %v; want 1, true (spilled)", i, ok)
	}
	if _, ok := x.findOrPut(g, k0, g.pairs[:0]); ok {
		t.Fatal("found user-0 before it was put")
	}
	if i, ok := x.findOrPut(g, k0, g.pairs); !ok || i != 0 {
		t.Errorf("find user-0 = %d, %v; want 0, true", i, ok)
	}
	if _, ok := x.findOrPut(g, []byte("\x00artist-x\x00user-x"), g.pairs); ok {
		t.Error("found a key never put")
	}
}

// TestCopyGroupsOfManyTenants checks grouping past the few groups looked
// up by scanning (maxScannedGroups): a batch of 3 projections' upserts
// interleaved over 12 tenant schemas gives a group per projection and
// tenant in order of first appearance, each with its own pairs in batch
// order, and a group below minRows goes back to statements in batch order.
func TestCopyGroupsOfManyTenants(t *testing.T) {
	tps := hotProjections(t, hotDefinitions[0].path)
	const tenants = 12
	var planned []pair
	for i := range 4 * tenants {
		tenant := fmt.Sprintf("tenant_%02d", i%tenants)
		if i == 5 {
			tenant = "lone" // a group of one
		}
		for _, v := range []string{hotFollowed, hotRated} {
			v = strings.NewReplacer(`"bench_tenant"`, `"`+tenant+`"`, `"user-0012345"`, fmt.Sprintf(`"user-%d"`, i),
				`"user-0054321"`, fmt.Sprintf(`"user-%d"`, i)).Replace(v)
			ev := hotEvent(t, v)
			for _, p := range tps {
				if !p.Handles(ev.EventType) {
					continue
				}
				st, err := p.Plan(ev)
				if err != nil {
					t.Fatal(err)
				}
				planned = append(planned, pair{d: &decoded{ev: ev}, h: p, stmt: st})
			}
		}
	}
	groups, rest := copyGroups(planned, 2)
	if len(groups) != 3*tenants {
		t.Fatalf("%d groups, want %d", len(groups), 3*tenants)
	}
	seen := map[copyGroupKey]bool{}
	for gi, g := range groups {
		k := copyGroupKey{g.p, g.schema}
		if seen[k] {
			t.Fatalf("group %d: %s in %s twice", gi, g.p.Name(), g.schema)
		}
		seen[k] = true
		want := 0
		for _, pr := range planned {
			if pr.h == g.p && pr.d.ev.TenantSchema == g.schema {
				if want >= len(g.all) || g.all[want].d != pr.d {
					t.Fatalf("group %s/%s: upsert %d is not the batch's next of the group", g.p.Name(), g.schema, want)
				}
				want++
			}
		}
		if want != len(g.all) || g.n != want || len(g.pairs) != want {
			t.Errorf("group %s/%s: n %d, all %d, pairs %d; want %d each", g.p.Name(), g.schema, g.n, len(g.all), len(g.pairs), want)
		}
	}
	if len(rest) != 3 {
		t.Fatalf("%d pairs left to statements, want the 3 of tenant lone", len(rest))
	}
	for i, pr := range rest {
		if pr.d.ev.TenantSchema != "lone" || (i > 0 && pr.h == rest[i-1].h) {
			t.Errorf("left to statements: %s in %s", pr.h.Name(), pr.d.ev.TenantSchema)
		}
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
	pool, schema, ratings := ratingsSchema(t)
	ctx := context.Background()
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
			g := ratingsGroup(t, ratings, schema, n, nil, nil)
			tmp, err := copyNumbered(ctx, tx, g.p, g.all, tempTables{})
			if err != nil {
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

// TestIsolationTablesEmptyThemselves: the isolation's temporary tables
// (the numbered table and the report) are not emptied at commit, as the
// COPY tables are (tempIsolated: PostgreSQL would truncate them at every
// commit of the connection after its first isolation), so isolateSQL
// empties them itself: after an isolation that refused a row and
// committed, and after one rolled back, both are empty; a row put into
// them outside an isolation outlives its commit (no ON COMMIT DELETE
// ROWS).
func TestIsolationTablesEmptyThemselves(t *testing.T) {
	pool, schema, ratings := ratingsSchema(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const n = 40
	refused := func(i int) bool { return i == 7 }
	tables := []string{ratings.numberedTable(), copyResultTable}
	rows := func(t *testing.T, when string) {
		t.Helper()
		for _, tab := range tables {
			var c int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{tab}.Sanitize()).Scan(&c); err != nil {
				t.Fatal(err)
			}
			if c != 0 {
				t.Errorf("%s: %s holds %d rows, want 0", when, tab, c)
			}
		}
	}
	isolateOnce := func(t *testing.T, commit bool) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		g := ratingsGroup(t, ratings, schema, n, nil, refused)
		tmp, err := copyNumbered(ctx, tx, g.p, g.all, tempTables{})
		if err != nil {
			t.Fatal(err)
		}
		ranges, err := isolate(ctx, tx, ratings.isolateSQL(schema, tmp, n, 8, false))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkCoverage(ranges, n); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ranges, func(r isolatedRange) bool { return r.kind == rangeRefused && r.lo == 7 }) {
			t.Fatalf("row 7 not reported refused: %+v", ranges)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	isolateOnce(t, true)
	rows(t, "after an isolation committed")
	isolateOnce(t, false)
	rows(t, "after an isolation rolled back")

	// Not emptied at commit: a row put in stays until the next isolation.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{ratings.numberedTable()}.Sanitize()+" ("+rangeColumn+") VALUES (1); "+
		"INSERT INTO "+pgx.Identifier{copyResultTable}.Sanitize()+" (kind) VALUES ('x')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tab := range tables {
		var c int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{tab}.Sanitize()).Scan(&c); err != nil {
			t.Fatal(err)
		}
		if c != 1 {
			t.Errorf("%s holds %d rows after its commit, want the 1 put in: it is emptied at every commit (ON COMMIT DELETE ROWS)", tab, c)
		}
	}
	if _, err := conn.Exec(ctx, "TRUNCATE "+pgx.Identifier{ratings.numberedTable()}.Sanitize()+", "+pgx.Identifier{copyResultTable}.Sanitize()); err != nil {
		t.Fatal(err)
	}
}

// TestIdleCopyTablesAreDropped: a connection drops the temporary COPY
// table of a projection that none of its last maxIdleCopyCommits batch
// transactions filled (PostgreSQL empties every such table at each commit,
// filled or not), keeps the one it fills, and makes a dropped one again
// when a group needs it.
func TestIdleCopyTablesAreDropped(t *testing.T) {
	_, schema, ratings := ratingsSchema(t)
	followers := hotProjections(t, hotDefinitions[0].path)[0]
	ctx := context.Background()
	pool, _ := oneSessionPool(t)
	w := copyWorker(pool)
	followersGroup := func() *copyGroup {
		var pairs []pair
		for i := range 8 {
			ev := hotEvent(t, strings.Replace(hotFollowed, `"user-0012345"`, `"user-`+strconv.Itoa(i)+`"`, 2))
			st, err := followers.Plan(ev)
			if err != nil {
				t.Fatal(err)
			}
			pairs = append(pairs, pair{d: &decoded{ev: ev}, h: followers, stmt: st})
		}
		return formGroup(newCopyGroup(followers, schema), pairs)
	}
	apply := func(groups ...*copyGroup) {
		t.Helper()
		left, failures, err := (&partition{w: w}).execCopy(ctx, groups)
		if err != nil || len(left) != 0 || len(failures) != 0 {
			t.Fatalf("execCopy: %d left, %d failures, error %v", len(left), len(failures), err)
		}
	}
	exists := func(table string) bool {
		t.Helper()
		var oid *uint32
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::oid", "pg_temp."+pgx.Identifier{table}.Sanitize()).Scan(&oid); err != nil {
			t.Fatal(err)
		}
		return oid != nil
	}
	apply(ratingsGroup(t, ratings, schema, 8, nil, nil), followersGroup())
	for i := 1; i <= maxIdleCopyCommits; i++ {
		apply(followersGroup())
		if want := i < maxIdleCopyCommits; exists(ratings.copyTable()) != want {
			t.Fatalf("after %d transactions that filled only %s: %s exists = %v, want %v",
				i, followers.copyTable(), ratings.copyTable(), !want, want)
		}
		if !exists(followers.copyTable()) {
			t.Fatalf("after %d transactions that filled it: %s dropped", i, followers.copyTable())
		}
	}
	apply(ratingsGroup(t, ratings, schema, 8, nil, nil))
	if !exists(ratings.copyTable()) {
		t.Errorf("%s not made again for a group that needs it", ratings.copyTable())
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "artist_ratings"}.Sanitize()).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 8 {
		t.Errorf("artist_ratings holds %d rows, want 8", rows)
	}
}

// TestReadmeStatesWhenIdleCopyTablesAreDropped: the README gives
// maxIdleCopyCommits as the code has it.
func TestReadmeStatesWhenIdleCopyTablesAreDropped(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("table once %d of its batch transactions in a row have not filled it", maxIdleCopyCommits)
	if !strings.Contains(strings.Join(strings.Fields(string(b)), " "), want) {
		t.Errorf("README.md does not say %q", want)
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

// TestRefusedMarkOutlastsCheckedCleanGroups: a mark whose groups have
// their CHECK constraints evaluated is cleared after checkedMarkGroups
// clean groups in a row, not at the first (with one refused row in a
// hundred, one group of 300 in twenty has none, and the group after it
// was then copied plainly, failed and was isolated); a refused row in
// between starts the count again.
func TestRefusedMarkOutlastsCheckedCleanGroups(t *testing.T) {
	tp := hotProjections(t, hotDefinitions[0].path)[0]
	g := newCopyGroup(tp, "tenant_a")
	g.check = "(SELECT true)"
	m := refusedMarks{}.set(g, true)
	for i := range checkedMarkGroups - 1 {
		if m = m.set(g, false); !m.has(g) {
			t.Fatalf("mark cleared after %d clean checked groups, want %d", i+1, checkedMarkGroups)
		}
	}
	m = m.set(g, true) // refused again: the count starts again
	for range checkedMarkGroups - 1 {
		m = m.set(g, false)
	}
	if !m.has(g) {
		t.Fatal("a refused group did not start the count again")
	}
	if m = m.set(g, false); m.has(g) {
		t.Errorf("mark kept after %d clean checked groups in a row", checkedMarkGroups)
	}
}

// BenchmarkIsolateGroup measures isolateSQL on a COPY group of 300
// artist_ratings upserts (the benchmark's definitions) of which 5, spread
// out, break a CHECK constraint (23514), against copyRows of the same
// group without them: each op copies the group into its temporary table
// and upserts it, in a transaction rolled back. The sub-benchmarks isolate
// the clean group and the one with 5 refused rows, whole first or from its
// parts (CopyMinRows 32). server-ms/op is the PostgreSQL backend's CPU
// time per op (while the op runs) when the server runs on this machine.
//
//	go test ./projection -run '^$' -bench IsolateGroup -count 5
func BenchmarkIsolateGroup(b *testing.B) {
	pool, schema, ratings := ratingsSchema(b)
	ctx := context.Background()
	const n = 300
	// The group's users are permuted (7919 is prime), so that the upsert
	// meets the refused rows spread out.
	user := func(i int) int { return i * 7919 % n }
	refusedAt := func(i int) bool { return i%(n/5) == n/10 }
	clean, poisoned := ratingsGroup(b, ratings, schema, n, user, nil), ratingsGroup(b, ratings, schema, n, user, refusedAt)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	// The temporary tables, emptied after each op's rollback (a worker's
	// commit empties them: ON COMMIT DELETE ROWS), outside the figures.
	truncate := "TRUNCATE " + pgx.Identifier{ratings.copyTable()}.Sanitize() + ", " + pgx.Identifier{ratings.numberedTable()}.Sanitize() + ", " + pgx.Identifier{ratings.checkedTable()}.Sanitize()
	inTx := func(b *testing.B, f func(tx pgx.Tx) error) {
		var cpu int64
		measured := true
		for range b.N {
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			cpu0, ok0 := backendCPU(backend)
			if err := f(tx); err != nil {
				b.Fatal(err)
			}
			cpu1, ok1 := backendCPU(backend)
			cpu += cpu1 - cpu0
			measured = measured && ok0 && ok1
			if err := tx.Rollback(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if _, err := conn.Exec(ctx, truncate); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if measured {
			b.ReportMetric(float64(cpu)/float64(b.N), "server-ms/op")
		}
	}
	// The temporary tables exist on a worker's connections after its first
	// batch: created once here, and the table emptied again.
	warm, err := conn.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := copyRows(ctx, warm, clean, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := warm.Exec(ctx, ratings.copyCreateSQL(ratings.numberedTable(), tempIsolated)+"; "+ratings.copyCreateSQL(ratings.checkedTable(), tempChecked)); err != nil {
		b.Fatal(err)
	}
	if _, err := isolate(ctx, warm, ratings.isolateSQL(schema, ratings.numberedTable(), 0, 1, false)); err != nil {
		b.Fatal(err)
	}
	if _, err := warm.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "artist_ratings"}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	if err := warm.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	b.Run("copy-clean", func(b *testing.B) {
		inTx(b, func(tx pgx.Tx) error { _, _, err := copyRows(ctx, tx, clean, tempTables{}); return err })
	})
	// A group whose last group had a row refused, with the table's CHECK
	// constraints as the catalog has them (copyGroup.check): copyRows
	// deletes the rows they refuse from its temporary table before the
	// upsert, in the same round trip.
	cat := newTableCatalog(pool, slog.New(slog.DiscardHandler))
	cols := cat.columns(ctx, schema, "artist_ratings") // reads the checks too
	check := ratings.checkPredicate(cat.checks(schema, "artist_ratings"), cols)
	if check == "" {
		b.Fatal("no CHECK constraint of artist_ratings read from the catalog")
	}
	for _, v := range []struct {
		name    string
		g       *copyGroup
		refused int
	}{
		{"copy-checked/clean", clean, 0},
		{"copy-checked/5-refused", poisoned, 5},
	} {
		b.Run(v.name, func(b *testing.B) {
			g := *v.g
			g.check = check
			inTx(b, func(tx pgx.Tx) error {
				_, out, err := copyRows(ctx, tx, &g, tempTables{})
				if err == nil && len(out) != v.refused {
					err = fmt.Errorf("%d rows refused, want %d", len(out), v.refused)
				}
				return err
			})
		})
	}
	for _, v := range []struct {
		name      string
		g         *copyGroup
		fromParts bool
		refused   int
	}{
		{"isolate-clean/whole", clean, false, 0},
		{"isolate-clean/from-parts", clean, true, 0},
		{"isolate-5-refused/whole-first", poisoned, false, 5},
		{"isolate-5-refused/from-parts", poisoned, true, 5},
	} {
		b.Run(v.name, func(b *testing.B) {
			inTx(b, func(tx pgx.Tx) error {
				tmp, err := copyNumbered(ctx, tx, v.g.p, v.g.all, tempTables{})
				if err != nil {
					return err
				}
				ranges, err := isolate(ctx, tx, ratings.isolateSQL(schema, tmp, n, 32, v.fromParts))
				if err != nil {
					return err
				}
				refused := 0
				for _, r := range ranges {
					if r.kind == rangeRefused {
						refused++
					}
				}
				if refused != v.refused {
					return fmt.Errorf("%d rows refused, want %d", refused, v.refused)
				}
				return checkCoverage(ranges, n)
			})
		})
	}
}

// BenchmarkCommitWithIdleCopyTables measures what a connection's idle
// temporary COPY tables cost PostgreSQL: each op is a batch transaction
// (execCopy) of one artist_ratings group of 300 rows on one connection
// that holds, besides that group's table, none ("none") or 16 more tables
// of the same shape that no transaction fills ("idle-16": made outside the
// worker's own record, so that it keeps them, as it kept every table
// before it dropped idle ones: maxIdleCopyCommits). server-ms/op is the
// PostgreSQL backend's CPU per op when the server runs on this machine.
//
//	go test ./projection -run '^$' -bench CommitWithIdleCopyTables -benchtime 300x -count 5
func BenchmarkCommitWithIdleCopyTables(b *testing.B) {
	_, schema, ratings := ratingsSchema(b)
	ctx := context.Background()
	group := ratingsGroup(b, ratings, schema, 300, nil, nil)
	for _, idle := range []int{0, 16} {
		name := "none"
		if idle > 0 {
			name = "idle-" + strconv.Itoa(idle)
		}
		b.Run(name, func(b *testing.B) {
			pool, backend := oneSessionPool(b)
			for i := range idle {
				if _, err := pool.Exec(ctx, ratings.copyCreateSQL("_causet_idle_"+strconv.Itoa(i), tempPlain)); err != nil {
					b.Fatal(err)
				}
			}
			pc := &partition{w: copyWorker(pool)}
			cpu0, ok0 := backendCPU(backend)
			b.ResetTimer()
			for range b.N {
				if _, _, err := pc.execCopy(ctx, []*copyGroup{group}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if cpu1, ok1 := backendCPU(backend); ok0 && ok1 {
				b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "server-ms/op")
			}
		})
	}
}

// oneSessionPool returns a pool of one connection to the test database,
// closed when tb ends, so that every transaction on it is in one session,
// and the PID of that session's backend.
func oneSessionPool(tb testing.TB) (*pgxpool.Pool, int) {
	tb.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		tb.Fatal(err)
	}
	return pool, backend
}

// copyWorker returns a Worker that execCopy can apply groups with on pool.
func copyWorker(pool *pgxpool.Pool) *Worker {
	return &Worker{cfg: Config{Metrics: &Metrics{}}, log: slog.New(slog.DiscardHandler), begin: pool,
		catalog: newTableCatalog(pool, slog.New(slog.DiscardHandler))}
}

// backendCPU returns the CPU time (user + system, in ms) of the PostgreSQL
// backend process pid when the server runs on this machine (Linux /proc),
// false otherwise: a figure that the machine's load changes less than the
// time an op takes.
func backendCPU(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	_, after, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(after)
	if !ok || len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (utime + stime) * 10, true // USER_HZ is 100 on Linux
}

// ratingsGroup returns a COPY group of n artist_ratings upserts in schema
// (the benchmark's definitions), of users user(i) (i when nil) with 1 to 5
// stars, and 0 stars (refused by a CHECK constraint between 1 and 5) where
// refused(i).
func ratingsGroup(tb testing.TB, ratings *TableProjection, schema string, n int, user func(int) int, refused func(int) bool) *copyGroup {
	tb.Helper()
	g := newCopyGroup(ratings, schema)
	var pairs []pair
	for i := range n {
		u, stars := i, 1+i%5
		if user != nil {
			u = user(i)
		}
		if refused != nil && refused(i) {
			stars = 0
		}
		v := strings.NewReplacer(`"user-0054321"`, `"user-`+strconv.Itoa(u)+`"`, `"stars":4`, `"stars":`+strconv.Itoa(stars)).Replace(hotRated)
		ev := hotEvent(tb, v)
		st, err := ratings.Plan(ev)
		if err != nil {
			tb.Fatal(err)
		}
		pairs = append(pairs, pair{d: &decoded{ev: ev}, h: ratings, stmt: st})
	}
	return formGroup(g, pairs)
}

// formGroup adds pairs, upserts of g's table projection, to the empty
// group g as copyGroupsChecked does, and returns g.
func formGroup(g *copyGroup, pairs []pair) *copyGroup {
	keys := newKeyIndex(len(pairs))
	defer keys.release()
	g.all = make([]pair, 0, len(pairs))
	var key []byte
	for _, pr := range pairs {
		key = appendKeyText(key[:0], g.p, pr.stmt.Args)
		g.add(pr, key, keys)
	}
	g.formed()
	return g
}

// ratingsSchema returns a pool and a fresh tenant schema migrated for the
// benchmark's definitions, whose artist_ratings refuses stars outside 1 to
// 5 (a CHECK constraint, 23514), and its artist_ratings projection; the
// schema is dropped when tb ends.
func ratingsSchema(tb testing.TB) (*pgxpool.Pool, string, *TableProjection) {
	tb.Helper()
	pool := pgtest.Pool(tb)
	ctx := context.Background()
	defs, err := LoadDefinitions(hotDefinitions[0].path)
	if err != nil {
		tb.Fatal(err)
	}
	schema := migratedSchema(tb, pool, defs)
	if _, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "artist_ratings"}.Sanitize()+
		" ADD CONSTRAINT stars_range CHECK (stars BETWEEN 1 AND 5)"); err != nil {
		tb.Fatal(err)
	}
	return pool, schema, hotProjections(tb, hotDefinitions[0].path)[2]
}

// TestIsolateSQLSplitsAFailedRangeAroundTheRowBeingUpserted: when a range
// fails, isolateSQL tries alone the row PostgreSQL was upserting
// (copyAtSequence), and then the rows before and after it, rather than
// halving the range down to it: a group of 64 with one row that a CHECK
// constraint refuses (or whose cast is out of range) is reported as its
// parts, the one holding the refused row as three ranges. An error raised at the end of the
// statement (an AFTER trigger) names no row: the row tried alone applies,
// and the range is halved down to the refused row instead; either way the
// refused row, and only it, is reported with PostgreSQL's error.
func TestIsolateSQLSplitsAFailedRangeAroundTheRowBeingUpserted(t *testing.T) {
	pool, schema, ratings := ratingsSchema(t)
	ctx := context.Background()
	fn := pgx.Identifier{schema, "refuse_user_37"}.Sanitize()
	tbl := pgx.Identifier{schema, "artist_ratings"}.Sanitize()
	for _, sql := range []string{
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.user_id = 'user-37' THEN RAISE EXCEPTION 'user-37 refused'; END IF; RETURN NULL; END $$",
		"CREATE TRIGGER refuse_user_37 AFTER INSERT OR UPDATE ON " + tbl + " FOR EACH ROW WHEN (NEW.stars = 5) EXECUTE FUNCTION " + fn + "()",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	const n, minRows, at = 64, 16, 37
	for _, tt := range []struct {
		name     string
		stars    string // of row at
		sqlstate string // of its refusal
		ranges   int    // reported, at most
		user     string // of row at, when not ""
	}{
		// The parts; the failing one as the rows before, at and after the refused one.
		{"CHECK constraint", "0", "23514", copyParts(n, minRows) + 2, ""},
		{"a cast out of range", "3000000000", "22003", copyParts(n, minRows) + 2, ""},
		// A key too long for the primary key's index (new-user trial).
		{"a key over the index's limit", "1", "54000", copyParts(n, minRows) + 2, randomHex(t, 3000)},
		// The parts, one more range per halving of the failing part
		// (log2 16 = 4) and the row tried alone: the first failure that
		// names a row wrongly turns the naming off.
		{"AFTER trigger", "5", "P0001", copyParts(n, minRows) + bits.Len(minRows), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := ratingsGroup(t, ratings, schema, n, nil, nil)
			for i := range g.all { // no row but at refused
				g.all[i].stmt.Args[2] = "1"
			}
			g.all[at].stmt.Args[2] = tt.stars
			if tt.user != "" {
				g.all[at].stmt.Args[1] = tt.user
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			tmp, err := copyNumbered(ctx, tx, g.p, g.all, tempTables{})
			if err != nil {
				t.Fatal(err)
			}
			ranges, err := isolate(ctx, tx, ratings.isolateSQL(schema, tmp, n, minRows, true))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkCoverage(ranges, n); err != nil {
				t.Fatal(err)
			}
			for _, r := range ranges {
				refused := r.lo == at
				if (r.kind == rangeRefused) != refused || refused && r.err.Code != tt.sqlstate || !refused && r.kind != rangeApplied {
					t.Errorf("range [%d, %d) %s (%v); want row %d alone refused with SQLSTATE %s, the rest applied", r.lo, r.hi, r.kind, r.err, at, tt.sqlstate)
				}
			}
			if len(ranges) > tt.ranges {
				t.Errorf("%d ranges reported, want at most %d", len(ranges), tt.ranges)
			}
		})
	}
}

// randomHex returns n random hex digits: text that compression cannot
// bring much under n/2 bytes.
func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}
