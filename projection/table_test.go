package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// tblProjections loads testdata/defs/apply.yaml and returns its definitions
// and projections by name.
func tblProjections(t testing.TB) (*Definitions, map[string]*TableProjection) {
	t.Helper()
	d, err := LoadDefinitions("testdata/defs/apply.yaml")
	if err != nil {
		t.Fatalf("LoadDefinitions: %v", err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		t.Fatalf("NewTableProjections: %v", err)
	}
	byName := map[string]*TableProjection{}
	for _, p := range tps {
		byName[p.Name()] = p
	}
	return d, byName
}

// tblTenant returns a pool and a fresh tenant schema migrated for
// apply.yaml; the schema is dropped when t ends.
func tblTenant(t *testing.T) (*pgxpool.Pool, string, map[string]*TableProjection) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchemaName(t)
	d, tps := tblProjections(t)
	ctx := context.Background()
	if err := Migrate(ctx, pool, d, schema); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return pool, schema, tps
}

// tblEvent decodes a projection event (SPEC §3) with the given fields;
// payload is raw JSON.
func tblEvent(t testing.TB, schema, eventType string, seq int64, ts int64, payload string) *Event {
	t.Helper()
	raw := fmt.Sprintf(`{"eventType":%q,"entityId":"user-123","forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":%d,"payload":%s}`,
		eventType, schema, seq, ts, payload)
	ev, err := DecodeEvent([]byte(raw))
	if err != nil {
		t.Fatalf("DecodeEvent(%s): %v", raw, err)
	}
	return ev
}

const specPayload = `{"user_id":"user-123","artist_id":"artist-456","points":10,"games":4,"big":9007199254740993,"amount":12345678901234567890.0123456789}`

type followerRow struct {
	FollowedAt time.Time
	Score      *int64
	Big        *string
	Amount     *string
	Seq        int64
}

// tblFollower reads the artist_followers row of (artist, user); ok is false
// when there is none.
func tblFollower(t *testing.T, pool *pgxpool.Pool, schema, artist, user string) (row followerRow, ok bool) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		"SELECT followed_at, score, big::text, amount::text, _causet_seq FROM "+pgx.Identifier{schema, "artist_followers"}.Sanitize()+
			" WHERE artist_id = $1 AND user_id = $2", artist, user).
		Scan(&row.FollowedAt, &row.Score, &row.Big, &row.Amount, &row.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, false
	}
	if err != nil {
		t.Fatalf("read row: %v", err)
	}
	return row, true
}

func tblApply(t *testing.T, db DB, p *TableProjection, ev *Event, want Outcome) {
	t.Helper()
	got, err := p.Apply(context.Background(), db, ev)
	if err != nil {
		t.Fatalf("Apply(%s seq %d): %v", ev.EventType, ev.SequenceNumber, err)
	}
	if got != want {
		t.Fatalf("Apply(%s seq %d) = %v, want %v", ev.EventType, ev.SequenceNumber, outcomeName(got), outcomeName(want))
	}
}

func outcomeName(o Outcome) string {
	if o == Stale {
		return "Stale"
	}
	return "Applied"
}

func ptr[T any](v T) *T { return &v }

// TestApplySPECExample projects the SPEC §3 event through the SPEC §4
// definition with exact values, and checks re-delivery and stale events.
func TestApplySPECExample(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["artist_followers"]
	ev := tblEvent(t, schema, "ARTIST_FOLLOWED", 1891, 1719331200000, specPayload)

	tblApply(t, pool, p, ev, Applied)
	want := followerRow{
		FollowedAt: time.Date(2024, 6, 25, 16, 0, 0, 0, time.UTC),
		Score:      ptr[int64](2),
		Big:        ptr("9007199254740993"),
		Amount:     ptr("12345678901234567890.0123456789"),
		Seq:        1891,
	}
	got, ok := tblFollower(t, pool, schema, "artist-456", "user-123")
	if !ok {
		t.Fatal("no row after upsert")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}

	t.Run("redelivery is applied and idempotent", func(t *testing.T) {
		tblApply(t, pool, p, ev, Applied)
		got, _ := tblFollower(t, pool, schema, "artist-456", "user-123")
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("row after re-delivery (-want +got):\n%s", diff)
		}
	})
	t.Run("older sequence number is stale", func(t *testing.T) {
		older := tblEvent(t, schema, "ARTIST_FOLLOWED", 1890, 1719331100000,
			`{"user_id":"user-123","artist_id":"artist-456","points":99,"games":1,"big":1,"amount":1}`)
		tblApply(t, pool, p, older, Stale)
		got, _ := tblFollower(t, pool, schema, "artist-456", "user-123")
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("row after stale event (-want +got):\n%s", diff)
		}
	})
	t.Run("newer sequence number overwrites, absent from path gives NULL", func(t *testing.T) {
		newer := tblEvent(t, schema, "ARTIST_FOLLOWED", 1900, 1719331300000,
			`{"user_id":"user-123","artist_id":"artist-456","points":9,"games":3}`)
		tblApply(t, pool, p, newer, Applied)
		got, _ := tblFollower(t, pool, schema, "artist-456", "user-123")
		want := followerRow{FollowedAt: time.UnixMilli(1719331300000).UTC(), Score: ptr[int64](3), Seq: 1900}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("row after newer event (-want +got):\n%s", diff)
		}
	})
}

// TestApplyOlderUpsertTheTableRefusesIsStale: an upsert older than its
// row is a stale no-op even when the table's own constraints (a CHECK, a
// NOT NULL the definitions do not have) refuse its values, which
// PostgreSQL checks before ON CONFLICT finds the row (tracing trial: a
// superseded rating that a CHECK refused was dead-lettered after its
// retries); a newer one is still refused.
func TestApplyOlderUpsertTheTableRefusesIsStale(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["artist_followers"]
	ctx := context.Background()
	table := pgx.Identifier{schema, "artist_followers"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" ADD CONSTRAINT score_small CHECK (score < 50), ALTER COLUMN big SET NOT NULL"); err != nil {
		t.Fatal(err)
	}
	tblApply(t, pool, p, tblEvent(t, schema, "ARTIST_FOLLOWED", 10, 1719331200000, specPayload), Applied)
	want, _ := tblFollower(t, pool, schema, "artist-456", "user-123")
	for _, payload := range []string{
		`{"user_id":"user-123","artist_id":"artist-456","points":99,"games":1,"big":1}`, // score 99: the CHECK
		`{"user_id":"user-123","artist_id":"artist-456","points":1,"games":1}`,          // big null: the NOT NULL
	} {
		tblApply(t, pool, p, tblEvent(t, schema, "ARTIST_FOLLOWED", 9, 1719331100000, payload), Stale)
		if got, _ := tblFollower(t, pool, schema, "artist-456", "user-123"); !cmp.Equal(want, got) {
			t.Errorf("row after a stale upsert of %s: %+v, want %+v", payload, got, want)
		}
		_, err := p.Apply(ctx, pool, tblEvent(t, schema, "ARTIST_FOLLOWED", 11, 1719331300000, payload))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "23514" && pgErr.Code != "23502") {
			t.Errorf("newer upsert of %s: %v, want PostgreSQL's refusal (23514 or 23502)", payload, err)
		}
	}
}

// TestApplyDeleteLeavesTombstone checks that a delete stops an older upsert
// replayed later from resurrecting the row, while a newer upsert does.
func TestApplyDeleteLeavesTombstone(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["artist_followers"]
	upsert := func(seq int64) *Event {
		return tblEvent(t, schema, "ARTIST_FOLLOWED", seq, 1719331200000+seq, specPayload)
	}
	del := func(seq int64) *Event {
		return tblEvent(t, schema, "ARTIST_UNFOLLOWED", seq, 1719331200000+seq, `{"user_id":"user-123","artist_id":"artist-456"}`)
	}

	tblApply(t, pool, p, upsert(10), Applied)
	tblApply(t, pool, p, del(5), Stale) // older than the row: the row stays
	if _, ok := tblFollower(t, pool, schema, "artist-456", "user-123"); !ok {
		t.Fatal("an older delete removed the row")
	}
	tblApply(t, pool, p, del(20), Applied)
	if _, ok := tblFollower(t, pool, schema, "artist-456", "user-123"); ok {
		t.Fatal("row still there after delete")
	}
	var tombSeq int64
	var tombPK []string
	if err := pool.QueryRow(context.Background(),
		"SELECT pk, _causet_seq FROM "+pgx.Identifier{schema, "_causet_tombstones"}.Sanitize()+" WHERE table_name = 'artist_followers'").
		Scan(&tombPK, &tombSeq); err != nil {
		t.Fatalf("read tombstone: %v", err)
	}
	if diff := cmp.Diff([]string{"artist-456", "user-123"}, tombPK); diff != "" || tombSeq != 20 {
		t.Errorf("tombstone = %v seq %d, want [artist-456 user-123] seq 20 (%s)", tombPK, tombSeq, diff)
	}

	tblApply(t, pool, p, del(20), Applied) // re-delivered delete rewrites its tombstone
	tblApply(t, pool, p, del(15), Stale)   // older delete: the newer tombstone stays
	tblApply(t, pool, p, upsert(15), Stale)
	tblApply(t, pool, p, upsert(20), Stale) // same sequence number as the delete: the delete wins
	if _, ok := tblFollower(t, pool, schema, "artist-456", "user-123"); ok {
		t.Fatal("an older upsert replayed after the delete resurrected the row")
	}
	tblApply(t, pool, p, upsert(21), Applied)
	row, ok := tblFollower(t, pool, schema, "artist-456", "user-123")
	if !ok || row.Seq != 21 {
		t.Fatalf("newer upsert after delete: row %+v, present %v; want seq 21", row, ok)
	}
}

