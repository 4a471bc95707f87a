package projection_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// produceAll writes values keyed by keys[i] in one record batch per
// partition, so that the worker polls them together: produced one by one
// with no linger, a loaded machine split 48 records into batches below
// CopyMinRows, and the COPY a test meant to drive was never tried (CI,
// TestWorkerCopyIsolatesAtOnceAfterARefusedGroup).
func (r *rig) produceAll(keys []string, values []string) {
	r.t.Helper()
	if r.batcher == nil {
		r.batcher = r.broker.Client(r.t, kgo.DefaultProduceTopic(r.topic), kgo.ManualFlushing())
	}
	var wg sync.WaitGroup
	errs := make([]error, len(values))
	for i, v := range values {
		wg.Add(1)
		r.batcher.Produce(context.Background(), &kgo.Record{Key: []byte(keys[i]), Value: []byte(v)}, func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	if err := r.batcher.Flush(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		r.t.Fatal(err)
	}
	r.produced += int64(len(values))
}

// ratings returns the artist_ratings rows of the rig's tenant: user_id →
// (stars, _causet_seq).
func (r *rig) ratings() map[string][2]int64 {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(), "SELECT user_id, stars, _causet_seq FROM "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize())
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string][2]int64{}
	for rows.Next() {
		var user string
		var stars, seq int64
		if err := rows.Scan(&user, &stars, &seq); err != nil {
			r.t.Fatal(err)
		}
		out[user] = [2]int64{stars, seq}
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// deadLetteredUsers returns the payload.user_id and sequence number of
// every dead letter, "user@seq", sorted, with their count.
func deadLetteredUsers(t *testing.T, dls []deadLetter) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, d := range dls {
		out[deadLetterUser(t, d)]++
	}
	return out
}

// deadLetterUser returns the payload.user_id and sequence number of the
// event of d, "user@seq" (a NUL in the user written \0).
func deadLetterUser(t *testing.T, d deadLetter) string {
	t.Helper()
	var ev struct {
		Seq     int64 `json:"sequenceNumber"`
		Payload struct {
			User string `json:"user_id"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(d.msg.OriginalEvent, &ev); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s@%d", strings.ReplaceAll(ev.Payload.User, "\x00", `\0`), ev.Seq)
}

// TestWorkerDeadLetteringDoesNotDependOnBatchSize puts poisoned events
// that PostgreSQL would refuse (an integer out of range, a NUL in text, a
// NULL for a notNull column), each followed in the same batch by a newer
// good event of the same key, among good events, and applies them with
// batches of 1, 100 and 500 records: each poisoned event is dead-lettered
// once (at plan time, permanent), whatever the batch, and the newer event
// of its key is applied. Before Plan checked values, a poisoned event
// superseded inside a COPY group was never tried at 100 records.
func TestWorkerDeadLetteringDoesNotDependOnBatchSize(t *testing.T) {
	t.Parallel()
	poison := map[int]string{ // position → payload (user filled in)
		40:  `{"user_id":%q,"artist_id":"a","stars":3000000000}`,
		120: `{"user_id":%q,"artist_id":"a","stars":"a\u0000b"}`,
		260: `{"user_id":%q,"artist_id":"a"}`,
	}
	const n = 300
	for _, batch := range []int{1, 100, 500} {
		t.Run(fmt.Sprintf("max batch records %d", batch), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{})
			var keys, values []string
			wantDead := map[string]int{}
			wantRows := map[string][2]int64{}
			for i := range n {
				user := fmt.Sprintf("user-%d", i)
				if p, ok := poison[i]; ok {
					// The poisoned event, then a newer one of its key two
					// records later: both in one batch of 100 or 500.
					keys = append(keys, user)
					values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(p, user)))
					wantDead[user+"@1"] = 1
					keys = append(keys, "other-"+user)
					values = append(values, r.event("ARTIST_RATED", "other-"+user, 1, fmt.Sprintf(`{"user_id":"other-%s","artist_id":"a","stars":1}`, user)))
					wantRows["other-"+user] = [2]int64{1, 1}
					keys = append(keys, user)
					values = append(values, r.event("ARTIST_RATED", user, 2, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":2}`, user)))
					wantRows[user] = [2]int64{2, 2}
					continue
				}
				keys = append(keys, user)
				values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, i%5)))
				wantRows[user] = [2]int64{int64(i % 5), 1}
			}
			r.produceAll(keys, values)
			r.start(func(c *projection.Config) { c.MaxBatchRecords = batch })
			r.waitCommitted(testTimeout)
			dls := r.deadLetters()
			if diff := cmp.Diff(wantDead, deadLetteredUsers(t, dls)); diff != "" {
				t.Errorf("dead letters (-want +got):\n%s", diff)
			}
			for _, d := range dls {
				if d.msg.RetryCount != 0 || d.headers["causet.dlq.error-class"] != retry.Permanent.String() || !strings.Contains(d.msg.Error, "column stars") {
					t.Errorf("dead letter: retries %d, class %s, error %q; want 0, permanent, naming column stars",
						d.msg.RetryCount, d.headers["causet.dlq.error-class"], d.msg.Error)
				}
			}
			if diff := cmp.Diff(wantRows, r.ratings()); diff != "" {
				t.Errorf("artist_ratings rows (-want +got):\n%s", diff)
			}
		})
	}
}

