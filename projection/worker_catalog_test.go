package projection_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/projection"
)

// deadLetterStates returns each dead letter as "<projection> <user>@<sequence
// number>" → its SQLSTATE header, failing t on a pair dead-lettered twice.
func deadLetterStates(t *testing.T, dls []deadLetter) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range dls {
		k := d.headers[dlq.HeaderProjection] + " " + deadLetterUser(t, d)
		if _, ok := out[k]; ok {
			t.Errorf("%s dead-lettered more than once", k)
		}
		out[k] = d.headers[dlq.HeaderSQLState]
	}
	return out
}

// startLogged starts the worker with mod, its logs, every level, counted
// in the returned logCounter.
func (r *rig) startLogged(mod func(*projection.Config)) *logCounter {
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) {
		mod(c)
		c.Logger = slog.New(logs)
	})
	return logs
}

// logSum returns the sum of the attribute key of the records logged with
// msg.
func logSum(logs *logCounter, msg, key string) int64 {
	var n int64
	for _, rec := range logs.records(msg) {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				n += a.Value.Int64()
			}
			return true
		})
	}
	return n
}

// The worker's debug lines that tell how a batch's upserts were applied.
const (
	logSuspect   = "upserts the table would refuse left to statements"
	logSuspects  = "suspect upserts applied in one round trip"
	logIsolated  = "copy group isolated in PostgreSQL"
	logCopyAgain = "copy group failed; applying it again on its own"
	// logUnhandledFirst (INFO, the first record of an event type no
	// projection handles) and logUnhandled (DEBUG, the later ones).
	logUnhandledFirst = "no projection handles the event type: its records are committed without a write (first of this type; the rest at debug)"
	logUnhandled      = "no projection handles the event type"
)

