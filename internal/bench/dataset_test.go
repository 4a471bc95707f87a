package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Shape of the generated stream.
const (
	numPartitions = 8      // partitions of the events topic
	numUsers      = 100000 // entities (entityId = user, the record key)
	numArtists    = 20000
	poisonEvery   = 100 // a poisoned run poisons event i when i%poisonEvery == poisonAt: 1%
	poisonAt      = 42
	followShare   = 0.6 // share of ARTIST_FOLLOWED; the rest are ARTIST_RATED
)

// Event types and their (event, projection) pairs in testdata/projections.yaml.
const (
	followed uint8 = iota // artist_followers + user_follows
	rated                 // artist_ratings
)

var (
	eventTypeNames = [...]string{followed: "ARTIST_FOLLOWED", rated: "ARTIST_RATED"}
	tiers          = [...]string{"free", "plus", "premium"}
	sources        = [...]string{"ios-app", "android-app", "web", "smart-tv"}
	devices        = [...]string{
		`{"os":"ios","model":"iPhone15,3","app_version":"5.12.3","locale":"en-US"}`,
		`{"os":"android","model":"Pixel 8","app_version":"5.12.1","locale":"de-DE"}`,
		`{"os":"web","browser":"firefox","app_version":"2026.3.1","locale":"fr-FR"}`,
		`{"os":"tizen","model":"QN90D","app_version":"3.4.0","locale":"ko-KR"}`,
	}
	reviews = [...]string{
		"Great live show, the encore was worth the wait.",
		"Sound was muddy from the balcony but the setlist was perfect.",
		"Best concert of the year!",
		"Too short, and the opener played longer than the headliner.",
	}
	baseTime = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
)

// names are the entity and artist ids as strings, built once.
var names = sync.OnceValue(func() (n struct{ users, artists []string }) {
	n.users = make([]string, numUsers)
	for i := range n.users {
		n.users[i] = fmt.Sprintf("user-%07d", i)
	}
	n.artists = make([]string, numArtists)
	for i := range n.artists {
		n.artists[i] = fmt.Sprintf("artist-%06d", i)
	}
	return n
})

// event is one generated projection event in compact form: the record value
// produced to Kafka and the rows of the raw upserts are both rendered from
// it.
type event struct {
	seq    int64
	ts     int64
	user   int32
	artist int32
	points int64 // beyond integer's range (score > 2^31−1) only in a rangePoison event
	games  int32 // 0 only in a derivePoison event: the score derive divides by zero
	absent bool  // for a tenant that is not migrated: every pair fails (42P01)
	poison poisonKind
	typ    uint8
	tier   int8 // index into tiers; −1: absent, the derive gives "free"
	source uint8
	device uint8
	stars  uint8
	review uint8 // index into reviews; noReview: the field is absent (nullPoison)
}

// noReview is event.review of an ARTIST_RATED without a review field,
// longReview of one whose review is longReviewText (checkFnPoison).
const (
	noReview   = 255
	longReview = 254
)

// longReviewText is the review of checkFnPoison: 520 characters, beyond
// the 500 that benchConstraints' review_length takes.
var longReviewText = strings.Repeat("Long review. ", 40)

func (e *event) partition() int32 { return e.user % numPartitions }

// Projections of testdata/projections.yaml, in its order (tps and
// tableNames follow it).
const (
	projFollowers = 0 // artist_followers
	projFollows   = 1 // user_follows
	projRatings   = 2 // artist_ratings
)

// poisonedPair reports whether the pair of e and projection proj (an index
// into the definitions' projections) fails: it has a dead letter and
// changes no row.
func (e *event) poisonedPair(proj int) bool {
	switch e.poison {
	case derivePoison, rangePoison:
		return proj == projFollowers
	case nullPoison, checkPoison, checkFnPoison:
		return proj == projRatings
	case unmigratedPoison:
		return true
	}
	return false
}

// reviewText is the review of an ARTIST_RATED with one.
func (e *event) reviewText() string {
	if e.review == longReview {
		return longReviewText
	}
	return reviews[e.review]
}

