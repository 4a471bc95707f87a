package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// rawSQL are the plain upserts of the raw ceiling into one tenant schema:
// INSERT ... VALUES ... ON CONFLICT (primary key) DO UPDATE, natively typed
// parameters, no sequence-number guard and no tombstone check.
type rawSQL struct{ followers, follows, ratings string }

func newRawSQL(schema string) rawSQL {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return rawSQL{
		followers: "INSERT INTO " + t("artist_followers") + " (artist_id, user_id, followed_at, score, source, _causet_seq)" +
			" VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (artist_id, user_id) DO UPDATE SET" +
			" followed_at = EXCLUDED.followed_at, score = EXCLUDED.score, source = EXCLUDED.source, _causet_seq = EXCLUDED._causet_seq",
		follows: "INSERT INTO " + t("user_follows") + " (user_id, artist_id, fork_id, followed_at, tier, device, _causet_seq)" +
			" VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (user_id, artist_id) DO UPDATE SET" +
			" fork_id = EXCLUDED.fork_id, followed_at = EXCLUDED.followed_at, tier = EXCLUDED.tier, device = EXCLUDED.device, _causet_seq = EXCLUDED._causet_seq",
		ratings: "INSERT INTO " + t("artist_ratings") + " (artist_id, user_id, stars, review, rated_at, _causet_seq)" +
			" VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (artist_id, user_id) DO UPDATE SET" +
			" stars = EXCLUDED.stars, review = EXCLUDED.review, rated_at = EXCLUDED.rated_at, _causet_seq = EXCLUDED._causet_seq",
	}
}

// queue queues the upserts of e (one per pair that is not poisoned, in the
// worker's projection order) and returns how many.
func (s rawSQL) queue(b *pgx.Batch, e *event) int {
	n := names()
	user, artist := n.users[e.user], n.artists[e.artist]
	ts := time.UnixMilli(e.ts).UTC()
	if e.absent {
		return 0 // its tenant has no tables: every pair is dead-lettered
	}
	switch e.typ {
	case followed:
		queued := 0
		if !e.poisonedPair(projFollowers) {
			b.Queue(s.followers, artist, user, ts, e.points/int64(e.games), sources[e.source], e.seq)
			queued++
		}
		tier := "free"
		if e.tier >= 0 {
			tier = tiers[e.tier]
		}
		b.Queue(s.follows, user, artist, "production", ts, tier, []byte(devices[e.device]), e.seq)
		return queued + 1
	default:
		if e.poisonedPair(projRatings) {
			return 0
		}
		b.Queue(s.ratings, artist, user, int32(e.stars), e.reviewText(), ts, e.seq)
		return 1
	}
}

// rawResult is one measurement of the raw ceiling.
type rawResult struct {
	goroutines int
	conns      int
	statements int
	elapsed    time.Duration
}

// queueFunc queues the statements of event i of a dataset and returns how
// many.
type queueFunc func(b *pgx.Batch, i int) int

// plainUpserts returns the queueFunc of the raw ceiling's plain upserts of d
// into schema.
func plainUpserts(d *dataset, schema string) queueFunc {
	sqls := newRawSQL(schema)
	return func(b *pgx.Batch, i int) int { return sqls.queue(b, &d.events[i]) }
}

// runRaw applies the statements of d's events (queue) in transactions of
// copyBatchEvents events (their statements pipelined in one pgx.Batch) from
// goroutines concurrent goroutines sharing a pool of conns connections (a
// goroutine holds a connection for one transaction, as the worker does);
// goroutine g takes the events of the partitions p with p mod goroutines ==
// g, in order, as the worker's partitions would. The time counted starts
// once the connections are open.
func runRaw(ctx context.Context, url string, d *dataset, goroutines, conns int, queue queueFunc) (rawResult, error) {
	pool, open, err := openConns(ctx, url, conns)
	if err != nil {
		return rawResult{}, fmt.Errorf("raw: %w", err)
	}
	defer pool.Close()
	for _, c := range open {
		c.Release()
	}
	counts := make([]int, goroutines)
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flush := func(b *pgx.Batch) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return tx.SendBatch(ctx, b).Close()
				})
			}
			b, events := &pgx.Batch{}, 0
			for i := range d.events {
				if int(d.events[i].partition())%goroutines != g {
					continue
				}
				counts[g] += queue(b, i)
				if events++; events == copyBatchEvents {
					events = 0
					if err := flush(b); err != nil {
						errs[g] = err
						return
					}
					b = &pgx.Batch{}
				}
			}
			if b.Len() > 0 {
				errs[g] = flush(b)
			}
		}()
	}
	wg.Wait()
	r := rawResult{goroutines: goroutines, conns: conns, elapsed: time.Since(start)}
	for g := range goroutines {
		if errs[g] != nil {
			return r, fmt.Errorf("raw upserts (goroutine %d): %w", g, errs[g])
		}
		r.statements += counts[g]
	}
	return r, nil
}