// TestApplyConvergesInAnyOrder applies a history of upserts and deletes of
// one key in random orders with duplicates: the final state is always that
// of the newest event.
func TestApplyConvergesInAnyOrder(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["artist_followers"]
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		user := fmt.Sprintf("user-%d", round)
		payload := fmt.Sprintf(`{"user_id":%q,"artist_id":"artist-1","points":1,"games":1}`, user)
		var history []*Event
		for seq := int64(1); seq <= 8; seq++ {
			typ := "ARTIST_FOLLOWED"
			if rng.IntN(3) == 0 {
				typ = "ARTIST_UNFOLLOWED"
			}
			history = append(history, tblEvent(t, schema, typ, seq, 1719331200000+seq, payload))
		}
		newest := history[len(history)-1]
		deliveries := append(append([]*Event{}, history...), history[rng.IntN(len(history))], history[rng.IntN(len(history))])
		rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
		for _, ev := range deliveries {
			if _, err := p.Apply(context.Background(), pool, ev); err != nil {
				t.Fatalf("round %d: Apply: %v", round, err)
			}
		}
		row, ok := tblFollower(t, pool, schema, "artist-1", user)
		if newest.EventType == "ARTIST_UNFOLLOWED" {
			if ok {
				t.Errorf("round %d: newest event is a delete, row %+v is present", round, row)
			}
		} else if !ok || row.Seq != newest.SequenceNumber {
			t.Errorf("round %d: newest event is upsert seq %d, row %+v present %v", round, newest.SequenceNumber, row, ok)
		}
	}
}

// TestApplyErrors checks the class (retry.Classify) and the message of each
// documented failure cause.
func TestApplyErrors(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		setup     string // SQL run first, %s is the tenant schema (quoted)
		proj      string
		schema    string // "" for the migrated one
		eventType string
		payload   string
		class     retry.Class
		sqlState  string
		message   string // substring of err.Error()
	}{
		{
			name: "tenant not migrated", proj: "artist_followers", schema: pgtest.NewSchemaName(t),
			eventType: "ARTIST_FOLLOWED", payload: specPayload,
			class: retry.Projection, sqlState: "42P01", message: "does not exist",
		},
		{
			name: "division by zero in derive", proj: "artist_followers", eventType: "ARTIST_FOLLOWED",
			payload: `{"user_id":"u","artist_id":"a","points":1,"games":0}`,
			class:   retry.Permanent, message: `projection "artist_followers": derive score: division by zero`,
		},
		{
			name: "missing field in derive", proj: "artist_followers", eventType: "ARTIST_FOLLOWED",
			payload: `{"user_id":"u","artist_id":"a","points":1}`,
			class:   retry.Permanent, message: `projection "artist_followers": derive score: no such key: games`,
		},
		{
			// Refused by Plan: the NOT NULL constraint is not reached.
			name: "derive null into notNull column", proj: "kinds", eventType: "KIND_SET",
			payload: `{}`,
			class:   retry.Permanent, message: `projection "kinds": column required (derive "payload.?required.orValue(null)", JSON null): null value in a notNull column`,
		},
		{
			name: "string into bigint", proj: "artist_followers", eventType: "ARTIST_FOLLOWED",
			payload: `{"user_id":"u","artist_id":"a","points":1,"games":1,"big":"abc"}`,
			class:   retry.Permanent, message: `projection "artist_followers": column big (from payload.big, JSON string): invalid input syntax for type bigint: "abc"`,
		},
		{
			name: "number out of range", proj: "kinds", eventType: "KIND_SET",
			payload: `{"required":1,"n_small":40000}`,
			class:   retry.Permanent, message: `projection "kinds": column n_small (from payload.n_small, JSON number): value "40000" is out of range for type smallint`,
		},
		{
			name: "object into text", proj: "kinds", eventType: "KIND_SET",
			payload: `{"required":1,"label":{"a":1}}`,
			class:   retry.Permanent, message: `projection "kinds": column label (from payload.label, JSON object): a JSON object cannot be stored in a text column (only jsonb)`,
		},
		{
			name: "array into bigint", proj: "artist_followers", eventType: "ARTIST_FOLLOWED",
			payload: `{"user_id":"u","artist_id":"a","points":1,"games":1,"big":[1]}`,
			class:   retry.Permanent, message: `projection "artist_followers": column big (from payload.big, JSON array): a JSON array cannot be stored in a bigint column (only jsonb)`,
		},
		{
			name: "fractional epoch into timestamptz", proj: "kinds", eventType: "KIND_SET",
			payload: `{"required":1,"at":1.5}`,
			class:   retry.Permanent, message: `projection "kinds": column at (from payload.at, JSON number): timestamptz from a number wants integer epoch milliseconds, got 1.5`,
		},
		{
			name: "bad RFC 3339 string into timestamptz", proj: "kinds", eventType: "KIND_SET",
			payload: `{"required":1,"at":"yesterday-ish"}`,
			class:   retry.Permanent, message: `projection "kinds": column at (from payload.at, JSON string): invalid input syntax for type timestamptz: "yesterday-ish" (want RFC 3339, such as 2024-06-25T16:00:00Z)`,
		},
		{
			// A constraint only PostgreSQL knows: its error as it prints it.
			name: "check constraint", setup: "ALTER TABLE %s.kinds ADD CONSTRAINT small_positive CHECK (n_small > 0)",
			proj: "kinds", eventType: "KIND_SET", payload: `{"required":1,"n_small":-1}`,
			class: retry.Projection, sqlState: "23514", message: `new row for relation "kinds" violates check constraint "small_positive"`,
		},
		{
			name: "null primary key", proj: "artist_followers", eventType: "ARTIST_FOLLOWED",
			payload: `{"user_id":"u","points":1,"games":1}`,
			class:   retry.Permanent, message: `projection "artist_followers": column artist_id (from payload.artist_id, JSON null): null value in a primary key column: payload.artist_id is absent from the event`,
		},
		{
			name: "null primary key on delete", proj: "artist_followers", eventType: "ARTIST_UNFOLLOWED",
			payload: `{"artist_id":null,"user_id":"u"}`,
			class:   retry.Permanent, message: `projection "artist_followers": column artist_id (from payload.artist_id, JSON null): null value in a primary key column`,
		},
		{
			name: "event type not handled", proj: "kinds", eventType: "ARTIST_FOLLOWED", payload: `{}`,
			class: retry.Permanent, message: `projection "kinds": event type "ARTIST_FOLLOWED" is not handled`,
		},
		{
			// Last: it drops a column.
			name: "column dropped", setup: "ALTER TABLE %s.artist_followers DROP COLUMN followed_at",
			proj: "artist_followers", eventType: "ARTIST_FOLLOWED", payload: specPayload,
			class: retry.Projection, sqlState: "42703", message: `column "followed_at" of relation "artist_followers" does not exist`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := schema
			if tt.schema != "" {
				s = tt.schema
			}
			if tt.setup != "" {
				if _, err := pool.Exec(ctx, fmt.Sprintf(tt.setup, pgx.Identifier{s}.Sanitize())); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			ev := tblEvent(t, s, tt.eventType, 7, 1719331200000, tt.payload)
			_, err := tps[tt.proj].Apply(ctx, pool, ev)
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			if got := retry.Classify(err); got != tt.class {
				t.Errorf("class = %v, want %v (%v)", got, tt.class, err)
			}
			if got := retry.SQLState(err); got != tt.sqlState {
				t.Errorf("SQLSTATE = %q, want %q (%v)", got, tt.sqlState, err)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("error %q does not contain %q", err, tt.message)
			}
			var pgErr *pgconn.PgError
			if tt.sqlState != "" && (!errors.As(err, &pgErr) || err.Error() != pgErr.Error()) {
				// The dead letter's error reads as PostgreSQL prints it.
				t.Errorf("error %q does not read as PostgreSQL prints it", err)
			}
		})
	}
}

// TestApplyColumnTypes checks the conversion of every column type, read back
// as PostgreSQL's text.
func TestApplyColumnTypes(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["kinds"]
	ev := tblEvent(t, schema, "KIND_SET", 9007199254740993, 1719331200000, `{
		"required": 1,
		"n_int": 2147483647, "n_small": -32768,
		"n_num": 123456789012345678901234567890.123456789012345678901234567890,
		"n_double": 0.1, "n_real": 1.5,
		"flag": true,
		"at": "2024-06-25T18:30:00.123456+02:00",
		"day": -62135596800000,
		"doc": {"big": 9007199254740993, "dec": 1.10, "s": "<&>", "l": [null, false]},
		"uid": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
		"label": 42.50,
		"tags": ["first", "second"]
	}`)
	tblApply(t, pool, p, ev, Applied)

	want := map[string]string{
		"id":          "user-123",
		"seq":         "9007199254740993",
		"fork":        "production",
		"n_int":       "2147483647",
		"n_small":     "-32768",
		"n_num":       "123456789012345678901234567890.123456789012345678901234567890",
		"n_double":    "0.1",
		"n_real":      "1.5",
		"flag":        "true",
		"timezone":    "2024-06-25 16:30:00.123456",
		"day":         "0001-01-01",
		"doc":         `{"l": [null, false], "s": "<&>", "big": 9007199254740993, "dec": 1.10}`,
		"uid":         "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"label":       "42.50",
		"first_tag":   "first",
		"required":    "1",
		"ratio":       "536870911.75",
		"derived_doc": `{"k": [1, 2.5, "x", null], "n": 2147483647, "at": "2024-06-25T16:00:00.5Z"}`,
		"_causet_seq": "9007199254740993",
	}
	if diff := cmp.Diff(want, rowTexts(t, pool, schema)); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
}