// poisonKind is the poison of a dataset: 1% of its events, one kind each.
type poisonKind int

const (
	noPoison poisonKind = iota
	// derivePoison: ARTIST_FOLLOWED with games 0, whose score derive divides
	// by zero (a permanent error at plan time; one dead letter per event).
	derivePoison
	// unmigratedPoison: events of a tenant schema that was never migrated;
	// each of their pairs fails with 42P01 (a projection error: retried,
	// then dead-lettered, or short-circuited by the breaker).
	unmigratedPoison
	// rangePoison: ARTIST_FOLLOWED whose score (points / games) is beyond
	// integer's range. The definitions say bigint, so Plan passes it; the
	// bench's own migration (benchConstraints) narrows artist_followers.score
	// to integer, so PostgreSQL refuses it (22003); the worker, reading the
	// table's catalog, sends it to its statement rather than a COPY group.
	rangePoison
	// nullPoison: ARTIST_RATED without a review. The definitions leave review
	// nullable, so Plan passes it; benchConstraints makes it NOT NULL, so
	// PostgreSQL refuses it (23502), at its statement as for rangePoison.
	nullPoison
	// checkPoison: ARTIST_RATED with 0 stars. The definitions take any
	// integer, so Plan passes it; benchConstraints adds a CHECK constraint
	// (stars between 1 and 5), so PostgreSQL refuses it (23514). The worker
	// evaluates that comparison from the table's catalog and sends the
	// upsert to its statement, as for rangePoison.
	checkPoison
	// checkFnPoison: ARTIST_RATED whose review has 520 characters.
	// benchConstraints adds a CHECK constraint written with a function
	// (char_length(review) <= 500), which the worker does not evaluate: the
	// expensive case, where PostgreSQL refuses the row (23514) inside its
	// COPY group, which then fails.
	checkFnPoison
)

// dataset is the generated stream of one run.
type dataset struct {
	events   []event
	poisoned int // dead letters expected: poisoned (event, projection) pairs
	pairs    int // (event, projection) pairs the worker handles, poisoned ones included
}

// statements returns the number of upserts that succeed: one per pair that
// is not poisoned.
func (d *dataset) statements() int { return d.pairs - d.poisoned }

// handles reports whether projection proj handles e's event type.
func (e *event) handles(proj int) bool {
	if e.typ == followed {
		return proj != projRatings
	}
	return proj == projRatings
}

// pairsOf returns the (event, projection) pairs of an event.
func (e *event) pairsOf() int {
	if e.typ == followed {
		return 2
	}
	return 1
}

// newDataset generates n events deterministically (the same n gives the same
// events); with poison, every poisonEvery-th event is poisoned as the
// poisonKind says (1%: one pair of it fails, or both for unmigratedPoison).
func newDataset(n int, poison poisonKind) *dataset {
	rng := rand.New(rand.NewPCG(20260301, 5))
	d := &dataset{events: make([]event, n)}
	seqs := make([]int64, numUsers)
	for i := range d.events {
		e := &d.events[i]
		e.user = int32(rng.IntN(numUsers))
		e.artist = int32(rng.IntN(numArtists))
		seqs[e.user]++
		e.seq = seqs[e.user]
		e.ts = baseTime + int64(i)*7
		e.typ = rated
		if rng.Float64() < followShare {
			e.typ = followed
		}
		e.points = int64(rng.IntN(100000))
		e.games = int32(1 + rng.IntN(500))
		e.tier = int8(rng.IntN(len(tiers)+1)) - 1
		e.source = uint8(rng.IntN(len(sources)))
		e.device = uint8(rng.IntN(len(devices)))
		e.stars = uint8(1 + rng.IntN(5))
		e.review = uint8(rng.IntN(len(reviews)))
		if i%poisonEvery == poisonAt && poison != noPoison {
			e.poison = poison
			switch poison {
			case derivePoison:
				e.typ, e.games = followed, 0
			case rangePoison:
				e.typ, e.points, e.games = followed, 3_000_000_000_000, 1
			case nullPoison:
				e.typ, e.review = rated, noReview
			case checkPoison:
				e.typ, e.stars = rated, 0
			case checkFnPoison:
				e.typ, e.review = rated, longReview
			case unmigratedPoison:
				e.absent = true
			}
			for j := range tables {
				if e.handles(j) && e.poisonedPair(j) {
					d.poisoned++
				}
			}
		}
		d.pairs += e.pairsOf()
	}
	return d
}

