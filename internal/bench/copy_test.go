package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgcopy"
	"github.com/causet/projection-worker/projection"
)

// copyBatchEvents is the number of events per transaction of
// BenchmarkApplyBatchVsCopy and of the raw ceiling (issue 5: a poll's
// records, applied together): the worker's own batch,
// projection.DefaultMaxBatchRecords, so that the raw methods pay a
// transaction's costs over as many events as the worker does.
const copyBatchEvents = projection.DefaultMaxBatchRecords

// applyMode is how BenchmarkApplyBatchVsCopy applies a batch.
type applyMode string

const (
	modeBatch applyMode = "batch" // the worker's: pgx.Batch of Plan's statements
	modeCopy  applyMode = "copy"  // COPY into a temporary table + INSERT ... SELECT ... ON CONFLICT
)

// BenchmarkApplyBatchVsCopy measures the two ways issue 5 names to apply a
// batch of planned upserts, on the clean dataset of BENCH_EVENTS events
// (default 200000) and the bench's three projections, each in a fresh tenant
// schema (projection.Migrate), from 8 goroutines (the worker's 8 partitions;
// goroutine g takes the partitions p with p mod 8 == g, in order) and from 1,
// each goroutine on its own connection, copyBatchEvents (1000) events per
// transaction:
//
//   - batch: the worker's way (projection/batch.go): every statement that
//     TableProjection.Plan returns for the batch's (event, projection) pairs,
//     pipelined in one pgx.Batch, one transaction per batch.
//   - copy: per batch and per (tenant, table), the pairs are deduplicated by
//     primary key (the highest sequenceNumber wins; on a tie the later event),
//     copied (COPY, binary, encoded by package pgcopy as the worker encodes
//     its rows) into a temporary table of the connection, and
//     applied with one INSERT INTO target ... SELECT ... FROM tmp WHERE NOT
//     EXISTS (tombstone not older) ON CONFLICT (pk) DO UPDATE ... WHERE
//     target._causet_seq <= EXCLUDED._causet_seq, one transaction per batch.
//     The copied values are Plan's Args by position (columns in
//     ColumnNames order, then the sequence number; the trailing table name
//     is passed once as $1), all text: the temporary table has a text column
//     per target column plus _causet_seq text, and the INSERT casts each one
//     to its column type exactly as Plan's SQL casts $n::text::type, so the
//     conversion, the seq guard and the tombstone check (its key text
//     included) are Plan's. The temporary tables are created once per
//     connection, ON COMMIT DELETE ROWS (emptied at every commit; a second
//     tenant of the same table in one transaction truncates it first).
//
// Events are decoded and planned before the clock starts; batch assembly
// (queueing, deduplication) is timed. Rates are (event, projection) upsert
// pairs per second, before deduplication, so both ways count the same rows.
// Every run's end state (row count and md5 of the rows in primary key order,
// per table) must equal the others'.
//
// Deduplication by key is only equivalent to applying the statements in
// order because the batch holds upserts only (no delete of the same key
// between two upserts of it), as in this dataset.
//
//	go test ./internal/bench -run '^$' -bench BenchmarkApplyBatchVsCopy -benchtime 1x -v
func BenchmarkApplyBatchVsCopy(b *testing.B) {
	n := benchEvents(b)
	e := newEnv(b, false)
	d := newDataset(n, noPoison)
	defs, tps := e.projections(b)
	shapes := newCopyShapes(defs)

	type key struct {
		mode       applyMode
		goroutines int
	}
	rate := map[key]float64{}
	var want []tableState
	var wantFrom string
	b.ResetTimer()
	for _, g := range []int{numPartitions, 1} {
		for _, mode := range []applyMode{modeBatch, modeCopy} {
			schema := e.schema(fmt.Sprintf("%s%d", mode, g))
			if err := projection.Migrate(e.ctx, e.pool, defs, schema); err != nil {
				b.Fatal(err)
			}
			planned := planPairs(b, d, tps, schema)
			r, err := runApply(e.ctx, e.dbURL, d, planned, g, mode, shapes)
			if err != nil {
				b.Fatalf("%s, %d goroutines: %v", mode, g, err)
			}
			if r.pairs != d.statements() {
				b.Fatalf("%s, %d goroutines: applied %d pairs, want %d", mode, g, r.pairs, d.statements())
			}
			state := e.tableStates(schema, shapes)
			e.dropSchema(schema)
			run := fmt.Sprintf("%s with %d goroutine(s)", mode, g)
			if want == nil {
				want, wantFrom = state, run
			} else {
				for i := range want {
					if state[i] != want[i] {
						b.Fatalf("%s left %s %+v, %s left %+v", run, shapes[i].table, state[i], wantFrom, want[i])
					}
				}
			}
			rate[key{mode, g}] = float64(r.pairs) / r.elapsed.Seconds()
			extra := ""
			if mode == modeCopy {
				extra = fmt.Sprintf("; %d rows copied after dedup (%d duplicates dropped)", r.copied, r.pairs-r.copied)
			}
			e.logf("%-5s %d goroutine(s): %d pairs of %d events in %d transactions, %s: %.0f rows/s = %.0f events/s; rows affected %d%s (load %s)",
				mode, g, r.pairs, n, r.txs, r.elapsed.Round(time.Millisecond),
				rate[key{mode, g}], float64(n)/r.elapsed.Seconds(), r.affected, extra, loadAvg())
		}
	}
	b.StopTimer()
	for _, s := range want {
		e.logf("end state of every run: %s rows %d md5 %s", s.table, s.rows, s.md5)
	}
	e.logf("N=%d events, %d upsert pairs, %d events per transaction; rows/s = (event, projection) upsert pairs per second", n, d.statements(), copyBatchEvents)
	for _, g := range []int{numPartitions, 1} {
		bt, cp := rate[key{modeBatch, g}], rate[key{modeCopy, g}]
		b.ReportMetric(bt, fmt.Sprintf("batch_rows/s_%dg", g))
		b.ReportMetric(cp, fmt.Sprintf("copy_rows/s_%dg", g))
		b.ReportMetric(cp/bt, fmt.Sprintf("copy/batch_%dg", g))
	}
	for _, g := range []int{numPartitions, 1} {
		bt, cp := rate[key{modeBatch, g}], rate[key{modeCopy, g}]
		label := fmt.Sprintf("%d goroutines", g)
		if g == 1 {
			label = "1 goroutine"
		}
		fmt.Printf("%s: batch rows/s: %.0f\n", label, bt)
		fmt.Printf("%s: copy rows/s: %.0f\n", label, cp)
		fmt.Printf("%s: copy/batch: %.3f\n", label, cp/bt)
	}
}

