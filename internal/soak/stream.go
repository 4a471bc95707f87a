// Package soak is the fault soak of the projection worker (issue 8): a
// seeded stream of projection events with every documented failure cause,
// a model of what the worker must make of it, and the checks of the soak's
// invariants against PostgreSQL and the dead letters. The stream, the model
// and the checks know nothing of the broker, so that a soak against a real
// Kafka reuses them; the in-process run with kfake fault injection is
// soak_test.go (make soak).
package soak

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Tenant schemas of the stream: Main is migrated at start, Late only half-way
// through (42P01 before), NoColumn lacks followers.tier (42703) for the whole
// run. NotATenant is a schema name that is not a tenant (issue 8 finding 13).
const (
	TenantMain     = "soak_main"
	TenantLate     = "soak_late"
	TenantNoColumn = "soak_nocol"
	NotATenant     = "public"
)

// Expect is what the worker must make of one (record, projection) pair.
type Expect int

const (
	// MustApply: the pair is applied (or is stale); a dead letter for it is
	// a violation.
	MustApply Expect = iota
	// MustDeadLetter: the pair always fails (permanent or projection error).
	MustDeadLetter
	// Either: applied or dead-lettered depending on timing (the tenant
	// migrated half-way).
	Either
)

func (e Expect) String() string {
	switch e {
	case MustApply:
		return "apply"
	case MustDeadLetter:
		return "dead-letter"
	}
	return "either"
}

// RowKey names one row of a projection table: tenant schema, table and the
// two primary key values in the table's key order.
type RowKey struct {
	Tenant, Table string
	K1, K2        string
}

// Pair is one (record, projection) pair the worker must apply or
// dead-letter.
type Pair struct {
	Projection string
	Row        RowKey
	Delete     bool
	Seq        int64
	Expect     Expect
	// Cause names the failure the pair provokes ("" for none), e.g.
	// "div0", "22P02", "42703".
	Cause string
	// Columns are the values the row must hold after this upsert (JSON
	// text of each column as to_jsonb renders it; "null" for NULL). Only
	// the columns listed are compared.
	Columns map[string]string
}

// Record is one produced record with what the model expects of it.
type Record struct {
	Key     []byte
	Value   []byte // nil: a Kafka tombstone
	Kind    string // follow, unfollow, rate, ping, redelivery, shared-follow, or poison:<cause>
	Pairs   []Pair
	Invalid bool // the value is not a valid event: one dead letter with projection ""
	// Set by the model once produced.
	Partition int32
	Offset    int64
}

// tableKeys is the primary key column names of each table, in key order.
var tableKeys = map[string][2]string{
	"followers":    {"artist_id", "user_id"},
	"user_follows": {"user_id", "artist_id"},
	"ratings":      {"artist_id", "user_id"},
	AuditTable:     {"user_id", "artist_id"},
}

// Tables returns the projection tables of the soak, sorted.
func Tables() []string { return []string{AuditTable, "followers", "ratings", "user_follows"} }

// Generator writes the seeded stream. It is not safe for concurrent use.
type Generator struct {
	rng      *rand.Rand
	users    int
	artists  int
	seq      map[string]int64  // next sequence number per user
	history  map[string][]int  // indices into past of a user's valid events
	past     []*Record         // every record generated
	migrated func(string) bool // reports whether a tenant is migrated now
	causes   map[string]bool   // poison causes enabled
	baseTS   int64             // epoch ms of sequence number 0
	poison   []string          // enabled poison causes, in order
	weights  []weighted        // record kinds
	tenants  []weightedTenant
	// lastArtist is the artist of each user's last valid event; a shared
	// record (Next) writes that row again from another partition.
	lastArtist  map[string]string
	artistNext  string  // the artist the next artist() returns, when set
	pending     *Record // the record Next returns next, when set
	pendingUser string  // pending's user
}

type weighted struct {
	kind string
	w    int
}

type weightedTenant struct {
	name string
	w    int
}

// PoisonCauses is every poison cause of the stream: record-level invalid
// values (permanent, projection ""), pair-level permanent failures and
// pair-level projection failures (retried, then dead-lettered). OptInCauses
// are off unless named in SOAK_CAUSES.
var PoisonCauses = []string{
	"not-json", "duplicate-key", "string-seq", "bad-tenant", "kafka-tombstone", "lone-surrogate", "missing-ts", "keyless",
	"not-a-tenant",
	"div0", "22P02", "22003",
	"23502", "23514", "panic",
}

