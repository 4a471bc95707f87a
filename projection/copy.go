package projection

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgcopy"
	"github.com/causet/projection-worker/retry"
)

// copyGroup is the upserts of one table projection in one tenant schema of
// a batch, applied with COPY into a temporary table and one INSERT ... ON
// CONFLICT. Only the newest sequence number of each primary key is sent:
// the older ones would be stale no-ops anyway.
type copyGroup struct {
	p      *TableProjection
	schema string
	// pairs is one upsert per primary key, the newest. When the group
	// holds no primary key twice it is all itself (the same array), not a
	// copy: see sharesPairs.
	pairs []pair
	n     int    // upserts in the group, before deduplication
	all   []pair // every upsert of the group, in batch order
	// key is, for each upsert of all (same index), the index in pairs of
	// the upsert of its primary key, so that an upsert's key is found
	// again without its text (suspectKeys, without, keysOf).
	key []int32
	// wholeRefused: PostgreSQL is known to refuse a row of the group as a
	// whole (rowError), so isolateGroup starts from its parts.
	wholeRefused bool
	// check is the table's CHECK constraints as one predicate on a row
	// src of the temporary table (checkPredicate), set by formCopyGroups
	// for a group whose last group had a row refused (refusedMarks) when
	// the constraints read only the projection's columns: copyRows then
	// deletes the rows it refuses from the temporary table before the
	// upsert, in the same round trip, so that the group is copied, not
	// isolated. "": no check.
	check string
	// checkedOut is every upsert of the primary keys whose rows check
	// refused, in batch order, taken out of the group by execCopy: once
	// its transaction committed, left to their statements
	// (applySuspects), as copyGroupsChecked's suspects.
	checkedOut []pair
}

// copyGroups splits planned into groups applied with COPY and the pairs left
// for pipelined statements: deletes, upserts of a key that the batch also
// deletes (their order matters), other handlers' statements, and groups too
// small for COPY (fewer than minRows upserts). Measured with BenchmarkApplyBatchVsCopy: COPY is about
// 1.65× faster for large groups.
func copyGroups(planned []pair, minRows int) ([]*copyGroup, []pair) {
	groups, rest, _ := copyGroupsChecked(planned, minRows, nil)
	return groups, rest
}

// copyGroupsChecked is copyGroups that also returns apart, in suspects
// (group by group), every upsert of a primary key that has a suspect
// upsert: one that check
// (when not nil) says the table would refuse (rowCheck.refuses). check is
// called once per group of at least minRows upserts, with the group's table
// projection and tenant schema; it returns nil when nothing is known. The
// whole key goes, in batch order, so that its upserts are applied as
// statements would apply them: an older upsert is never skipped for a
// suspect newer one, and the sequence guard keeps the newest. A group left
// with fewer than minRows upserts goes to statements too. A suspect key
// has no delete in the batch (a deleted key's upserts are never grouped),
// so suspects may be applied apart from rest.
func copyGroupsChecked(planned []pair, minRows int, check func(*copyGroup) *rowCheck) ([]*copyGroup, []pair, []pair) {
	deleted := map[string]bool{}
	for _, pr := range planned {
		if tp, ok := pr.h.(*TableProjection); ok && pr.stmt.Op == OpDelete {
			deleted[rowKey(tp, pr.d.ev.TenantSchema, pr.stmt.Args[:len(tp.pk)])] = true
		}
	}
	// deletedKey reports whether the batch deletes the row of upsert pr.
	deletedKey := func(tp *TableProjection, pr pair) bool {
		return len(deleted) > 0 && deleted[upsertKey(tp, pr)]
	}
	// Two passes: the first finds each upsert's group and counts them, so
	// that the second fills groups sized once (no slice or map growth).
	var groups groupIndex
	in := make([]*copyGroup, len(planned)) // each pair's group; nil: rest
	var rest []pair
	for i, pr := range planned {
		tp, ok := pr.h.(*TableProjection)
		if !ok || pr.stmt.Op != OpUpsert || deletedKey(tp, pr) {
			rest = append(rest, pr)
			continue
		}
		g := groups.get(tp, pr.d.ev.TenantSchema)
		if g == nil {
			g = &copyGroup{p: tp, schema: pr.d.ev.TenantSchema}
			groups.add(g)
		}
		in[i] = g
		g.n++ // counted here, counted again by add
	}
	order := groups.order
	upserts := 0
	for _, g := range order {
		upserts += g.n
	}
	keyAt := make([]int32, upserts) // every group's key, one allocation
	for _, g := range order {
		g.all, g.key, keyAt = make([]pair, 0, g.n), keyAt[:0:g.n], keyAt[g.n:]
		g.n = 0
	}
	keys := newKeyIndex(upserts)
	defer keys.release()
	var key []byte // the primary key of an upsert in its group, reused
	for i, pr := range planned {
		if g := in[i]; g != nil {
			key = appendKeyText(key[:0], g.p, pr.stmt.Args)
			g.add(pr, key, keys)
		}
	}
	for _, g := range order {
		g.formed()
	}
	var suspect map[*copyGroup][]pair // the upserts left to statements, of a group left too small
	var suspects []pair
	for _, g := range order {
		if check == nil || g.n < minRows {
			continue
		}
		if rc := check(g); rc != nil {
			if keys := rc.suspectKeys(g); keys != nil {
				out := g.without(keys)
				suspects = append(suspects, out...)
				if g.n < minRows {
					if suspect == nil {
						suspect = map[*copyGroup][]pair{}
					}
					suspect[g] = out
				}
			}
		}
	}
	var out []*copyGroup
	small := map[*copyGroup]bool{}
	for _, g := range order {
		if g.n < minRows {
			small[g] = true
		} else {
			out = append(out, g)
		}
	}
	if len(small) == 0 {
		return out, rest, suspects
	}
	// Small groups go back to the statement path, less their suspect
	// upserts (in suspects already), in batch order.
	rest = rest[:0]
	for i, pr := range planned {
		if g := in[i]; g != nil {
			if !small[g] {
				continue // in a COPY group, or suspect
			}
			if slices.ContainsFunc(suspect[g], func(s pair) bool { return s.d == pr.d && s.h == pr.h }) {
				continue
			}
		}
		rest = append(rest, pr)
	}
	return out, rest, suspects
}

// newCopyGroup returns an empty group of p's upserts in schema.
func newCopyGroup(p *TableProjection, schema string) *copyGroup {
	return &copyGroup{p: p, schema: schema}
}

