package projection

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// BenchmarkSweep measures what the sweep after commit (sweep.go) costs a
// COPY batch of a projection with deletes: 500 upserts of the examples'
// artist_followers copied in one transaction as the worker copies a COPY
// group (copyRows), beside 100 000 tombstones, in three arms alternated
// round by round on one connection:
//   - copy: the batch alone, READ COMMITTED, no sweep (what the worker did
//     before; it lets an older upsert come back beside a newer tombstone);
//   - copy+sweep: the batch, then its sweep in a statement of its own (the
//     worker now);
//   - serializable: the batch in a SERIALIZABLE transaction, no sweep (the
//     other correct way; measured here without the aborts that concurrent
//     batches would add).
//
// The serializable arm runs one batch at a time, so it pays none of the
// serialization failures (40001) that SERIALIZABLE costs when batches run
// at once. A last part measures those: 4 goroutines (4 partitions, each
// with keys of its own) apply 40 batches each in SERIALIZABLE
// transactions, one in five a batch of deletes as statements, and it
// reports the share of transactions PostgreSQL aborted with 40001, each
// of which the worker would have to apply again.
//
// It does so for keys without tombstones (the sweep probes the tombstones'
// index, 500 times) and for keys that each have an older tombstone (a
// follow after an unfollow: the sweep then probes the table's index too,
// the expensive case). It reports each arm's median µs per upsert and its
// ratio to copy. BENCH_SWEEP_ROUNDS (default 7) rounds of 20 batches per
// arm.
//
//	go test ./projection -run '^$' -bench BenchmarkSweep -benchtime 1x -v
func BenchmarkSweep(b *testing.B) {
	rounds := 7
	if s := os.Getenv("BENCH_SWEEP_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			b.Fatalf("BENCH_SWEEP_ROUNDS=%q: want a positive integer", s)
		}
	}
	const batch, batches, tombstones = 500, 20, 100000
	pool := pgtest.Pool(b)
	ctx := context.Background()
	d, err := LoadDefinitions("../examples/projections.yaml")
	if err != nil {
		b.Fatal(err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		b.Fatal(err)
	}
	p := tps[0] // artist_followers: ARTIST_UNFOLLOWED deletes
	schema := migratedSchema(b, pool, d)
	qs := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		// Unrelated tombstones, and an older one for each "old" key.
		"INSERT INTO " + qs + "._causet_tombstones (table_name, pk, _causet_seq) SELECT 'artist_followers', ARRAY['x', 'gone' || i], 1 FROM generate_series(1, " + strconv.Itoa(tombstones) + ") i",
		"INSERT INTO " + qs + "._causet_tombstones (table_name, pk, _causet_seq) SELECT 'artist_followers', ARRAY['a', 'old' || i], 0 FROM generate_series(0, " + strconv.Itoa(batch*batches-1) + ") i",
		"ANALYZE " + qs + "._causet_tombstones",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	seq := int64(0)
	groups := func(prefix string) []*copyGroup {
		var gs []*copyGroup
		for k := range batches {
			seq++
			var pairs []pair
			for i := range batch {
				pr, err := plannedPair(p, tblEvent(b, schema, "ARTIST_FOLLOWED", seq, 1719331200000,
					fmt.Sprintf(`{"artist_id":"a","user_id":"%s%d","points":10,"games":4}`, prefix, k*batch+i)))
				if err != nil {
					b.Fatal(err)
				}
				pairs = append(pairs, pr)
			}
			gs = append(gs, formGroup(newCopyGroup(p, schema), pairs))
		}
		return gs
	}
	arms := []string{"copy", "copy+sweep", "serializable"}
	apply := func(arm string, g *copyGroup) {
		opts := pgx.TxOptions{}
		if arm == "serializable" {
			opts.IsoLevel = pgx.Serializable
		}
		err := pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
			_, _, err := copyRows(ctx, tx, g, tempTables{})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if arm == "copy+sweep" {
			if _, errs, err := execIndependently(ctx, pool, []Statement{sweepGroups(g.all)[0].statement()}); err != nil || errs[0] != nil {
				b.Fatal(err, errs)
			}
		}
	}
	b.ResetTimer()
	for _, keys := range []string{"new", "old"} {
		took := map[string][]float64{}
		for range rounds {
			for _, arm := range arms {
				gs := groups(keys) // planned outside the timing
				start := time.Now()
				for _, g := range gs {
					apply(arm, g)
				}
				took[arm] = append(took[arm], float64(time.Since(start).Microseconds())/float64(batch*batches))
			}
		}
		base := median(took["copy"])
		for _, arm := range arms {
			m := median(took[arm])
			b.Logf("keys %s: %-13s %6.2f µs/upsert median (%.2f–%.2f), %.3f of copy", map[string]string{"new": "without a tombstone", "old": "with an older tombstone"}[keys],
				arm, m, slices.Min(took[arm]), slices.Max(took[arm]), m/base)
			b.ReportMetric(m/base, keys+"-"+arm+"/copy")
		}
	}
	b.Logf("serializable, 4 at once: %.1f %% of the transactions aborted with 40001 (of %d)", 100*serializableAborts(b, p, schema), 4*40)
}

// serializableAborts applies, from 4 goroutines at once, 40 batches of 500
// events each of p (keys of its own per goroutine) in SERIALIZABLE
// transactions, one in five of deletes (statements), the others of
// upserts (copyRows), and returns the share aborted with 40001.
func serializableAborts(b *testing.B, p *TableProjection, schema string) float64 {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	var done, aborted atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for k := range 40 {
				typ := "ARTIST_FOLLOWED"
				if k%5 == 0 {
					typ = "ARTIST_UNFOLLOWED"
				}
				var pairs []pair
				for range 500 {
					pr, err := plannedPair(p, tblEvent(b, schema, typ, int64(1000+k), 1719331200000, fmt.Sprintf(`{"artist_id":"s","user_id":"w%d-%d"}`, w, rng.IntN(12500))))
					if err != nil {
						b.Error(err)
						return
					}
					pairs = append(pairs, pr)
				}
				err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
					if typ == "ARTIST_UNFOLLOWED" {
						bt := &pgx.Batch{}
						for _, pr := range pairs {
							bt.Queue(pr.stmt.SQL, pr.stmt.Args...)
						}
						return tx.SendBatch(ctx, bt).Close()
					}
					_, _, err := copyRows(ctx, tx, formGroup(newCopyGroup(p, schema), pairs), tempTables{})
					return err
				})
				done.Add(1)
				switch {
				case retry.SQLState(err) == "40001":
					aborted.Add(1)
				case err != nil:
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(aborted.Load()) / float64(max(done.Load(), 1))
}

// median returns the median of xs (the mean of the middle two for an even
// count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