// OptInCauses are poison causes generated only when named: plan-panic (a
// panic in a Go projection's Plan, which swaps the soak's Go projection for
// one applied in batches, so the one-pair path goes untested) and
// slow-statement (a statement that always exceeds the soak database's
// statement_timeout: 57014, retried then dead-lettered, which slows every
// run by its retries).
var OptInCauses = []string{"plan-panic", "slow-statement"}

// NewGenerator returns the stream of seed over users and artists. migrated
// reports whether a tenant schema is migrated when an event is generated
// (the Late tenant is not, until half-way). causes are the poison causes to
// generate (PoisonCauses when nil), plus "plan-panic" when wanted.
func NewGenerator(seed uint64, users, artists int, causes []string, migrated func(string) bool) *Generator {
	if causes == nil {
		causes = PoisonCauses
	}
	g := &Generator{
		rng:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		users:      users,
		artists:    artists,
		seq:        map[string]int64{},
		history:    map[string][]int{},
		lastArtist: map[string]string{},
		migrated:   migrated,
		causes:     map[string]bool{},
		baseTS:     1719331200000,
		poison:     causes,
	}
	for _, c := range causes {
		g.causes[c] = true
	}
	g.weights = []weighted{{"follow", 50}, {"unfollow", 14}, {"rate", 16}, {"ping", 2}, {"redelivery", 8}, {"shared", 6}}
	if len(causes) > 0 {
		g.weights = append(g.weights, weighted{"poison", 10})
	}
	g.tenants = []weightedTenant{{TenantMain, 80}, {TenantLate, 12}, {TenantNoColumn, 8}}
	return g
}

func (g *Generator) pick(ws []weighted) string {
	total := 0
	for _, w := range ws {
		total += w.w
	}
	n := g.rng.IntN(total)
	for _, w := range ws {
		if n < w.w {
			return w.kind
		}
		n -= w.w
	}
	return ws[len(ws)-1].kind
}

func (g *Generator) tenant() string {
	total := 0
	for _, t := range g.tenants {
		total += t.w
	}
	n := g.rng.IntN(total)
	for _, t := range g.tenants {
		if n < t.w {
			return t.name
		}
		n -= t.w
	}
	return TenantMain
}

// Next returns the next record of the stream.
func (g *Generator) Next() *Record {
	if r := g.pending; r != nil {
		g.pending = nil
		return g.add(r, g.pendingUser)
	}
	user := "u" + strconv.Itoa(g.rng.IntN(g.users))
	kind := g.pick(g.weights)
	var r *Record
	switch kind {
	case "redelivery":
		r = g.redelivery(user)
	case "shared":
		// Another entity writing the row of the user's last event (a
		// follow, from the user's sequence numbers) under another record
		// key, so from another partition, and right after it the user's
		// unfollow of that row: an older upsert and a newer delete of one
		// key, produced together to two partitions, run at once (the
		// worker's sweep after commit; before it, the row came back beside
		// the newer tombstone). Half the time the unfollow comes first.
		g.artistNext = g.lastArtist[user]
		r = g.valid(user, "follow", TenantMain, nil)
		r.Key = []byte("shared:" + user)
		r.Kind = "shared-follow"
		g.artistNext = g.lastArtist[user]
		g.pending, g.pendingUser = g.valid(user, "unfollow", TenantMain, nil), user
		if g.rng.IntN(2) == 0 {
			r, g.pending = g.pending, r
		}
	case "poison":
		cause := g.poison[g.rng.IntN(len(g.poison))]
		if g.causes["keyless"] && g.rng.IntN(4) == 0 {
			cause = "keyless" // more often: the only dead letters that leave their partition
		}
		r = g.poisoned(user, cause)
	default:
		r = g.valid(user, kind, g.tenant(), nil)
	}
	if r == nil {
		r = g.valid(user, "follow", g.tenant(), nil)
	}
	return g.add(r, user)
}