// plannedPair is one (event, projection) pair planned by
// TableProjection.Plan.
type plannedPair struct {
	proj   int // index into the definitions' projections (and copyShapes)
	tenant string
	seq    int64
	st     projection.Statement
}

// planPairs renders d's events in tenant schema, decodes them and plans
// every (event, projection) pair that is not poisoned (those succeed: the
// rows the worker must leave), in the worker's projection order.
func planPairs(b *testing.B, d *dataset, tps []*projection.TableProjection, schema string) [][]plannedPair {
	b.Helper()
	out := make([][]plannedPair, len(d.events))
	buf := make([]byte, 0, 512)
	for i := range d.events {
		if d.events[i].absent {
			continue
		}
		buf = appendValue(buf[:0], &d.events[i], schema)
		ev, err := projection.DecodeEvent(buf)
		if err != nil {
			b.Fatal(err)
		}
		for j, p := range tps {
			if !p.Handles(ev.EventType) || d.events[i].poisonedPair(j) {
				continue
			}
			st, err := p.Plan(ev)
			if err != nil {
				b.Fatal(err)
			}
			out[i] = append(out[i], plannedPair{proj: j, tenant: ev.TenantSchema, seq: ev.SequenceNumber, st: st})
		}
	}
	return out
}

// copyShape is what the COPY way needs of one projection.
type copyShape struct {
	table string
	tmp   string   // the connection's temporary table
	cols  []string // ColumnNames, Plan's argument order
	types []string
	pk    []int // indexes into cols
	mu    sync.Mutex
	sqls  map[string]string // tenant schema → INSERT ... SELECT
}