// add adds the upsert pr of the row with primary key k (appendKeyText) to
// g, in batch order: it replaces the pair of the same key unless that one is
// newer. It is called only while the groups are formed (copyGroupsChecked,
// with one keys for all its groups), after which a group whose pairs is
// still nil (no key twice) takes all as its pairs.
func (g *copyGroup) add(pr pair, k []byte, keys *keyIndex) {
	g.n++
	g.all = append(g.all, pr)
	// Until a key comes twice, pairs is all (kept nil meanwhile): an index
	// into one is an index into the other.
	dedup := g.pairs
	if dedup == nil {
		dedup = g.all[:len(g.all)-1]
	}
	i, ok := keys.findOrPut(g, k, dedup)
	if !ok {
		g.key = append(g.key, int32(len(dedup)))
		if g.pairs != nil {
			g.pairs = append(g.pairs, pr)
		}
		return
	}
	g.key = append(g.key, int32(i))
	if g.pairs == nil { // the first key twice: pairs becomes a copy
		g.pairs = append(make([]pair, 0, cap(g.all)), dedup...)
	}
	// Last sequence wins; on a tie, the later record (as applying them in
	// order would).
	if pr.d.ev.SequenceNumber >= g.pairs[i].d.ev.SequenceNumber {
		g.pairs[i] = pr
	}
}

// formed ends the adds to g: pairs is all when no primary key came twice.
func (g *copyGroup) formed() {
	if g.pairs == nil {
		g.pairs = g.all
	}
}

// sharesPairs reports whether g.pairs is g.all itself (no primary key
// twice), so that removing upserts from one removes them from both.
func (g *copyGroup) sharesPairs() bool {
	return len(g.pairs) == len(g.all) && (len(g.all) == 0 || &g.pairs[0] == &g.all[0])
}

// keyIndex finds, while copyGroupsChecked forms its groups, the upsert of
// a primary key in its group: by a hash of the key's text, so that no
// string is kept per upsert (a map of the keys' text cost an allocation
// per upsert: BenchmarkHotCopy). A hit is compared with the key of the
// upsert it names; a key whose hash another key of its group took first
// goes to spill, by its text.
type keyIndex struct {
	seed  maphash.Seed
	slots map[keySlot]int32
	spill map[keySpill]int32
}

type keySlot struct {
	g *copyGroup
	h uint64
}

type keySpill struct {
	g *copyGroup
	k string
}

var keyIndexes = sync.Pool{New: func() any { return &keyIndex{seed: maphash.MakeSeed()} }}

// newKeyIndex returns an empty keyIndex for about n keys, from a pool.
func newKeyIndex(n int) *keyIndex {
	x := keyIndexes.Get().(*keyIndex)
	if x.slots == nil {
		x.slots = make(map[keySlot]int32, n)
	}
	return x
}

// release empties x and puts it back in the pool.
func (x *keyIndex) release() {
	clear(x.slots)
	x.spill = nil
	keyIndexes.Put(x)
}

// findOrPut returns the index in pairs (g's upserts, one per key so far)
// of the upsert of primary key k, and true; or, when there is none,
// records len(pairs) as its index (where add puts it) and returns false:
// one hash of k and one lookup for each upsert of a new key.
func (x *keyIndex) findOrPut(g *copyGroup, k []byte, pairs []pair) (int, bool) {
	s := keySlot{g, maphash.Bytes(x.seed, k)}
	i, taken := x.slots[s]
	if !taken {
		x.slots[s] = int32(len(pairs))
		return 0, false
	}
	var buf [64]byte
	if string(appendKeyText(buf[:0], g.p, pairs[i].stmt.Args)) == string(k) {
		return int(i), true
	}
	// Another key of g took the slot of k's hash first.
	sp := keySpill{g, string(k)}
	if j, ok := x.spill[sp]; ok {
		return int(j), true
	}
	if x.spill == nil {
		x.spill = map[keySpill]int32{}
	}
	x.spill[sp] = int32(len(pairs))
	return 0, false
}

// appendKeyText appends to b the primary key values of tp's upsert
// arguments args (as Plan sends them, never NUL inside), each after a NUL:
// it tells the rows of one table in one tenant schema apart.
func appendKeyText(b []byte, tp *TableProjection, args []any) []byte {
	for _, i := range tp.pk {
		s, _ := args[i].(string)
		b = append(b, 0)
		b = append(b, keyValueText(tp.cols[i].kind, s)...)
	}
	return b
}

// keyValueText returns one text for all the spellings of a primary key
// value s that PostgreSQL reads as one value of a column of kind k, so that
// the batch tells rows apart as the table's primary key does: 7 and 7.0
// (numeric), +1 and 01 (integers), -0 and 0 (floating point), yes and t
// (boolean), upper-case and braced uuids, one instant at two UTC offsets
// (timestamptz), one date with two times after it (date). Two spellings of one row in one COPY group made its
// INSERT ... ON CONFLICT fail (21000), and the group's isolation then
// applied them out of order (new-user trial: the older of two equal
// sequence numbers won). A spelling it cannot read stays as it is; text
// (and jsonb, which Plan writes canonically) are returned unchanged.
func keyValueText(k colKind, s string) string {
	switch k {
	case kindSmallint, kindInteger, kindBigint:
		if n, err := strconv.ParseInt(strings.TrimPrefix(pgTrim(s), "+"), 10, 64); err == nil {
			return strconv.FormatInt(n, 10)
		}
	case kindNumeric:
		t := strings.TrimPrefix(pgTrim(s), "+")
		if t != "" && strings.Trim(t, "0123456789.eE+-") == "" {
			return canonicalNumber(t)
		}
		return strings.ToLower(t) // NaN, Infinity
	case kindDouble, kindReal:
		bits := 64
		if k == kindReal {
			bits = 32
		}
		if f, err := strconv.ParseFloat(pgTrim(s), bits); err == nil {
			return strconv.FormatFloat(f+0, 'g', -1, bits) // +0: -0 is 0
		}
	case kindBoolean:
		if b, ok := pgBool(pgTrim(s)); ok {
			return strconv.FormatBool(b)
		}
	case kindUUID:
		if u := strings.ToLower(strings.NewReplacer("{", "", "}", "", "-", "").Replace(pgTrim(s))); len(u) == 32 {
			return u
		}
	case kindTimestamptz:
		if tm, infinite, err := parseTimeText(k, s); err == nil && !infinite {
			return tm.UTC().Format(time.RFC3339Nano)
		}
	case kindDate:
		// PostgreSQL takes the date as written, whatever the time and
		// offset after it.
		if _, infinite, err := parseTimeText(k, s); err == nil && !infinite {
			return pgTrim(s)[:10]
		}
	}
	return s
}

// rowKey identifies a row of a table projection in a tenant schema by the
// text of its primary key values (as Plan sends them).
func rowKey(tp *TableProjection, schema string, keyArgs []any) string {
	var b strings.Builder
	b.WriteString(tp.def.Table)
	b.WriteByte(0)
	b.WriteString(schema)
	for j, a := range keyArgs {
		b.WriteByte(0)
		s, _ := a.(string)
		b.WriteString(keyValueText(tp.cols[tp.pk[j]].kind, s))
	}
	return b.String()
}