// rowTexts reads the kinds row as column → text.
func rowTexts(t *testing.T, pool *pgxpool.Pool, schema string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id, seq::text, fork, n_int::text, n_small::text, n_num::text, n_double::text, n_real::text, flag::text,"+
		" (at AT TIME ZONE 'UTC')::text, day::text, doc::text, uid::text, label, first_tag, required::text, ratio::text, derived_doc::text, _causet_seq::text FROM "+
		pgx.Identifier{schema, "kinds"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	m, err := pgx.CollectExactlyOneRow(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
		} else if v != nil {
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

// TestApplyTypedKeyTombstones checks that tombstones match keys by their
// typed value, whatever the spelling of the event and the session time zone.
func TestApplyTypedKeyTombstones(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["typed_keys"]
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET TimeZone = 'Asia/Tokyo'"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET TimeZone") //nolint:errcheck

	upsert := tblEvent(t, schema, "TYPED_SET", 1, 0, `{"uuid":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","at":"2024-06-25T16:00:00Z","num":1.5,"v":"x"}`)
	tblApply(t, pool, p, upsert, Applied)
	del := tblEvent(t, schema, "TYPED_DELETED", 5, 0, `{"uuid":"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11","at":1719331200000,"num":1.5}`)
	tblApply(t, conn.Conn(), p, del, Applied) // another time zone, spelling and epoch form
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "typed_keys"}.Sanitize()).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after delete = %d (%v), want 0", n, err)
	}
	replay := tblEvent(t, schema, "TYPED_SET", 4, 0, `{"uuid":"A0EEBC99-9c0b-4ef8-bb6d-6bb9bd380a11","at":"2024-06-26T01:00:00+09:00","num":1.5,"v":"old"}`)
	tblApply(t, pool, p, replay, Stale)
	tblApply(t, conn.Conn(), p, replay, Stale)
}

// TestApplyTimestampRange checks that epoch milliseconds reach PostgreSQL
// exactly across timestamptz's whole range.
func TestApplyTimestampRange(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	p := tps["kinds"]
	for i, ms := range []int64{0, -1, 1, 1719331200123, MinTimestampMillis, EndTimestampMillis - 1, -62135596800001, 253402300800000} {
		ev := tblEvent(t, schema, "KIND_SET", int64(i+1), 0, fmt.Sprintf(`{"required":1,"at":%d,"day":%d}`, ms, ms))
		tblApply(t, pool, p, ev, Applied)
		var got int64
		var day, wantDay string
		if err := pool.QueryRow(context.Background(), "SELECT (extract(epoch FROM at) * 1000)::bigint, day::text FROM "+pgx.Identifier{schema, "kinds"}.Sanitize()).Scan(&got, &day); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(context.Background(), "SELECT (to_timestamp($1::numeric / 1000) AT TIME ZONE 'UTC')::date::text", fmt.Sprint(ms)).Scan(&wantDay); err != nil {
			t.Fatal(err)
		}
		if got != ms || day != wantDay {
			t.Errorf("epoch ms %d (%s) stored as %d, date %s (want %s)", ms, formatTime(time.UnixMilli(ms), false), got, day, wantDay)
		}
	}
}

// eventOf returns the Event DecodeEvent makes of the event object fields
// (encoded by encoding/json).
func eventOf(tb testing.TB, fields map[string]any) *Event {
	tb.Helper()
	raw, err := json.Marshal(fields)
	if err != nil {
		tb.Fatal(err)
	}
	ev, err := DecodeEvent(raw)
	if err != nil {
		tb.Fatalf("DecodeEvent(%s): %v", raw, err)
	}
	return ev
}

// TestPlanRefusesInvalidTenantSchema checks that the SQL for a hostile
// schema name is never built, even for a hand-made Event.
func TestPlanRefusesInvalidTenantSchema(t *testing.T) {
	_, tps := tblProjections(t)
	p := tps["artist_followers"]
	for _, schema := range []string{`acme"; DROP TABLE x; --`, "Acme", "", "a b", "1acme", strings.Repeat("a", 64), "acme\x00"} {
		// Hand-made: DecodeEvent refuses these names.
		ev := tblEvent(t, "acme", "ARTIST_FOLLOWED", 1, 1719331200000, `{"user_id":"u","artist_id":"a","points":1,"games":1}`)
		ev.TenantSchema = schema
		st, err := p.Plan(ev)
		if err == nil || !retry.IsPermanent(err) {
			t.Errorf("Plan(schema %q) = %+v, %v; want a permanent error", schema, st, err)
			continue
		}
		if want := fmt.Sprintf("tenant schema %q is not a valid identifier", schema); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
		if st.SQL != "" || st.Args != nil {
			t.Errorf("Plan built a statement for schema %q: %+v", schema, st)
		}
		if _, err := p.Apply(context.Background(), failDB{t}, ev); !retry.IsPermanent(err) {
			t.Errorf("Apply(schema %q): %v, want a permanent error", schema, err)
		}
	}
}

// failDB fails the test when a statement reaches it.
type failDB struct{ t *testing.T }

func (f failDB) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	f.t.Errorf("statement reached the database: %s", sql)
	return pgconn.CommandTag{}, errors.New("failDB")
}

func (f failDB) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	f.t.Errorf("query reached the database: %s", sql)
	return nil, errors.New("failDB")
}

