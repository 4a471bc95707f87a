package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/projection"
)

// BenchmarkRawWorkerSQL is a diagnostic for BenchmarkWorkerThroughput: it
// applies the clean scenario's rows without Kafka and without the worker,
// once with the raw ceiling's plain upserts and once with the statements the
// worker sends (TableProjection.Plan: text parameters cast in SQL, the
// sequence-number guard and the tombstone check), planned before the clock
// starts, each from 8 goroutines over 8 and over 4 connections (4 is
// pgxpool's default MaxConns on 2 CPUs, which the worker uses). It also times
// DecodeEvent + Plan alone, on one goroutine.
//
//	BENCH_EVENTS=200000 go test ./internal/bench -run '^$' -bench BenchmarkRawWorkerSQL -benchtime 1x -v
func BenchmarkRawWorkerSQL(b *testing.B) {
	n := benchEvents(b)
	e := newEnv(b, false)
	d := newDataset(n, noPoison)
	defs, tps := e.projections(b)

	// plan renders, decodes and plans every event for schema; the time of
	// decoding and planning (not rendering) is returned.
	plan := func(schema string) ([][]projection.Statement, time.Duration) {
		values := make([][]byte, n)
		for i := range d.events {
			values[i] = appendValue(make([]byte, 0, 400), &d.events[i], schema)
		}
		out := make([][]projection.Statement, n)
		start := time.Now()
		for i, v := range values {
			ev, err := projection.DecodeEvent(v)
			if err != nil {
				b.Fatal(err)
			}
			for _, p := range tps {
				if !p.Handles(ev.EventType) {
					continue
				}
				st, err := p.Plan(ev)
				if err != nil {
					b.Fatal(err)
				}
				out[i] = append(out[i], st)
			}
		}
		return out, time.Since(start)
	}

	type config struct {
		name              string
		worker            bool
		goroutines, conns int
	}
	var rows [tables]int64
	b.ResetTimer()
	for _, c := range []config{
		{"plain upserts", false, 8, 8},
		{"worker SQL", true, 8, 8},
		{"plain upserts", false, 8, 4},
		{"worker SQL", true, 8, 4},
	} {
		schema := e.schema(fmt.Sprintf("sql%d_%s", c.conns, map[bool]string{false: "plain", true: "worker"}[c.worker]))
		if err := projection.Migrate(e.ctx, e.pool, defs, schema); err != nil {
			b.Fatal(err)
		}
		queue := plainUpserts(d, schema)
		if c.worker {
			stmts, took := plan(schema)
			e.logf("DecodeEvent + Plan of %d events on one goroutine: %s (%.1f µs/event)",
				n, took.Round(time.Millisecond), float64(took.Microseconds())/float64(n))
			queue = func(b *pgx.Batch, i int) int {
				for _, st := range stmts[i] {
					b.Queue(st.SQL, st.Args...)
				}
				return len(stmts[i])
			}
		}
		r, err := runRaw(e.ctx, e.dbURL, d, c.goroutines, c.conns, queue)
		if err != nil {
			b.Fatal(err)
		}
		got := e.rowCounts(schema)
		e.dropSchema(schema)
		if rows == ([tables]int64{}) {
			rows = got
		} else if got != rows {
			b.Fatalf("%s left rows %v, plain upserts %v", c.name, got, rows)
		}
		e.logf("%-13s %d goroutines over %d conns: %d statements in %s: %.0f statements/s = %.0f events/s (load %s)",
			c.name, c.goroutines, c.conns, r.statements, r.elapsed.Round(time.Millisecond),
			float64(r.statements)/r.elapsed.Seconds(), float64(n)/r.elapsed.Seconds(), loadAvg())
	}
}