// logCounter counts the messages logged at any level.
type logCounter struct {
	mu   sync.Mutex
	msgs map[string][]slog.Record
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) Handle(_ context.Context, rec slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs[rec.Message] = append(c.msgs[rec.Message], rec)
	return nil
}
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCounter) WithGroup(string) slog.Handler      { return c }

func (c *logCounter) records(msg string) []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msgs[msg]
}

// describe returns the records whose message starts with one of
// prefixes, a line each with their attributes (a failing test's context).
func (c *logCounter) describe(prefixes ...string) string {
	var recs []slog.Record
	for _, p := range prefixes {
		recs = append(recs, c.withPrefix(p)...)
	}
	slices.SortStableFunc(recs, func(a, b slog.Record) int { return a.Time.Compare(b.Time) })
	var b strings.Builder
	for _, rec := range recs {
		fmt.Fprintf(&b, "%s %q", rec.Time.Format("15:04:05.000"), rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

// withPrefix returns the records whose message starts with prefix.
func (c *logCounter) withPrefix(prefix string) []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []slog.Record
	for msg, recs := range c.msgs {
		if strings.HasPrefix(msg, prefix) {
			out = append(out, recs...)
		}
	}
	return out
}

// starsRangeUnread is a CHECK constraint of artist_ratings, stars from 0
// to 10, written with a function, which the worker does not evaluate in Go
// (a comparison it would: checkExpr): PostgreSQL alone refuses the rows,
// inside their COPY groups, as the tests of that path need.
const starsRangeUnread = "CHECK (abs(stars - 5) <= 5)"

// TestWorkerCopyBisectionIsolatesConstraintViolations puts rows that only
// PostgreSQL refuses (a CHECK constraint) into one COPY group of 128 rows
// with CopyMinRows 16: the failed group's copied rows are upserted by parts
// of 16, a failing one split around its refused row, in PostgreSQL
// (isolateSQL), every
// good row is applied, and exactly the violating pairs are dead-lettered,
// once each, with PostgreSQL's error. One violating row is the newer of two upserts
// of its key: the older one, superseded in the group, is applied with its
// own part. Two upserts of one key with one sequence number in a part
// that succeeds: the later wins.
func TestWorkerCopyBisectionIsolatesConstraintViolations(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range "+starsRangeUnread)
	const n, minRows = 128, 16
	var keys, values []string
	wantDead := map[string]int{}
	wantRows := map[string][2]int64{}
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		stars, seq := i%10, int64(1)
		switch i {
		case 70, 100:
			stars = 99
			wantDead[user+"@1"] = 1
		case 60:
			// user-10's newer event, refused; its older one (i = 10, in a
			// part that succeeds) stands.
			user, stars, seq = "user-10", 77, 2
			wantDead[user+"@2"] = 1
		case 25:
			// user-20 again, same sequence number, in part [16, 32).
			user, stars = "user-20", 4
			wantRows[user] = [2]int64{4, 1}
		default:
			wantRows[user] = [2]int64{int64(stars), 1}
		}
		keys = append(keys, user)
		values = append(values, r.event("ARTIST_RATED", user, seq, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) {
		c.CopyMinRows = minRows
		c.Retry.MaxRetries = 1
		c.Logger = slog.New(logs)
	})
	r.waitCommitted(testTimeout)
	if diff := cmp.Diff(wantDead, deadLetteredUsers(t, r.deadLetters())); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantRows, r.ratings()); diff != "" {
		t.Errorf("artist_ratings rows (-want +got):\n%s", diff)
	}
	// The refused rows are found inside the COPY pass, down to the row, in
	// PostgreSQL: nothing goes to statements.
	var refused, statements int64
	for _, rec := range logs.records("copy group isolated in PostgreSQL") {
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "refused":
				refused += a.Value.Int64()
			case "to_statements":
				statements += a.Value.Int64()
			}
			return true
		})
	}
	if refused != 3 || statements != 0 {
		t.Errorf("the COPY pass isolated %d refused rows and left %d to statements; want 3 and 0", refused, statements)
	}
	for _, dl := range r.deadLetters() {
		if !strings.Contains(dl.msg.Error, "stars_range") || dl.headers[dlq.HeaderSQLState] != "23514" {
			t.Errorf("dead letter error %q (SQLSTATE %q): want PostgreSQL's check violation", dl.msg.Error, dl.headers[dlq.HeaderSQLState])
		}
	}
}

