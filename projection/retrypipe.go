package projection

// Retries in one round trip: the due pairs of a partition whose handler
// plans one statement (Planner) are attempted together, each statement in a
// transaction of its own, so that a retry costs its statement and not the
// round trips of a statement prepared again (pgx drops the cached statement
// of an SQL that failed) while the partition's batches wait behind it.

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/retry"
)

// Acquirer is what attempting retries in one round trip needs of the
// database besides DB: *pgxpool.Pool satisfies it. Without it, every retry
// is its own Exec.
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// attemptResult is the outcome of one pair's attempt; made is false when
// the attempt was not made (or its answer is unknown) and is left to the
// pair's own attempt (partition.attempt) or to the statement path.
type attemptResult struct {
	out  Outcome
	err  error
	made bool
	// aside: a retry that rode a batch found a lock it would wait for
	// longer than rideLockTimeout; it was not made, and goes back to the
	// retry set for a round of its own (finishRetries).
	aside bool
}

// attemptTogether makes the attempts of the pairs in ps whose handler is a
// Planner in one round trip (execTogether) and fills their results in res
// (same indexes): a Plan error or PostgreSQL's answer, an error reading as
// the one-by-one attempt's would (statementError), counted in the attempt
// metrics. It leaves made false, for the pair's own attempt, for a handler
// that is not a Planner and where execTogether does.
func (pc *partition) attemptTogether(ctx context.Context, ps []*retryPair, res []attemptResult) {
	if pc.w.acquire == nil || pc.w.begin == nil {
		return
	}
	at := pc.planAttempts(ctx, ps, res)
	at.answered(ctx, pc.w.execTogether(ctx, "retry statements", at.planned, len(at.planned)))
	at.sweep(ctx, pc)
}

// plannedAttempts is the statements of a round of retries (planAttempts),
// to be made in one round trip, and where their answers go.
type plannedAttempts struct {
	w       *Worker
	planned []pair
	idx     []int           // planned[k] is the attempt of pair idx[k]
	res     []attemptResult // by the round's pair index
}

// planAttempts plans the next attempts of the pairs in ps whose handler is
// a Planner; a Plan error is the attempt's result at once (in res, by ps's
// indexes), counted in the attempt metrics.
func (pc *partition) planAttempts(ctx context.Context, ps []*retryPair, res []attemptResult) plannedAttempts {
	w := pc.w
	at := plannedAttempts{w: w, idx: make([]int, 0, len(ps)), planned: make([]pair, 0, len(ps)), res: res}
	for i, p := range ps {
		pl, ok := p.h.(Planner)
		if !ok {
			continue
		}
		st, err := plan(pl, p.h.Name(), p.d.ev)
		if err != nil {
			err = fmt.Errorf("apply %s to %s: %w", p.d.ev.EventType, p.h.Name(), err)
			w.cfg.Metrics.failed(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema), retry.Classify(err))
			res[i] = attemptResult{err: err, made: true}
			continue
		}
		at.idx = append(at.idx, i)
		at.planned = append(at.planned, pair{d: p.d, h: p.h, stmt: st})
	}
	return at
}

// answered fills the results of the planned attempts from execTogether's
// answers (same indexes as at.planned): a refusal reads as the one-by-one
// attempt's would (statementError) and is counted in the attempt metrics.
func (at plannedAttempts) answered(ctx context.Context, answers []attemptResult) {
	for k, r := range answers {
		if r.made && r.err != nil {
			p := at.planned[k]
			r.err = at.w.statementError(ctx, p.h, p.d.ev, p.stmt.Args, r.err)
			at.w.cfg.Metrics.failed(ctx, pairAttrs(p.h.Name(), p.d.ev.TenantSchema), retry.Classify(r.err))
		}
		at.res[at.idx[k]] = r
	}
}