// add records r, the next record of the stream, an event of user, in the
// history, and returns it.
func (g *Generator) add(r *Record, user string) *Record {
	g.past = append(g.past, r)
	if !r.Invalid && len(r.Pairs) > 0 && r.Kind != "redelivery" {
		g.history[user] = append(g.history[user], len(g.past)-1)
	}
	return r
}

func (g *Generator) nextSeq(user string) int64 {
	g.seq[user]++
	return g.seq[user]
}

func (g *Generator) artist() string {
	if a := g.artistNext; a != "" {
		g.artistNext = ""
		return a
	}
	return "a" + strconv.Itoa(g.rng.IntN(g.artists))
}

// event renders a projection event; payload is a JSON object text.
func (g *Generator) event(typ, user, tenant string, seq int64, payload string) []byte {
	return fmt.Appendf(nil, `{"eventType":%q,"entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":%d,"payload":%s}`,
		typ, user, tenant, seq, g.ts(seq), payload)
}

func (g *Generator) ts(seq int64) int64 { return g.baseTS + seq*1000 }

// tsJSON is the to_jsonb text of the timestamptz of seq at time zone UTC.
func (g *Generator) tsJSON(seq int64) string {
	return strconv.Quote(time.UnixMilli(g.ts(seq)).UTC().Format("2006-01-02T15:04:05") + "+00:00")
}

// expectFor is the expectation of a pair that applies cleanly in a
// migrated tenant.
func (g *Generator) expectFor(tenant string) (Expect, string) {
	switch {
	case tenant == TenantLate && !g.migrated(TenantLate):
		return Either, "42P01"
	case tenant == NotATenant:
		return MustDeadLetter, "not-a-tenant"
	}
	return MustApply, ""
}

// valid returns a follow, unfollow, rate or ping event of user in tenant;
// tweak, when set, changes the payload and pairs (poison of one pair).
func (g *Generator) valid(user, kind, tenant string, tweak func(payload map[string]any, r *Record)) *Record {
	seq := g.nextSeq(user)
	artist := g.artist()
	g.lastArtist[user] = artist
	exp, cause := g.expectFor(tenant)
	r := &Record{Key: []byte(user), Kind: kind}
	payload := map[string]any{"user_id": user, "artist_id": artist}
	var typ string
	switch kind {
	case "follow":
		typ = "ARTIST_FOLLOWED"
		points, games := g.rng.IntN(1000), 1+g.rng.IntN(9)
		payload["points"], payload["games"] = points, games
		tier := []string{"free", "gold", "platinum"}[g.rng.IntN(3)]
		payload["tier"] = tier
		fexp, fcause := exp, cause
		if tenant == TenantNoColumn {
			fexp, fcause = MustDeadLetter, "42703"
		}
		r.Pairs = []Pair{
			{Projection: "followers", Row: RowKey{tenant, "followers", artist, user}, Seq: seq, Expect: fexp, Cause: fcause,
				Columns: map[string]string{"followed_at": g.tsJSON(seq), "score": strconv.Itoa(points / games), "tier": strconv.Quote(tier)}},
			{Projection: "user_follows", Row: RowKey{tenant, "user_follows", user, artist}, Seq: seq, Expect: exp, Cause: cause,
				Columns: map[string]string{"fork_id": `"production"`}},
		}
	case "unfollow":
		typ = "ARTIST_UNFOLLOWED"
		r.Pairs = []Pair{
			{Projection: "followers", Row: RowKey{tenant, "followers", artist, user}, Delete: true, Seq: seq, Expect: exp, Cause: cause},
			{Projection: "user_follows", Row: RowKey{tenant, "user_follows", user, artist}, Delete: true, Seq: seq, Expect: exp, Cause: cause},
		}
	case "rate":
		typ = "ARTIST_RATED"
		stars := 1 + g.rng.IntN(5)
		payload["stars"] = stars
		r.Pairs = []Pair{
			{Projection: "ratings", Row: RowKey{tenant, "ratings", artist, user}, Seq: seq, Expect: exp, Cause: cause,
				Columns: map[string]string{"stars": strconv.Itoa(stars)}},
			{Projection: AuditProjection, Row: RowKey{tenant, AuditTable, user, artist}, Seq: seq, Expect: exp, Cause: cause,
				Columns: map[string]string{}},
		}
	case "ping":
		typ = "USER_PINGED" // handled by no projection: nothing to apply
	}
	if tweak != nil {
		tweak(payload, r)
	}
	p, err := json.Marshal(payload)
	if err != nil {
		panic(err) // maps of strings and ints always marshal
	}
	r.Value = g.event(typ, user, tenant, seq, string(p))
	return r
}