// TestWorkerCopyUndoesAFailedGroupAlone: in a batch with three COPY groups
// (artist_followers and user_follows from ARTIST_FOLLOWED, artist_ratings
// from ARTIST_RATED), rows of artist_ratings that only PostgreSQL refuses
// undo that group alone: it is applied again on its own (and its refused
// pairs dead-lettered), while the other two groups are applied by their
// first COPY, never copied again.
func TestWorkerCopyUndoesAFailedGroupAlone(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range "+starsRangeUnread)
	const n = 64
	var keys, values []string
	wantDead := map[string]int{}
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		stars := i % 10
		if i == 7 || i == 40 {
			stars = 99
			wantDead[user+"@1"] = 1
		}
		keys = append(keys, user, user)
		values = append(values, r.follow(user, "a", 1),
			r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) {
		c.CopyMinRows = 16
		c.MaxBatchRecords = 2 * n
		c.Logger = slog.New(logs)
	})
	r.waitCommitted(testTimeout)
	if diff := cmp.Diff(wantDead, deadLetteredUsers(t, r.deadLetters())); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	if got := r.count("user_follows"); got != n {
		t.Errorf("user_follows holds %d rows, want %d", got, n)
	}
	if got := len(r.ratings()); got != n-2 {
		t.Errorf("artist_ratings holds %d rows, want %d", got, n-2)
	}
	again := map[string]int{}
	for _, rec := range logs.records("copy group failed; applying it again on its own") {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "projection" {
				again[a.Value.String()]++
			}
			return true
		})
	}
	if again["artist_ratings"] == 0 || len(again) != 1 {
		t.Errorf("groups applied again on their own: %v; want artist_ratings only (the other groups commit at once)", again)
	}
}