func newCopyShapes(defs *projection.Definitions) []*copyShape {
	var out []*copyShape
	for _, pd := range defs.Projections {
		s := &copyShape{table: pd.Table, tmp: "copy_" + pd.Table, sqls: map[string]string{}}
		for _, c := range pd.ColumnNames {
			s.cols = append(s.cols, c)
			s.types = append(s.types, pd.Columns[c].Type)
		}
		for _, k := range pd.PrimaryKey {
			for i, c := range s.cols {
				if c == k {
					s.pk = append(s.pk, i)
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// copyColumns are the temporary table's columns: the target's, then
// _causet_seq.
func (s *copyShape) copyColumns() []string {
	return append(append([]string{}, s.cols...), "_causet_seq")
}

// createTemp creates the temporary table: every column text.
func (s *copyShape) createTemp() string {
	var defs []string
	for _, c := range s.copyColumns() {
		defs = append(defs, pgx.Identifier{c}.Sanitize()+" text")
	}
	return "CREATE TEMP TABLE IF NOT EXISTS " + pgx.Identifier{s.tmp}.Sanitize() +
		" (" + strings.Join(defs, ", ") + ") ON COMMIT DELETE ROWS"
}

// cast returns the source column i cast to its type as Plan's param does
// ($n::text::type; a text column as it is).
func (s *copyShape) cast(i int) string {
	c := "src." + pgx.Identifier{s.cols[i]}.Sanitize()
	if s.types[i] == "text" {
		return c
	}
	return c + "::" + s.types[i]
}

// keyText is Plan's keyText for source column i: the value cast to its
// type, then to text (timestamptz at time zone UTC).
func (s *copyShape) keyText(i int) string {
	switch s.types[i] {
	case "text":
		return s.cast(i)
	case "timestamptz":
		return "(" + s.cast(i) + " AT TIME ZONE 'UTC')::text"
	}
	return s.cast(i) + "::text"
}

// insertSQL returns the set-based form of Plan's upsert for tenant, reading
// the temporary table; $1 is the table name (Plan's last argument):
//
//	INSERT INTO s.t AS t (c1, ..., cn, _causet_seq)
//	SELECT src.c1::type1, ..., src._causet_seq::bigint FROM pg_temp.tmp src
//	WHERE NOT EXISTS (SELECT 1 FROM s._causet_tombstones tb
//	    WHERE tb.table_name = $1::text AND tb.pk = ARRAY[<key columns as text>]
//	    AND tb._causet_seq >= src._causet_seq::bigint)
//	ON CONFLICT (pk...) DO UPDATE SET c = EXCLUDED.c, ..., _causet_seq = EXCLUDED._causet_seq
//	WHERE t._causet_seq <= EXCLUDED._causet_seq
func (s *copyShape) insertSQL(tenant string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sql, ok := s.sqls[tenant]; ok {
		return sql
	}
	id := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	isKey := map[int]bool{}
	var names, values, keys, keyTexts, sets []string
	for i, c := range s.cols {
		names = append(names, id(c))
		values = append(values, s.cast(i))
	}
	for _, i := range s.pk {
		isKey[i] = true
		keys = append(keys, id(s.cols[i]))
		keyTexts = append(keyTexts, s.keyText(i))
	}
	for i, c := range s.cols {
		if !isKey[i] {
			sets = append(sets, id(c)+" = EXCLUDED."+id(c))
		}
	}
	seq := "src._causet_seq::bigint"
	names = append(names, "_causet_seq")
	values = append(values, seq)
	sets = append(sets, "_causet_seq = EXCLUDED._causet_seq")
	sql := "INSERT INTO " + pgx.Identifier{tenant, s.table}.Sanitize() + " AS t (" + strings.Join(names, ", ") + ")" +
		" SELECT " + strings.Join(values, ", ") + " FROM pg_temp." + id(s.tmp) + " src" +
		" WHERE NOT EXISTS (SELECT 1 FROM " + pgx.Identifier{tenant, "_causet_tombstones"}.Sanitize() + " tb" +
		" WHERE tb.table_name = $1::text AND tb.pk = ARRAY[" + strings.Join(keyTexts, ", ") + "]" +
		" AND tb._causet_seq >= " + seq + ")" +
		" ON CONFLICT (" + strings.Join(keys, ", ") + ") DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE t._causet_seq <= EXCLUDED._causet_seq"
	s.sqls[tenant] = sql
	return sql
}

// applyResult is one measurement of runApply.
type applyResult struct {
	pairs    int   // (event, projection) pairs in the batches
	copied   int   // rows copied (after deduplication); copy only
	affected int64 // rows inserted or updated (command tags)
	txs      int
	elapsed  time.Duration
	pgCPU    time.Duration // PostgreSQL's CPU while applying (0: not measured)
	// clientCPU is this process's CPU over runApply: the raw method's
	// goroutines (connecting, encoding, pgx).
	clientCPU time.Duration
	// firstAt is when the first transaction committed (of any goroutine),
	// since the clock started, and firstPairs its pairs: fromFirstRow.
	firstAt    time.Duration
	firstPairs int
}

// fromFirstRow is the rate once the first transaction committed, in
// events/s for n events: the pairs applied after it, over the time from
// it to the end, as workerResult.fromFirstRow measures a worker run; 0
// without such a time.
func (r applyResult) fromFirstRow(n int) float64 {
	if r.firstAt == 0 || r.elapsed <= r.firstAt || r.pairs <= r.firstPairs {
		return 0
	}
	return float64(n) * float64(r.pairs-r.firstPairs) / float64(r.pairs) / (r.elapsed - r.firstAt).Seconds()
}

// runApply applies the planned pairs of d's events with mode, from
// goroutines goroutines each on its own connection (opened, and given its
// temporary tables, before the clock starts), copyBatchEvents events per
// transaction; goroutine g takes the events of the partitions p with
// p mod goroutines == g, in order.
func runApply(ctx context.Context, url string, d *dataset, planned [][]plannedPair, goroutines int, mode applyMode, shapes []*copyShape) (applyResult, error) {
	pool, conns, err := openConns(ctx, url, goroutines)
	if err != nil {
		return applyResult{}, err
	}
	defer pool.Close()
	for i := range conns {
		defer conns[i].Release()
		if mode == modeCopy {
			for _, s := range shapes {
				if _, err := conns[i].Exec(ctx, s.createTemp()); err != nil {
					return applyResult{}, fmt.Errorf("create temporary table: %w", err)
				}
			}
		}
	}
	results := make([]applyResult, goroutines)
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	var first sync.Once
	var firstAt time.Duration
	var firstPairs int
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, r := conns[g].Conn(), &results[g]
			flush := func(idx []int) error {
				r.txs++
				pairs := r.pairs
				var err error
				if mode == modeBatch {
					err = applyBatch(ctx, conn, planned, idx, r)
				} else {
					err = applyCopy(ctx, conn, planned, idx, shapes, r)
				}
				if err == nil {
					first.Do(func() { firstAt, firstPairs = time.Since(start), r.pairs-pairs })
				}
				return err
			}
			idx := make([]int, 0, copyBatchEvents)
			for i := range d.events {
				if int(d.events[i].partition())%goroutines != g {
					continue
				}
				idx = append(idx, i)
				if len(idx) == copyBatchEvents {
					if errs[g] = flush(idx); errs[g] != nil {
						return
					}
					idx = idx[:0]
				}
			}
			if len(idx) > 0 {
				errs[g] = flush(idx)
			}
		}()
	}
	wg.Wait()
	out := applyResult{elapsed: time.Since(start)}
	first.Do(func() {}) // every goroutine is done: firstAt and firstPairs are set, or never will be
	out.firstAt, out.firstPairs = firstAt, firstPairs
	for g, r := range results {
		if errs[g] != nil {
			return out, fmt.Errorf("goroutine %d: %w", g, errs[g])
		}
		out.pairs += r.pairs
		out.copied += r.copied
		out.affected += r.affected
		out.txs += r.txs
	}
	return out, nil
}

// applyBatch applies the pairs of events idx as the worker's execBatch
// does: Plan's statements pipelined in one pgx.Batch, in one transaction.
func applyBatch(ctx context.Context, conn *pgx.Conn, planned [][]plannedPair, idx []int, r *applyResult) error {
	bt := &pgx.Batch{}
	for _, i := range idx {
		for _, p := range planned[i] {
			bt.Queue(p.st.SQL, p.st.Args...)
		}
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		br := tx.SendBatch(ctx, bt)
		for range bt.Len() {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return err
			}
			r.affected += tag.RowsAffected()
		}
		r.pairs += bt.Len()
		return br.Close()
	})
}

// copyGroup is the deduplicated rows of one (tenant, table) of a batch.
type copyGroup struct {
	tenant string
	proj   int
	rows   [][]any // Plan's Args[:n+1]: the columns, then the sequence number
	seqs   []int64
	byKey  map[string]int // primary key values joined by NUL → index in rows
}

// applyCopy applies the pairs of events idx in one transaction: per
// (tenant, table), deduplicated by primary key (highest sequence number, the
// later event on a tie), COPY into the temporary table, then one INSERT ...
// SELECT ... ON CONFLICT.
func applyCopy(ctx context.Context, conn *pgx.Conn, planned [][]plannedPair, idx []int, shapes []*copyShape, r *applyResult) error {
	type gkey struct {
		tenant string
		proj   int
	}
	groups := map[gkey]*copyGroup{}
	var order []*copyGroup
	var kb strings.Builder
	pairs := 0
	for _, i := range idx {
		for _, p := range planned[i] {
			pairs++
			s := shapes[p.proj]
			gk := gkey{p.tenant, p.proj}
			grp := groups[gk]
			if grp == nil {
				grp = &copyGroup{tenant: p.tenant, proj: p.proj, byKey: map[string]int{}}
				groups[gk] = grp
				order = append(order, grp)
			}
			kb.Reset()
			for j, c := range s.pk {
				if j > 0 {
					kb.WriteByte(0)
				}
				kb.WriteString(p.st.Args[c].(string)) // Plan rejects a NULL key
			}
			row := p.st.Args[:len(s.cols)+1]
			if at, ok := grp.byKey[kb.String()]; ok {
				if p.seq >= grp.seqs[at] {
					grp.rows[at], grp.seqs[at] = row, p.seq
				}
				continue
			}
			grp.byKey[kb.String()] = len(grp.rows)
			grp.rows = append(grp.rows, row)
			grp.seqs = append(grp.seqs, p.seq)
		}
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		used := map[int]bool{}
		for _, grp := range order {
			s := shapes[grp.proj]
			tmp := pgx.Identifier{"pg_temp", s.tmp}
			if used[grp.proj] { // a second tenant of this table in the transaction
				if _, err := tx.Exec(ctx, "TRUNCATE "+tmp.Sanitize()); err != nil {
					return err
				}
			}
			used[grp.proj] = true
			// Encoded as the worker encodes its COPY rows (package pgcopy):
			// faster than pgx's CopyFrom, so the raw method stays the
			// strongest.
			n, err := pgcopy.From(ctx, tx, tmp, s.copyColumns(), len(grp.rows), func(i int, r *pgcopy.Row) {
				for _, v := range grp.rows[i] {
					r.Text(v)
				}
			})
			if err != nil {
				return fmt.Errorf("copy into %s: %w", s.tmp, err)
			}
			r.copied += int(n)
			tag, err := tx.Exec(ctx, s.insertSQL(grp.tenant), s.table)
			if err != nil {
				return fmt.Errorf("insert into %s.%s: %w", grp.tenant, s.table, err)
			}
			r.affected += tag.RowsAffected()
		}
		r.pairs += pairs
		return nil
	})
}

// tableState is a projection table's row count and the md5 of its rows
// (as text, in primary key order).
type tableState struct {
	table string
	rows  int64
	md5   string
}

// tableStates returns the state of every projection table in schema.
func (e *env) tableStates(schema string, shapes []*copyShape) []tableState {
	e.b.Helper()
	var out []tableState
	for _, s := range shapes {
		var order []string
		for _, i := range s.pk {
			order = append(order, "t."+pgx.Identifier{s.cols[i]}.Sanitize())
		}
		st := tableState{table: s.table}
		q := "SELECT count(*), coalesce(md5(string_agg(t::text, ',' ORDER BY " + strings.Join(order, ", ") + ")), '')" +
			" FROM " + pgx.Identifier{schema, s.table}.Sanitize() + " t"
		if err := e.pool.QueryRow(e.ctx, q).Scan(&st.rows, &st.md5); err != nil {
			e.b.Fatalf("checksum %s.%s: %v", schema, s.table, err)
		}
		out = append(out, st)
	}
	return out
}
