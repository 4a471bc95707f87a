package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Model is what was produced, by source partition and offset. It is safe
// for concurrent use.
type Model struct {
	mu      sync.Mutex
	records map[int32]map[int64]*Record
	count   int
	pairs   int
	// expectedGood are the causes a pair that must apply may still be
	// dead-lettered with, given the faults injected (ExpectGoodDeadLetters).
	expectedGood map[string]bool
	// rewinds are, by partition, the offsets a worker's client rewound to
	// within an assignment (Rewound).
	rewinds map[int32][]int64
	// timedOut are the pairs a dead-letter write attempt of timed out
	// (WriteTimedOut).
	timedOut map[PairID]bool
}

// WriteTimedOut tells the final check that an attempt to write id's dead
// letter timed out (dlq.ErrAttemptTimeout): Kafka may have stored it all
// the same, and the writer's next attempt writes it again (at least once,
// as documented), so its copies are counted apart, not as violations.
func (m *Model) WriteTimedOut(id PairID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.timedOut == nil {
		m.timedOut = map[PairID]bool{}
	}
	m.timedOut[id] = true
}

// Rewound tells the final check that a worker's client delivered partition
// p again from offset: the pairs from there on were processed again, and
// their dead letters written twice are counted apart, not as violations.
func (m *Model) Rewound(p int32, offset int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rewinds == nil {
		m.rewinds = map[int32][]int64{}
	}
	m.rewinds[p] = append(m.rewinds[p], offset)
}

// afterRewind reports whether a rewind of id's partition went back to or
// before id's offset.
func (m *Model) afterRewind(id PairID) bool {
	for _, o := range m.rewinds[id.Partition] {
		if o <= id.Offset {
			return true
		}
	}
	return false
}

// ExpectGoodDeadLetters tells the final check that pairs which must apply
// may be dead-lettered with cause (such as "projection/57014" when the
// database's statement_timeout was cut for longer than the retries last: a
// statement timeout is a projection error, retried then dead-lettered, by
// design). Such dead letters are counted apart, not as violations.
func (m *Model) ExpectGoodDeadLetters(cause string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.expectedGood == nil {
		m.expectedGood = map[string]bool{}
	}
	m.expectedGood[cause] = true
}

// NewModel returns an empty model.
func NewModel() *Model { return &Model{records: map[int32]map[int64]*Record{}} }

// Add records r, produced at r.Partition, r.Offset.
func (m *Model) Add(r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.records[r.Partition]
	if p == nil {
		p = map[int64]*Record{}
		m.records[r.Partition] = p
	}
	p[r.Offset] = r
	m.count++
	m.pairs += len(r.Pairs)
}

// Get returns the record at partition p, offset o.
func (m *Model) Get(p int32, o int64) (*Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[p][o]
	return r, ok
}

// Counts returns the records and pairs added.
func (m *Model) Counts() (records, pairs int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.count, m.pairs
}

// All returns every record, by partition and offset.
func (m *Model) All() []*Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	var all []*Record
	for _, ps := range m.records {
		for _, r := range ps {
			all = append(all, r)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Partition != all[j].Partition {
			return all[i].Partition < all[j].Partition
		}
		return all[i].Offset < all[j].Offset
	})
	return all
}

// Database reads the projection tables directly (never through the soak's
// proxy): the oracle of "applied".
type Database struct {
	Pool *pgxpool.Pool
}