// TestWorkerCopyIsolationLeavesStatementErrorsToStatements: a row that
// makes the upsert fail with an error that is not PostgreSQL refusing a
// row (a trigger raising 42501, class 42) is not split further in the COPY
// pass: its range goes to statements, which find the failing pair and
// retry it as a projection error, then dead-letter it with PostgreSQL's
// error; every other row is applied.
func TestWorkerCopyIsolationLeavesStatementErrorsToStatements(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	tbl := pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()
	fn := pgx.Identifier{r.tenant, "refuse_98"}.Sanitize()
	exec(t, r.pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.stars = 98 THEN RAISE EXCEPTION 'not allowed' USING ERRCODE = '42501'; END IF; RETURN NEW; END $$")
	exec(t, r.pool, "CREATE TRIGGER refuse_98 BEFORE INSERT OR UPDATE ON "+tbl+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	const n = 64
	var keys, values []string
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		stars := i % 10
		if i == 33 {
			stars = 98
		}
		keys = append(keys, user)
		values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) {
		c.CopyMinRows = 16
		c.Retry.MaxRetries = 1
		c.Logger = slog.New(logs)
	})
	r.waitCommitted(testTimeout)
	dls := r.deadLetters()
	if len(dls) != 1 || dls[0].key != "user-33" || dls[0].headers[dlq.HeaderSQLState] != "42501" || dls[0].msg.RetryCount != 1 {
		t.Errorf("dead letters %+v: want user-33's alone, SQLSTATE 42501, retried once", dls)
	}
	if got := len(r.ratings()); got != n-1 {
		t.Errorf("artist_ratings holds %d rows, want %d", got, n-1)
	}
	var statements int64
	for _, rec := range logs.records("copy group isolated in PostgreSQL") {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "to_statements" {
				statements += a.Value.Int64()
			}
			return true
		})
	}
	if statements == 0 {
		t.Errorf("no range went to statements: the COPY pass split a statement error as if a row were refused")
	}
}

// TestWorkerCopyIsolatesAtOnceAfterARefusedGroup: once PostgreSQL refused
// a row of a COPY group, the next group of that projection and tenant
// schema skips the doomed first attempt (no "copy group failed" line): it
// is isolated at once, from its parts; a group isolated with nothing
// refused clears the mark, and the group after it takes plain COPY again
// (no isolation at all). Every good row is applied, each refused row is
// dead-lettered once with PostgreSQL's error. The refusal is a trigger's,
// which no check before the COPY can evaluate (a CHECK constraint is:
// TestWorkerCopyChecksConstraintsAfterARefusedGroup).
func TestWorkerCopyIsolatesAtOnceAfterARefusedGroup(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	refuseStarsAbove(t, r, 10)
	logs := &logCounter{msgs: map[string][]slog.Record{}}
	r.start(func(c *projection.Config) {
		c.CopyMinRows = 16
		c.MaxBatchRecords = 500
		c.Retry.MaxRetries = 1
		c.Logger = slog.New(logs)
	})
	const perWave = 48
	wantDead := map[string]int{}
	// wave produces perWave ratings at once; refused: the first is refused
	// (first, so that a wave split into two batches starts refused).
	wave := func(w int, refused bool) {
		t.Helper()
		ratingsWave(t, r, w, perWave, wantDead, func(i int) bool { return refused && i == 0 })
	}
	failed := func() int { return len(logs.records("copy group failed; applying it again on its own")) }
	isolated := func() []slog.Record { return logs.records("copy group isolated in PostgreSQL") }

	wave(1, true)
	if failed() == 0 {
		t.Fatal("the first refused group did not fail: the test no longer shows what it should")
	}
	failedBefore := failed()
	wave(2, true)
	if failed() != failedBefore {
		t.Errorf("a group after a refused one was tried as a whole again (%d more copy group failed lines)", failed()-failedBefore)
	}
	atOnce := 0
	for _, rec := range isolated() {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "cause" && a.Value.String() == "last group refused" {
				atOnce++
			}
			return true
		})
	}
	if atOnce == 0 {
		t.Errorf("no group was isolated at once after a refused one; the COPY path logged:\n%s",
			logs.describe("copy ", "upserts the table would refuse"))
	}
	wave(3, false) // isolated at once, nothing refused: the mark is cleared
	isolatedBefore := len(isolated())
	wave(4, false)
	if got := len(isolated()); got != isolatedBefore {
		t.Errorf("%d groups isolated after a group isolated with nothing refused, want 0 (plain COPY again)", got-isolatedBefore)
	}
	checkRefusedRatings(t, r, wantDead, 4*perWave)
}