// redelivery re-sends an older valid event of user, byte for byte; nil when
// user has none yet.
func (g *Generator) redelivery(user string) *Record {
	h := g.history[user]
	if len(h) == 0 {
		return nil
	}
	old := g.past[h[g.rng.IntN(len(h))]]
	r := &Record{Key: old.Key, Value: old.Value, Kind: "redelivery"}
	for _, p := range old.Pairs {
		if p.Cause == "42P01" {
			// Migrated since, perhaps: either outcome is right.
			p.Expect = Either
		}
		r.Pairs = append(r.Pairs, p)
	}
	return r
}

// poisoned returns a record that fails with cause.
func (g *Generator) poisoned(user, cause string) *Record {
	invalid := func(v []byte) *Record {
		return &Record{Key: []byte(user), Value: v, Kind: "poison:" + cause, Invalid: true}
	}
	seq := g.nextSeq(user)
	switch cause {
	case "not-json":
		return invalid([]byte(`{"eventType":"ARTIST_FOLLOWED", not json`))
	case "duplicate-key":
		return invalid(fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","eventType":"ARTIST_RATED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":%d,"payload":{}}`,
			user, TenantMain, seq, g.ts(seq)))
	case "string-seq":
		return invalid(fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":"%d","ts":%d,"payload":{}}`,
			user, TenantMain, seq, g.ts(seq)))
	case "bad-tenant":
		return invalid(g.event("ARTIST_FOLLOWED", user, "Bad-Tenant", seq, `{}`))
	case "kafka-tombstone":
		return invalid(nil)
	case "lone-surrogate":
		return invalid(fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":%d,"payload":{"user_id":"\ud800x"}}`,
			user, TenantMain, seq, g.ts(seq)))
	case "keyless":
		// Garbage from a producer that sets no key: its dead letter has no
		// key either, so it lands on a partition of its own choosing and
		// a batch's dead letters span brokers.
		r := invalid(fmt.Appendf(nil, "keyless garbage %d", g.rng.Uint32()))
		r.Key = nil
		return r
	case "missing-ts":
		return invalid(fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"payload":{}}`,
			user, TenantMain, seq))
	}
	g.seq[user]-- // valid takes its own
	kind := "follow"
	switch cause {
	case "22P02", "22003", "23502", "23514", "panic", "plan-panic", "slow-statement":
		kind = "rate"
	}
	tenant := TenantMain
	if cause == "not-a-tenant" {
		tenant = NotATenant
	}
	r := g.valid(user, kind, tenant, func(payload map[string]any, r *Record) {
		mark := func(proj string, exp Expect) {
			for i := range r.Pairs {
				if r.Pairs[i].Projection == proj {
					r.Pairs[i].Expect, r.Pairs[i].Cause = exp, cause
				}
			}
		}
		switch cause {
		case "div0":
			payload["games"] = 0
			mark("followers", MustDeadLetter)
		case "22P02":
			payload["stars"] = "abc"
			mark("ratings", MustDeadLetter)
		case "22003":
			payload["stars"] = 99999999999
			mark("ratings", MustDeadLetter)
		case "23502":
			delete(payload, "stars")
			mark("ratings", MustDeadLetter)
		case "23514":
			// Within the definitions' integer, beyond the CHECK constraint
			// of RatingsCheckSQL: only PostgreSQL refuses it, inside the
			// row's COPY group (23514, retried, then dead-lettered).
			payload["stars"] = ratingsStarsMax + 1
			mark("ratings", MustDeadLetter)
		case "panic":
			payload["explode"] = true
			mark(AuditProjection, MustDeadLetter)
		case "plan-panic":
			payload["explode_plan"] = true
			mark(AuditProjection, MustDeadLetter)
		case "slow-statement":
			payload["slow"] = true
			mark(AuditProjection, MustDeadLetter)
		}
	})
	r.Kind = "poison:" + cause
	return r
}