// execTogether applies the planned pairs' statements in one round trip,
// each in a transaction of its own (execIndependently; from index bounded
// on, under a lock_timeout of rideLockTimeout: execBounded), under a span named
// name linked to their records, and returns each pair's outcome or
// PostgreSQL's error as it is; an applied pair is counted in the metrics
// (its apply duration the round trip's). It leaves made false for a
// statement whose answer is an infrastructure error (the caller's path
// waits for the database under InfraPause) and for the statements after a
// round trip that failed (connection lost, ctx done): they may or may not
// have been applied, and the upsert's guard makes applying one again
// harmless.
func (w *Worker) execTogether(ctx context.Context, name string, planned []pair, bounded int) []attemptResult {
	res := make([]attemptResult, len(planned))
	if len(planned) == 0 {
		return res
	}
	start := time.Now()
	sctx, span := w.tr.startBatch(ctx, name, len(planned), slices.Values(planned))
	stmts := make([]Statement, len(planned))
	for i, p := range planned {
		stmts[i] = p.stmt
	}
	tags, errs, err := execBounded(sctx, w.acquire, stmts, bounded)
	endBatch(span, err)
	took := time.Since(start)
	for i, terr := range errs {
		p := planned[i]
		if terr != nil && retry.IsInfrastructure(terr) {
			continue
		}
		attrs := pairAttrs(p.h.Name(), p.d.ev.TenantSchema)
		w.cfg.Metrics.observeApply(ctx, attrs, took)
		if terr != nil {
			res[i] = attemptResult{err: terr, made: true}
			continue
		}
		out := p.stmt.Outcome(tags[i])
		w.cfg.Metrics.applied(ctx, attrs, out)
		res[i] = attemptResult{out: out, made: true}
	}
	return res
}

// statementError is the failure of pair (h, ev) whose statement, planned
// with arguments args (Statement.Args), PostgreSQL refused, as the pair's
// dead letter reads it: a *ColumnError when the error is about one column
// of a table projection's row, wrapped as "apply <event type> to
// <projection>: ...". A class 42 error on a table also drops the table
// from the catalog cache (tableCatalog.forgetOn).
func (w *Worker) statementError(ctx context.Context, h Handler, ev *Event, args []any, err error) error {
	if tp, ok := h.(*TableProjection); ok {
		w.catalog.forgetOn(tp, ev.TenantSchema, err)
		err = tp.columnError(ev, err)
		err = w.catalogColumnError(ctx, tp, ev, args, err)
	}
	return fmt.Errorf("apply %s to %s: %w", ev.EventType, h.Name(), err)
}

// catalogColumnError returns err, a data exception (class 22) about an
// upsert that names no column (`smallint out of range`, `numeric field
// overflow`: the table's type is narrower than the definition's), as a
// *ColumnError when the table's columns as the catalog has them refuse the
// value of exactly one column of the row (args, the upsert's planned
// arguments); else err unchanged. The catalog is read here when the cache
// has no live entry for the table (a table no COPY group has read, or one
// read more than catalogTTL ago): at most once per table and TTL, and only
// on such a failure.
func (w *Worker) catalogColumnError(ctx context.Context, tp *TableProjection, ev *Event, args []any, err error) error {
	var ce *ColumnError
	if !strings.HasPrefix(retry.SQLState(err), "22") || errors.As(err, &ce) || tp.opOf(ev.EventType) != OpUpsert {
		return err
	}
	rc := newRowCheck(tp, w.catalog.columns(ctx, ev.TenantSchema, tp.def.Table))
	if rc == nil {
		return err
	}
	if ci := rc.refusing(args); ci >= 0 {
		return tp.newColumnError(ev, ci, err)
	}
	return err
}

// slotSlack is what a retry slot (breaker.lead) is held beyond the
// pair's longest waits (retry.Policy.Longest): the time its attempts take.
// A slot is freed when its pair leaves the retry set; this bounds only
// how long the pairs waiting for a slot wait for one whose pair left
// unseen.
const slotSlack = 10 * time.Second

// rideLockTimeout bounds how long a retry that rides a batch's round trip
// (rideRetries) waits for a lock (a row another session holds, an
// advisory lock in a trigger): 100 ms, PostgreSQL's lock_timeout for its
// statement, so that such a retry holds its batch, and so its partition,
// no longer than that; it then goes aside (attemptResult.aside).
const rideLockTimeout = 100 * time.Millisecond

// lockNotAvailable is SQLSTATE 55P03, what lock_timeout cancels a
// statement with.
const lockNotAvailable = "55P03"

var (
	setRideLockTimeout = Statement{SQL: fmt.Sprintf("SET lock_timeout = %d", rideLockTimeout.Milliseconds())}
	resetLockTimeout   = Statement{SQL: "RESET lock_timeout"}
)