// refuseStarsAbove makes r's artist_ratings refuse, with a BEFORE trigger
// raising check_violation (23514), a row of more than max stars.
func refuseStarsAbove(t *testing.T, r *rig, max int) {
	t.Helper()
	fn := pgx.Identifier{r.tenant, "refuse_stars"}.Sanitize()
	exec(t, r.pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "+
		"IF NEW.stars > "+strconv.Itoa(max)+" THEN RAISE EXCEPTION 'stars %', NEW.stars USING ERRCODE = 'check_violation'; END IF; "+
		"RETURN NEW; END $$")
	exec(t, r.pool, "CREATE TRIGGER refuse_stars BEFORE INSERT OR UPDATE ON "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+
		" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
}

// TestWorkerCopyChecksConstraintsAfterARefusedGroup: once PostgreSQL
// refused a row of a COPY group for a CHECK constraint, the next groups of
// that projection and tenant schema have the table's CHECK constraints
// evaluated on their rows first (the catalog's expressions, each column
// cast to the table's type): the rows they refuse leave the group for
// their statements, and the group is copied, neither tried whole nor
// isolated. Every good row is applied, each refused row dead-lettered once
// with PostgreSQL's 23514.
func TestWorkerCopyChecksConstraintsAfterARefusedGroup(t *testing.T) {
	t.Parallel()
	r, logs, wave, wantDead := checkedRatingsRig(t, "CONSTRAINT stars_range "+starsRangeUnread)
	wave(1)
	if len(logs.records(logCopyAgain)) == 0 {
		t.Fatal("the first refused group did not fail: the test no longer shows what it should")
	}
	failed, isolated, suspect := len(logs.records(logCopyAgain)), len(logs.records(logIsolated)), logSum(logs, logSuspect, "upserts")
	wave(2)
	wave(3)
	if n := len(logs.records(logCopyAgain)) - failed; n != 0 {
		t.Errorf("%d groups after a refused one tried whole, want 0", n)
	}
	if n := len(logs.records(logIsolated)) - isolated; n != 0 {
		t.Errorf("%d groups after a refused one isolated, want 0: their refused rows left them", n)
	}
	// Their 4 refused rows left their groups (a few rows of a wave that a
	// fetch split off, below --copy-min-rows, go to statements anyway).
	if n := logSum(logs, logSuspect, "upserts") - suspect; n < 1 || n > 4 {
		t.Errorf("%d upserts left the groups of waves 2 and 3, want their refused ones (1 to 4)", n)
	}
	checkRefusedRatings(t, r, wantDead, 3*checkedRatingsPerWave)
}

// TestWorkerCopyLeavesRowsACheckRefusesToStatements: a CHECK constraint
// that Go evaluates (a comparison, checkExpr) takes the rows it refuses
// out of their COPY groups from the first group on (issue 11: each
// refused row failed its group, which was then isolated or checked in
// PostgreSQL): no group fails, none is isolated, the refused rows go to
// their statements and are dead-lettered once each with PostgreSQL's
// 23514, and every good row is applied.
func TestWorkerCopyLeavesRowsACheckRefusesToStatements(t *testing.T) {
	t.Parallel()
	r, logs, wave, wantDead := checkedRatingsRig(t, "CONSTRAINT stars_range CHECK (stars BETWEEN 0 AND 10)")
	for w := 1; w <= 3; w++ {
		wave(w)
	}
	if n := len(logs.records(logCopyAgain)); n != 0 {
		t.Errorf("%d groups tried whole and refused, want 0", n)
	}
	if n := len(logs.records(logIsolated)); n != 0 {
		t.Errorf("%d groups isolated, want 0: their refused rows left them", n)
	}
	if n := logSum(logs, logSuspect, "upserts"); n < 1 || n > 6 {
		t.Errorf("%d upserts left the groups, want their refused ones (1 to 6)", n)
	}
	checkRefusedRatings(t, r, wantDead, 3*checkedRatingsPerWave)
}

// TestWorkerCopyIsolationSkipsUpsertsOlderThanTheirRow: ratings older
// than their row that a CHECK only PostgreSQL evaluates would refuse,
// copied in one group with good ones and with ratings that it refuses for
// good, are stale no-ops, not refused: with no retries to turn a refusal
// into a stale retry, only the new refused ratings are dead-lettered, the
// rows keep their newer ratings and the good ones apply (fresh-user
// trial: PostgreSQL checks a proposed row before ON CONFLICT finds the
// newer row, so isolation reported 100 stale events refused, and they
// were dead-lettered with 23514).
func TestWorkerCopyIsolationSkipsUpsertsOlderThanTheirRow(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range "+starsRangeUnread)
	r.start(func(c *projection.Config) {
		c.CopyMinRows = 16
		c.MaxBatchRecords = 500
		c.Retry.MaxRetries = 0
	})
	const n = 40
	rate := func(keys, values *[]string, user string, seq, stars int) {
		*keys = append(*keys, "one-partition")
		*values = append(*values, r.event("ARTIST_RATED", user, int64(seq), fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	var keys, values []string
	for i := range n {
		rate(&keys, &values, fmt.Sprintf("old-%d", i), 10, 1)
	}
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
	keys, values = nil, nil
	for i := range n {
		rate(&keys, &values, fmt.Sprintf("old-%d", i), 5, 99) // older than the row, beyond the CHECK
		rate(&keys, &values, fmt.Sprintf("new-%d", i), 1, 2)
	}
	rate(&keys, &values, "refused-0", 1, 99)
	rate(&keys, &values, "refused-1", 1, 99)
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
	if diff := cmp.Diff(map[string]int{"refused-0@1": 1, "refused-1@1": 1}, deadLetteredUsers(t, r.deadLetters())); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	ratings := r.ratings()
	for i := range n {
		if got, want := ratings[fmt.Sprintf("old-%d", i)], [2]int64{1, 10}; got != want {
			t.Errorf("old-%d: (stars, seq) %v, want %v", i, got, want)
		}
		if got, want := ratings[fmt.Sprintf("new-%d", i)], [2]int64{2, 1}; got != want {
			t.Errorf("new-%d: (stars, seq) %v, want %v", i, got, want)
		}
	}
}

// checkedRatingsPerWave is the ratings of a wave of checkedRatingsRig.
const checkedRatingsPerWave = 48

// checkedRatingsRig returns a rig whose artist_ratings gets constraint
// (ADD's text), its worker started with --copy-min-rows 16, batches of
// 500 records and one retry, logged; wave(w) produces wave w of
// checkedRatingsPerWave ratings (ratingsWave), the first and the middle
// one rating 99 stars, and waits for them; wantDead gathers their users.
func checkedRatingsRig(t *testing.T, constraint string) (r *rig, logs *logCounter, wave func(w int), wantDead map[string]int) {
	t.Helper()
	r = newRig(t, rigOptions{})
	exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" ADD "+constraint)
	logs = r.startLogged(func(c *projection.Config) {
		c.CopyMinRows = 16
		c.MaxBatchRecords = 500
		c.Retry.MaxRetries = 1
	})
	wantDead = map[string]int{}
	wave = func(w int) {
		t.Helper()
		ratingsWave(t, r, w, checkedRatingsPerWave, wantDead, func(i int) bool { return i == 0 || i == checkedRatingsPerWave/2 })
	}
	return r, logs, wave, wantDead
}

// checkRefusedRatings checks that the users of wantDead, and they alone,
// were dead-lettered once each with 23514, and that artist_ratings holds
// the other ratings of the produced ones.
func checkRefusedRatings(t *testing.T, r *rig, wantDead map[string]int, produced int) {
	t.Helper()
	dls := r.deadLetters()
	if diff := cmp.Diff(wantDead, deadLetteredUsers(t, dls)); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	for _, dl := range dls {
		if dl.headers[dlq.HeaderSQLState] != "23514" {
			t.Errorf("dead letter SQLSTATE %q, want 23514", dl.headers[dlq.HeaderSQLState])
		}
	}
	if got, want := len(r.ratings()), produced-len(wantDead); got != want {
		t.Errorf("artist_ratings holds %d rows, want %d", got, want)
	}
}

// ratingsWave produces n ratings of wave w at once (0–9 stars) and waits
// until they are committed; the i-th rates 99 stars when refused(i), and
// its user is added to wantDead.
func ratingsWave(t *testing.T, r *rig, w, n int, wantDead map[string]int, refused func(int) bool) {
	t.Helper()
	var keys, values []string
	for i := range n {
		user := fmt.Sprintf("user-%d-%d", w, i)
		stars := i % 10
		if refused(i) {
			stars = 99
			wantDead[user+"@1"] = 1
		}
		keys = append(keys, user)
		values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
}

// TestWorkerDeferredConstraintRefusesOnlyItsPair: a deferred constraint
// trigger that refuses one row at COMMIT fails its batch's transaction
// (the COPY one, then the statements'), not one statement: the worker
// applies the pairs again each in a transaction of its own, so only the
// refused pair fails. With no retries, a good pair blamed for the COMMIT
// would be dead-lettered (new-user trial: 57 good events dead-lettered
// once the fingerprint's breaker was open).
func TestWorkerDeferredConstraintRefusesOnlyItsPair(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 2})
	fn := pgx.Identifier{r.tenant, "refuse_at_commit"}.Sanitize()
	exec(t, r.pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "+
		"IF NEW.stars = 99 THEN RAISE EXCEPTION 'stars 99 refused at commit' USING ERRCODE = 'check_violation'; END IF; "+
		"RETURN NULL; END $$")
	exec(t, r.pool, "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON "+
		pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()+" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	r.start(func(c *projection.Config) {
		c.Retry.MaxRetries = 0
		c.Breaker.Threshold = -1
	})
	wantDead := map[string]int{}
	ratingsWave(t, r, 1, 60, wantDead, func(i int) bool { return i == 17 })
	checkRefusedRatings(t, r, wantDead, 60)
}

// TestWorkerCommitRefusedAppliesASuspectOnce: when the COMMIT of a
// batch's COPY transaction is refused (a deferred constraint trigger), the
// batch's pairs go to statements, the upserts the catalog calls suspect
// among them; they are not also applied as suspects. Before, a suspect
// was applied twice, and a refused one dead-lettered twice (a duplicate
// dead letter for one pair).
func TestWorkerCommitRefusedAppliesASuspectOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{partitions: 2})
	table := pgx.Identifier{r.tenant, "artist_ratings"}.Sanitize()
	exec(t, r.pool, "ALTER TABLE "+table+" ALTER COLUMN stars TYPE smallint") // stricter than the definition's integer
	fn := pgx.Identifier{r.tenant, "refuse_at_commit"}.Sanitize()
	exec(t, r.pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "+
		"IF NEW.stars = 99 THEN RAISE EXCEPTION 'stars 99 refused at commit' USING ERRCODE = 'check_violation'; END IF; "+
		"RETURN NULL; END $$")
	exec(t, r.pool, "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON "+table+
		" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	logs := r.startLogged(func(c *projection.Config) {
		c.CopyMinRows = 4
		c.Retry.MaxRetries = 0
		c.Breaker.Threshold = -1
	})
	const n = 60
	var keys, values []string
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		stars := i % 10
		switch {
		case i%20 == 7:
			stars = 99 // refused at COMMIT (23514)
		case i%20 == 13:
			stars = 40000 // out of range for smallint: a suspect (22003)
		}
		keys = append(keys, user)
		values = append(values, r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars)))
	}
	r.produceAll(keys, values)
	r.waitCommitted(testTimeout)
	if logSum(logs, logSuspect, "upserts") == 0 {
		t.Fatal("no upsert was left to statements as suspect: the test no longer shows what it should")
	}
	want := map[string]int{}
	for i := 7; i < n; i += 20 {
		want[fmt.Sprintf("user-%d@1", i)] = 1
		want[fmt.Sprintf("user-%d@1", i+6)] = 1
	}
	dls := r.deadLetters()
	if diff := cmp.Diff(want, deadLetteredUsers(t, dls)); diff != "" {
		t.Errorf("dead letters, one per refused pair (-want +got):\n%s", diff)
	}
	if got := len(r.ratings()); got != n-len(want) {
		t.Errorf("artist_ratings holds %d rows, want %d", got, n-len(want))
	}
}