// TestPlanStatements pins the SQL and arguments of the SPEC projection.
func TestPlanStatements(t *testing.T) {
	_, tps := tblProjections(t)
	p := tps["artist_followers"]
	ev := tblEvent(t, "acme", "ARTIST_FOLLOWED", 1891, 1719331200000, specPayload)
	st, err := p.Plan(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := Statement{
		SQL: `INSERT INTO "acme"."artist_followers" AS t ("artist_id", "user_id", "followed_at", "score", "big", "amount", _causet_seq)` +
			` SELECT $1::text, $2::text, $3::text::timestamptz, $4::text::bigint, $5::text::bigint, $6::text::numeric, $7::text::bigint` +
			` WHERE NOT EXISTS (SELECT 1 FROM "acme"."_causet_tombstones" tb WHERE tb.table_name = $8::text AND tb.pk = ARRAY[$1::text, $2::text] AND tb._causet_seq >= $7::text::bigint)` +
			` AND NOT EXISTS (SELECT 1 FROM "acme"."artist_followers" WHERE "artist_id" = $1::text AND "user_id" = $2::text AND _causet_seq > $7::text::bigint)` +
			` ON CONFLICT ("artist_id", "user_id") DO UPDATE SET "followed_at" = EXCLUDED."followed_at", "score" = EXCLUDED."score", "big" = EXCLUDED."big", "amount" = EXCLUDED."amount", _causet_seq = EXCLUDED._causet_seq` +
			` WHERE t._causet_seq <= EXCLUDED._causet_seq`,
		Args: []any{"artist-456", "user-123", "2024-06-25T16:00:00.000Z", "2", "9007199254740993", "12345678901234567890.0123456789", "1891", "artist_followers"},
		Op:   OpUpsert,
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("upsert (-want +got):\n%s", diff)
	}

	ev = tblEvent(t, "acme", "ARTIST_UNFOLLOWED", 1892, 1719331200000, `{"user_id":"user-123","artist_id":"artist-456"}`)
	st, err = p.Plan(ev)
	if err != nil {
		t.Fatal(err)
	}
	want = Statement{
		SQL: `WITH del AS (DELETE FROM "acme"."artist_followers" WHERE "artist_id" = $1::text AND "user_id" = $2::text AND _causet_seq <= $3::text::bigint)` +
			` INSERT INTO "acme"."_causet_tombstones" AS tb (table_name, pk, _causet_seq) SELECT $4::text, ARRAY[$1::text, $2::text], $3::text::bigint` +
			` WHERE NOT EXISTS (SELECT 1 FROM "acme"."artist_followers" WHERE "artist_id" = $1::text AND "user_id" = $2::text AND _causet_seq > $3::text::bigint)` +
			` ON CONFLICT (table_name, pk) DO UPDATE SET _causet_seq = EXCLUDED._causet_seq WHERE tb._causet_seq <= EXCLUDED._causet_seq`,
		Args: []any{"artist-456", "user-123", "1892", "artist_followers"},
		Op:   OpDelete,
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("delete (-want +got):\n%s", diff)
	}

	// A delete does not evaluate non-key derives: a payload without points
	// deletes fine.
	if _, err := tps["artist_followers"].Plan(ev); err != nil {
		t.Errorf("delete needs only the key: %v", err)
	}
	tk := tps["typed_keys"]
	st, err = tk.Plan(tblEvent(t, "acme", "TYPED_DELETED", 1, 0, `{"uuid":"123e4567-e89b-12d3-a456-426614174000","at":0,"num":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `ARRAY[$1::text::uuid::text, ($2::text::timestamptz AT TIME ZONE 'UTC')::text, trim_scale($3::text::numeric)::text]`; !strings.Contains(st.SQL, want) {
		t.Errorf("typed key tombstone: SQL %s does not contain %s", st.SQL, want)
	}
}

func TestToParam(t *testing.T) {
	tests := []struct {
		typ     string
		in      any
		want    any
		wantErr string
	}{
		{"text", nil, nil, ""},
		{"jsonb", nil, nil, ""},
		{"text", "s", "s", ""},
		{"text", json.Number("1.50"), "1.50", ""},
		{"text", true, "true", ""},
		{"boolean", false, "false", ""},
		{"bigint", json.Number("9007199254740993"), "9007199254740993", ""},
		{"bigint", "abc", "abc", ""}, // PostgreSQL says 22P02
		{"numeric", json.Number("1e400"), "1e400", ""},
		{"timestamptz", json.Number("1719331200000"), "2024-06-25T16:00:00.000Z", ""},
		{"timestamptz", json.Number("-1"), "1969-12-31T23:59:59.999Z", ""},
		{"timestamptz", json.Number(fmt.Sprint(MinTimestampMillis)), "4714-11-24T00:00:00.000Z BC", ""},
		{"timestamptz", json.Number(fmt.Sprint(EndTimestampMillis - 1)), "294276-12-31T23:59:59.999Z", ""},
		{"timestamptz", "2024-06-25T16:00:00+02:00", "2024-06-25T16:00:00+02:00", ""},
		{"timestamptz", time.Date(2024, 6, 25, 16, 0, 0, 1000, time.UTC), "2024-06-25T16:00:00.000001Z", ""},
		{"date", json.Number("1719331200000"), "2024-06-25", ""},
		{"timestamptz", json.Number("1e3"), nil, "timestamptz from a number wants integer epoch milliseconds, got 1e3"},
		{"jsonb", map[string]any{"a": []any{json.Number("9007199254740993"), "<>", nil}}, `{"a":[9007199254740993,"<>",null]}`, ""},
		{"jsonb", "s", `"s"`, ""},
		{"jsonb", json.Number("01"), nil, "cannot encode as JSON: json: invalid number literal \"01\""},
		{"text", map[string]any{}, nil, "a JSON object cannot be stored in a text column (only jsonb)"},
		{"uuid", []any{}, nil, "a JSON array cannot be stored in a uuid column (only jsonb)"},
		{"text", 1.5, nil, "unsupported value of type float64"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %v", tt.typ, tt.in), func(t *testing.T) {
			got, err := toParam(tt.typ, tt.in)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("toParam = %v, %v; want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("toParam = %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}
}

func TestEvalDerive(t *testing.T) {
	ev := eventOf(t, map[string]any{
		"eventType": "E", "entityId": "e", "forkId": "f", "tenantSchema": "s", "irVersion": "v1",
		"sequenceNumber": json.Number("9007199254740993"), "ts": json.Number("5"),
		"extra": map[string]any{"region": "eu"},
		"payload": map[string]any{
			"i": json.Number("7"), "f": json.Number("2.5"), "huge": json.Number("18446744073709551616"),
			"s": "x", "b": true, "n": nil, "l": []any{json.Number("1"), "a"},
			// More digits than a double holds (definitions trial: a
			// derive passing them through stored them rounded).
			"long": json.Number("123456789.123456789123"),
			"obj":  map[string]any{"a": json.Number("12345678901234567890"), "l": []any{json.Number("-1.00000000000000000001")}},
			"same": json.Number("1.8446744073709551616e19"), // huge, spelt another way
		},
	})
	tests := []struct {
		expr    string
		want    any
		wantErr string
	}{
		{"payload.i / 2", json.Number("3"), ""},
		{"payload.f * 2.0", json.Number("5"), ""},
		{"payload.i + payload.f", nil, "no such overload"},
		// A number a double does not hold exactly, passed through, is
		// written as sent; computed with, it is a double.
		{"payload.huge", json.Number("18446744073709551616"), ""},
		{"has(payload.huge) ? payload.huge : dyn(null)", json.Number("18446744073709551616"), ""},
		{"payload.long", json.Number("123456789.123456789123"), ""},
		{"payload.obj", map[string]any{"a": json.Number("12345678901234567890"), "l": []any{json.Number("-1.00000000000000000001")}}, ""},
		{"[payload.obj.a, payload.long * 2.0]", []any{json.Number("12345678901234567890"), json.Number("2.4691357824691358e+08")}, ""},
		{"payload.huge * 2.0", json.Number("3.6893488147419103e+19"), ""},
		{"double(payload.i) * 2.5", json.Number("17.5"), ""},
		{"double(event.sequenceNumber)", json.Number("9.007199254740992e+15"), ""}, // an int made a double: docs/events.md
		{"payload.i / 0", nil, "division by zero"},
		{"payload.missing", nil, "no such key: missing"},
		{"payload.?missing.orValue(null)", nil, ""},
		{"payload.?missing", nil, ""},
		{"payload.?s", "x", ""},
		{"payload.n", nil, ""},
		{"payload.i > 3 ? 'big' : dyn(null)", "big", ""},
		{"payload.i > 9 ? payload.s : null", nil, ""},
		{"payload.i > 1.5", true, ""},
		{"event.sequenceNumber", json.Number("9007199254740993"), ""},
		{"event.extra.region + '-' + event.forkId", "eu-f", ""},
		{"event.payload.l", []any{json.Number("1"), "a"}, ""},
		{"{'k': payload.l[0], 'u': 3u}", map[string]any{"k": json.Number("1"), "u": json.Number("3")}, ""},
		{"0.0 / 0.0", "NaN", ""},
		{"-1.0 / 0.0", "-Infinity", ""},
		{"timestamp('2024-06-25T16:00:00Z')", time.Date(2024, 6, 25, 16, 0, 0, 0, time.UTC), ""},
		// Values no column takes, of expressions that read a field (a
		// constant one is refused at load: TestDeriveOfAResultKindNoColumnTakesIsRefusedAtLoad).
		{"{payload.i: 2}", nil, "map key 7 is an int, not a string"},
		{"[duration(\"1s\"), payload.i]", nil, "result of type duration cannot be stored"},
		{"dyn(payload.b ? b'x' : b'y')", nil, "result of type bytes cannot be stored"}, // dyn: only known when it runs
		{"'ab'.upperAscii()", "AB", ""},
		{"[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, a+b+c+d+e+f > 0))))))", nil, "cost limit exceeded (an evaluation may cost at most 1000000 CEL cost units"},
	}
	vars := deriveVars(ev)
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			prg, err := compileDerive(tt.expr)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			got, err := evalDerive(prg, vars)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("evalDerive = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("evalDerive: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanConcurrent plans from many goroutines at once (run with -race):
// TableProjection and its CEL programs are shared by partitions.
func TestPlanConcurrent(t *testing.T) {
	_, tps := tblProjections(t)
	p := tps["artist_followers"]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				ev := tblEvent(t, fmt.Sprintf("tenant_%d", g), "ARTIST_FOLLOWED", int64(i), 0,
					fmt.Sprintf(`{"user_id":"u","artist_id":"a","points":%d,"games":%d}`, i, i%5))
				st, err := p.Plan(ev)
				if i%5 == 0 {
					if !retry.IsPermanent(err) {
						t.Errorf("division by zero: %v", err)
					}
					continue
				}
				if err != nil || st.Args[3] != fmt.Sprint(i/(i%5)) || !strings.Contains(st.SQL, fmt.Sprintf(`"tenant_%d"."artist_followers"`, g)) {
					t.Errorf("Plan = %v, %v", st.Args, err)
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPlan measures planning an upsert: derive, conversions and the SQL
// text for the tenant schema (built once per schema, then cached).
func BenchmarkPlan(b *testing.B) {
	_, tps := tblProjections(b)
	p := tps["artist_followers"]
	ev := tblEvent(b, "acme_concertapp_production", "ARTIST_FOLLOWED", 1891, 1719331200000, specPayload)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Plan(ev); err != nil {
			b.Fatal(err)
		}
	}
}

// kindsPayload sets a value of every column type of the kinds projection.
const kindsPayload = `{"n_int":2147483647,"n_small":-32768,"n_num":"12345678901234567890.0123456789","n_double":1.5e300,"n_real":3.25,"flag":true,` +
	`"at":"2024-06-25T16:00:00.5+02:00","day":1719331200000,"doc":{"a":[1,"x",null]},"uid":"123e4567-e89b-12d3-a456-426614174000",` +
	`"label":"hello","tags":["first"],"required":7}`

// BenchmarkPlanKinds measures planning an upsert with a value of every
// column type (the type checks of every kind on the hot path).
func BenchmarkPlanKinds(b *testing.B) {
	_, tps := tblProjections(b)
	p := tps["kinds"]
	ev := tblEvent(b, "acme_concertapp_production", "KIND_SET", 1891, 1719331200000, kindsPayload)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Plan(ev); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSQLTemplateKeepsTheTextOfEachSchema checks that planning does not
// write the SQL text again for a tenant schema it has seen, that the text
// kept is the one written, and that schemas beyond maxCachedSchemas still
// get theirs.
func TestSQLTemplateKeepsTheTextOfEachSchema(t *testing.T) {
	_, tps := tblProjections(t)
	tmpl := tps["artist_followers"].upsert
	schema := strings.Clone("acme_concertapp_production")
	want := tmpl.write(schema)
	if !strings.Contains(want, `"acme_concertapp_production"."artist_followers"`) {
		t.Fatalf("write = %s", want)
	}
	if got := tmpl.build(schema); got != want {
		t.Fatalf("build = %s, want %s", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = tmpl.build(schema) }); n != 0 {
		t.Errorf("build of a schema seen before: %v allocations, want 0", n)
	}
	for i := range maxCachedSchemas + 10 {
		s := fmt.Sprintf("tenant_%d", i)
		if got := tmpl.build(s); got != tmpl.write(s) {
			t.Fatalf("build(%s) = %s", s, got)
		}
	}
	if n := tmpl.cache.n.Load(); n != maxCachedSchemas {
		t.Errorf("%d schemas kept, want %d", n, maxCachedSchemas)
	}
}

// BenchmarkSQLTemplate measures only the SQL text for a tenant schema.
func BenchmarkSQLTemplate(b *testing.B) {
	_, tps := tblProjections(b)
	p := tps["artist_followers"]
	b.ReportAllocs()
	for b.Loop() {
		_ = p.upsert.build("acme_concertapp_production")
	}
}

func TestMigrate(t *testing.T) {
	pool, schema, _ := tblTenant(t) // migrated once
	ctx := context.Background()
	d, tps := tblProjections(t)
	if err := Migrate(ctx, pool, d, schema); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	tblApply(t, pool, tps["artist_followers"], tblEvent(t, schema, "ARTIST_FOLLOWED", 1, 0, specPayload), Applied)

	type col struct {
		Name, Type, Nullable string
		Default              *string
	}
	columns := func(table string) []col {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`, schema, table)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c col, err error) {
			err = r.Scan(&c.Name, &c.Type, &c.Nullable, &c.Default)
			return c, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return cols
	}
	want := []col{
		{"artist_id", "text", "NO", nil},
		{"user_id", "text", "NO", nil},
		{"followed_at", "timestamp with time zone", "YES", nil},
		{"score", "bigint", "YES", nil},
		{"big", "bigint", "YES", nil},
		{"amount", "numeric", "YES", nil},
		{"_causet_seq", "bigint", "NO", ptr("0")},
	}
	if diff := cmp.Diff(want, columns("artist_followers")); diff != "" {
		t.Errorf("artist_followers columns (-want +got):\n%s", diff)
	}
	var pkDef string
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`,
		pgx.Identifier{schema, "artist_followers"}.Sanitize()).Scan(&pkDef); err != nil || pkDef != "PRIMARY KEY (artist_id, user_id)" {
		t.Errorf("primary key = %q (%v)", pkDef, err)
	}

	t.Run("adds missing columns", func(t *testing.T) {
		pd := &d.Projections[0]
		pd.Columns["note"] = ColumnDef{Type: "text", From: "payload.note"}
		pd.ColumnNames = append(pd.ColumnNames, "note")
		if err := Migrate(ctx, pool, d, schema); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		got := columns("artist_followers")
		if last := got[len(got)-1]; last != (col{"note", "text", "YES", nil}) {
			t.Errorf("last column = %+v, want note text", last)
		}
	})

	t.Run("all or nothing", func(t *testing.T) {
		pd := &d.Projections[0]
		// A NOT NULL column cannot be added to a table with rows (23502), and
		// a new projection's table must then not be created either.
		pd.Columns["must"] = ColumnDef{Type: "bigint", From: "payload.must", NotNull: true}
		pd.ColumnNames = append(pd.ColumnNames, "must")
		d.Projections = append(d.Projections, ProjectionDef{
			Name: "later", Table: "later", PrimaryKey: []string{"id"},
			Columns: map[string]ColumnDef{"id": {Type: "text", From: "entityId"}},
			Events:  map[string]Op{"LATER": OpUpsert},
		})
		err := Migrate(ctx, pool, d, schema)
		if retry.SQLState(err) != "23502" || !strings.Contains(err.Error(), "migrate tenant schema "+schema+": ") {
			t.Fatalf("Migrate = %v, want 23502 naming the schema", err)
		}
		if got := columns("later"); len(got) != 0 {
			t.Errorf("table later was created by a failed migration: %+v", got)
		}
		if got := columns("artist_followers"); got[len(got)-1].Name != "note" {
			t.Errorf("failed migration left column %+v", got[len(got)-1])
		}
	})

	t.Run("invalid tenant schema", func(t *testing.T) {
		for _, s := range []string{`x"; DROP SCHEMA public; --`, "Acme", ""} {
			err := Migrate(ctx, failDB{t}, d, s)
			if want := fmt.Sprintf("migrate: tenant schema %q is not a valid identifier", s); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Migrate(%q) = %v, want %q", s, err, want)
			}
		}
	})

	t.Run("PostgreSQL's own schemas refused before SQL", func(t *testing.T) {
		for _, s := range []string{"public", "pg_catalog", "pg_toast", "information_schema"} {
			err := Migrate(ctx, failDB{t}, d, s)
			if want := fmt.Sprintf("migrate: tenant schema %q must name a tenant, not one of PostgreSQL's own schemas", s); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Migrate(%q) = %v, want %q", s, err, want)
			}
		}
	})

	t.Run("invalid definitions", func(t *testing.T) {
		bad := &Definitions{IRVersion: "v1"}
		err := Migrate(ctx, failDB{t}, bad, "acme")
		if want := "migrate tenant schema acme: projection definitions: projections: none defined"; err == nil || err.Error() != want {
			t.Errorf("Migrate = %v, want %q", err, want)
		}
	})
}