// execBounded is execIndependently with the statements from index bounded
// on run under a lock_timeout of rideLockTimeout: a SET before them and a
// RESET (back to the session's configured value) after them, in the same
// pipeline, whose own results are left out. With bounded >= len(stmts) it
// is execIndependently.
func execBounded(ctx context.Context, db Acquirer, stmts []Statement, bounded int) (tags []pgconn.CommandTag, errs []error, err error) {
	if bounded >= len(stmts) {
		return execIndependently(ctx, db, stmts)
	}
	all := make([]Statement, 0, len(stmts)+2)
	all = append(append(append(append(all, stmts[:bounded]...), setRideLockTimeout), stmts[bounded:]...), resetLockTimeout)
	tags, errs, err = execIndependently(ctx, db, all)
	// Without the SET's result (index bounded) and the RESET's (the last);
	// a round trip that failed left fewer.
	tags = slices.Delete(tags, min(bounded, len(tags)), min(bounded+1, len(tags)))
	errs = slices.Delete(errs, min(bounded, len(errs)), min(bounded+1, len(errs)))
	return tags[:min(len(tags), len(stmts))], errs[:min(len(errs), len(stmts))], err
}

// execIndependently executes stmts on one connection of db in one round
// trip, each in a transaction of its own: PostgreSQL's pipeline mode with a
// Sync after each statement, so a statement PostgreSQL refuses rolls back
// alone and the next ones run. Every argument must be a string or nil
// (Statement). It returns the command tag and error of each statement
// answered, in order: len(errs) < len(stmts) when the round trip itself
// failed (no connection, connection lost, ctx done), with that error; the
// statements not answered may or may not have been applied.
//
// Each SQL is prepared once per connection (preparedStatements), in the
// same round trip as its first execution, and executed from then on
// without being parsed and planned again: an upsert of the benchmark's
// definitions cost PostgreSQL about 143 µs of CPU unprepared against 45 µs
// prepared (pgbench, 5000 transactions, 2 alternated runs), and a pair
// refused by PostgreSQL is attempted up to 6 times. A statement that
// cannot be prepared (a table not migrated) fails with PostgreSQL's error,
// as do the statements of the same SQL after it in the round trip.
func execIndependently(ctx context.Context, db Acquirer, stmts []Statement) (tags []pgconn.CommandTag, errs []error, err error) {
	args := make([][][]byte, len(stmts))
	for i, st := range stmts {
		args[i] = make([][]byte, len(st.Args))
		for j, a := range st.Args {
			switch a := a.(type) {
			case nil:
			case string:
				args[i][j] = []byte(a)
			default:
				return nil, nil, fmt.Errorf("statement %d: argument %d is %T, want a string or nil", i+1, j+1, a)
			}
		}
	}
	c, err := db.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer c.Release()
	conn := c.Conn().PgConn()
	cache := preparedOn(conn)
	names, prepare, evicted := cache.take(stmts)
	pl := conn.StartPipeline(ctx)
	for _, name := range evicted {
		pl.SendDeallocate(name)
	}
	if len(evicted) > 0 {
		pl.SendPipelineSync()
	}
	for i, st := range stmts {
		switch {
		case names[i] == "": // no room left: parsed and planned this once
			pl.SendQueryParams(st.SQL, args[i], nil, nil, nil)
		case prepare[i]:
			pl.SendPrepare(names[i], st.SQL, nil)
			fallthrough
		default:
			pl.SendQueryPrepared(names[i], args[i], nil, nil)
		}
		pl.SendPipelineSync()
	}
	if err := pl.Flush(); err != nil {
		_ = pl.Close()
		conn.Close(context.WithoutCancel(ctx)) // which statements it holds is unknown
		return nil, nil, err
	}
	broken := func() {
		_ = pl.Close()
		conn.Close(context.WithoutCancel(ctx)) // its state is unknown
	}
	for range evicted {
		if _, err := pl.GetResults(); err != nil {
			broken()
			return nil, nil, err
		}
	}
	if len(evicted) > 0 {
		if r, err := pl.GetResults(); err != nil || r == nil {
			broken()
			return nil, nil, cmp.Or(err, errors.New("pipeline: no Sync after deallocating"))
		} else if _, ok := r.(*pgconn.PipelineSync); !ok {
			broken()
			return nil, nil, fmt.Errorf("pipeline: %T where the Sync after deallocating was expected", r)
		}
	}
	tags = make([]pgconn.CommandTag, 0, len(stmts))
	errs = make([]error, 0, len(stmts))
	var unprepared map[string]error // statement name → why it could not be prepared (made on first use)
	var pgErr *pgconn.PgError
	for i := range stmts {
		var tag pgconn.CommandTag
		var r any
		var err error
		if prepare[i] {
			if r, err = pl.GetResults(); err == nil {
				if _, ok := r.(*pgconn.StatementDescription); !ok {
					err = fmt.Errorf("pipeline: unexpected %T for a prepared statement", r)
				}
			}
			if err != nil && !errors.As(err, &pgErr) {
				broken()
				return tags, errs, err
			}
			if err != nil { // the execution was skipped: the Sync is next
				if unprepared == nil {
					unprepared = map[string]error{}
				}
				unprepared[names[i]] = err
				cache.forget(stmts[i].SQL)
			}
		}
		if err == nil {
			r, err = pl.GetResults()
			switch r := r.(type) {
			case *pgconn.ResultReader:
				tag, err = r.Close()
			case nil:
				if err == nil {
					err = errors.New("pipeline: no result for a statement")
				}
			default:
				err = fmt.Errorf("pipeline: unexpected %T for a statement", r)
			}
			if err != nil && !errors.As(err, &pgErr) {
				broken()
				return tags, errs, err
			}
			if err != nil && pgErr.Code == "26000" && names[i] != "" { // prepared statement does not exist
				if perr, ok := unprepared[names[i]]; ok {
					err = perr // the statement its first execution could not prepare
				} else {
					// Deallocated behind our back (DEALLOCATE ALL, a
					// pooler): prepared again at the next attempt.
					cache.forget(stmts[i].SQL)
				}
			}
		}
		r, serr := pl.GetResults()
		if serr != nil && errors.As(serr, &pgErr) {
			// The statement's implicit COMMIT was refused (a deferred
			// constraint): it is not applied.
			tag, err = pgconn.CommandTag{}, serr
			r, serr = pl.GetResults()
		}
		if _, ok := r.(*pgconn.PipelineSync); !ok || serr != nil {
			if serr == nil {
				serr = fmt.Errorf("pipeline: %T where the Sync after a statement was expected", r)
			}
			broken()
			return tags, errs, serr
		}
		tags, errs = append(tags, tag), append(errs, err)
	}
	return tags, errs, pl.Close()
}