// appendValue appends the JSON record value of e in tenant schema tenant: a
// projection event of SPEC §3 of about 435 bytes (payload about 250).
func appendValue(b []byte, e *event, tenant string) []byte {
	n := names()
	user, artist := n.users[e.user], n.artists[e.artist]
	b = append(b, `{"eventType":"`...)
	b = append(b, eventTypeNames[e.typ]...)
	b = append(b, `","entityId":"`...)
	b = append(b, user...)
	b = append(b, `","forkId":"production","tenantSchema":"`...)
	b = append(b, tenant...)
	b = append(b, `","irVersion":"v42","sequenceNumber":`...)
	b = strconv.AppendInt(b, e.seq, 10)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, e.ts, 10)
	b = append(b, `,"payload":{"user_id":"`...)
	b = append(b, user...)
	b = append(b, `","artist_id":"`...)
	b = append(b, artist...)
	b = append(b, '"')
	switch e.typ {
	case followed:
		b = append(b, `,"points":`...)
		b = strconv.AppendInt(b, e.points, 10)
		b = append(b, `,"games":`...)
		b = strconv.AppendInt(b, int64(e.games), 10)
		if e.tier >= 0 {
			b = append(b, `,"tier":"`...)
			b = append(b, tiers[e.tier]...)
			b = append(b, '"')
		}
		b = append(b, `,"campaign":"summer-tour-2026","followed_via":"search"`...)
	case rated:
		b = append(b, `,"stars":`...)
		b = strconv.AppendInt(b, int64(e.stars), 10)
		if e.review != noReview {
			b = append(b, `,"review":"`...)
			b = append(b, e.reviewText()...)
			b = append(b, '"')
		}
		b = append(b, `,"venue_id":"venue-0042"`...)
	}
	b = append(b, `,"source":"`...)
	b = append(b, sources[e.source]...)
	b = append(b, `","device":`...)
	b = append(b, devices[e.device]...)
	b = append(b, "}}"...)
	return b
}

// produce writes d's events to topic (partition = user mod 8, key = entityId)
// with an asynchronous, batching producer and waits until all are acked. The
// events marked absent name tenant absentTenant.
func produce(ctx context.Context, opts []kgo.Opt, topic, tenant, absentTenant string, d *dataset) error {
	n := names()
	return produceRecords(ctx, opts, func(emit func(*kgo.Record)) {
		for i := range d.events {
			e := &d.events[i]
			t := tenant
			if e.absent {
				t = absentTenant
			}
			emit(&kgo.Record{
				Topic:     topic,
				Partition: e.partition(),
				Key:       []byte(n.users[e.user]),
				Value:     appendValue(make([]byte, 0, 400), e, t),
			})
		}
	})
}

// produceRecords produces the records that each emits, to the partition each
// names, with an asynchronous, batching producer, and waits until all are
// acked; it returns the first five errors.
func produceRecords(ctx context.Context, opts []kgo.Opt, each func(emit func(*kgo.Record))) error {
	cl, err := kgo.NewClient(append(opts,
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(50*time.Millisecond),
		kgo.MaxBufferedRecords(1<<16),
		kgo.RequiredAcks(kgo.LeaderAck()),
		kgo.DisableIdempotentWrite(),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var mu sync.Mutex
	var errs []error
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			if len(errs) < 5 {
				errs = append(errs, err)
			}
			mu.Unlock()
		}
	}
	each(func(r *kgo.Record) { cl.Produce(ctx, r, done) })
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}
