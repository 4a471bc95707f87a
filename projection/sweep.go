package projection

// Sweeping after commit: the rows an older upsert brought back beside a
// newer tombstone.
//
// An upsert checks for a tombstone with the snapshot of its statement
// (PostgreSQL's READ COMMITTED), and a delete deletes the rows its
// statement's snapshot sees. When an older upsert and a newer delete of one
// primary key run at once (two entities on two partitions writing one key;
// a retried upsert beside the delete its partition applied meanwhile),
// neither sees the other: a delete cannot wait for an uncommitted insert of
// a new key, nor an upsert for an uncommitted first tombstone. The row then
// comes back beside a tombstone at least as new (a new-user trial brought
// back 491 of 500 deleted rows so).
//
// So every apply of an upsert or a delete of a projection that has deletes
// (TableProjection.deletes) is followed, after its commit, by a sweep of
// its keys (sweepSQL): the row of each key that a tombstone at least as new
// covers is deleted. Commits are totally ordered, so of an upsert and a
// delete running at once, the one that commits later sweeps after both
// have committed, and finds the row. The record's offset advances only
// after the sweep: a worker stopped between a commit and its sweep leaves
// the record to be applied and swept again. A row that a newer upsert
// changes while the sweep runs is checked again by PostgreSQL, and kept.

import (
	"context"
	"slices"
	"strconv"
	"strings"
)

// sweptMessage is the INFO line of a sweep that deleted rows, which
// docs/events.md quotes.
const sweptMessage = "deleted rows that an older upsert brought back beside a newer tombstone (an upsert and a delete of one key at once)"

// sweepGroup is the keys of the applied pairs of one table projection in
// one tenant schema, one []string per primary key column, and their
// events' sequence numbers (same indexes).
type sweepGroup struct {
	p      *TableProjection
	schema string
	cols   [][]string
	seqs   []string
}

// sweepGroups groups the primary keys of pairs whose handler is a
// TableProjection with deletes, by projection and tenant schema, in order
// of first appearance; nil when there is none.
func sweepGroups(pairs []pair) []sweepGroup {
	var groups []sweepGroup
	for _, pr := range pairs {
		tp, ok := pr.h.(*TableProjection)
		if !ok || !tp.deletes {
			continue
		}
		schema := pr.d.ev.TenantSchema
		k := -1
		for i := range groups {
			if groups[i].p == tp && groups[i].schema == schema {
				k = i
				break
			}
		}
		if k < 0 {
			k = len(groups)
			groups = append(groups, sweepGroup{p: tp, schema: schema, cols: make([][]string, len(tp.pk))})
		}
		g := &groups[k]
		for j := range tp.pk {
			s, _ := tp.keyArg(pr.stmt, j).(string)
			g.cols[j] = append(g.cols[j], s)
		}
		g.seqs = append(g.seqs, strconv.FormatInt(pr.d.ev.SequenceNumber, 10))
	}
	return groups
}

// keyArg is the value of the j-th primary key column in st, an upsert or
// a delete that p planned.
func (p *TableProjection) keyArg(st Statement, j int) any {
	if st.Op == OpDelete {
		return st.Args[j]
	}
	return st.Args[p.pk[j]]
}

// statement is the sweep of g's keys.
func (g sweepGroup) statement() Statement {
	args := make([]any, 0, len(g.cols)+2)
	for _, vals := range g.cols {
		args = append(args, textArray(vals))
	}
	return Statement{SQL: g.p.sweep.build(g.schema), Args: append(args, textArray(g.seqs), g.p.table)}
}