// maxPreparedStatements bounds the statements execIndependently keeps
// prepared on a connection, the least recently used deallocated first: a
// statement's SQL names its tenant schema, so a worker of many tenant
// schemas has many. A variable for tests.
var maxPreparedStatements = 128

// preparedKey is the key of a connection's *preparedStatements in its
// pgconn.PgConn.CustomData, which lives and dies with the connection.
const preparedKey = "causet.prepared"

// preparedStatements are the statements execIndependently prepared on one
// connection: names by SQL, most recently used first.
type preparedStatements struct {
	bySQL map[string]*list.Element // of *preparedStatement
	lru   *list.List
	seq   uint64 // names made so far
	round uint64 // execIndependently's calls so far
}

type preparedStatement struct {
	sql, name string
	round     uint64 // the last call that used it
}

// preparedOn returns conn's preparedStatements, made on first use.
func preparedOn(conn *pgconn.PgConn) *preparedStatements {
	data := conn.CustomData()
	if ps, ok := data[preparedKey].(*preparedStatements); ok {
		return ps
	}
	ps := &preparedStatements{bySQL: map[string]*list.Element{}, lru: list.New()}
	data[preparedKey] = ps
	return ps
}

// take returns, for each statement, the name to execute it by and whether
// to prepare it first (its first execution on the connection), and the
// statements to deallocate to make room for the new ones (none used by
// this call). A statement gets no name ("": executed unprepared) when
// every statement kept was used by this call and none is left to evict.
func (ps *preparedStatements) take(stmts []Statement) (names []string, prepare []bool, evict []string) {
	ps.round++
	names, prepare = make([]string, len(stmts)), make([]bool, len(stmts))
	for i, st := range stmts {
		if e, ok := ps.bySQL[st.SQL]; ok {
			p := e.Value.(*preparedStatement)
			p.round = ps.round
			ps.lru.MoveToFront(e)
			names[i] = p.name
			continue
		}
		if ps.lru.Len() >= maxPreparedStatements {
			oldest := ps.lru.Back()
			p := oldest.Value.(*preparedStatement)
			if p.round == ps.round {
				continue
			}
			ps.lru.Remove(oldest)
			delete(ps.bySQL, p.sql)
			evict = append(evict, p.name)
		}
		ps.seq++
		p := &preparedStatement{sql: st.SQL, name: "causet_" + strconv.FormatUint(ps.seq, 10), round: ps.round}
		ps.bySQL[st.SQL] = ps.lru.PushFront(p)
		names[i], prepare[i] = p.name, true
	}
	return names, prepare, evict
}

// forget drops sql, which could not be prepared.
func (ps *preparedStatements) forget(sql string) {
	if e, ok := ps.bySQL[sql]; ok {
		ps.lru.Remove(e)
		delete(ps.bySQL, sql)
	}
}