// TestMigrateConcurrently runs migrations of one new tenant schema at once:
// the advisory lock makes them queue instead of failing on the catalog.
func TestMigrateConcurrently(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchemaName(t)
	d, _ := tblProjections(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := Migrate(context.Background(), pool, d, schema); err != nil {
				t.Errorf("Migrate: %v", err)
			}
		})
	}
	wg.Wait()
}

// TestApplyExamplesFile applies the SPEC §3 event, verbatim, to the
// projections of examples/projections.yaml.
func TestApplyExamplesFile(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	tps, schema := exampleTables(t, pool)
	ev, err := DecodeEvent([]byte(`{
  "eventType": "ARTIST_FOLLOWED",
  "entityId": "user-123",
  "forkId": "production",
  "tenantSchema": "` + schema + `",
  "irVersion": "v42",
  "sequenceNumber": 1891,
  "ts": 1719331200000,
  "payload": { "user_id": "user-123", "artist_id": "artist-456" }
}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tps {
		if !p.Handles(ev.EventType) {
			continue
		}
		if _, err := p.Apply(ctx, pool, ev); err != nil {
			t.Errorf("%s: %v", p.Name(), err)
		}
	}
	var followScore *int64
	if err := pool.QueryRow(ctx, "SELECT score FROM "+pgx.Identifier{schema, "artist_followers"}.Sanitize()).Scan(&followScore); err != nil || followScore != nil {
		t.Errorf("artist_followers row: score %v, err %v; want NULL score (no games in the event)", followScore, err)
	}
	var tier, source string
	var score *string
	if err := pool.QueryRow(ctx, "SELECT tier, score::text, source::text FROM "+pgx.Identifier{schema, "user_follows"}.Sanitize()).Scan(&tier, &score, &source); err != nil {
		t.Fatal(err)
	}
	if tier != "free" || score != nil || source != `{"user_id": "user-123", "artist_id": "artist-456"}` {
		t.Errorf("user_follows row: tier %q, score %v, source %s", tier, score, source)
	}
}

// TestTombstoneStopsEverySpellingOfItsKey: a key value PostgreSQL deems
// equal to the deleted one, spelt otherwise (numeric 7.50 and 7.5, 5 and
// 5.0; double precision and real −0 and 0), is stopped by the delete's
// tombstone, on the statement path and on the COPY path (new-user trial:
// an older upsert of 7.50 after the delete of 7.5 brought the row back on
// both); and a tombstone an older worker wrote, with the key as text, still
// stops an upsert of that spelling.
func TestTombstoneStopsEverySpellingOfItsKey(t *testing.T) {
	src := `irVersion: v42
projections:
  - name: nk
    table: nk
    primaryKey: [u, n]
    columns:
      u: { type: text, from: payload.u }
      n: { type: numeric, from: payload.n }
      v: { type: text, from: payload.v }
    events: { K_UP: upsert, K_DEL: delete }
  - name: dk
    table: dk
    primaryKey: [d, r]
    columns:
      d: { type: double precision, from: payload.d }
      r: { type: real, from: payload.r }
      v: { type: text, from: payload.v }
    events: { K_UP: upsert, K_DEL: delete }
`
	defs, tps := keyProjections(t, src)
	pool := pgtest.Pool(t)
	ctx := context.Background()
	type step struct {
		typ     string
		seq     int64
		payload string
	}
	cases := []struct {
		name  string
		steps []step // the last is the late upsert, older than the delete
	}{
		{"numeric 7.50 after a delete of 7.5", []step{{"K_UP", 100, `{"u":"a","n":"7.50","d":1,"r":1,"v":"x"}`}, {"K_DEL", 200, `{"u":"a","n":"7.5","d":1,"r":1}`}, {"K_UP", 150, `{"u":"a","n":"7.50","d":1,"r":1,"v":"back"}`}}},
		{"numeric 5.0 after a delete of 5", []step{{"K_DEL", 200, `{"u":"a","n":5,"d":1,"r":1}`}, {"K_UP", 150, `{"u":"a","n":"5.0","d":1,"r":1,"v":"back"}`}}},
		{"double precision -0 after a delete of 0", []step{{"K_DEL", 200, `{"u":"a","n":1,"d":0,"r":0}`}, {"K_UP", 150, `{"u":"a","n":1,"d":-0,"r":"-0","v":"back"}`}}},
		{"real 0 after a delete of -0", []step{{"K_DEL", 200, `{"u":"a","n":1,"d":"-0","r":-0.0}`}, {"K_UP", 150, `{"u":"a","n":1,"d":0,"r":0,"v":"back"}`}}},
	}
	for _, path := range []string{"statements", "copy"} {
		for _, tc := range cases {
			t.Run(path+"/"+tc.name, func(t *testing.T) {
				schema := pgtest.NewSchemaName(t)
				if err := Migrate(ctx, pool, defs, schema); err != nil {
					t.Fatal(err)
				}
				for i, st := range tc.steps {
					ev := tblEvent(t, schema, st.typ, st.seq, 1719331200000, st.payload)
					for _, p := range tps {
						if i == len(tc.steps)-1 && path == "copy" {
							applyByCopy(t, pool, p, ev)
							continue
						}
						stmt, err := p.Plan(ev)
						if err != nil {
							t.Fatal(err)
						}
						if _, err := pool.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
							t.Fatalf("%s %d: %v", st.typ, st.seq, err)
						}
					}
				}
				for _, table := range []string{"nk", "dk"} {
					var n int
					if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
						t.Fatal(err)
					}
					if n != 0 {
						t.Errorf("%s: %d rows after the late upsert; want the delete's tombstone to stop it", table, n)
					}
				}
			})
		}
	}

	// A tombstone of an older worker: the key as text ("7.50").
	schema := pgtest.NewSchemaName(t)
	if err := Migrate(ctx, pool, defs, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, tombstoneTable}.Sanitize()+
		" (table_name, pk, _causet_seq) VALUES ('nk', ARRAY['a', '7.50'], 200)"); err != nil {
		t.Fatal(err)
	}
	ev := tblEvent(t, schema, "K_UP", 150, 1719331200000, `{"u":"a","n":"7.50","d":1,"r":1,"v":"back"}`)
	stmt, err := tps[0].Plan(ev)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := pool.Exec(ctx, stmt.SQL, stmt.Args...)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("upsert after an older worker's tombstone: %v, %d rows; want stale", err, tag.RowsAffected())
	}
	applyByCopy(t, pool, tps[0], ev)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "nk"}.Sanitize()).Scan(&n); err != nil || n != 0 {
		t.Fatalf("COPY after an older worker's tombstone: %d rows, %v; want none", n, err)
	}
}

// jsonbKeyDefinitions is a projection, jk, whose primary key (u, j) has a
// jsonb column, with a delete.
const jsonbKeyDefinitions = `irVersion: v42
projections:
  - name: jk
    table: jk
    primaryKey: [u, j]
    columns:
      u: { type: text, from: payload.u }
      j: { type: jsonb, from: payload.j }
      v: { type: text, from: payload.v }
    events: { K_UP: upsert, K_DEL: delete }
`

// TestTombstoneStopsEverySpellingOfAJSONBKey: a jsonb primary key value
// that PostgreSQL deems equal to the deleted one ({"x": 1.0} and {"x": 1})
// is stopped by the delete's tombstone, on the statement path and on the
// COPY path (new-user trial: an older upsert of {"x": 1.0} after the delete
// of {"x": 1} brought the row back); and an upsert of another spelling
// lands on the row of the first, as PostgreSQL's primary key has it.
func TestTombstoneStopsEverySpellingOfAJSONBKey(t *testing.T) {
	defs, tps := keyProjections(t, jsonbKeyDefinitions)
	p := tps[0]
	pool := pgtest.Pool(t)
	ctx := context.Background()
	cases := []struct{ deleted, late string }{
		{`{"x":1}`, `{"x":1.0}`},
		{`{"x":1.0}`, `{"x":1}`},
		{`[100, "a"]`, `[1e2, "a"]`},
		{`{"a":{"b":[0.5]}}`, `{"a":{"b":[5.00e-1]}}`},
		{`0`, `-0.0`},
		{`2.5`, `25E-1`},
	}
	for _, path := range []string{"statements", "copy"} {
		for _, tc := range cases {
			t.Run(path+"/"+tc.late+" after a delete of "+tc.deleted, func(t *testing.T) {
				schema := pgtest.NewSchemaName(t)
				if err := Migrate(ctx, pool, defs, schema); err != nil {
					t.Fatal(err)
				}
				apply := func(typ string, seq int64, j, v string, viaCopy bool) {
					ev := tblEvent(t, schema, typ, seq, 1719331200000, `{"u":"a","j":`+j+`,"v":"`+v+`"}`)
					if viaCopy {
						applyByCopy(t, pool, p, ev)
						return
					}
					stmt, err := p.Plan(ev)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := pool.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
						t.Fatalf("%s %d: %v", typ, seq, err)
					}
				}
				table := pgx.Identifier{schema, "jk"}.Sanitize()
				apply("K_UP", 100, tc.deleted, "first", false)
				apply("K_UP", 110, tc.late, "second", path == "copy")
				var n int
				var v string
				if err := pool.QueryRow(ctx, "SELECT count(*), max(v) FROM "+table).Scan(&n, &v); err != nil {
					t.Fatal(err)
				}
				if n != 1 || v != "second" {
					t.Fatalf("after upserts of %s and %s: %d rows, v %q; want one row, v second", tc.deleted, tc.late, n, v)
				}
				apply("K_DEL", 200, tc.deleted, "", false)
				apply("K_UP", 150, tc.late, "back", path == "copy")
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("%d rows after the late upsert of %s; want the tombstone of %s to stop it", n, tc.late, tc.deleted)
				}
			})
		}
	}
}

// TestCanonicalJSONNumbers: every spelling of a number becomes one, outside
// strings only, and a text without numbers to change is returned as it is.
func TestCanonicalJSONNumbers(t *testing.T) {
	for in, want := range map[string]string{
		`{"x":1.0}`:              `{"x":1}`,
		`{"x":1}`:                `{"x":1}`,
		`[100,1e2,1.00E+2,10e1]`: `[1e2,1e2,1e2,1e2]`,
		`[0,-0,0.000,-0.0e5]`:    `[0,0,0,0]`,
		`[1.50,15e-1,0.15e1]`:    `[15e-1,15e-1,15e-1]`,
		`-12.3400`:               `-1234e-2`,
		`{"a-1.0":"-1.0 \"2.0\"","b":[true,null,-7]}`: `{"a-1.0":"-1.0 \"2.0\"","b":[true,null,-7]}`,
		`"1.0"`:                    `"1.0"`,
		`[1e99999999999999999999]`: `[1e99999999999999999999]`,
	} {
		if got := canonicalJSONNumbers(in); got != want {
			t.Errorf("canonicalJSONNumbers(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestACopyGroupTakesTwoSpellingsOfAKeyAsOneRow: two upserts of one row
// with equal sequence numbers, its key spelt two ways, in one COPY group,
// leave the row as the later one makes it, for every key type with more
// than one spelling (new-user trial: numeric 7 then 7.0 left the earlier
// event's value: the group's INSERT failed with 21000 and its isolation
// applied them out of order).
func TestACopyGroupTakesTwoSpellingsOfAKeyAsOneRow(t *testing.T) {
	cases := []struct{ typ, first, second string }{
		{"numeric", `7`, `7.0`},
		{"numeric", `"1e1"`, `"10.00"`},
		{"bigint", `"01"`, `" +1"`},
		{"integer", `5`, `"5"`},
		{"double precision", `-0`, `0`},
		{"real", `16777217`, `16777216`},
		{"boolean", `"yes"`, `true`},
		{"uuid", `"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"`, `"{a0eebc999c0b4ef8bb6d6bb9bd380a11}"`},
		{"timestamptz", `"2024-06-25T12:00:00Z"`, `"2024-06-25T14:00:00+02:00"`},
		{"date", `"2024-06-25"`, `"2024-06-25T23:00:00-05:00"`},
		{"jsonb", `{"x":1}`, `{"x":1.0}`},
	}
	for _, tc := range cases {
		t.Run(tc.typ+" "+tc.first+" then "+tc.second, func(t *testing.T) {
			defs, tps := keyProjections(t, `irVersion: v42
projections:
  - name: k
    table: k
    primaryKey: [k]
    columns:
      k: { type: `+tc.typ+`, from: payload.k }
      v: { type: text, from: payload.v }
    events: { K_UP: upsert }
`)
			pool := pgtest.Pool(t)
			schema := pgtest.NewSchemaName(t)
			if err := Migrate(context.Background(), pool, defs, schema); err != nil {
				t.Fatal(err)
			}
			applyByCopy(t, pool, tps[0],
				tblEvent(t, schema, "K_UP", 5, 1719331200000, `{"k":`+tc.first+`,"v":"first"}`),
				tblEvent(t, schema, "K_UP", 5, 1719331200000, `{"k":`+tc.second+`,"v":"second"}`))
			var n int
			var v string
			if err := pool.QueryRow(context.Background(), "SELECT count(*), max(v) FROM "+pgx.Identifier{schema, "k"}.Sanitize()).Scan(&n, &v); err != nil {
				t.Fatal(err)
			}
			if n != 1 || v != "second" {
				t.Errorf("%d rows, v %q; want one row, v second (the later of two equal sequence numbers)", n, v)
			}
		})
	}
}

// TestKeyValueText: the spellings PostgreSQL reads as one key value get
// one text; values it tells apart keep theirs.
func TestKeyValueText(t *testing.T) {
	same := []struct {
		k    colKind
		a, b string
	}{
		{kindNumeric, "7", "7.000"}, {kindNumeric, " +1e1 ", "10"}, {kindNumeric, "NaN", "nan"},
		{kindBigint, "+01", "1"}, {kindSmallint, " 2 ", "2"},
		{kindDouble, "-0", "0"}, {kindDouble, "1e0", "1.0"}, {kindReal, "16777217", "16777216"},
		{kindBoolean, "Yes", "t"}, {kindBoolean, "of", "false"},
		{kindUUID, "{A0EEBC99-9C0B4EF8-BB6D6BB9-BD380A11}", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{kindTimestamptz, "2024-06-25t12:00:00z", "2024-06-25 14:00:00+02:00"},
		{kindTimestamptz, "2016-12-31T23:59:60Z", "2017-01-01T00:00:00Z"},
		{kindDate, "2024-06-25T23:00:00-05:00", "2024-06-25"}, {kindDate, "2016-12-31T23:59:60Z", "2016-12-31"},
	}
	for _, c := range same {
		if a, b := keyValueText(c.k, c.a), keyValueText(c.k, c.b); a != b {
			t.Errorf("kind %d: %q → %q and %q → %q, want one text", c.k, c.a, a, c.b, b)
		}
	}
	apart := []struct {
		k    colKind
		a, b string
	}{
		{kindText, "a", "a "}, {kindNumeric, "1", "1.0001"}, {kindDouble, "0.1", "0.10000000000000002"},
		{kindBigint, "1", "2"}, {kindBoolean, "t", "f"}, {kindTimestamptz, "2024-06-25T12:00:00Z", "2024-06-25T12:00:00+02:00"},
	}
	for _, c := range apart {
		if a, b := keyValueText(c.k, c.a), keyValueText(c.k, c.b); a == b {
			t.Errorf("kind %d: %q and %q both → %q, want two texts", c.k, c.a, c.b, a)
		}
	}
}

// keyProjections returns the definitions src and their projections.
func keyProjections(t *testing.T, src string) (*Definitions, []*TableProjection) {
	t.Helper()
	defs, err := ParseDefinitions("keys.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	tps, err := NewTableProjections(defs)
	if err != nil {
		t.Fatal(err)
	}
	return defs, tps
}

// plannedPair returns the pair of ev and p with p's statement for ev, as
// the worker plans it, or Plan's error.
func plannedPair(p *TableProjection, ev *Event) (pair, error) {
	st, err := p.Plan(ev)
	return pair{d: &decoded{ev: ev}, h: p, stmt: st}, err
}

// applyByCopy applies the upserts evs (in that order) to p as one COPY
// group would
// (copyRows in a transaction).
func applyByCopy(t *testing.T, pool *pgxpool.Pool, p *TableProjection, evs ...*Event) {
	t.Helper()
	var pairs []pair
	for _, ev := range evs {
		pr, err := plannedPair(p, ev)
		if err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, pr)
	}
	g := formGroup(newCopyGroup(p, evs[0].TenantSchema), pairs)
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, _, err := copyRows(context.Background(), tx, g, tempTables{})
		return err
	})
	if err != nil {
		t.Fatalf("copyRows: %v", err)
	}
}

// TestDriftSaysWhatMigrateLeaves: Drift reports a column whose type is not
// the definitions' (another type, a modifier) and a notNull column the
// table lets be NULL, none on a table just migrated (every type of the
// definitions as format_type spells it) nor on a schema that does not
// exist (new-user trial: migrate said "migrated" over a type changed in
// the file).
func TestDriftSaysWhatMigrateLeaves(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	ctx := context.Background()
	d, _ := tblProjections(t)
	if got, err := Drift(ctx, pool, d, schema); err != nil || len(got) != 0 {
		t.Fatalf("Drift of a schema just migrated = %q, %v; want none", got, err)
	}
	// A primary key of the same columns in another order: ON CONFLICT
	// infers it all the same.
	if _, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "artist_followers"}.Sanitize()+
		" DROP CONSTRAINT artist_followers_pkey, ADD PRIMARY KEY (user_id, artist_id)"); err != nil {
		t.Fatal(err)
	}
	tblApply(t, pool, tps["artist_followers"], tblEvent(t, schema, "ARTIST_FOLLOWED", 1, 0, specPayload), Applied)
	if got, err := Drift(ctx, pool, d, schema); err != nil || len(got) != 0 {
		t.Fatalf("Drift with the primary key's columns in another order = %q, %v; want none", got, err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "artist_followers"}.Sanitize()); err != nil {
		t.Fatal(err) // its amount would not fit the numeric(10,2) below
	}
	if got, err := Drift(ctx, pool, d, schema+"_none"); err != nil || len(got) != 0 {
		t.Fatalf("Drift of a schema that does not exist = %q, %v; want none", got, err)
	}
	tbl := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	for _, q := range []string{
		"ALTER TABLE " + tbl("artist_followers") + " ALTER COLUMN score TYPE integer, ALTER COLUMN amount TYPE numeric(10,2)",
		"ALTER TABLE " + tbl("kinds") + " ALTER COLUMN required DROP NOT NULL, ALTER COLUMN label TYPE varchar(20)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	drift := func() []string {
		t.Helper()
		ds, err := Drift(ctx, pool, d, schema)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, dr := range ds {
			s, _, _ := strings.Cut(dr.String(), " (")
			if dr.Blocks {
				s = "BLOCKS " + s
			}
			out = append(out, s)
		}
		return out
	}
	want := []string{
		"artist_followers.score: the table's type is integer, the definitions' bigint",
		"artist_followers.amount: the table's type is numeric(10,2), the definitions' numeric",
		"kinds.label: the table's type is character varying(20), the definitions' text",
		"kinds.required: notNull in the definitions, NULL allowed in the table",
	}
	if diff := cmp.Diff(want, drift()); diff != "" {
		t.Errorf("Drift (-want +got):\n%s", diff)
	}

	// What the worker cannot write at all (second new-user trial: a
	// primary key changed in the file, a view of the table's name, a NOT
	// NULL column of the table's own; migrate said "migrated").
	for _, q := range []string{
		"ALTER TABLE " + tbl("artist_followers") + " DROP CONSTRAINT artist_followers_pkey, ADD PRIMARY KEY (user_id)",
		"ALTER TABLE " + tbl("kinds") + " ADD COLUMN extra text NOT NULL, ADD COLUMN filled text NOT NULL DEFAULT 'x'",
		"ALTER TABLE " + tbl("typed_keys") + " RENAME TO typed_keys_old",
		"CREATE VIEW " + tbl("typed_keys") + " AS SELECT 1 AS k_uuid",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// The same lines, in projection order with the blocking ones.
	want = append(append([]string{"BLOCKS artist_followers: primary key"}, want...),
		"BLOCKS kinds.extra: NOT NULL without a default, and not in the definitions: every upsert fails",
		"BLOCKS typed_keys: a relation of kind \"v\"")
	if diff := cmp.Diff(want, drift()); diff != "" {
		t.Errorf("Drift after the blocking changes (-want +got):\n%s", diff)
	}
	// Migrate leaves the view as it is and says nothing of it: Drift does
	// (new-user trial: "created table typed_keys" on every run).
	for run := 1; run <= 2; run++ {
		if changes, err := MigrateChanges(ctx, pool, d, schema); err != nil || len(changes) != 0 {
			t.Errorf("migrate run %d over the view: changes %q, error %v; want none", run, changes, err)
		}
	}
}

// TestDriftBlocksTypesPostgreSQLCannotWrite: a column of another type is a
// warning when PostgreSQL converts the definitions' type into it (bigint
// into integer, integer into bigint, uuid into text), and blocks when it
// cannot: no assignment cast (jsonb into numeric, text into timestamptz),
// or, for a primary-key column, no comparison (numeric with text)
// (definition-author trial: such tables were warnings, migrate exited 0,
// and every event was dead-lettered with 42804 or 42883).
func TestDriftBlocksTypesPostgreSQLCannotWrite(t *testing.T) {
	pool, schema, _ := tblTenant(t)
	ctx := context.Background()
	d, _ := tblProjections(t)
	tbl := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	for _, q := range []string{
		"ALTER TABLE " + tbl("artist_followers") + " ALTER COLUMN score TYPE integer",
		"ALTER TABLE " + tbl("kinds") + " ALTER COLUMN doc TYPE numeric USING NULL, ALTER COLUMN first_tag TYPE timestamptz USING NULL," +
			" ALTER COLUMN n_int TYPE bigint, ALTER COLUMN uid TYPE text",
		"ALTER TABLE " + tbl("typed_keys") + " ALTER COLUMN k_num TYPE text",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := Drift(ctx, pool, d, schema)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, dr := range ds {
		line := dr.Table + "." + dr.Column
		if dr.Blocks {
			line = "BLOCKS " + line
			for _, want := range []string{"which PostgreSQL cannot convert: every upsert fails", "SQLSTATE 42", "ALTER TABLE " + tbl(dr.Table) + " ALTER COLUMN"} {
				if !strings.Contains(dr.Problem, want) {
					t.Errorf("%s: %q does not say %q", line, dr.Problem, want)
				}
			}
			// The statement it gives runs (fresh-user trial: without
			// USING, PostgreSQL refused it for a jsonb column), here in a
			// transaction rolled back.
			_, stmt, _ := strings.Cut(dr.Problem, "); ")
			stmt, _, _ = strings.Cut(stmt, ", or give")
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				t.Errorf("%s: the fix %q fails: %v", line, stmt, err)
			}
			_ = tx.Rollback(ctx)
		}
		got = append(got, line)
	}
	want := []string{"artist_followers.score", "kinds.n_int", "BLOCKS kinds.doc", "kinds.uid", "BLOCKS kinds.first_tag", "BLOCKS typed_keys.k_num"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Drift (-want +got):\n%s\n%v", diff, ds)
	}
}

// TestMigrateANotNullColumnOnATableWithRowsSaysHow: a notNull column new
// to a table that has rows cannot be added; the error says how to add it,
// and nothing was migrated (new-user trial: PostgreSQL's 23502 alone).
func TestMigrateANotNullColumnOnATableWithRowsSaysHow(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	ctx := context.Background()
	tblApply(t, pool, tps["artist_followers"], tblEvent(t, schema, "ARTIST_FOLLOWED", 1, 0, specPayload), Applied)
	d, _ := tblProjections(t)
	pd := &d.Projections[0]
	pd.Columns["fresh"] = ColumnDef{Type: "text", From: "forkId", NotNull: true}
	pd.ColumnNames = append(pd.ColumnNames, "fresh")
	err := Migrate(ctx, pool, d, schema)
	if err == nil || retry.SQLState(err) != "23502" || !strings.Contains(err.Error(), "add it without notNull") {
		t.Fatalf("Migrate = %v, want 23502 saying how to add the column", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND column_name = 'fresh'", schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("after the failed migration, %d columns named fresh (%v), want none", n, err)
	}
}

// TestReadmeQuotesThePlanTimeErrorOfTheExample: the README's and
// docs/definitions.md's example of a value refused at plan time is what
// Plan says of examples/projections.yaml's artist_ratings with stars
// 3000000000 (third new-user trial: they quoted a from path the example
// does not have).
func TestReadmeQuotesThePlanTimeErrorOfTheExample(t *testing.T) {
	ratings := hotProjections(t, hotDefinitions[1].path)[2]
	_, planErr := ratings.Plan(hotEvent(t, strings.Replace(hotRated, `"stars":4`, `"stars":3000000000`, 1)))
	if planErr == nil {
		t.Fatal("Plan of stars 3000000000 succeeded, want it refused")
	}
	for _, doc := range []string{"../README.md", "../docs/definitions.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(strings.Fields(string(b)), " "); !strings.Contains(text, planErr.Error()) {
			t.Errorf("%s does not quote Plan's error %q", doc, planErr)
		}
	}
}

// TestRepairOfAnOlderUpsertThatRacedANewerDelete checks the race the
// worker's sweep undoes (sweep.go), made with the bare statements (no
// sweep), and the statement docs/events.md gives to repair rows that such
// a race left (Deletes and tombstones). An upsert's tombstone check reads
// the snapshot of its statement: an older upsert (sequence number 500)
// that waits on a lock of its row while a newer delete (1000) commits is
// not stopped by the new tombstone, and the row comes back beside it
// (new-user trial: 491 of 500 deleted rows back, with the upserts and
// deletes on two partitions). The documented DELETE removes every row
// that a tombstone at least as new covers.
func TestRepairOfAnOlderUpsertThatRacedANewerDelete(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	tps, schema := exampleTables(t, pool)
	p := tps[0] // artist_followers, primary key [artist_id, user_id]
	table := pgx.Identifier{schema, "artist_followers"}.Sanitize()
	plan := func(typ string, seq int64) Statement {
		st, err := p.Plan(tblEvent(t, schema, typ, seq, 1719331200000, `{"user_id":"u1","artist_id":"a1"}`))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	up, del := plan("ARTIST_FOLLOWED", 500), plan("ARTIST_UNFOLLOWED", 1000)

	// A transaction holding the row's key makes the upsert wait.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, "INSERT INTO "+table+" (artist_id, user_id, _causet_seq) VALUES ('a1', 'u1', 1)"); err != nil {
		t.Fatal(err)
	}
	upserted := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, up.SQL, up.Args...)
		upserted <- err
	}()
	if !waitsOnLock(t, pool, up.SQL) {
		t.Fatal("the upsert did not wait on the blocker's row")
	}
	if _, err := pool.Exec(ctx, del.SQL, del.Args...); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-upserted; err != nil {
		t.Fatal(err)
	}
	covered := func() int {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" t JOIN "+pgx.Identifier{schema, tombstoneTable}.Sanitize()+
			" tb ON tb.table_name = 'artist_followers' AND tb.pk = ARRAY[t.artist_id, t.user_id] AND tb._causet_seq >= t._causet_seq").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := covered(); n != 1 {
		t.Fatalf("%d rows a tombstone at least as new covers after the raw statements' race, want 1 (the race the worker's sweep undoes)", n)
	}

	// The repair, as docs/events.md gives it (schema "acme" there).
	repair := `DELETE FROM acme.artist_followers t
USING acme._causet_tombstones tb
WHERE tb.table_name = 'artist_followers'
  AND tb.pk = ARRAY[t.artist_id, t.user_id]
  AND tb._causet_seq >= t._causet_seq`
	doc, err := os.ReadFile("../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), repair) {
		t.Fatalf("docs/events.md does not give the repair:\n%s", repair)
	}
	if _, err := pool.Exec(ctx, strings.ReplaceAll(repair, "acme.", pgx.Identifier{schema}.Sanitize()+".")); err != nil {
		t.Fatal(err)
	}
	if n := covered(); n != 0 {
		t.Errorf("%d rows a tombstone at least as new covers after the repair, want none", n)
	}

	// Beside a worker: a covered row (600) that a newer upsert (1500) is
	// changing when the repair reaches it is checked again and kept.
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (artist_id, user_id, _causet_seq) VALUES ('a1', 'u1', 600)"); err != nil {
		t.Fatal(err)
	}
	newer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = newer.Rollback(ctx) }()
	st := plan("ARTIST_FOLLOWED", 1500)
	if tag, err := newer.Exec(ctx, st.SQL, st.Args...); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("newer upsert: %v, %d rows", err, tag.RowsAffected())
	}
	repaired := make(chan error, 1)
	ownRepair := strings.ReplaceAll(repair, "acme.", pgx.Identifier{schema}.Sanitize()+".")
	go func() {
		_, err := pool.Exec(ctx, ownRepair)
		repaired <- err
	}()
	if !waitsOnLock(t, pool, ownRepair) {
		t.Fatal("the repair did not wait on the newer upsert's row")
	}
	if err := newer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-repaired; err != nil {
		t.Fatal(err)
	}
	var seq int64
	if err := pool.QueryRow(ctx, "SELECT _causet_seq FROM "+table).Scan(&seq); err != nil || seq != 1500 {
		t.Errorf("after the repair beside a newer upsert: row at %d (%v), want the newer upsert's 1500 kept", seq, err)
	}
}

// TestApplySweepsTheRowAnOlderUpsertBroughtBackBesideANewerDelete: an
// older upsert (sequence number 500) and a newer delete (1000) of one key,
// each applied by TableProjection.Apply while the other runs, leave no
// row, whichever commits last (sweep.go). Without the sweep both leave the
// row at 500 beside the tombstone at 1000.
//   - upsert last: the upsert waits on a transaction holding the row's key;
//     the delete commits meanwhile; the upsert, whose snapshot is older
//     than the tombstone, writes the row when the holder rolls back.
//   - delete last: the delete waits on a transaction holding the key's
//     tombstone; the upsert commits meanwhile and its sweep finds no
//     tombstone; the delete, whose snapshot is older than the row, writes
//     its tombstone without deleting the row when the holder rolls back.
func TestApplySweepsTheRowAnOlderUpsertBroughtBackBesideANewerDelete(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, last := range []string{"upsert", "delete"} {
		t.Run(last+" commits last", func(t *testing.T) {
			tps, schema := exampleTables(t, pool)
			p := tps[0] // artist_followers, primary key [artist_id, user_id]
			table := pgx.Identifier{schema, "artist_followers"}.Sanitize()
			tombstones := pgx.Identifier{schema, tombstoneTable}.Sanitize()
			payload := `{"user_id":"u1","artist_id":"a1"}`
			up := tblEvent(t, schema, "ARTIST_FOLLOWED", 500, 1719331200000, payload)
			del := tblEvent(t, schema, "ARTIST_UNFOLLOWED", 1000, 1719331200000, payload)
			first, second := del, up // second waits on the holder
			hold := "INSERT INTO " + table + " (artist_id, user_id, _causet_seq) VALUES ('a1', 'u1', 1)"
			if last == "delete" {
				first, second = up, del
				hold = "INSERT INTO " + tombstones + " (table_name, pk, _causet_seq) VALUES ('artist_followers', ARRAY['a1', 'u1'], 1)"
			}
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := holder.Exec(ctx, hold); err != nil {
				t.Fatal(err)
			}
			applied := make(chan error, 1)
			go func() {
				_, err := p.Apply(ctx, pool, second)
				applied <- err
			}()
			st, err := p.Plan(second)
			if err != nil {
				t.Fatal(err)
			}
			if !waitsOnLock(t, pool, st.SQL) {
				t.Fatalf("the %s did not wait on the holder", map[bool]string{true: "upsert", false: "delete"}[second == up])
			}
			if _, err := p.Apply(ctx, pool, first); err != nil {
				t.Fatal(err)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-applied; err != nil {
				t.Fatal(err)
			}
			var rows int
			var seqs []int64
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if err := pool.QueryRow(ctx, "SELECT array_agg(_causet_seq) FROM "+tombstones).Scan(&seqs); err != nil {
				t.Fatal(err)
			}
			if rows != 0 || !slices.Equal(seqs, []int64{1000}) {
				t.Errorf("after an upsert at 500 and a delete at 1000 at once (%s last): %d rows, tombstones at %v; want no row and the tombstone at 1000", last, rows, seqs)
			}
		})
	}
}

// exampleTables returns the table projections of examples/projections.yaml
// and a new tenant schema migrated for them, dropped when t ends.
func exampleTables(t *testing.T, pool *pgxpool.Pool) ([]*TableProjection, string) {
	t.Helper()
	d, err := LoadDefinitions("../examples/projections.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		t.Fatal(err)
	}
	return tps, migratedSchema(t, pool, d)
}

// migratedSchema returns a new tenant schema migrated for d, dropped when
// tb ends.
func migratedSchema(tb testing.TB, pool *pgxpool.Pool, d *Definitions) string {
	tb.Helper()
	schema := pgtest.NewSchemaName(tb)
	if err := Migrate(context.Background(), pool, d, schema); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return schema
}

// waitsOnLock reports whether a statement of text sql comes to wait on a
// lock (pg_stat_activity) within 10 s.
func waitsOnLock(t *testing.T, pool *pgxpool.Pool, sql string) bool {
	t.Helper()
	waiting := false
	for deadline := time.Now().Add(10 * time.Second); !waiting && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = $1)", sql).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	return waiting
}