// TestWorkerCopyGroupsOfTwoTenantsInOneBatch applies waves of ratings for
// two tenant schemas at once, so that each batch has a COPY group of
// artist_ratings per tenant and both go through the same temporary tables
// in one transaction: plain after plain (wave 1), isolated after plain
// (tenant A refuses a row, wave 2), isolated after checked (B refuses a
// row while A's group is checked, wave 3) and checked after checked
// (wave 4). Each tenant's table ends with its own ratings only, and each
// refused rating is dead-lettered once. A temporary table that still held
// the other tenant's rows would upsert them into the wrong tenant.
func TestWorkerCopyGroupsOfTwoTenantsInOneBatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	other := pgtest.NewSchemaName(t)
	defs, err := projection.LoadDefinitions("testdata/worker/projections.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(context.Background(), r.pool, defs, other); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{r.tenant, other} {
		exec(t, r.pool, "ALTER TABLE "+pgx.Identifier{s, "artist_ratings"}.Sanitize()+" ADD CONSTRAINT stars_range "+starsRangeUnread)
	}
	logs := r.startLogged(func(c *projection.Config) {
		c.CopyMinRows = 4
		c.MaxBatchRecords = 500
		c.Retry.MaxRetries = 1
	})
	const perTenant = 24
	wantDead := map[string]int{}
	wantRows := map[string]int{r.tenant: 0, other: 0}
	wave := func(w int, refusedIn string) {
		t.Helper()
		var keys, values []string
		for _, s := range []string{r.tenant, other} {
			for i := range perTenant {
				user := fmt.Sprintf("%s-user-%d-%d", s, w, i)
				stars := i % 10
				if s == refusedIn && i == perTenant/2 {
					stars = 99
					wantDead[user+"@1"] = 1
				} else {
					wantRows[s]++
				}
				ev := r.event("ARTIST_RATED", user, 1, fmt.Sprintf(`{"user_id":%q,"artist_id":"a","stars":%d}`, user, stars))
				keys = append(keys, user)
				values = append(values, strings.Replace(ev, `"tenantSchema":"`+r.tenant+`"`, `"tenantSchema":"`+s+`"`, 1))
			}
		}
		r.produceAll(keys, values)
		r.waitCommitted(testTimeout)
	}
	wave(1, "")
	wave(2, r.tenant)
	wave(3, other)
	wave(4, "")
	if n := len(logs.records(logIsolated)); n < 2 {
		t.Fatalf("%d groups isolated, want one per refused rating: the test no longer shows what it should", n)
	}
	if diff := cmp.Diff(wantDead, deadLetteredUsers(t, r.deadLetters())); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	for s, want := range wantRows {
		var n, foreign int
		q := "SELECT count(*), count(*) FILTER (WHERE user_id NOT LIKE $1) FROM " + pgx.Identifier{s, "artist_ratings"}.Sanitize()
		if err := r.pool.QueryRow(context.Background(), q, s+"-user-%").Scan(&n, &foreign); err != nil {
			t.Fatal(err)
		}
		if n != want || foreign != 0 {
			t.Errorf("%s.artist_ratings holds %d rows, %d of them another tenant's; want %d, its own", s, n, foreign, want)
		}
	}
}