// TestWorkerLeavesUpsertsTheTableRefusesToStatements makes the tables
// stricter than the definitions (artist_ratings.stars smallint where the
// definition says integer, artist_followers.score NOT NULL where it is
// nullable), as the benchmark's poison scenarios do, and applies one batch
// in COPY groups: the upserts the tables would refuse are found from the
// catalog before the groups are formed and go to statements, where
// PostgreSQL refuses them, each dead-lettered once with 22003 or 23502;
// every other row lands, and no COPY group fails (nothing is isolated).
// Two keys have two upserts, one of them refused: user-10's newer (its
// older one stands) and user-30's older (its newer one lands).
func TestWorkerLeavesUpsertsTheTableRefusesToStatements(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ALTER COLUMN stars TYPE smallint")
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_followers"}.Sanitize()+" ALTER COLUMN score SET NOT NULL")
	const n = 64
	var keys, values []string
	add := func(user string, value string) {
		keys = append(keys, user)
		values = append(values, value)
	}
	rated := func(user string, seq int64, stars int) string {
		return r.event("ARTIST_RATED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars))
	}
	wantDead := map[string]string{}
	wantRows := map[string][2]int64{}
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		if i == 13 { // no games: score NULL
			add(user, r.follow(user, "a", 1))
			wantDead["artist_followers "+user+"@1"] = "23502"
		} else {
			add(user, r.event("ARTIST_FOLLOWED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","points":%d,"games":2}`, user, 2*i)))
		}
		switch i {
		case 7:
			add(user, rated(user, 1, 40000))
			wantDead["artist_ratings "+user+"@1"] = "22003"
		case 30:
			add(user, rated(user, 1, 40000))
			wantDead["artist_ratings "+user+"@1"] = "22003"
			add(user, rated(user, 2, 5))
			wantRows[user] = [2]int64{5, 2}
		default:
			add(user, rated(user, 1, i%5))
			wantRows[user] = [2]int64{int64(i % 5), 1}
		}
	}
	add("user-10", rated("user-10", 2, 40000)) // newer than user-10's stars 0
	wantDead["artist_ratings user-10@2"] = "22003"
	r.produceAll(keys, values)
	logs := r.startLogged(func(c *projection.Config) {
		c.CopyMinRows = 1
		c.MaxBatchRecords = 500
		c.Retry.MaxRetries = 1
	})
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if diff := cmp.Diff(wantDead, deadLetterStates(t, dls)); diff != "" {
		t.Errorf("dead letters and their SQLSTATE (-want +got):\n%s", diff)
	}
	// PostgreSQL's "smallint out of range" names no column; the table's
	// catalog says which one it refuses, and the stack trace names it.
	for _, d := range dls {
		want := map[string]string{"22003": `column stars (derive`, "23502": `column score`}[d.headers[dlq.HeaderSQLState]]
		if !strings.Contains(d.msg.StackTrace, want) {
			t.Errorf("dead letter %s (%s): stack trace does not name %q:\n%s", deadLetterUser(t, d), d.msg.Error, want, d.msg.StackTrace)
		}
	}
	if diff := cmp.Diff(wantRows, r.ratings()); diff != "" {
		t.Errorf("artist_ratings rows (-want +got):\n%s", diff)
	}
	if got := r.count("artist_followers"); got != n-1 {
		t.Errorf("artist_followers holds %d rows, want %d", got, n-1)
	}
	if got := r.count("user_follows"); got != n {
		t.Errorf("user_follows holds %d rows, want %d", got, n)
	}
	// 4 upserts suspect: user-7, user-30@1, user-10@2 and user-13's
	// follow (user-10@1 and user-30@2 go with their keys, not suspect).
	if got := logSum(logs, logSuspect, "upserts"); got != 4 {
		t.Errorf("%d upserts left to statements as suspect, want 4", got)
	}
	// Those 4 and the 2 of their keys went to PostgreSQL together, each
	// in a transaction of its own: the 4 refused there, at their first
	// attempt (user-13's 23502 once more at its retry).
	if got := logSum(logs, logSuspects, "upserts"); got != 6 {
		t.Errorf("%d suspect keys' upserts applied in one round trip, want 6", got)
	}
	if got := logSum(logs, logSuspects, "refused"); got != 4 {
		t.Errorf("%d of them refused there, want 4", got)
	}
	if got := len(logs.records(logIsolated)) + len(logs.records(logCopyAgain)); got != 0 {
		t.Errorf("%d COPY groups failed (isolated or applied again), want none", got)
	}
}

// TestWorkerAppliesASuspectUpsertWhenTheCatalogCacheIsStale: the worker
// reads artist_ratings.stars as smallint; the column is then widened to
// integer, within the cache's TTL. A value beyond smallint is suspect by
// the cache's word, so it goes to its statement, where PostgreSQL takes
// it: applied, never dead-lettered on the cache's word. Its key's older
// upsert in the same batch is applied before it; the newer wins.
func TestWorkerAppliesASuspectUpsertWhenTheCatalogCacheIsStale(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	tbl := pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()
	exec(t, r.pool, "ALTER TABLE "+tbl+" ALTER COLUMN stars TYPE smallint")
	rated := func(user string, seq int64, stars int) string {
		return r.event("ARTIST_RATED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars))
	}
	var keys, values []string
	wantRows := map[string][2]int64{}
	for i := range 8 {
		user := fmt.Sprintf("user-%d", i)
		keys, values = append(keys, user), append(values, rated(user, 1, i))
		wantRows[user] = [2]int64{int64(i), 1}
	}
	r.produceAll(keys, values)
	logs := r.startLogged(func(c *projection.Config) { c.CopyMinRows = 1 })
	r.waitCommitted(testTimeout) // the catalog read: stars smallint
	exec(t, r.pool, "ALTER TABLE "+tbl+" ALTER COLUMN stars TYPE integer")

	keys, values = nil, nil
	for i := 8; i < 16; i++ {
		user := fmt.Sprintf("user-%d", i)
		keys, values = append(keys, user), append(values, rated(user, 1, i))
		wantRows[user] = [2]int64{int64(i), 1}
	}
	keys, values = append(keys, "user-3"), append(values, rated("user-3", 2, 40000))
	wantRows["user-3"] = [2]int64{40000, 2}
	keys, values = append(keys, "user-12"), append(values, rated("user-12", 2, 50000))
	wantRows["user-12"] = [2]int64{50000, 2}
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("dead letters %+v, want none", dls)
	}
	if diff := cmp.Diff(wantRows, r.ratings()); diff != "" {
		t.Errorf("artist_ratings rows (-want +got):\n%s", diff)
	}
	if got := logSum(logs, logSuspect, "upserts"); got != 2 {
		t.Errorf("%d upserts left to statements as suspect, want 2 (the cache still says smallint)", got)
	}
}

// TestWorkerNamesTheRefusedColumnWithoutACopyGroup: a table narrower than
// its definition (artist_ratings.stars smallint) refuses a value with a
// message that names no column ("smallint out of range"); with COPY off,
// no COPY group ever read the table's catalog, and the dead letter still
// names the column: the catalog is read on that failure (new-user trial:
// such dead letters named no column).
func TestWorkerNamesTheRefusedColumnWithoutACopyGroup(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ALTER COLUMN stars TYPE smallint")
	r.produce("user-1", []byte(r.event("ARTIST_RATED", "user-1", 1, `{"user_id":"user-1","artist_id":"a","stars":40000}`)))
	r.produce("user-2", []byte(r.event("ARTIST_RATED", "user-2", 1, `{"user_id":"user-2","artist_id":"a","stars":4}`)))
	r.start(func(c *projection.Config) { c.CopyMinRows = -1 })
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 || dls[0].headers[dlq.HeaderSQLState] != "22003" {
		t.Fatalf("%d dead letters, want user-1's with 22003", len(dls))
	}
	if d := dls[0]; !strings.Contains(d.msg.StackTrace, "column stars (derive") {
		t.Errorf("dead letter (%s): stack trace does not name column stars:\n%s", d.msg.Error, d.msg.StackTrace)
	}
}

// TestWorkerSaysOnceWhenNoProjectionHandlesAType: the first record of each
// event type no projection handles is logged at INFO, naming the type, and
// its later ones at DEBUG only; all are committed without a write or a
// dead letter (new-user trial: a type misspelt in the definitions showed
// nowhere without --log-level debug).
func TestWorkerSaysOnceWhenNoProjectionHandlesAType(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	logs := r.startLogged(func(*projection.Config) {})
	var keys, values []string
	long := strings.Repeat("T", 100_000) // its line says 64 bytes of it and its length (new-user trial: a 100 KB line)
	for i, typ := range []string{"ARTIST_FOLOWED", "ARTIST_FOLOWED", "OTHER_TEAMS_EVENT", "ARTIST_FOLOWED", long} {
		keys = append(keys, fmt.Sprintf("e-%d", i))
		values = append(values, r.event(typ, fmt.Sprintf("e-%d", i), 1, `{"user_id":"u","artist_id":"a"}`))
	}
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
	var infoTypes []string
	for _, rec := range logs.records(logUnhandledFirst) {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "event_type" && rec.Level == slog.LevelInfo {
				infoTypes = append(infoTypes, a.Value.String())
			}
			return true
		})
	}
	if diff := cmp.Diff([]string{"ARTIST_FOLOWED", "OTHER_TEAMS_EVENT", long[:64] + "... (100000 bytes)"}, infoTypes); diff != "" {
		t.Errorf("INFO lines by event type (-want +got):\n%s", diff)
	}
	if n := len(logs.records(logUnhandled)); n != 2 {
		t.Errorf("%d DEBUG lines for the later records, want 2", n)
	}
	if dls := r.deadLetters(); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
}