// upsertKey is rowKey for an upsert pair (its arguments hold every column).
func upsertKey(tp *TableProjection, pr pair) string {
	return rowKey(tp, pr.d.ev.TenantSchema, tp.upsertKeyArgs(pr.stmt.Args))
}

// execCopy applies the groups in one transaction and returns the pairs
// left for statements and the pairs whose rows PostgreSQL refused. Each
// group is copied inside a savepoint (copyRows); a group that fails
// (PostgreSQL refused a row, or its statement) is rolled back to it alone
// and then isolated in the same transaction (isolateGroup), starting from
// its parts when PostgreSQL refused a row of it (rowError). A group whose
// (table projection, tenant schema) had a row refused in its last groups
// (refusedMarks) is copied with the table's CHECK constraints evaluated
// (copyGroup.check) or, when none can be, skips the doomed first attempt:
// it is isolated from its parts at once, copied once. After the commit,
// each isolated or checked group sets its mark when a row was refused; a
// clean one clears it (refusedMarks.set: a checked one after
// checkedMarkGroups in a row), so that a clean stream takes plain
// copyRows again. An error that is not one
// group's (begin, commit, a savepoint, an isolation's COPY, an
// infrastructure error) is returned: nothing was applied.
func (pc *partition) execCopy(ctx context.Context, groups []*copyGroup) (left []pair, failures []pairFailure, err error) {
	w := pc.w
	sortGroupsForLocks(groups)
	start := time.Now()
	ctx, done := w.batchTx(ctx, start, "copy batch", groupsSize(groups), groupPairs(groups))
	applied, began := 0, false
	defer func() { done(err, applied, began) }()
	tx, err := w.begin.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	began = true
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	results := make([]copyResult, 0, len(groups))
	refused := map[*copyGroup]bool{} // the isolated and checked groups: whether a row was refused
	filled := tempTables{}
	for _, g := range groups {
		cause := "last group refused"
		g.wholeRefused = pc.refusedGroups.has(g) && g.check == ""
		if !g.wholeRefused {
			affected, out, gerr := copyRows(ctx, tx, g, filled)
			switch {
			case gerr == nil:
				if g.check != "" {
					// Checked while marked: marked as long as the check
					// finds rows the table refuses. Every upsert of their
					// keys leaves the group for its statement.
					refused[g] = len(out) > 0
					if len(out) > 0 {
						g.checkedOut = g.without(g.keysOf(out))
						w.log.Debug("upserts the table would refuse left to statements", "partition", pc.partition,
							"projection", g.p.Name(), "tenant_schema", g.schema, "upserts", len(g.checkedOut))
					}
				}
				res := copyResult{g: g, n: g.n, affected: affected}
				if w.tr.spansEveryPair() {
					res.pairs = g.all
				}
				results = append(results, res)
				continue
			case ctx.Err() != nil || retry.IsInfrastructure(gerr) || errors.Is(gerr, errSavepoint):
				return nil, nil, gerr
			}
			// The group's own failure: undone alone (copyRows rolled back
			// to its savepoint), isolated now.
			cause = "failed"
			g.wholeRefused = rowError(gerr)
			w.catalog.forgetOn(g.p, g.schema, gerr)
			w.log.Debug("copy group failed; applying it again on its own", "partition", pc.partition, "projection", g.p.Name(),
				"tenant_schema", g.schema, "rows", g.n, "error", gerr)
		}
		res, l, f, err := pc.isolateGroup(ctx, tx, g, cause, filled)
		if err != nil {
			return nil, nil, err
		}
		results = append(results, res)
		left = append(left, l...)
		failures = append(failures, f...)
		refused[g] = len(f) > 0
	}
	if err := w.dropIdleTables(ctx, tx, filled); err != nil {
		return nil, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	for g, r := range refused {
		pc.refusedGroups = pc.refusedGroups.set(g, r)
	}
	applied = w.copyApplied(ctx, results, start)
	return left, failures, nil
}

// tempTables records the temporary tables (by name, with their kind) a
// transaction has filled. ON COMMIT DELETE ROWS empties them when it ends
// (tempIsolated ones empty themselves); one filled before in the same
// transaction (a group of the same projection for another tenant schema, a
// group isolated after its check) is emptied before it is filled again.
// Emptying it after every group instead cost PostgreSQL a deleted row per
// upsert: about 0.37 µs of CPU per row (psql, 300 transactions of 500
// rows, 3 alternated runs).
type tempTables map[string]tempKind

// fill returns the statement that empties tmp, "; DELETE FROM tmp", when
// tmp was filled before in the transaction (or t is nil: not known), else
// "", and records tmp, of kind, as filled.
func (t tempTables) fill(tmp string, kind tempKind) string {
	if t != nil {
		if _, ok := t[tmp]; !ok {
			t[tmp] = kind
			return ""
		}
	}
	return "; DELETE FROM " + pgx.Identifier{tmp}.Sanitize()
}

// maxIdleCopyCommits is how many batch transactions in a row on one
// connection may leave a temporary table of copyRows unfilled before
// execCopy drops it. PostgreSQL empties every ON COMMIT DELETE ROWS table
// of the session at each commit, filled or not (copyCreateSQL): about 0.16
// ms of its CPU a table, so that a connection that has once copied a
// group of each of 20 projections and then fills 3 a batch pays for 17
// more at every commit; dropping the table and making it again when
// needed costs about 0.9 ms (psql, 1 000 CREATE TEMP TABLE and DROP TABLE
// of 8 columns, 2 runs: 1.28 s against 0.38 without them).
const maxIdleCopyCommits = 16

// copyTablesKey is the key of a connection's *sessionCopyTables in its
// CustomData.
const copyTablesKey = "causet.copy-tables"

// sessionCopyTables is what one connection holds of the temporary tables
// of copyRows (tempPlain, tempChecked: emptied at every commit): for each,
// the batch transaction that last filled it, counted in the connection's
// batch transactions. Used by one goroutine at a time, as the connection
// is.
type sessionCopyTables struct {
	txs  uint64
	last map[string]uint64
}

// copyTablesOn returns conn's sessionCopyTables, made on first use.
func copyTablesOn(conn *pgconn.PgConn) *sessionCopyTables {
	data := conn.CustomData()
	if st, ok := data[copyTablesKey].(*sessionCopyTables); ok {
		return st
	}
	st := &sessionCopyTables{last: map[string]uint64{}}
	data[copyTablesKey] = st
	return st
}

// idle counts one more batch transaction, in which the tables filled were
// filled, and returns the tables of copyRows that none of the last
// maxIdleCopyCommits filled, sorted: the ones to drop before its commit.
func (st *sessionCopyTables) idle(filled tempTables) []string {
	st.txs++
	for name, kind := range filled {
		if kind != tempIsolated {
			st.last[name] = st.txs
		}
	}
	var drop []string
	for name, at := range st.last {
		if st.txs-at >= maxIdleCopyCommits {
			drop = append(drop, name)
		}
	}
	slices.Sort(drop)
	return drop
}

// dropIdleTables drops the temporary tables of copyRows that tx's
// connection has not filled in its last maxIdleCopyCommits batch
// transactions (sessionCopyTables), in tx, inside a savepoint, and forgets
// them (before the commit, after which the connection is another
// goroutine's: a commit that fails leaves them, unknown, until a group
// fills one again). A failure to drop them is logged and leaves them
// known (the batch goes on); an error setting or rolling back to the
// savepoint, which tx cannot go on after, is returned.
func (w *Worker) dropIdleTables(ctx context.Context, tx pgx.Tx, filled tempTables) error {
	conn := tx.Conn()
	if conn == nil {
		return nil
	}
	st := copyTablesOn(conn.PgConn())
	drop := st.idle(filled)
	if len(drop) == 0 {
		return nil
	}
	names := make([]string, len(drop))
	for i, name := range drop {
		names[i] = pgx.Identifier{"pg_temp", name}.Sanitize()
	}
	_, err := tx.Exec(ctx, "SAVEPOINT causet_drop; DROP TABLE IF EXISTS "+strings.Join(names, ", ")+"; RELEASE causet_drop")
	switch {
	case err == nil:
		for _, name := range drop {
			delete(st.last, name)
		}
		return nil
	case ctx.Err() != nil || retry.IsInfrastructure(err):
		return err
	}
	w.log.Warn("dropping idle temporary COPY tables failed; keeping them", "tables", drop, "error", err)
	if _, rbErr := tx.Exec(ctx, "ROLLBACK TO causet_drop; RELEASE causet_drop"); rbErr != nil {
		return fmt.Errorf("%w: %w (after %w)", errSavepoint, rbErr, err)
	}
	return nil
}

// errSavepoint marks a failure to set or roll back to a COPY group's
// savepoint: the transaction cannot go on.
var errSavepoint = errors.New("copy group savepoint")

// maxRefusedMarks bounds a partition's refusedMarks.
const maxRefusedMarks = 64

// groupIndex finds a batch's COPY groups by table projection and tenant
// schema: by looking through them while they are few (a batch has a group
// per table and tenant, usually a handful), by a map beyond.
type groupIndex struct {
	order []*copyGroup // in order of creation
	m     map[copyGroupKey]*copyGroup
}

// maxScannedGroups is where groupIndex starts a map.
const maxScannedGroups = 8

func (x *groupIndex) get(p *TableProjection, schema string) *copyGroup {
	if x.m != nil {
		return x.m[copyGroupKey{p, schema}]
	}
	for _, g := range x.order {
		if g.p == p && g.schema == schema {
			return g
		}
	}
	return nil
}

func (x *groupIndex) add(g *copyGroup) {
	x.order = append(x.order, g)
	switch {
	case x.m != nil:
		x.m[copyGroupKey{g.p, g.schema}] = g
	case len(x.order) > maxScannedGroups:
		x.m = make(map[copyGroupKey]*copyGroup, 2*len(x.order))
		for _, g := range x.order {
			x.m[copyGroupKey{g.p, g.schema}] = g
		}
	}
}

// copyGroupKey is the table projection and tenant schema of a COPY group.
type copyGroupKey struct {
	p      *TableProjection
	schema string
}

// refusedMarks holds, for one partition, the (table projection, tenant
// schema) pairs whose last COPY groups had a row refused by PostgreSQL
// (execCopy), each with the clean groups still to come before its mark is
// cleared: at most maxRefusedMarks (setting one more drops another),
// owned by the partition's goroutine and dropped with the partition on
// revoke. The zero value (nil) is empty.
type refusedMarks map[copyGroupKey]int

// checkedMarkGroups is how many groups in a row must come through with
// no row refused, their CHECK constraints evaluated (copyGroup.check),
// before a mark is cleared: evaluating them costs PostgreSQL about what
// the group's COPY does, while a group copied plainly that a refused row
// fails is isolated, at about twice (BenchmarkIsolateGroup). With one
// refused row in a hundred and groups of 300, one group in twenty has
// none; clearing the mark then cost an isolation at the next group.
const checkedMarkGroups = 16

// has reports whether g's last groups had a row refused.
func (m refusedMarks) has(g *copyGroup) bool {
	_, ok := m[copyGroupKey{g.p, g.schema}]
	return ok
}

// set marks g when refused, for checkedMarkGroups clean groups; a clean
// group counts one of those when its CHECK constraints were evaluated
// (g.check) and clears the mark at once otherwise (an isolated group: no
// constraint could be evaluated). It returns m (allocated on the first
// mark).
func (m refusedMarks) set(g *copyGroup, refused bool) refusedMarks {
	k := copyGroupKey{g.p, g.schema}
	if !refused {
		if left, ok := m[k]; ok && g.check != "" && left > 1 {
			m[k] = left - 1
		} else {
			delete(m, k)
		}
		return m
	}
	if m == nil {
		m = refusedMarks{}
	}
	if _, ok := m[k]; !ok && len(m) >= maxRefusedMarks {
		for old := range m {
			delete(m, old)
			break
		}
	}
	m[k] = checkedMarkGroups
	return m
}

// copySavepoint is the savepoint around each group of execCopy (copyRows).
const copySavepoint = "SAVEPOINT causet_copy"

// rangeColumn numbers the rows of isolateGroup's temporary table: the
// index of the upsert in its group, in batch order (copyGroup.all).
const rangeColumn = "_causet_rn"

// copyResult is what execCopy applied of one group.
type copyResult struct {
	g        *copyGroup
	n        int    // upserts in the ranges applied
	affected int64  // rows the upserts changed
	pairs    []pair // the pairs of those upserts, with a span for every pair only (their spans end)
}

// groupPairs yields the pairs of groups (their batch span's links).
func groupPairs(groups []*copyGroup) iter.Seq[pair] {
	return func(yield func(pair) bool) {
		for _, g := range groups {
			for _, p := range g.all {
				if !yield(p) {
					return
				}
			}
		}
	}
}

// groupsSize is the number of upserts in groups.
func groupsSize(groups []*copyGroup) int {
	n := 0
	for _, g := range groups {
		n += g.n
	}
	return n
}

// isolateGroup applies g in tx, whose COPY failed or is known to fail
// (cause, for the log), and returns what it applied, the pairs left for
// statements and the pairs whose rows PostgreSQL refused. Its upserts,
// every one of them (copyGroup.all, superseded ones included), are copied
// into a temporary table numbered in batch order; then ranges of them are
// upserted, each inside a subtransaction, the newest per key of the range
// only (as copyGroup.add chooses), in one round trip (isolateSQL): the
// whole group first, or its parts (copyParts) when g.wholeRefused. A range
// that fails is rolled back alone; then, when PostgreSQL refused a row
// (rowError), its parts are upserted in its place, recursively, down to
// the single upsert refused, whose pair is a failure with PostgreSQL's
// error (as its statement would have failed); when the range's statement
// failed otherwise, its pairs are left for statements. An upsert
// superseded in a range that fails is upserted again with its part, never
// skipped. An infrastructure error, or any error outside a range's
// subtransaction (the COPY, the report), is returned: tx cannot go on.
func (pc *partition) isolateGroup(ctx context.Context, tx pgx.Tx, g *copyGroup, cause string, filled tempTables) (res copyResult, left []pair, failures []pairFailure, err error) {
	w := pc.w
	res.g = g
	// The ranges are parts of the group in lock order, so that the
	// transaction takes its row locks in it, range after range.
	all := sortForLocks(g.all)
	tmp, err := copyNumbered(ctx, tx, g.p, all, filled)
	if err != nil {
		return res, nil, nil, err
	}
	ranges, err := isolate(ctx, tx, g.p.isolateSQL(g.schema, tmp, len(all), w.cfg.CopyMinRows, g.wholeRefused))
	if err == nil {
		err = checkCoverage(ranges, len(all))
	}
	if err != nil {
		return res, nil, nil, err
	}
	statements := 0
	for _, r := range ranges {
		switch r.kind {
		case rangeApplied:
			res.n += r.hi - r.lo
			res.affected += r.affected
			if w.tr.spansEveryPair() {
				res.pairs = append(res.pairs, all[r.lo:r.hi]...)
			}
		case rangeRefused: // the pair's own row: its failure, as its statement would have failed
			failures = append(failures, w.batchFailure(ctx, all[r.lo], r.err))
		default: // the range's statement failed otherwise: statements find out
			statements += r.hi - r.lo
			left = append(left, all[r.lo:r.hi]...)
		}
	}
	w.log.Debug("copy group isolated in PostgreSQL", "partition", pc.partition, "projection", g.p.Name(), "tenant_schema", g.schema,
		"cause", cause, "from_parts", g.wholeRefused, "rows", len(all), "refused", len(failures), "to_statements", statements)
	return res, left, failures, nil
}

// copyNumbered copies the upserts all of p into p's numbered temporary
// table, which it creates if needed (and empties, when filled says it was
// filled before in tx), numbered by index in rangeColumn, and returns the
// table's name.
func copyNumbered(ctx context.Context, tx pgx.Tx, p *TableProjection, all []pair, filled tempTables) (string, error) {
	tmp := p.numberedTable()
	if _, err := tx.Exec(ctx, p.copyCreateSQL(tmp, tempIsolated)+filled.fill(tmp, tempIsolated)); err != nil {
		return "", err
	}
	return tmp, copyFrom(ctx, tx, p, tmp, all, true)
}

// maxCopyParts bounds the parts a failing range of isolateGroup is
// split into.
const maxCopyParts = 16

// rangeKind is what became of a range of isolateGroup's temporary
// table.
type rangeKind string

const (
	rangeApplied   rangeKind = "applied"   // upserted
	rangeRefused   rangeKind = "refused"   // one upsert, its row refused by PostgreSQL
	rangeStatement rangeKind = "statement" // its upsert failed otherwise: left to statements
)

// isolatedRange is one range [lo, hi) of a group's upserts (copyGroup.all)
// as isolateSQL reports it.
type isolatedRange struct {
	kind     rangeKind
	lo, hi   int
	affected int64           // rows the upsert changed (applied)
	err      *pgconn.PgError // PostgreSQL's error (refused, statement)
}

// copyResultTable holds isolateSQL's report, one row per range.
const copyResultTable = reservedPrefix + "_copy_result"

// copyAtSequence is the temporary sequence in which isolateSQL's upsert
// sets the number of the row it is upserting: a sequence is not rolled
// back with the range that fails, so it then names the row PostgreSQL was
// upserting.
const copyAtSequence = reservedPrefix + "_copy_at"

// isolateSQL is one round trip (the simple protocol, several statements)
// that upserts the n rows of the numbered temporary table tmp into p's
// table in schema and reports, a row per range, what became of them. A
// PL/pgSQL block upserts ranges of the rows, starting from the whole
// [0, n), or from its parts (copyParts) when fromParts (PostgreSQL is
// known to refuse a row of the whole), each in a block with an
// exception handler (a subtransaction, as a savepoint), the newest per key
// of the range only (copyRangeSQL): when PostgreSQL refuses a row of a
// range (SQLSTATE classes 21, 22, 23, P0001 and 54000, as rowError), the row
// the upsert was at (its number, set in copyAtSequence as each row is
// upserted; a sequence is not rolled back with the range) is upserted
// alone, then the rows before it and the rows after it, each a range of
// its own. When that row alone applies (the error was raised at the end
// of the statement: an AFTER trigger, a deferred check), naming rows is
// turned off for the rest of the block, and a range that fails is split
// into parts (copyParts, the same rule) instead, recursively. Either way
// the single upsert refused is reported with PostgreSQL's error fields
// (BenchmarkIsolateGroup, 3 alternated runs: PostgreSQL's CPU for a group
// of 300 with 5 rows refused, medians 7.5 → 6.0 ms); a range whose
// upsert fails otherwise is reported for statements; an infrastructure
// error (classes 08, 53, 57, 58, XX, 40001, 40P01) and a cancelled
// statement end the whole statement with it. The upsert is written into
// the block as static SQL, so that PL/pgSQL plans it once for all the
// ranges. The temporary table and the report's are emptied after
// (TRUNCATE: they are not emptied at commit, tempIsolated).
func (p *TableProjection) isolateSQL(schema, tmp string, n, minRows int, fromParts bool) string {
	minRows = max(minRows, 1)
	todo := make([]string, 0, 2*maxCopyParts)
	if parts := copyParts(n, minRows); fromParts && n > 1 {
		for i := parts - 1; i >= 0; i-- { // a stack: the first part on top
			todo = append(todo, strconv.Itoa(n*i/parts), strconv.Itoa(n*(i+1)/parts))
		}
	} else {
		todo = append(todo, "0", strconv.Itoa(n))
	}
	at := quoteLiteral("pg_temp."+pgx.Identifier{copyAtSequence}.Sanitize()) + "::regclass"
	upsert := strings.NewReplacer("$1::text", quoteLiteral(p.def.Table)+"::text",
		"$2::bigint", "_causet_lo", "$3::bigint", "_causet_hi").Replace(
		p.copyInsertSQL(schema, p.copyRangeSQL(tmp), "setval("+at+", src."+rangeColumn+") >= 0 AND ", true))
	result := pgx.Identifier{copyResultTable}.Sanitize()
	return "CREATE TEMP TABLE IF NOT EXISTS " + result + " (kind text, lo bigint, hi bigint, affected bigint," +
		" sqlstate text, message text, detail text, hint text, schema_name text, table_name text," +
		" column_name text, datatype text, constraint_name text);\n" +
		"CREATE TEMP SEQUENCE IF NOT EXISTS " + pgx.Identifier{copyAtSequence}.Sanitize() + " MINVALUE -1;\n" +
		"DO $causet_isolate$\nDECLARE\n" +
		"  _causet_todo int8[] := ARRAY[" + strings.Join(todo, ", ") + "]::int8[];\n" +
		"  _causet_lo int8; _causet_hi int8; _causet_size int8; _causet_parts int8; _causet_n int8;\n" +
		"  _causet_st text; _causet_msg text; _causet_det text; _causet_hint text; _causet_sch text;\n" +
		"  _causet_tbl text; _causet_col text; _causet_typ text; _causet_con text;\n" +
		"  _causet_at int8; _causet_probe int8 := -1; _causet_blind bool := false;\n" +
		"BEGIN\n" +
		"  WHILE cardinality(_causet_todo) > 0 LOOP\n" +
		"    _causet_hi := _causet_todo[cardinality(_causet_todo)];\n" +
		"    _causet_lo := _causet_todo[cardinality(_causet_todo) - 1];\n" +
		"    _causet_todo := _causet_todo[1:cardinality(_causet_todo) - 2];\n" +
		"    CONTINUE WHEN _causet_lo >= _causet_hi;\n" + // a part of a range around its failing row can be empty
		"    PERFORM setval(" + at + ", -1);\n" +
		"    BEGIN\n" +
		"      " + upsert + ";\n" +
		"      GET DIAGNOSTICS _causet_n = ROW_COUNT;\n" +
		"      IF _causet_lo = _causet_probe THEN\n" + // not the row being upserted when its range failed
		"        _causet_blind := true;\n" +
		"      END IF;\n" +
		"      INSERT INTO " + result + " (kind, lo, hi, affected) VALUES ('" + string(rangeApplied) + "', _causet_lo, _causet_hi, _causet_n);\n" +
		"    EXCEPTION WHEN OTHERS THEN\n" +
		"      GET STACKED DIAGNOSTICS _causet_st = RETURNED_SQLSTATE, _causet_msg = MESSAGE_TEXT,\n" +
		"        _causet_det = PG_EXCEPTION_DETAIL, _causet_hint = PG_EXCEPTION_HINT, _causet_sch = SCHEMA_NAME,\n" +
		"        _causet_tbl = TABLE_NAME, _causet_col = COLUMN_NAME, _causet_typ = PG_DATATYPE_NAME,\n" +
		"        _causet_con = CONSTRAINT_NAME;\n" +
		"      IF left(_causet_st, 2) IN ('08', '53', '57', '58', 'XX') OR _causet_st IN ('40001', '40P01') THEN\n" +
		"        RAISE;\n" +
		"      END IF;\n" +
		"      _causet_size := _causet_hi - _causet_lo;\n" +
		"      _causet_at := currval(" + at + ");\n" +
		"      IF (left(_causet_st, 2) IN ('21', '22', '23') OR _causet_st IN ('P0001', '54000')) AND _causet_size > 1\n" +
		"          AND NOT _causet_blind AND _causet_at >= _causet_lo AND _causet_at < _causet_hi THEN\n" +
		"        _causet_todo := _causet_todo || ARRAY[_causet_at + 1, _causet_hi, _causet_lo, _causet_at, _causet_at, _causet_at + 1];\n" +
		"        _causet_probe := _causet_at;\n" +
		"      ELSIF (left(_causet_st, 2) IN ('21', '22', '23') OR _causet_st IN ('P0001', '54000')) AND _causet_size > 1 THEN\n" +
		"        _causet_parts := greatest(2, least(" + strconv.Itoa(maxCopyParts) + ", (_causet_size + " + strconv.Itoa(minRows-1) + ") / " + strconv.Itoa(minRows) + "));\n" +
		"        FOR _causet_n IN REVERSE _causet_parts - 1 .. 0 LOOP\n" +
		"          _causet_todo := _causet_todo || ARRAY[_causet_lo + _causet_size * _causet_n / _causet_parts,\n" +
		"            _causet_lo + _causet_size * (_causet_n + 1) / _causet_parts];\n" +
		"        END LOOP;\n" +
		"      ELSE\n" +
		"        INSERT INTO " + result + " VALUES (CASE WHEN left(_causet_st, 2) IN ('21', '22', '23') OR _causet_st IN ('P0001', '54000')\n" +
		"          THEN '" + string(rangeRefused) + "' ELSE '" + string(rangeStatement) + "' END, _causet_lo, _causet_hi, 0, _causet_st, _causet_msg,\n" +
		"          _causet_det, _causet_hint, _causet_sch, _causet_tbl, _causet_col, _causet_typ, _causet_con);\n" +
		"      END IF;\n" +
		"    END;\n" +
		"  END LOOP;\n" +
		"END $causet_isolate$;\n" +
		"SELECT kind, lo, hi, affected, sqlstate, message, detail, hint, schema_name, table_name, column_name, datatype, constraint_name FROM " + result + " ORDER BY lo;\n" +
		"TRUNCATE " + result + ", " + pgx.Identifier{tmp}.Sanitize()
}

// checkCoverage returns an error unless ranges cover [0, n) once each, as
// isolateSQL's report must.
func checkCoverage(ranges []isolatedRange, n int) error {
	next := 0
	for _, r := range ranges { // ordered by lo
		if r.lo != next || r.hi <= r.lo || r.hi > n || (r.kind == rangeRefused && r.hi-r.lo != 1) {
			return fmt.Errorf("copy isolation report: range [%d, %d) %s where [%d, ...) was expected, of %d rows", r.lo, r.hi, r.kind, next, n)
		}
		next = r.hi
	}
	if next != n {
		return fmt.Errorf("copy isolation report: ranges end at %d of %d rows", next, n)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// isolate runs isolateSQL in tx and returns its report.
func isolate(ctx context.Context, tx pgx.Tx, sql string) ([]isolatedRange, error) {
	mrr := tx.Conn().PgConn().Exec(ctx, sql)
	var out []isolatedRange
	var parseErr error
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		for rr.NextRow() {
			v := rr.Values()
			if len(v) != 13 {
				continue // not the report
			}
			r := isolatedRange{kind: rangeKind(v[0])}
			lo, err1 := strconv.Atoi(string(v[1]))
			hi, err2 := strconv.Atoi(string(v[2]))
			affected, err3 := strconv.ParseInt(string(v[3]), 10, 64)
			if err := errors.Join(err1, err2, err3); err != nil {
				parseErr = fmt.Errorf("copy isolation report: %w", err)
				continue
			}
			r.lo, r.hi, r.affected = lo, hi, affected
			if r.kind != rangeApplied {
				r.err = &pgconn.PgError{Severity: "ERROR", Code: string(v[4]), Message: string(v[5]), Detail: string(v[6]),
					Hint: string(v[7]), SchemaName: string(v[8]), TableName: string(v[9]), ColumnName: string(v[10]),
					DataTypeName: string(v[11]), ConstraintName: string(v[12])}
			}
			out = append(out, r)
		}
		if _, err := rr.Close(); err != nil {
			_ = mrr.Close()
			return nil, err
		}
	}
	if err := mrr.Close(); err != nil {
		return nil, err
	}
	return out, parseErr
}

// copyParts returns the parts a failing range of size upserts is split
// into: parts of about minRows upserts, at most maxCopyParts (larger parts
// are split again), at least 2; a range of minRows or fewer is halved, down
// to the single upsert PostgreSQL refuses. Halves from the top would cost
// more: with 5 refused rows in a 500-row group, halving down to 31 rows
// upserts each good row about four times; parts of about minRows upsert
// each good row about twice, and only the few rows around a refused one
// are halved further.
func copyParts(size, minRows int) int {
	minRows = max(minRows, 1)
	return max(2, min(maxCopyParts, (size+minRows-1)/minRows))
}

// copyRows applies g inside a savepoint: it creates its projection's
// temporary table if needed (and empties it, when filled says it was
// filled before in tx), copies g's rows into it and upserts them into the
// table, in three round trips. With
// g.check, the rows are numbered (the numbered temporary table of
// copyNumbered, by index into g.pairs) and, in the upsert's round trip,
// the rows the check refuses are deleted from the temporary table first
// and returned in out (indexes into g.pairs, ascending). It returns the
// rows the upsert changed. When the COPY or the upsert fails, it rolls
// back to the savepoint (the temporary table is empty again) and returns
// that error; an error setting or rolling back to the savepoint wraps
// errSavepoint.
func copyRows(ctx context.Context, tx pgx.Tx, g *copyGroup, filled tempTables) (affected int64, out []int, err error) {
	numbered := g.check != ""
	tmp, kind := g.p.copyTable(), tempPlain
	if numbered {
		tmp, kind = g.p.checkedTable(), tempChecked
	}
	// No arguments: one round trip in the simple protocol, every statement.
	if _, err := tx.Exec(ctx, g.p.copyCreateSQL(tmp, kind)+filled.fill(tmp, kind)+"; "+copySavepoint); err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errSavepoint, err)
	}
	var tag pgconn.CommandTag
	err = copyFrom(ctx, tx, g.p, tmp, g.pairs, numbered)
	if err == nil {
		// The check, the upsert and the release in one round trip.
		b := &pgx.Batch{}
		if numbered {
			b.Queue(checkDeleteSQL(tmp, g.check))
		}
		b.Queue(g.p.copyInsertSQL(g.schema, pgx.Identifier{tmp}.Sanitize(), "", false), g.p.def.Table)
		b.Queue("RELEASE " + copySavepoint)
		br := tx.SendBatch(ctx, b)
		if numbered {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				var rn int64
				_, err = pgx.ForEachRow(rows, []any{&rn}, func() error {
					out = append(out, int(rn))
					return nil
				})
			}
		}
		if err == nil {
			if tag, err = br.Exec(); err == nil {
				_, err = br.Exec()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		slices.Sort(out)
		return tag.RowsAffected(), out, nil
	}
	if ctx.Err() != nil || retry.IsInfrastructure(err) {
		return 0, nil, err
	}
	if _, rbErr := tx.Exec(ctx, "ROLLBACK TO "+copySavepoint); rbErr != nil {
		return 0, nil, fmt.Errorf("%w: %w (after %w)", errSavepoint, rbErr, err)
	}
	return 0, nil, err
}

// checkDeleteSQL deletes from the numbered temporary table tmp the rows
// that check (checkPredicate, on src) refuses, false rather than NULL as
// PostgreSQL's CHECK, and returns their numbers.
func checkDeleteSQL(tmp, check string) string {
	return "DELETE FROM " + pgx.Identifier{tmp}.Sanitize() + " src WHERE " + check + " IS FALSE RETURNING src." + rangeColumn
}

// copyFrom copies pairs, upserts of p, into the temporary table tmp: each
// column's value, then the sequence number (Plan's Args, all text), then
// with numbered the pair's index (rangeColumn).
func copyFrom(ctx context.Context, tx pgx.Tx, p *TableProjection, tmp string, pairs []pair, numbered bool) error {
	fields := len(p.cols) + 1
	cols := make([]string, 0, fields+1)
	for _, c := range p.cols {
		cols = append(cols, c.name)
	}
	cols = append(cols, seqColumn)
	if numbered {
		cols = append(cols, rangeColumn)
	}
	_, err := pgcopy.From(ctx, tx, pgx.Identifier{tmp}, cols, len(pairs), func(i int, r *pgcopy.Row) {
		for _, v := range pairs[i].stmt.Args[:fields] {
			r.Text(v)
		}
		if numbered {
			r.Int8(int64(i))
		}
	})
	return err
}

// copyApplied records committed COPY work in the metrics: of each
// result's n upserts, affected applied and the rest stale.
func (w *Worker) copyApplied(ctx context.Context, results []copyResult, start time.Time) (total int) {
	for _, r := range results {
		total += r.n
	}
	took := time.Since(start)
	w.cfg.Metrics.observeBatch(ctx, total, took, true)
	for _, r := range results {
		for _, p := range r.pairs {
			endPair(p.span, outcomeCopied, 0)
		}
		attrs := pairAttrs(r.g.p.Name(), r.g.schema)
		applied := min(r.affected, int64(r.n))
		// The rest are stale: superseded in the batch, or older than the row.
		w.cfg.Metrics.appliedN(ctx, attrs, applied, int64(r.n)-applied)
		w.cfg.Metrics.observeApplyN(ctx, attrs, took, r.n) // a pair of a batch takes the batch's transaction
	}
	return total
}

// copyTable returns the name of the projection's temporary COPY table (one
// per table projection and connection; a hash keeps it within 63 bytes).
func (p *TableProjection) copyTable() string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.def.Table))
	return "_causet_copy_" + strconv.FormatUint(uint64(h.Sum32()), 16)
}