// AppliedSeqs returns, for each key, the newest sequence number applied to
// it: the larger of its row's and its tombstone's _causet_seq (0 when
// neither exists, or the table does not exist yet).
func (d Database) AppliedSeqs(ctx context.Context, keys []RowKey) (map[RowKey]int64, error) {
	type group struct{ k1, k2 []string }
	groups := map[[2]string]*group{}
	for _, k := range keys {
		g := groups[[2]string{k.Tenant, k.Table}]
		if g == nil {
			g = &group{}
			groups[[2]string{k.Tenant, k.Table}] = g
		}
		g.k1 = append(g.k1, k.K1)
		g.k2 = append(g.k2, k.K2)
	}
	out := make(map[RowKey]int64, len(keys))
	for tt, g := range groups {
		cols := tableKeys[tt[1]]
		rows := "SELECT " + ident(cols[0]) + ", " + ident(cols[1]) + ", _causet_seq FROM " + pgx.Identifier{tt[0], tt[1]}.Sanitize() +
			" WHERE (" + ident(cols[0]) + ", " + ident(cols[1]) + ") IN (SELECT * FROM unnest($1::text[], $2::text[]))"
		tombs := "SELECT pk[1], pk[2], _causet_seq FROM " + pgx.Identifier{tt[0], "_causet_tombstones"}.Sanitize() +
			" WHERE table_name = $3 AND (pk[1], pk[2]) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
		for _, q := range []string{rows, tombs} {
			args := []any{g.k1, g.k2}
			if q == tombs {
				args = append(args, tt[1])
			}
			if err := d.scanSeqs(ctx, q, args, tt, out); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func (d Database) scanSeqs(ctx context.Context, q string, args []any, tt [2]string, out map[RowKey]int64) error {
	rows, err := d.Pool.Query(ctx, q, args...)
	if err != nil {
		return missingIsEmpty(err)
	}
	var k1, k2 string
	var seq int64
	_, err = pgx.ForEachRow(rows, []any{&k1, &k2, &seq}, func() error {
		k := RowKey{tt[0], tt[1], k1, k2}
		out[k] = max(out[k], seq)
		return nil
	})
	return missingIsEmpty(err)
}

// missingIsEmpty turns "schema/table does not exist" (a tenant not migrated
// yet) into nothing found.
func missingIsEmpty(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		return nil
	}
	return err
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// State is the final content of the projection tables.
type State struct {
	Rows  map[RowKey]Row
	Tombs map[RowKey]int64
}

// Row is one projection row: its sequence number and columns as to_jsonb
// renders them.
type Row struct {
	Seq     int64
	Columns map[string]string
}

// Dump reads every row and tombstone of the soak's tables in tenants.
func (d Database) Dump(ctx context.Context, tenants []string) (State, error) {
	st := State{Rows: map[RowKey]Row{}, Tombs: map[RowKey]int64{}}
	for _, tenant := range tenants {
		for _, table := range Tables() {
			cols := tableKeys[table]
			q := "SELECT " + ident(cols[0]) + ", " + ident(cols[1]) + ", _causet_seq, j.key, j.value::text FROM " +
				pgx.Identifier{tenant, table}.Sanitize() + " t, jsonb_each(to_jsonb(t)) j"
			rows, err := d.Pool.Query(ctx, q)
			if err != nil {
				if err = missingIsEmpty(err); err != nil {
					return st, err
				}
				continue
			}
			var k1, k2, col, val string
			var seq int64
			_, err = pgx.ForEachRow(rows, []any{&k1, &k2, &seq, &col, &val}, func() error {
				k := RowKey{tenant, table, k1, k2}
				r, ok := st.Rows[k]
				if !ok {
					r = Row{Seq: seq, Columns: map[string]string{}}
				}
				r.Columns[col] = val
				st.Rows[k] = r
				return nil
			})
			if err = missingIsEmpty(err); err != nil {
				return st, err
			}
		}
		rows, err := d.Pool.Query(ctx, "SELECT table_name, pk[1], pk[2], _causet_seq FROM "+pgx.Identifier{tenant, "_causet_tombstones"}.Sanitize())
		if err != nil {
			if err = missingIsEmpty(err); err != nil {
				return st, err
			}
			continue
		}
		var table, k1, k2 string
		var seq int64
		_, err = pgx.ForEachRow(rows, []any{&table, &k1, &k2, &seq}, func() error {
			st.Tombs[RowKey{tenant, table, k1, k2}] = seq
			return nil
		})
		if err = missingIsEmpty(err); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Violation is one broken invariant, with what is needed to find it again.
type Violation struct {
	Invariant int    // 1..5
	Kind      string // short label, counted in the report
	Detail    string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d %s: %s", v.Invariant, v.Kind, v.Detail)
}

// CommitChecker is invariant 2: an offset commit must not pass a record with
// a pair neither applied (in PostgreSQL) nor acknowledged as a dead letter.
// Check is called for every commit the broker receives; a range of offsets
// found good is not checked again (both conditions only ever become true).
type CommitChecker struct {
	Model *Model
	DB    Database
	// Acked reports whether a dead letter for the pair was acknowledged.
	Acked func(PairID) bool
	// Wait is how long Check waits for the model to learn of records the
	// commit covers (the producer adds them after its acknowledgement).
	Wait time.Duration

	mu       sync.Mutex
	verified map[int32]int64
	reported map[PairID]bool
	// Commits counts the partition offsets checked; Bad the commits that
	// passed an unfinished pair; Late the commits that covered records the
	// model did not know yet (checked against the records it knew).
	Commits, Bad, Late int
	// ViaDeadLetter are the pairs a commit was allowed to pass only because
	// their dead letter was seen acknowledged: the final check makes sure
	// each is in the dead-letter topic.
	ViaDeadLetter map[PairID]bool
}

// Check checks a commit of offset (the next record to read) on partition p
// by member. It returns the violations found, each pair reported once.
func (c *CommitChecker) Check(ctx context.Context, member string, p int32, offset int64) []Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.verified == nil {
		c.verified = map[int32]int64{}
		c.reported = map[PairID]bool{}
		c.ViaDeadLetter = map[PairID]bool{}
	}
	c.Commits++
	from := c.verified[p]
	if offset <= from {
		return nil
	}
	type pending struct {
		r    *Record
		pair Pair
	}
	var todo []pending
	var vs []Violation
	var keys []RowKey
	deadline := time.Now().Add(c.Wait)
	for o := from; o < offset; o++ {
		r, ok := c.Model.Get(p, o)
		for !ok && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			r, ok = c.Model.Get(p, o)
		}
		if !ok {
			c.Late++
			offset = o
			break
		}
		whole := c.Acked(PairID{p, o, ""})
		if r.Invalid {
			if !whole {
				id := PairID{p, o, ""}
				if !c.reported[id] {
					c.reported[id] = true
					vs = append(vs, Violation{2, "commit passes an invalid record not dead-lettered",
						fmt.Sprintf("member %s committed partition %d offset %d; record %d (%s) has no acknowledged dead letter", member, p, offset, o, r.Kind)})
				}
			} else {
				c.ViaDeadLetter[PairID{p, o, ""}] = true
			}
			continue
		}
		for _, pr := range r.Pairs {
			id := PairID{p, o, pr.Projection}
			if whole || c.Acked(id) {
				c.ViaDeadLetter[id] = true
				if whole {
					c.ViaDeadLetter[PairID{p, o, ""}] = true
				}
				continue
			}
			todo = append(todo, pending{r, pr})
			keys = append(keys, pr.Row)
		}
	}
	if len(todo) > 0 {
		seqs, err := c.DB.AppliedSeqs(ctx, keys)
		if err != nil {
			vs = append(vs, Violation{2, "checker error", fmt.Sprintf("query applied sequence numbers: %v (commit of partition %d offset %d not checked)", err, p, offset)})
			return vs
		}
		for _, t := range todo {
			if seqs[t.pair.Row] >= t.pair.Seq {
				continue
			}
			id := PairID{p, t.r.Offset, t.pair.Projection}
			if c.reported[id] {
				continue
			}
			c.reported[id] = true
			vs = append(vs, Violation{2, "commit passes an unfinished pair",
				fmt.Sprintf("member %s committed partition %d offset %d; pair %s (%s, key %s, seq %d, expect %s %s) neither applied (db seq %d) nor dead-lettered",
					member, p, offset, id, t.r.Kind, t.pair.Row, t.pair.Seq, t.pair.Expect, t.pair.Cause, seqs[t.pair.Row])})
		}
	}
	if len(vs) > 0 {
		c.Bad++
	}
	c.verified[p] = offset
	return vs
}

func (k RowKey) String() string { return fmt.Sprintf("%s.%s(%s,%s)", k.Tenant, k.Table, k.K1, k.K2) }

// Final is the result of the final checks (invariants 1, 3 and 5).
type Final struct {
	Violations []Violation
	Lost       int
	// GoodDeadLettered counts dead letters of pairs that must apply, by
	// cause (a violation: an outage must not burn events into the DLQ);
	// ExpectedGoodDeadLettered those with a cause the faults explain
	// (Model.ExpectGoodDeadLetters), not violations.
	GoodDeadLettered, ExpectedGoodDeadLettered map[string]int
	// Duplicates counts pairs dead-lettered more than once, by cause;
	// InFlightDuplicates those written again after an instance that held
	// them died abruptly (allowed).
	Duplicates, InFlightDuplicates map[string]int
	// RewoundDuplicates counts those written again after a worker's client
	// rewound the partition (Model.Rewound; allowed).
	RewoundDuplicates map[string]int
	// TimedOutDuplicates counts those written again after a write attempt
	// of theirs timed out (Model.WriteTimedOut; allowed).
	TimedOutDuplicates map[string]int
	DeadLetters        int
	ByCause            map[string]int // dead letters by cause
	// Unprocessed counts the pairs at or above their partition's final
	// committed offset that are neither applied nor dead-lettered: not
	// lost, but left behind by a stall (reported as such).
	Unprocessed int
}

// CheckFinal compares the final tables with the model and the dead letters
// read from the dead-letter topic: nothing lost (1), at most one dead letter
// per pair except those in flight at an abrupt death (3), every dead letter
// valid (5, through check). abrupt reports whether a worker (its
// causet.dlq.worker header) died abruptly.
//
// committed is the group's final committed offset of each partition: a
// pair not done at or above it was never passed by a commit, so it counts
// as unprocessed (the stall check reports why), not as lost.
func CheckFinal(m *Model, st State, dls []DeadLetter, committed map[int32]int64, abrupt func(worker string) bool, check func(DeadLetter, []byte) error) Final {
	f := Final{GoodDeadLettered: map[string]int{}, ExpectedGoodDeadLettered: map[string]int{}, Duplicates: map[string]int{}, InFlightDuplicates: map[string]int{}, RewoundDuplicates: map[string]int{}, TimedOutDuplicates: map[string]int{}, ByCause: map[string]int{}}
	bad := func(inv int, kind, format string, args ...any) {
		f.Violations = append(f.Violations, Violation{inv, kind, fmt.Sprintf(format, args...)})
	}
	byPair := map[PairID][]DeadLetter{}
	for _, dl := range dls {
		byPair[dl.Pair] = append(byPair[dl.Pair], dl)
		f.DeadLetters++
		f.ByCause[dl.Cause()]++
		r, ok := m.Get(dl.Pair.Partition, dl.Pair.Offset)
		if !ok {
			bad(5, "dead letter of no produced record", "%s", dl.Pair)
			continue
		}
		if err := check(dl, r.Value); err != nil {
			bad(5, "invalid dead letter", "%s (%s): %v", dl.Pair, r.Kind, err)
		}
	}
	for id, copies := range byPair {
		if len(copies) < 2 {
			continue
		}
		// Copies in the order they were written (failedAt): the
		// dead-letter topic's order holds only within one of its
		// partitions, and a keyless record's copies can land on several.
		// They were in flight at an abrupt death when the first writer
		// died abruptly and the others are the next owners; a worker that
		// writes one dead letter twice is never excused.
		sort.SliceStable(copies, func(i, j int) bool { return failedAt(copies[i]) < failedAt(copies[j]) })
		workers := map[string]bool{}
		inFlight := abrupt(copies[0].Worker)
		for i, c := range copies {
			workers[c.Worker] = true
			if i > 0 && c.Worker == copies[0].Worker {
				inFlight = false
			}
		}
		how := "same worker"
		if len(workers) > 1 {
			how = "across workers"
		}
		cause := copies[0].Cause() + ", " + how
		if inFlight {
			f.InFlightDuplicates[cause] += len(copies) - 1
			continue
		}
		if m.afterRewind(id) {
			f.RewoundDuplicates[cause] += len(copies) - 1
			continue
		}
		if m.timedOut[id] {
			f.TimedOutDuplicates[cause] += len(copies) - 1
			continue
		}
		f.Duplicates[cause] += len(copies) - 1
		ws := make([]string, 0, len(workers))
		for w := range workers {
			ws = append(ws, w)
		}
		sort.Strings(ws)
		bad(3, "duplicate dead letter", "%s dead-lettered %d times (%s; workers %s)", id, len(copies), copies[0].Cause(), strings.Join(ws, ","))
	}

	// Invariant 1, key by key: every pair newer than what the table holds
	// is dead-lettered, and the row is the one its sequence number says.
	type keyed struct {
		r *Record
		p Pair
	}
	byKey := map[RowKey][]keyed{}
	for _, r := range m.All() {
		dead := len(byPair[PairID{r.Partition, r.Offset, ""}]) > 0
		if r.Invalid {
			if !dead && r.Offset >= committed[r.Partition] {
				f.Unprocessed++
			} else if !dead {
				f.Lost++
				bad(1, "lost", "invalid record %d@%d (%s) neither dead-lettered", r.Partition, r.Offset, r.Kind)
			}
			continue
		}
		for _, p := range r.Pairs {
			byKey[p.Row] = append(byKey[p.Row], keyed{r, p})
			dl := byPair[PairID{r.Partition, r.Offset, p.Projection}]
			if p.Expect == MustApply && len(dl) > 0 && m.expectedGood[dl[0].Cause()] {
				f.ExpectedGoodDeadLettered[dl[0].Cause()]++
			} else if p.Expect == MustApply && len(dl) > 0 {
				f.GoodDeadLettered[dl[0].Cause()]++
				bad(1, "good pair dead-lettered", "%d@%d/%s (%s, %s seq %d): %s", r.Partition, r.Offset, p.Projection, r.Kind, p.Row, p.Seq, dl[0].Cause())
			}
		}
	}
	for k, ps := range byKey {
		row, hasRow := st.Rows[k]
		applied := max(st.Tombs[k], row.Seq)
		for _, kp := range ps {
			if kp.p.Seq <= applied {
				continue
			}
			if len(byPair[PairID{kp.r.Partition, kp.r.Offset, kp.p.Projection}]) > 0 || len(byPair[PairID{kp.r.Partition, kp.r.Offset, ""}]) > 0 {
				continue
			}
			if kp.r.Offset >= committed[kp.r.Partition] {
				f.Unprocessed++
				continue
			}
			f.Lost++
			bad(1, "lost", "%d@%d/%s (%s, %s seq %d, expect %s %s): table holds seq %d",
				kp.r.Partition, kp.r.Offset, kp.p.Projection, kp.r.Kind, k, kp.p.Seq, kp.p.Expect, kp.p.Cause, applied)
		}
		if !hasRow {
			continue
		}
		if t, ok := st.Tombs[k]; ok && t >= row.Seq {
			bad(1, "row older than its tombstone", "%s row seq %d, tombstone seq %d", k, row.Seq, t)
		}
		var src *Pair
		for i := range ps {
			if ps[i].p.Seq == row.Seq && !ps[i].p.Delete {
				src = &ps[i].p
				break
			}
		}
		if src == nil {
			bad(1, "row of no upsert", "%s holds seq %d, which no upsert of the key has", k, row.Seq)
			continue
		}
		for col, want := range src.Columns {
			if got := row.Columns[col]; got != want {
				bad(1, "wrong row", "%s seq %d column %s = %s, want %s", k, row.Seq, col, got, want)
			}
		}
	}
	for k, row := range st.Rows {
		if _, ok := byKey[k]; !ok {
			bad(1, "row of no upsert", "%s holds seq %d and no event has its key", k, row.Seq)
		}
	}
	sort.Slice(f.Violations, func(i, j int) bool { return f.Violations[i].String() < f.Violations[j].String() })
	return f
}

// failedAt returns a dead letter's failedAt (epoch ms), 0 when unreadable.
func failedAt(dl DeadLetter) int64 {
	var m struct {
		FailedAt int64 `json:"failedAt"`
	}
	_ = json.Unmarshal(dl.Value, &m)
	return m.FailedAt
}
