package projection

import (
	"cmp"
	"slices"
	"strings"
)

// Lock order. Two partitions' transactions that write the same rows (a
// projection whose primary key is not the event's entity: a per-account
// total written by the events of many payments, on many partitions) each
// lock those rows as they write them; when they do so in opposite orders,
// PostgreSQL finds a deadlock after deadlock_timeout (1 s by default) and
// aborts one of them (40P01, an infrastructure error: its partition waits
// and tries again). A new-user trial with 20 projections, three of them
// such totals, saw 30 deadlocks and the worker fall to about 200 events/s.
// So every batch transaction writes the rows of its tables in one order:
// by tenant schema, then table, then primary key, the key's values as
// Plan sends them, compared byte by byte (COLLATE "C"): COPY groups in
// that order (sortGroupsForLocks), each group's upsert reading its rows
// in it (copyInsertSQL's ORDER BY), and the statements of a batch in it
// (sortForLocks; pairs of one row keep their batch order). Transactions
// that take their locks in one order cannot deadlock with each other.

// sortGroupsForLocks sorts groups by tenant schema, then table.
func sortGroupsForLocks(groups []*copyGroup) {
	slices.SortStableFunc(groups, func(a, b *copyGroup) int {
		return cmp.Or(strings.Compare(a.schema, b.schema), strings.Compare(a.p.def.Table, b.p.def.Table))
	})
}

// sortForLocks returns planned in lock order: the statements of table
// projections by tenant schema, table and primary key (keyValue), pairs
// of one row in their batch order; the others after them, in their batch
// order. planned itself is left as it is.
func sortForLocks(planned []pair) []pair {
	sorted := slices.Clone(planned)
	slices.SortStableFunc(sorted, func(a, b pair) int {
		ta, oka := lockTable(a)
		tb, okb := lockTable(b)
		if !oka || !okb {
			return cmp.Compare(rankLast(oka), rankLast(okb))
		}
		if c := cmp.Or(strings.Compare(a.d.ev.TenantSchema, b.d.ev.TenantSchema), strings.Compare(ta.def.Table, tb.def.Table)); c != 0 {
			return c
		}
		for j := range ta.pk { // one table: one key shape
			if c := strings.Compare(keyValue(ta, a, j), keyValue(tb, b, j)); c != 0 {
				return c
			}
		}
		return 0
	})
	return sorted
}

// rankLast is 0 for true, 1 for false: table pairs first.
func rankLast(ok bool) int {
	if ok {
		return 0
	}
	return 1
}

// lockTable returns p's table projection when p is one's upsert or delete.
func lockTable(p pair) (*TableProjection, bool) {
	tp, ok := p.h.(*TableProjection)
	return tp, ok && (p.stmt.Op == OpUpsert || p.stmt.Op == OpDelete)
}

// keyValue returns the j-th primary key value of tp's statement in p, as
// Plan sends it (an upsert's arguments hold every column; a delete's start
// with the key).
func keyValue(tp *TableProjection, p pair, j int) string {
	i := j
	if p.stmt.Op == OpUpsert {
		i = tp.pk[j]
	}
	s, _ := p.stmt.Args[i].(string)
	return s
}