// numberedTable returns the name of the projection's numbered temporary
// table of isolateGroup (copyNumbered), tempIsolated.
func (p *TableProjection) numberedTable() string { return p.copyTable() + "_r" }

// checkedTable returns the name of the projection's numbered temporary
// table of copyRows with a check, tempChecked.
func (p *TableProjection) checkedTable() string { return p.copyTable() + "_c" }

// tempKind is what a temporary COPY table is for (copyCreateSQL).
type tempKind uint8

const (
	// tempPlain: copyRows without a check: the columns, emptied at commit.
	tempPlain tempKind = iota
	// tempChecked: copyRows with a check: the columns and rangeColumn,
	// emptied at commit, no index (the check reads every row).
	tempChecked
	// tempIsolated: isolateGroup: the columns and rangeColumn with an
	// index on it, so that each range of isolateSQL reads its own rows
	// rather than the whole table (BenchmarkIsolateGroup, 4 alternated
	// runs: PostgreSQL's CPU for a group with 5 rows refused, medians 10.6
	// → 9.1 ms); not emptied at commit but by isolateSQL itself (TRUNCATE,
	// and a rollback leaves it empty too).
	tempIsolated
)

// copyCreateSQL creates the temporary table tmp of kind: every column
// text, as Plan's parameters are, then seqColumn, then for tempChecked and
// tempIsolated rangeColumn (bigint).
//
// The tables of copyRows are emptied at commit (ON COMMIT DELETE ROWS).
// PostgreSQL truncates every such table of the session at each commit of
// a transaction that used any temporary table, whether it filled that one
// or not: about 0.16 ms of its CPU a table, 0.3 with an index (psql, 3 000
// commits with 5 such tables untouched, 2 alternated runs: 2.9 s, and 5.1
// with an index each, against 0.55 without them). The isolation's tables,
// used seldom, are not among them: isolateSQL empties them itself, so that
// a connection that once isolated a group does not pay for them at every
// commit after.
func (p *TableProjection) copyCreateSQL(tmp string, kind tempKind) string {
	cols := make([]string, 0, len(p.cols)+2)
	for _, c := range p.cols {
		cols = append(cols, ident(c.name)+" text")
	}
	cols = append(cols, seqColumn+" text")
	if kind != tempPlain {
		cols = append(cols, rangeColumn+" bigint")
	}
	sql := "CREATE TEMP TABLE IF NOT EXISTS " + pgx.Identifier{tmp}.Sanitize() + " (" + strings.Join(cols, ", ") + ")"
	if kind != tempIsolated {
		return sql + " ON COMMIT DELETE ROWS"
	}
	return sql + "; CREATE INDEX IF NOT EXISTS " + pgx.Identifier{tmp + "_rn"}.Sanitize() + " ON " + pgx.Identifier{tmp}.Sanitize() + " (" + rangeColumn + ")"
}