// textArray writes vals as a PostgreSQL text[] literal, each element
// double-quoted with its backslashes and double quotes escaped: {"a","b \"c\""}.
func textArray(vals []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for k := 0; k < len(v); k++ {
			if v[k] == '"' || v[k] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(v[k])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// sweep deletes the rows of the applied pairs' keys that a tombstone at
// least as new covers (see the top of this file), each (projection, tenant
// schema) in a statement of its own, all in one round trip when the
// database is an Acquirer, under a span "sweep" linked to the pairs'
// records. It logs at INFO and counts (causet.projection.swept) the rows
// it deleted. It returns the first
// error: a statement's (PostgreSQL's) or the round trip's.
func (w *Worker) sweep(ctx context.Context, applied []pair) (err error) {
	groups := sweepGroups(applied)
	if len(groups) == 0 {
		return nil
	}
	ctx, span := w.tr.startBatch(ctx, "sweep", len(applied), slices.Values(applied))
	defer func() { endBatch(span, err) }()
	stmts := make([]Statement, len(groups))
	for i, g := range groups {
		stmts[i] = g.statement()
	}
	var rows []int64
	if w.acquire != nil {
		tags, errs, err := execIndependently(ctx, w.acquire, stmts)
		if err != nil {
			return err
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		for _, t := range tags {
			rows = append(rows, t.RowsAffected())
		}
	} else {
		for _, st := range stmts {
			tag, err := w.db.Exec(ctx, st.SQL, st.Args...)
			if err != nil {
				return err
			}
			rows = append(rows, tag.RowsAffected())
		}
	}
	for i, n := range rows {
		if n > 0 {
			w.cfg.Metrics.swept(ctx, pairAttrs(groups[i].p.Name(), groups[i].schema), n)
			w.log.Info(sweptMessage,
				"projection", groups[i].p.Name(), "tenant_schema", groups[i].schema, "rows", n)
		}
	}
	return nil
}

// sweepApplied sweeps the applied pairs (Worker.sweep), waiting for the
// database while its error is an infrastructure error. It returns a
// non-nil error only when ctx is done first: the caller then leaves the
// pairs' records unfinished, to be applied and swept again. Another error
// (PostgreSQL refusing the sweep) is logged at ERROR and nil returned: the
// rows are applied, and the repair statement of docs/events.md removes
// what the sweep would have.
func (pc *partition) sweepApplied(ctx context.Context, applied []pair) error {
	err := pc.untilAvailable(ctx, func(ctx context.Context) error { return pc.w.sweep(ctx, applied) }, "while", "sweeping after commit")
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	pc.w.log.Error("sweep after commit failed: a row that an older upsert brought back beside a newer tombstone may remain (docs/events.md, Deletes and tombstones, gives the repair)",
		"topic", pc.w.cfg.Topic, "partition", pc.partition, "error", err)
	return nil
}

// sweptOf returns the pairs of planned that a sweep concerns (a
// TableProjection with deletes) and that are not among failures: the
// batch's applied upserts and deletes of such projections.
func sweptOf(planned []pair, failures []pairFailure) []pair {
	type pairID struct {
		d *decoded
		h Handler
	}
	var out []pair
	var failed map[pairID]bool
	for _, pr := range planned {
		if tp, ok := pr.h.(*TableProjection); !ok || !tp.deletes {
			continue
		}
		if failed == nil && len(failures) > 0 {
			failed = make(map[pairID]bool, len(failures))
			for _, f := range failures {
				failed[pairID{f.d, f.h}] = true
			}
		}
		if !failed[pairID{pr.d, pr.h}] {
			out = append(out, pr)
		}
	}
	return out
}

// sweep sweeps the attempts that were applied (made, without an error:
// partition.sweepApplied). When ctx is done first, their results become
// not made: left to the pair's own attempt, which applies and sweeps
// again.
func (at plannedAttempts) sweep(ctx context.Context, pc *partition) {
	var applied []pair
	var idx []int
	for k, i := range at.idx {
		if r := at.res[i]; r.made && r.err == nil {
			applied = append(applied, at.planned[k])
			idx = append(idx, i)
		}
	}
	if pc.sweepApplied(ctx, applied) != nil {
		for _, i := range idx {
			at.res[i] = attemptResult{}
		}
	}
}