// copyRangeSQL is the rows $2 <= rangeColumn < $3 of the numbered
// temporary table tmp, the newest of each primary key only (last sequence
// wins; on a tie the later record, as copyGroup.add chooses), as a
// subquery for copyInsertSQL, in the key's type's order (which copyInsertSQL's
// qual needs: a sort above it would undo its naming of the row being
// upserted).
func (p *TableProjection) copyRangeSQL(tmp string) string {
	keys := make([]string, 0, len(p.pk))
	for _, i := range p.pk {
		keys = append(keys, ident(p.cols[i].name))
	}
	k := strings.Join(keys, ", ")
	return "(SELECT DISTINCT ON (" + k + ") * FROM " + pgx.Identifier{tmp}.Sanitize() +
		" WHERE " + rangeColumn + " >= $2::bigint AND " + rangeColumn + " < $3::bigint" +
		" ORDER BY " + k + ", " + seqColumn + "::bigint DESC, " + rangeColumn + " DESC)"
}

// copyInsertSQL is upsertSQL for the rows of from, the temporary table or
// a subquery of it: the same casts, tombstone check and sequence guard ($1
// is the table name). With skipNewer it also proposes no row where the
// table's is newer, as upsertSQL does (PostgreSQL checks a proposed row's
// constraints before ON CONFLICT finds the existing row, so an upsert
// older than its row that a CHECK refuses would be reported refused, not
// stale; fresh-user trial: 100 stale events dead-lettered with 23514 with
// --max-retries 0). isolateSQL takes it: isolating a failed group costs a
// probe of the primary key per row; a group's first COPY does not. Without qual, the rows are upserted in primary key
// order, each value as sent, byte by byte (lock order: lockorder.go); the
// sort costs PostgreSQL about 0.25 µs a row
// (BenchmarkCommitWithIdleCopyTables/none, 300 rows, 3 alternated runs:
// 1.63 against 1.55 server-ms). isolateSQL's qual names the row being
// upserted as it goes (copyAtSequence), which a sort above it would undo:
// isolateGroup numbers its rows in lock order, so that its ranges follow
// one another in it, and each range comes in copyRangeSQL's order, the
// key's type's: the same for text keys in a database whose collation is
// C, not for others (a deadlock with another partition is then possible
// within one range of an isolation, and PostgreSQL ends it: 40P01).
func (p *TableProjection) copyInsertSQL(schema, from, qual string, skipNewer bool) string {
	cast := func(name, typ string) string {
		if typ == "text" {
			return "src." + ident(name)
		}
		return "src." + ident(name) + "::" + typ
	}
	var names, values, sets, keys, keyExprs, keyTypes []string
	for i, c := range p.cols {
		names = append(names, ident(c.name))
		values = append(values, cast(c.name, c.typ))
		if !p.isKey(i) {
			sets = append(sets, ident(c.name)+" = EXCLUDED."+ident(c.name))
		}
	}
	for _, i := range p.pk {
		keys = append(keys, ident(p.cols[i].name))
		keyExprs = append(keyExprs, cast(p.cols[i].name, p.cols[i].typ))
		keyTypes = append(keyTypes, p.cols[i].typ)
	}
	seq := "src." + seqColumn + "::bigint"
	names = append(names, seqColumn)
	values = append(values, seq)
	sets = append(sets, seqColumn+" = EXCLUDED."+seqColumn)
	s := pgx.Identifier{schema}.Sanitize()
	newer := ""
	if skipNewer {
		match := make([]string, len(p.pk))
		for j, i := range p.pk {
			match[j] = "n." + ident(p.cols[i].name) + " = " + keyExprs[j]
		}
		newer = " AND NOT EXISTS (SELECT 1 FROM " + s + "." + ident(p.def.Table) + " n WHERE " +
			strings.Join(match, " AND ") + " AND n." + seqColumn + " > " + seq + ")"
	}
	orderBy := ""
	if qual == "" {
		order := make([]string, len(p.pk))
		for j, i := range p.pk {
			order[j] = "src." + ident(p.cols[i].name) + ` COLLATE "C"`
		}
		orderBy = " ORDER BY " + strings.Join(order, ", ")
	}
	return "INSERT INTO " + s + "." + ident(p.def.Table) + " AS t (" + strings.Join(names, ", ") + ")" +
		" SELECT " + strings.Join(values, ", ") + " FROM " + from + " src" +
		" WHERE " + qual + "NOT EXISTS (SELECT 1 FROM " + s + "." + ident(tombstoneTable) + " tb" +
		" WHERE tb.table_name = $1::text AND " + tombstoneMatch(keyExprs, keyTypes) +
		" AND tb." + seqColumn + " >= " + seq + ")" + newer +
		orderBy +
		" ON CONFLICT (" + strings.Join(keys, ", ") + ") DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE t." + seqColumn + " <= EXCLUDED." + seqColumn
}
