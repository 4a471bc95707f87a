package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

// t0 is the failedAt of the first dead letter of the fixtures.
var t0 = time.Date(2024, 6, 25, 12, 0, 0, 0, time.UTC)

// fixture is an events topic, a dead-letter topic and a ledger topic on a
// broker (kfake, or KAFKA_BROKERS with unique topic names).
type fixture struct {
	t                        testing.TB
	b                        *kafkatest.Broker
	events, dlqTopic, ledger string
	eventsPartitions         int32
	cl                       *kgo.Client
	offsets                  int64 // the original offsets given so far
}

func newFixture(t testing.TB, b *kafkatest.Broker, eventsPartitions, dlqPartitions int32) *fixture {
	t.Helper()
	f := &fixture{
		t:                t,
		b:                b,
		events:           kafkatest.TopicName(t, "events"),
		dlqTopic:         kafkatest.TopicName(t, "dlq"),
		ledger:           kafkatest.TopicName(t, "ledger"),
		eventsPartitions: eventsPartitions,
	}
	b.CreateTopic(t, f.events, eventsPartitions, nil)
	b.CreateTopic(t, f.dlqTopic, dlqPartitions, nil)
	f.cl = b.Client(t, kgo.ProducerLinger(0))
	return f
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deadLetter describes one dead letter to write.
type deadLetter struct {
	key                     string // "" for a nil key
	value                   []byte // default: event(fork, tenant, eventType, key)
	fork, tenant, eventType string
	projection              string
	err                     error
	class                   retry.Class
	originalPartition       int32
	originalOffset          int64 // 0: the next of the fixture's (41, 42, ...): each dead letter another record
	replayCount             int
	failedAt                time.Time // default t0
	firstFailedAt           time.Time
	headers                 []kgo.RecordHeader // of the original record
	strip                   bool               // drop the causet.dlq.* headers (a dead letter from another writer)
	topic                   string             // the topic it was read from; default the fixture's events topic
}

func event(fork, tenant, eventType, entity string) []byte {
	return fmt.Appendf(nil, `{"eventType":%q,"entityId":%q,"forkId":%q,"tenantSchema":%q,"irVersion":"v42","sequenceNumber":7,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"artist-456"}}`,
		eventType, entity, fork, tenant, entity)
}

func pgErr(code, msg string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg}
}

// add writes the dead letter of d to the dead-letter topic (built by
// dlq.NewRecord, as the worker does) and returns where it landed.
func (f *fixture) add(d deadLetter) dlq.Coordinates {
	f.t.Helper()
	return f.produce(f.record(d))
}

// record returns the dead letter d as the worker writes it.
func (f *fixture) record(d deadLetter) *kgo.Record {
	f.t.Helper()
	var key []byte
	if d.key != "" {
		key = []byte(d.key)
	}
	value := d.value
	if value == nil {
		value = event(d.fork, d.tenant, d.eventType, d.key)
	}
	if d.err == nil {
		d.err = pgErr("42703", `column "followed_at" of relation "artist_followers" does not exist`)
	}
	if d.failedAt.IsZero() {
		d.failedAt = t0
	}
	topic := f.events
	if d.topic != "" {
		topic = d.topic
	}
	if d.originalOffset == 0 {
		d.originalOffset = 41 + f.offsets
		f.offsets++
	}
	src := &kgo.Record{Topic: topic, Partition: d.originalPartition, Offset: d.originalOffset, Key: key, Value: value,
		Headers: d.headers, Timestamp: d.failedAt.Add(-time.Minute)}
	rec, err := dlq.NewRecord(dlq.DeadLetter{
		Source: src, Projection: d.projection, TenantSchema: d.tenant, ForkID: d.fork, EventType: d.eventType,
		Class: d.class, Err: d.err, Retries: 5, FirstFailedAt: d.firstFailedAt, ReplayCount: d.replayCount,
	}, dlq.RecordConfig{Topic: f.dlqTopic, Worker: "test"}, d.failedAt)
	if err != nil {
		f.t.Fatal(err)
	}
	if d.strip {
		rec.Headers = slices.DeleteFunc(rec.Headers, func(h kgo.RecordHeader) bool { return strings.HasPrefix(h.Key, "causet.dlq.") })
	}
	return rec
}

func (f *fixture) produce(rec *kgo.Record) dlq.Coordinates {
	f.t.Helper()
	r, err := f.cl.ProduceSync(testCtx(f.t), rec).First()
	if err != nil {
		f.t.Fatalf("produce dead letter: %v", err)
	}
	return dlq.Coordinates{Partition: r.Partition, Offset: r.Offset}
}

func (f *fixture) openLedger(readOnly bool) *dlq.Ledger {
	f.t.Helper()
	l, err := dlq.OpenLedger(testCtx(f.t), f.b.Opts(), dlq.LedgerConfig{Topic: f.ledger, ReadOnly: readOnly})
	if err != nil {
		f.t.Fatalf("open ledger: %v", err)
	}
	f.t.Cleanup(l.Close)
	return l
}

// retry runs one Retry as a fresh dlq-replayer run would: ledger opened
// anew. It returns the result and the outcomes.
func (f *fixture) retry(cfg dlq.ReplayConfig) (dlq.Result, []dlq.Outcome) {
	f.t.Helper()
	res, outs, err := f.run(cfg, (*dlq.Replayer).Retry)
	if err != nil {
		f.t.Fatalf("retry: %v", err)
	}
	return res, outs
}

func (f *fixture) run(cfg dlq.ReplayConfig, op func(*dlq.Replayer, context.Context) (dlq.Result, error)) (dlq.Result, []dlq.Outcome, error) {
	f.t.Helper()
	cfg.EventsTopic, cfg.DLQTopic = f.events, f.dlqTopic
	var outs []dlq.Outcome
	cfg.OnOutcome = func(o dlq.Outcome) { outs = append(outs, o) }
	r, err := dlq.NewReplayer(f.b.Opts(), f.openLedger(false), cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	res, err := op(r, testCtx(f.t))
	return res, outs, err
}

// readTopic returns every record of topic up to its current end offsets,
// sorted by partition and offset.
func readTopic(t testing.TB, b *kafkatest.Broker, topic string) []*kgo.Record {
	t.Helper()
	ctx := testCtx(t)
	adm := kadm.NewClient(b.Client(t))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl := b.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s: %v", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset < end {
				out = append(out, r)
				if r.Offset == end-1 {
					delete(want, r.Partition)
				}
			}
		})
	}
	slices.SortFunc(out, func(a, b *kgo.Record) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return out
}

func headerValue(hs []kgo.RecordHeader, key string) (string, bool) {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// filterFixture writes five dead letters and returns their coordinates by
// name:
//
//	A production/acme_prod     artist_followers ARTIST_FOLLOWED   42703 column  t0
//	B production/acme_prod     artist_stats     ARTIST_FOLLOWED   division by zero (permanent) t0+1h
//	C staging/acme_staging     artist_followers ARTIST_UNFOLLOWED 42703 column  t0+2h
//	D production/acme_legacy   artist_followers ARTIST_FOLLOWED   42P01 relation t0+3h
//	E input error, value not JSON (no projection, tenant, fork)    t0+4h
func filterFixture(f *fixture, strip bool) map[string]dlq.Coordinates {
	colErr := pgErr("42703", `column "followed_at" of relation "artist_followers" does not exist`)
	return map[string]dlq.Coordinates{
		"A": f.add(deadLetter{key: "user-1", fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
			projection: "artist_followers", err: colErr, failedAt: t0, strip: strip}),
		"B": f.add(deadLetter{key: "user-2", fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
			projection: "artist_stats", err: retry.MarkPermanent(errors.New("derive score: division by zero")), class: retry.Permanent,
			failedAt: t0.Add(time.Hour), strip: strip}),
		"C": f.add(deadLetter{key: "user-3", fork: "staging", tenant: "acme_staging", eventType: "ARTIST_UNFOLLOWED",
			projection: "artist_followers", err: colErr, failedAt: t0.Add(2 * time.Hour), strip: strip}),
		"D": f.add(deadLetter{key: "user-4", fork: "production", tenant: "acme_legacy", eventType: "ARTIST_FOLLOWED",
			projection: "artist_followers", err: pgErr("42P01", `relation "artist_followers" does not exist`),
			failedAt: t0.Add(3 * time.Hour), strip: strip}),
		"E": f.add(deadLetter{key: "user-5", value: []byte("not json"), class: retry.Permanent,
			err:      retry.MarkPermanent(errors.New("invalid projection event: value is not a JSON object")),
			failedAt: t0.Add(4 * time.Hour), strip: strip}),
	}
}

// TestFiltersSelectExactlyTheRightEntries scans the fixture with each filter
// and compares the selected dead letters, with the causet.dlq.* headers and
// without them (values then come from the message and its originalEvent).
func TestFiltersSelectExactlyTheRightEntries(t *testing.T) {
	b := kafkatest.New(t)
	for _, variant := range []struct {
		name  string
		strip bool
	}{{"headers", false}, {"message fallback", true}} {
		t.Run(variant.name, func(t *testing.T) {
			f := newFixture(t, b, 3, 2)
			at := filterFixture(f, variant.strip)
			colFingerprint := dlq.Fingerprint("artist_followers", retry.Projection, "42703",
				`ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`)
			tests := []struct {
				name     string
				filters  dlq.Filters
				want     string
				headered bool // needs the headers
			}{
				{"none", dlq.Filters{}, "ABCDE", false},
				{"fork", dlq.Filters{ForkID: "production"}, "ABD", false},
				{"projection", dlq.Filters{Projection: "artist_followers"}, "ACD", false},
				{"tenant", dlq.Filters{TenantSchema: "acme_staging"}, "C", false},
				{"event type", dlq.Filters{EventType: "ARTIST_UNFOLLOWED"}, "C", false},
				{"error contains, any case", dlq.Filters{ErrorContains: "DOES NOT EXIST"}, "ACD", false},
				{"error contains SQLSTATE", dlq.Filters{ErrorContains: "SQLSTATE 42P01"}, "D", false},
				{"fingerprint", dlq.Filters{Fingerprint: colFingerprint}, "AC", true},
				{"fingerprint upper case", dlq.Filters{Fingerprint: strings.ToUpper(colFingerprint)}, "AC", true},
				{"since", dlq.Filters{Since: t0.Add(time.Hour)}, "BCDE", false},
				{"until is exclusive", dlq.Filters{Until: t0.Add(2 * time.Hour)}, "AB", false},
				{"since and until", dlq.Filters{Since: t0.Add(time.Hour), Until: t0.Add(3 * time.Hour)}, "BC", false},
				{"fork and projection", dlq.Filters{ForkID: "production", Projection: "artist_followers"}, "AD", false},
				{"fork, projection and time", dlq.Filters{ForkID: "production", Projection: "artist_followers", Since: t0.Add(time.Minute)}, "D", false},
				{"nothing matches", dlq.Filters{ForkID: "production", TenantSchema: "acme_staging"}, "", false},
				{"unknown projection", dlq.Filters{Projection: "nope"}, "", false},
			}
			for _, tt := range tests {
				if variant.strip && tt.headered {
					continue
				}
				t.Run(tt.name, func(t *testing.T) {
					var got []dlq.Coordinates
					st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: tt.filters}, func(e *dlq.Entry) error {
						got = append(got, e.Coordinates())
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					var want []dlq.Coordinates
					for _, n := range tt.want {
						want = append(want, at[string(n)])
					}
					sortCoords(got)
					sortCoords(want)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("selected (-want +got):\n%s", diff)
					}
					if st.Scanned != 5 || st.Matched != int64(len(want)) {
						t.Errorf("stats = %+v, want 5 scanned, %d matched", st, len(want))
					}
				})
			}
		})
	}
}

func sortCoords(cs []dlq.Coordinates) {
	slices.SortFunc(cs, func(a, b dlq.Coordinates) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
}

func TestFiltersMatch(t *testing.T) {
	e := &dlq.Entry{ForkID: "production", Projection: "p", TenantSchema: "t", EventType: "E", Fingerprint: "00ff00ff00ff00ff",
		Message: dlq.Message{Error: "ERROR: Boom (SQLSTATE 42703)", FailedAt: t0.UnixMilli()}}
	tests := []struct {
		name string
		f    dlq.Filters
		want bool
	}{
		{"zero", dlq.Filters{}, true},
		{"since equal is in", dlq.Filters{Since: t0}, true},
		{"since after", dlq.Filters{Since: t0.Add(time.Millisecond)}, false},
		{"until equal is out", dlq.Filters{Until: t0}, false},
		{"until after", dlq.Filters{Until: t0.Add(time.Millisecond)}, true},
		{"error any case", dlq.Filters{ErrorContains: "boom"}, true},
		{"error absent", dlq.Filters{ErrorContains: "bang"}, false},
		{"fingerprint any case", dlq.Filters{Fingerprint: "00FF00FF00FF00FF"}, true},
		{"all of them", dlq.Filters{ForkID: "production", Projection: "p", TenantSchema: "t", EventType: "E", ErrorContains: "42703"}, true},
		{"one fails", dlq.Filters{ForkID: "production", Projection: "q"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Match(e); got != tt.want {
				t.Errorf("Match = %t, want %t", got, tt.want)
			}
		})
	}
}

func TestParseTimeBound(t *testing.T) {
	now := time.Date(2024, 6, 26, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{"2024-06-25T12:00:00Z", t0, false},
		{"2024-06-25T14:00:00+02:00", t0, false},
		{"24h", t0, false},
		{"90m", now.Add(-90 * time.Minute), false},
		{"yesterday", time.Time{}, true},
		{"-1h", time.Time{}, true},
		{"2024-06-25", time.Time{}, true},
		{"0s", time.Time{}, true}, // not positive (second new-user trial: taken)
		{"99999999999h", time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := dlq.ParseTimeBound(tt.in, now)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %t", err, tt.wantErr)
			}
			// Beyond time.Duration's range: said so, not "not a positive
			// duration" (second new-user trial).
			if tt.in == "99999999999h" && !strings.Contains(err.Error(), "longer than Go's limit") {
				t.Errorf("err = %v, want it to say the duration is too long", err)
			}
			if !got.Equal(tt.want) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestRetryRepublishesByteForByte checks value, key, headers and partition
// of a replayed event.
func TestRetryRepublishesByteForByte(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 4, 2)
	// Odd spacing, whitespace around the object, escapes, a big number and
	// HTML characters: any re-encoding would show (new-user trial: the
	// whitespace around the object was dropped).
	value := []byte(" \n\t" + `{ "eventType":"ARTIST_FOLLOWED","entityId":"user-9", "forkId":"production","tenantSchema":"acme_prod","irVersion":"v42","sequenceNumber":9007199254740993,"ts":1719331200000,"payload":{"note":"caf\u00e9 <b>&amp;","n":1.50}}` + " \r\n")
	first := t0.Add(-time.Hour)
	at := f.add(deadLetter{key: "user-9", value: value, fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
		projection: "artist_followers", originalPartition: 3, firstFailedAt: first, replayCount: 1,
		headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			{Key: dlq.HeaderReplaySource, Value: []byte("9:99")}, // from an earlier replay: replaced
			{Key: dlq.HeaderReplayCountOut, Value: []byte("1")},
			{Key: "empty", Value: nil},
		}})

	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice", RunID: "run-1"})
	if res.String() != "matched=1 replayed=1 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("result = %s", res)
	}
	if len(outs) != 1 || outs[0].Partition != 3 || !outs[0].FromHeader {
		t.Fatalf("outcomes = %+v", outs)
	}
	got := readTopic(t, b, f.events)
	if len(got) != 1 {
		t.Fatalf("events topic has %d records, want 1", len(got))
	}
	r := got[0]
	if !bytes.Equal(r.Value, value) {
		t.Errorf("value changed:\n got %s\nwant %s", r.Value, value)
	}
	if string(r.Key) != "user-9" || r.Partition != 3 {
		t.Errorf("key %q partition %d, want user-9 and 3", r.Key, r.Partition)
	}
	type hdr struct{ K, V string }
	var hs []hdr
	for _, h := range r.Headers {
		hs = append(hs, hdr{h.Key, string(h.Value)})
	}
	want := []hdr{
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"empty", ""},
		{dlq.HeaderReplayProjection, "artist_followers"},
		{dlq.HeaderReplaySource, at.String()},
		{dlq.HeaderReplayCountOut, "2"},
		{dlq.HeaderReplayFirstFailedAt, strconv.FormatInt(first.UnixMilli(), 10)},
	}
	if diff := cmp.Diff(want, hs); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}

	l := f.openLedger(true)
	d, ok := l.Lookup(at)
	if !ok {
		t.Fatalf("ledger has no decision for %s", at)
	}
	d.At = 0
	if diff := cmp.Diff(dlq.Decision{Entry: at, Action: dlq.ActionReplayed, Actor: "alice", RunID: "run-1", ReplayCount: 2}, d); diff != "" {
		t.Errorf("ledger decision (-want +got):\n%s", diff)
	}
}

// crc32Key returns a key that librdkafka's default (CRC32) partitioner puts
// in partition want of n while murmur2 puts it elsewhere.
func crc32Key(t testing.TB, want, n int) string {
	crc := kgo.SaramaHasher(crc32.ChecksumIEEE)
	murmur := dlq.NewReplayPartitioner(int32(n))
	for i := range 100000 {
		k := "user-" + strconv.Itoa(i)
		if crc([]byte(k), n) == want && int(murmur.Hash([]byte(k))) != want {
			return k
		}
	}
	t.Fatal("no key found")
	return ""
}

// TestRetryKeepsTheOriginalPartitionOfACRC32Producer produces an event as
// kcat does (CRC32), dead-letters it from the partition it was read from,
// and checks that the replay goes back to that partition, not to murmur2's.
func TestRetryKeepsTheOriginalPartitionOfACRC32Producer(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 6, 1)
	key := crc32Key(t, 5, 6)
	kcat := b.Client(t, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaHasher(crc32.ChecksumIEEE))))
	value := event("production", "acme_prod", "ARTIST_FOLLOWED", key)
	src, err := kcat.ProduceSync(testCtx(t), &kgo.Record{Topic: f.events, Key: []byte(key), Value: value}).First()
	if err != nil {
		t.Fatal(err)
	}
	if src.Partition != 5 {
		t.Fatalf("kcat-style producer wrote to partition %d, want 5", src.Partition)
	}
	f.add(deadLetter{key: key, fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
		projection: "artist_followers", originalPartition: src.Partition})

	res, _ := f.retry(dlq.ReplayConfig{})
	if res.Replayed != 1 {
		t.Fatalf("result = %s", res)
	}
	got := readTopic(t, b, f.events)
	if len(got) != 2 || got[1].Partition != 5 || got[1].Offset != 1 || !bytes.Equal(got[1].Value, value) {
		t.Fatalf("events = %v, want the original and its replay in partition 5", got)
	}
}

// TestRetryHashesTheKeyWithMurmur2WithoutAUsableHeader covers a dead letter
// without causet.dlq.original-partition and one whose partition no longer
// exists: both go where kgo's (Kafka's) murmur2 partitioner puts the key.
func TestRetryHashesTheKeyWithMurmur2WithoutAUsableHeader(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 6, 1)
	murmur := kgo.StickyKeyPartitioner(nil).ForTopic(f.events)
	tests := []struct {
		name string
		key  string
		edit func([]kgo.RecordHeader) []kgo.RecordHeader
	}{
		{"header missing", crc32Key(t, 2, 6), func(hs []kgo.RecordHeader) []kgo.RecordHeader {
			return slices.DeleteFunc(hs, func(h kgo.RecordHeader) bool { return h.Key == dlq.HeaderOriginalPartition })
		}},
		{"partition gone", crc32Key(t, 4, 6), func(hs []kgo.RecordHeader) []kgo.RecordHeader {
			for i := range hs {
				if hs[i].Key == dlq.HeaderOriginalPartition {
					hs[i].Value = []byte("7")
				}
			}
			return hs
		}},
		{"header garbage", crc32Key(t, 1, 6), func(hs []kgo.RecordHeader) []kgo.RecordHeader {
			for i := range hs {
				if hs[i].Key == dlq.HeaderOriginalPartition {
					hs[i].Value = []byte("x")
				}
			}
			return hs
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.ledger = kafkatest.TopicName(t, "ledger")
			rec, err := dlq.NewRecord(dlq.DeadLetter{
				Source:     &kgo.Record{Topic: f.events, Partition: 0, Key: []byte(tt.key), Value: event("production", "acme_prod", "E", tt.key)},
				Projection: "p", Err: errors.New("boom"),
			}, dlq.RecordConfig{Topic: f.dlqTopic}, t0)
			if err != nil {
				t.Fatal(err)
			}
			rec.Headers = tt.edit(rec.Headers)
			f.produce(rec)
			_, outs := f.retry(dlq.ReplayConfig{Filters: dlq.Filters{ErrorContains: "boom"}})
			want := int32(murmur.Partition(&kgo.Record{Key: []byte(tt.key)}, 6))
			var sent []dlq.Outcome
			for _, o := range outs {
				if string(o.Entry.Key) == tt.key {
					sent = append(sent, o)
				}
			}
			if len(sent) != 1 || sent[0].Kind != dlq.OutcomeReplayed || sent[0].Partition != want || sent[0].FromHeader {
				t.Fatalf("outcomes = %+v, want one replay to murmur2 partition %d", sent, want)
			}
			var found bool
			for _, r := range readTopic(t, b, f.events) {
				if string(r.Key) == tt.key {
					found = r.Partition == want
				}
			}
			if !found {
				t.Errorf("replayed record not in partition %d", want)
			}
		})
	}
}

// TestRetryLedger: a second run replays nothing, --include-replayed replays
// again, and skipped entries are never sent.
func TestRetryLedger(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 2)
	at := filterFixture(f, false)
	prod := dlq.Filters{ForkID: "production"} // A, B, D

	res, _ := f.retry(dlq.ReplayConfig{Filters: prod})
	if got, want := res.String(), "matched=3 replayed=3 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0"; got != want {
		t.Fatalf("first run: %s, want %s", got, want)
	}
	res, _ = f.retry(dlq.ReplayConfig{Filters: prod})
	if got, want := res.String(), "matched=3 replayed=0 skipped=0 already-replayed=3 already-skipped=0 refused=0 failed=0"; got != want {
		t.Fatalf("second run: %s, want %s", got, want)
	}
	if n := len(readTopic(t, b, f.events)); n != 3 {
		t.Fatalf("events topic has %d records after two runs, want 3", n)
	}
	res, _ = f.retry(dlq.ReplayConfig{Filters: prod, IncludeReplayed: true})
	if got, want := res.String(), "matched=3 replayed=3 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0"; got != want {
		t.Fatalf("--include-replayed: %s, want %s", got, want)
	}

	// skip C, then retry everything: C is not sent, E (not JSON) refused.
	sres, _, err := f.run(dlq.ReplayConfig{Filters: dlq.Filters{ForkID: "staging"}, Reason: "data fixed by hand", Actor: "bob"}, (*dlq.Replayer).Skip)
	if err != nil || sres.Skipped != 1 || sres.Matched != 1 {
		t.Fatalf("skip: %s, %v", sres, err)
	}
	before := len(readTopic(t, b, f.events))
	var logged bytes.Buffer
	res, outs := f.retry(dlq.ReplayConfig{IncludeReplayed: true, Force: true, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if got, want := res.String(), "matched=5 replayed=3 skipped=0 already-replayed=0 already-skipped=1 refused=1 failed=0"; got != want {
		t.Fatalf("retry --all after skip: %s, want %s", got, want)
	}
	// OnOutcome reports the refusal: no WARN line of it as well (new-user
	// trial: dlq-replayer said each refusal on stdout and again on stderr).
	if strings.Contains(logged.String(), "replay refused") {
		t.Errorf("a refusal reported to OnOutcome was logged too:\n%s", logged.String())
	}
	for _, o := range outs {
		if o.Entry.Coordinates() == at["C"] && o.Kind != dlq.OutcomeSkipped {
			t.Errorf("skipped entry C: outcome %s", o.Kind)
		}
		if o.Entry.Coordinates() == at["E"] && (o.Kind != dlq.OutcomeRefused || !strings.Contains(o.Reason, "originalEvent is null") || !strings.Contains(o.Reason, "originalValueBase64 keeps its bytes")) {
			t.Errorf("entry E without an original event: %s (%s)", o.Kind, o.Reason)
		}
	}
	after := readTopic(t, b, f.events)
	if len(after) != before+3 {
		t.Fatalf("events topic grew by %d, want 3", len(after)-before)
	}
	for _, r := range after {
		if src, _ := headerValue(r.Headers, dlq.HeaderReplaySource); src == at["C"].String() || src == at["E"].String() {
			t.Errorf("entry %s was sent", src)
		}
	}
	l := f.openLedger(true)
	if d, _ := l.Lookup(at["C"]); d.Action != dlq.ActionSkipped || d.Reason != "data fixed by hand" || d.Actor != "bob" {
		t.Errorf("ledger for C = %+v", d)
	}
	if _, ok := l.Lookup(at["E"]); ok {
		t.Error("ledger has a decision for E, which was refused")
	}
}

// TestResultStringNamesWhatADryRunWouldDo: a dry run's line says
// would-replay (retry) or would-skip (skip), not replayed or skipped, for
// what it did not do (issue 12); a real run's line is unchanged.
func TestResultStringNamesWhatADryRunWouldDo(t *testing.T) {
	tests := []struct {
		name string
		res  dlq.Result
		want string
	}{
		{"retry", dlq.Result{Action: dlq.OutcomeReplayed, Matched: 4, Replayed: 3, Skipped: 1},
			"matched=4 replayed=3 skipped=1 already-replayed=0 already-skipped=0 refused=0 failed=0"},
		{"retry dry run", dlq.Result{Action: dlq.OutcomeReplayed, DryRun: true, Matched: 4, Replayed: 3, Skipped: 1},
			"matched=4 would-replay=3 skipped=1 already-replayed=0 already-skipped=0 refused=0 failed=0"},
		{"skip", dlq.Result{Action: dlq.OutcomeSkipped, Matched: 2, Skipped: 2},
			"matched=2 replayed=0 skipped=2 already-replayed=0 already-skipped=0 refused=0 failed=0"},
		{"skip dry run", dlq.Result{Action: dlq.OutcomeSkipped, DryRun: true, Matched: 2, Skipped: 2},
			"matched=2 replayed=0 would-skip=2 already-replayed=0 already-skipped=0 refused=0 failed=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.res.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestARetryInterruptedWithReplaysInItsBatchLeavesThemNotDone: dead
// letters selected and waiting in the batch when the run is interrupted
// are not sent, and are counted not-done, not failed, with no ERROR
// (replayer trial: SIGTERM gave "failed=6", each logged "produce to the
// events topic failed" with "context canceled", for 6 never sent); the
// next run replays them.
func TestARetryInterruptedWithReplaysInItsBatchLeavesThemNotDone(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 1)
	colErr := pgErr("42703", `column "followed_at" of relation "artist_followers" does not exist`)
	for i := range 2 {
		f.add(deadLetter{key: fmt.Sprint("user-", i), fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED", projection: "artist_followers", err: colErr})
	}
	f.add(deadLetter{key: "bad", value: []byte("not json"), class: retry.Permanent, err: retry.MarkPermanent(errors.New("invalid projection event: value is not a JSON object"))})
	f.add(deadLetter{key: "user-3", fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED", projection: "artist_followers", err: colErr})
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	r, err := dlq.NewReplayer(b.Opts(), f.openLedger(false), dlq.ReplayConfig{
		EventsTopic: f.events, DLQTopic: f.dlqTopic, Rate: 40, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		OnOutcome: func(o dlq.Outcome) {
			if o.Kind == dlq.OutcomeRefused { // the third: two replays wait in the batch of 4
				cancel()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Retry(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("retry error = %v, want it cancelled", err)
	}
	if res.Failed != 0 || res.Replayed != 0 || res.Refused != 1 || res.NotDone() != 3 {
		t.Errorf("%s; want refused=1, the two in the batch and the one after not-done, none failed", res)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("an ERROR was logged for replays never sent:\n%s", logs.String())
	}
	if recs := readTopic(t, b, f.events); len(recs) != 0 {
		t.Errorf("%d events sent, want none", len(recs))
	}
	if full, _ := f.retry(dlq.ReplayConfig{}); full.Replayed != 3 {
		t.Errorf("the run after: %s; want the 3 replayed", full)
	}
}

// TestARetryInterruptedWhileKafkaAcknowledgesRecordsTheReplays: replays
// Kafka acknowledges after the run was interrupted are recorded in the
// ledger, so that the next run does not send them again (the cancelled
// context failed their ledger write: "republished, but the ledger write
// failed", and the next run sent each event twice).
func TestARetryInterruptedWhileKafkaAcknowledgesRecordsTheReplays(t *testing.T) {
	b := kafkatest.Fake(t)
	f := newFixture(t, b, 3, 1)
	for i := range 2 {
		f.add(deadLetter{key: fmt.Sprint("user-", i), fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED", projection: "artist_followers"})
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	b.RefuseProduce(t, f.events, 0, func(int64) bool {
		cancel() // interrupted while the produce request is at the broker, which stores it
		return false
	})
	r, err := dlq.NewReplayer(b.Opts(), f.openLedger(false), dlq.ReplayConfig{EventsTopic: f.events, DLQTopic: f.dlqTopic})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := r.Retry(ctx)
	if res.Replayed != 2 || res.Failed != 0 {
		t.Errorf("%s; want the 2 acknowledged replays recorded", res)
	}
	if again, _ := f.retry(dlq.ReplayConfig{}); again.AlreadyReplayed != 2 || again.Replayed != 0 {
		t.Errorf("the run after: %s; want both already-replayed", again)
	}
	if recs := readTopic(t, b, f.events); len(recs) != 2 {
		t.Errorf("%d events sent, want 2", len(recs))
	}
}

// TestInterruptedRetryCountsWhatItLeftNotDone: a retry stopped before the
// end (its context cancelled, as Ctrl-C or SIGTERM cancels it) while
// a matched dead letter waits for --rate counts that one not-done, so that
// its summary line adds up to matched (new-user trial: an interrupted retry
// printed matched=121 replayed=120 and no other counter above 0).
func TestInterruptedRetryCountsWhatItLeftNotDone(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 2)
	filterFixture(f, false)
	res, outs, err := f.run(dlq.ReplayConfig{Rate: 4}, func(r *dlq.Replayer, ctx context.Context) (dlq.Result, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer time.AfterFunc(400*time.Millisecond, cancel).Stop()
		return r.Retry(ctx)
	})
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("retry error = %v, want it cancelled (4 replays at 4/s take 750 ms)", err)
	}
	if res.NotDone() < 1 || res.NotDone() != res.Matched-len(outs) {
		t.Errorf("NotDone() = %d of %d matched with %d outcomes, want matched less the outcomes, at least 1", res.NotDone(), res.Matched, len(outs))
	}
	// Those selected and not sent are not-done, not failed (replayer
	// trial: "failed=6 ... produce to the events topic failed" with
	// "context canceled", for 6 never sent).
	if res.Failed != 0 {
		t.Errorf("%s: want no failed, the ones not sent not-done", res)
	}
	if want := fmt.Sprintf(" not-done=%d", res.NotDone()); !strings.HasSuffix(res.String(), want) {
		t.Errorf("summary line %q does not end with %q", res.String(), want)
	}
	full, _ := f.retry(dlq.ReplayConfig{})
	if full.NotDone() != 0 || strings.Contains(full.String(), "not-done") {
		t.Errorf("a run to the end: NotDone() = %d, line %q; want 0 and no not-done counter", full.NotDone(), full.String())
	}
	if full.Matched != 5 || full.AlreadyReplayed != res.Replayed || full.Replayed+full.AlreadyReplayed != 4 {
		t.Errorf("the run after: %s; want the %d replayed before already-replayed and the rest of the 4 replayed", full, res.Replayed)
	}
}

func TestRetryDryRunSendsAndRecordsNothing(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 2)
	filterFixture(f, false)
	res, outs := f.retry(dlq.ReplayConfig{DryRun: true})
	if got, want := res.String(), "matched=5 would-replay=4 skipped=0 already-replayed=0 already-skipped=0 refused=1 failed=0"; got != want || !res.DryRun {
		t.Fatalf("dry run: %s (dry %t), want %s", got, res.DryRun, want)
	}
	for _, o := range outs {
		if o.Kind == dlq.OutcomeReplayed && (!o.DryRun || o.Partition < 0) {
			t.Errorf("dry-run outcome %+v: want DryRun and the partition it would go to", o)
		}
	}
	if n := len(readTopic(t, b, f.events)); n != 0 {
		t.Errorf("dry run sent %d records", n)
	}
	if n := f.openLedger(true).Len(); n != 0 {
		t.Errorf("dry run recorded %d decisions", n)
	}
	if recs := readTopic(t, b, f.ledger); len(recs) != 0 {
		t.Errorf("ledger topic has %d records", len(recs))
	}
}

// TestRetryMaxReplays refuses events replayed --max-replays times unless
// --force, and counts replays on.
func TestRetryMaxReplays(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 1)
	first := t0.Add(-48 * time.Hour)
	for n := range 4 {
		f.add(deadLetter{key: "user-" + strconv.Itoa(n), fork: "production", tenant: "acme_prod", eventType: "E",
			projection: "p", replayCount: n, firstFailedAt: first})
	}
	// The count said in words, and the flags that change the outcome.
	refusedReplayed := regexp.MustCompile(`^event already replayed (1 time|[2-9] times) \(--max-replays [0-9]; --force to replay it all the same\)$`)
	tests := []struct {
		name string
		cfg  dlq.ReplayConfig
		want string
		sent []int // replay counts of the sent entries
	}{
		{"default 3", dlq.ReplayConfig{}, "matched=4 replayed=3 skipped=0 already-replayed=0 already-skipped=0 refused=1 failed=0", []int{0, 1, 2}},
		// Replayed once each by the run above: its replays count too (the
		// entry of count 0 goes out with 2, the others are at 2 and more).
		{"max 2", dlq.ReplayConfig{MaxReplays: 2, IncludeReplayed: true}, "matched=4 replayed=1 skipped=0 already-replayed=0 already-skipped=0 refused=3 failed=0", []int{1}},
		{"max 1", dlq.ReplayConfig{MaxReplays: 1, IncludeReplayed: true}, "matched=4 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=4 failed=0", nil},
		{"force", dlq.ReplayConfig{Force: true}, "matched=4 replayed=1 skipped=0 already-replayed=3 already-skipped=0 refused=0 failed=0", []int{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(readTopic(t, b, f.events))
			res, outs := f.retry(tt.cfg)
			if res.String() != tt.want {
				t.Fatalf("result %s, want %s (scan %+v)", res, tt.want, res.Scan)
			}
			for _, o := range outs {
				if o.Kind == dlq.OutcomeRefused && !refusedReplayed.MatchString(o.Reason) {
					t.Errorf("refusal reason %q, want it to match %s", o.Reason, refusedReplayed)
				}
			}
			var sent []int
			for _, r := range readTopic(t, b, f.events)[before:] {
				c, _ := headerValue(r.Headers, dlq.HeaderReplayCountOut)
				n, _ := strconv.Atoi(c)
				sent = append(sent, n-1)
				if ff, _ := headerValue(r.Headers, dlq.HeaderReplayFirstFailedAt); ff != strconv.FormatInt(first.UnixMilli(), 10) {
					t.Errorf("first-failed-at %s, want %d", ff, first.UnixMilli())
				}
			}
			slices.Sort(sent)
			if diff := cmp.Diff(tt.sent, sent); diff != "" {
				t.Errorf("replay counts of the sent entries (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRetryIncludeReplayedCountsEachReplay: replaying one dead letter again
// (--include-replayed) counts up, from the ledger's last replay of it, so
// that --max-replays refuses it in the end (new-user trial: five runs sent
// it five times, each with causet.replay.count 1).
func TestRetryIncludeReplayedCountsEachReplay(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	f.add(deadLetter{key: "user-203", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	var counts []string
	for run := 1; run <= 4; run++ {
		res, outs := f.retry(dlq.ReplayConfig{IncludeReplayed: true})
		if run == 4 {
			if res.Replayed != 0 || res.Refused != 1 || len(outs) != 1 || outs[0].Reason != "event already replayed 3 times (--max-replays 3; --force to replay it all the same)" {
				t.Fatalf("run 4: %s, %+v; want it refused, replayed 3 times", res, outs)
			}
			break
		}
		if res.Replayed != 1 {
			t.Fatalf("run %d: %s, want it replayed", run, res)
		}
	}
	for _, r := range readTopic(t, b, f.events) {
		c, _ := headerValue(r.Headers, dlq.HeaderReplayCountOut)
		counts = append(counts, c)
	}
	if diff := cmp.Diff([]string{"1", "2", "3"}, counts); diff != "" {
		t.Errorf("causet.replay.count of the replays (-want +got):\n%s", diff)
	}
}

// TestRetryIncludeReplayedSendsAnEventOncePerRun: an event whose replays
// keep failing leaves a chain of dead letters, each replay's dead letter
// holding the causet.replay.source of the one replayed; retry
// --include-replayed selects them all, and sends the event once a run
// (new-user trial: it sent every one, 1, 2, 4 then 8 copies of one event,
// the copies doubling with each run). Several dead-letter partitions, so
// that a chain's dead letters may be read out of order.
func TestRetryIncludeReplayedSendsAnEventOncePerRun(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 3)
	f.add(deadLetter{key: "user-204", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	f.add(deadLetter{key: "user-205", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"}) // another event
	sentBefore := 0
	for run := 1; run <= 4; run++ {
		res, outs := f.retry(dlq.ReplayConfig{IncludeReplayed: true, MaxReplays: 10})
		if res.Replayed != 2 || res.Refused != res.Matched-2 {
			t.Fatalf("run %d: %s, want each of the 2 events replayed once, the rest of their chains refused", run, res)
		}
		for _, o := range outs {
			if o.Kind == dlq.OutcomeRefused && !strings.Contains(o.Reason, "one replay of an event per run") {
				t.Errorf("run %d: refusal %q, want it to say one replay of an event per run", run, o.Reason)
			}
		}
		sent := readTopic(t, b, f.events)
		if got := len(sent) - sentBefore; got != 2 {
			t.Fatalf("run %d sent %d records, want 2", run, got)
		}
		// The worker fails each replay again: its dead letter carries the
		// replayed record's headers, causet.replay.source among them.
		for _, r := range sent[sentBefore:] {
			n, _ := headerValue(r.Headers, dlq.HeaderReplayCountOut)
			count, _ := strconv.Atoi(n)
			f.add(deadLetter{key: string(r.Key), value: r.Value, fork: "production", tenant: "acme_prod", eventType: "E",
				projection: "p", replayCount: count, headers: r.Headers})
		}
		sentBefore = len(sent)
	}
}

// TestRetrySendsADeadLetterWrittenTwiceOnce: a worker that stops after
// writing a dead letter and before committing its offset writes it again
// (at least once, SPEC §3). retry sends the record once a run, refusing
// the copy as the same event, and a later run counts the copy
// already-replayed (operator trial: both copies were replayed, while the
// README said a run sends an event once). The record's dead letter for
// another projection is its own, as is another record's.
func TestRetrySendsADeadLetterWrittenTwiceOnce(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	dl := deadLetter{key: "user-301", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p", originalOffset: 7}
	first := f.add(dl)
	copied := f.add(dl)
	other := dl
	other.projection = "q"
	f.add(other)
	f.add(deadLetter{key: "user-302", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})

	res, outs := f.retry(dlq.ReplayConfig{})
	if res.Matched != 4 || res.Replayed != 3 || res.Refused != 1 {
		t.Fatalf("first run: %s, want 4 matched, 3 replayed, the copy refused", res)
	}
	for _, o := range outs {
		if o.Entry.Coordinates() == copied && (o.Kind != dlq.OutcomeRefused || o.Reason != "a copy of dead letter "+first.String()+", which this run replays (one dead letter written twice): one replay of an event per run") {
			t.Errorf("the copy %s: %v %q, want it refused as the same event as %s", copied, o.Kind, o.Reason, first)
		}
	}
	if n := len(readTopic(t, b, f.events)); n != 3 {
		t.Errorf("first run sent %d records, want 3", n)
	}
	res, outs = f.retry(dlq.ReplayConfig{})
	if res.Replayed != 0 || res.AlreadyReplayed != 4 {
		t.Errorf("second run: %s (%+v), want the 4 already replayed, the copy as its first", res, outs)
	}
	if n := len(readTopic(t, b, f.events)); n != 3 {
		t.Errorf("after the second run %d records were sent, want still 3", n)
	}
}

// TestRetryInputErrorHasNoProjectionHeader: a dead letter with
// projectionName "" (an input error no projection saw) is replayed without
// causet.replay.projection, so every projection sees it again.
func TestRetryInputErrorHasNoProjectionHeader(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	f.add(deadLetter{key: "user-1", fork: "production", tenant: "acme_prod", eventType: "E", class: retry.Permanent,
		err: retry.MarkPermanent(errors.New("invalid projection event: field \"ts\" is a string"))})
	if res, _ := f.retry(dlq.ReplayConfig{}); res.Replayed != 1 {
		t.Fatalf("result %s", res)
	}
	r := readTopic(t, b, f.events)[0]
	if v, ok := headerValue(r.Headers, dlq.HeaderReplayProjection); ok {
		t.Errorf("causet.replay.projection = %q, want no header", v)
	}
	if v, _ := headerValue(r.Headers, dlq.HeaderReplayCountOut); v != "1" {
		t.Errorf("causet.replay.count = %q, want 1", v)
	}
}

// TestRetryProduceFailureLeavesNoLedgerEntry fails the produce to the events
// topic (kfake): the run counts failed=1, the ledger has nothing for the
// entry, and the next run sends it.
func TestRetryProduceFailureLeavesNoLedgerEntry(t *testing.T) {
	b := kafkatest.Fake(t)
	f := newFixture(t, b, 3, 1)
	at := f.add(deadLetter{key: "user-1", fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	failProduce(t, b, f.events)

	res, outs := f.retry(dlq.ReplayConfig{})
	if got, want := res.String(), "matched=1 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=1"; got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	if len(outs) != 1 || !errors.Is(outs[0].Err, kerr.InvalidRecord) {
		t.Fatalf("outcomes %+v, want the produce error", outs)
	}
	if _, ok := f.openLedger(true).Lookup(at); ok {
		t.Fatal("ledger records an entry whose produce failed")
	}
	if res, _ := f.retry(dlq.ReplayConfig{}); res.Replayed != 1 {
		t.Fatalf("next run: %s, want it replayed", res)
	}
}

// failProduce makes kfake fail the next produce request that writes to
// topic with INVALID_RECORD (not retriable).
func failProduce(t testing.TB, b *kafkatest.Broker, topic string) {
	t.Helper()
	b.RefuseProduce(t, topic, kerr.InvalidRecord.Code, func(n int64) bool { return n == 1 })
}

func TestRetryRateLimit(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 2, 1)
	for i := range 6 {
		f.add(deadLetter{key: "user-" + strconv.Itoa(i), fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	}
	start := time.Now()
	res, _ := f.retry(dlq.ReplayConfig{Rate: 20})
	if res.Replayed != 6 {
		t.Fatalf("result %s", res)
	}
	// 6 records at 20/s: the last leaves 250 ms after the first.
	if d := time.Since(start); d < 240*time.Millisecond {
		t.Errorf("6 replays at 20/s took %s", d)
	}
}

func TestSkipNeedsReasonAndActor(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	_, _, err := f.run(dlq.ReplayConfig{Actor: "bob"}, (*dlq.Replayer).Skip)
	if err == nil {
		t.Fatal("skip without a reason: no error")
	}
}

func TestReplayConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  dlq.ReplayConfig
		want string
	}{
		{"zero", dlq.ReplayConfig{}, "events topic"},
		{"events topic only", dlq.ReplayConfig{EventsTopic: "e"}, ""},
		{"negative max replays", dlq.ReplayConfig{EventsTopic: "e", MaxReplays: -1}, "max replays"},
		{"negative rate", dlq.ReplayConfig{EventsTopic: "e", Rate: -1}, "rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error with %q", err, tt.want)
			}
			if err == nil && (tt.cfg.DLQTopic != dlq.DefaultTopic || tt.cfg.MaxReplays != dlq.DefaultMaxReplays || tt.cfg.RunID == "") {
				t.Errorf("Validate() left defaults unset: %+v", tt.cfg)
			}
		})
	}
}

func TestSummaryGroups(t *testing.T) {
	entries := []*dlq.Entry{
		// First failed at 500, dead-lettered at 3000 after its retries:
		// FIRST FAILED is when its first failure was (day-2 trial).
		{Projection: "a", TenantSchema: "t1", Fingerprint: "f1", Message: dlq.Message{Error: "boom 1\nmore", FirstFailedAt: 500, FailedAt: 3000}},
		{Projection: "a", TenantSchema: "t2", Fingerprint: "f1", Message: dlq.Message{Error: "boom 2", FailedAt: 1000}},
		{Projection: "b", TenantSchema: "t2", Fingerprint: "f2", Message: dlq.Message{Error: "bang", FailedAt: 2000}},
		{Projection: "c", TenantSchema: "t2", Fingerprint: "f3", Message: dlq.Message{Error: "bang", FailedAt: 4000}},
	}
	statuses := []string{dlq.ActionReplayed, dlq.ActionSkipped, "", dlq.ActionReplayed} // of entries, from the ledger
	tests := []struct {
		by   dlq.GroupBy
		want []dlq.Group
	}{
		{dlq.GroupByFingerprint, []dlq.Group{
			{Key: "f1", Count: 2, Replayed: 1, Skipped: 1, FirstFailedAt: 500, LastFailedAt: 3000, Projections: []string{"a"}, SampleError: "boom 1\nmore"},
			{Key: "f2", Count: 1, FirstFailedAt: 2000, LastFailedAt: 2000, Projections: []string{"b"}, SampleError: "bang"},
			{Key: "f3", Count: 1, Replayed: 1, FirstFailedAt: 4000, LastFailedAt: 4000, Projections: []string{"c"}, SampleError: "bang"},
		}},
		{dlq.GroupByTenant, []dlq.Group{
			{Key: "t2", Count: 3, Replayed: 1, Skipped: 1, FirstFailedAt: 1000, LastFailedAt: 4000, Projections: []string{"a", "b", "c"}, SampleError: "boom 2"},
			{Key: "t1", Count: 1, Replayed: 1, FirstFailedAt: 500, LastFailedAt: 3000, Projections: []string{"a"}, SampleError: "boom 1\nmore"},
		}},
		{dlq.GroupByError, []dlq.Group{
			{Key: "bang", Count: 2, Replayed: 1, FirstFailedAt: 2000, LastFailedAt: 4000, Projections: []string{"b", "c"}, SampleError: "bang"},
			{Key: "boom 1", Count: 1, Replayed: 1, FirstFailedAt: 500, LastFailedAt: 3000, Projections: []string{"a"}, SampleError: "boom 1\nmore"},
			{Key: "boom 2", Count: 1, Skipped: 1, FirstFailedAt: 1000, LastFailedAt: 1000, Projections: []string{"a"}, SampleError: "boom 2"},
		}},
	}
	for _, tt := range tests {
		t.Run(string(tt.by), func(t *testing.T) {
			s := dlq.NewSummary(tt.by)
			for i, e := range entries {
				s.Add(e, statuses[i])
			}
			if diff := cmp.Diff(tt.want, s.Groups()); diff != "" {
				t.Errorf("groups (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkScan writes 200,000 dead letters (about 1 KiB each, 8 partitions,
// 1% of them for projection "rare") and measures Scan with that selective
// header filter, Scan with --error-contains (1% match), Scan without a
// filter (every value decoded) and a Retry of the
// selection (fresh ledger each iteration): dead letters scanned per second,
// and replayed per second.
//
//	go test ./dlq -run '^$' -bench BenchmarkScan -benchtime 3x
func BenchmarkScan(b *testing.B) {
	const total, every = 200_000, 100
	br := kafkatest.New(b)
	f := newFixture(b, br, 8, 8)
	cl := br.Client(b, kgo.MaxBufferedRecords(50_000))
	stack := strings.Repeat("goroutine 42 [running]:\nprojection.(*TableProjection).Apply(...)\n\t/src/projection/table.go:120\n", 6)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var errs atomic.Int64
	for i := range total {
		proj, dbErr := "artist_followers", pgErr("42703", `column "followed_at" of relation "artist_followers" does not exist`)
		if i%every == 0 {
			proj, dbErr = "rare", pgErr("42P01", `relation "rare" does not exist`)
		}
		key := "user-" + strconv.Itoa(i)
		rec, err := dlq.NewRecord(dlq.DeadLetter{
			Source:     &kgo.Record{Topic: f.events, Partition: int32(i % 8), Offset: int64(i), Key: []byte(key), Value: event("production", "acme_prod", "ARTIST_FOLLOWED", key)},
			Projection: proj, TenantSchema: "acme_prod", ForkID: "production", EventType: "ARTIST_FOLLOWED",
			Err: dbErr, Stack: stack, Retries: 5,
		}, dlq.RecordConfig{Topic: f.dlqTopic}, t0.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs.Add(1)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil || errs.Load() > 0 {
		b.Fatalf("seeding: %v, %d failed", err, errs.Load())
	}
	filters := dlq.Filters{ForkID: "production", Projection: "rare"}

	b.Run("scan", func(b *testing.B) {
		var scanned, matched int64
		for b.Loop() {
			st, err := dlq.Scan(ctx, br.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: filters}, func(*dlq.Entry) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			scanned += st.Scanned
			matched += st.Matched
		}
		if scanned != int64(b.N)*total || matched != int64(b.N)*total/every {
			b.Fatalf("scanned %d, matched %d", scanned, matched)
		}
		b.ReportMetric(float64(scanned)/b.Elapsed().Seconds(), "scanned/s")
	})
	b.Run("scan-error-contains", func(b *testing.B) { // 1% match; the rest skipped on their raw bytes
		var scanned int64
		for b.Loop() {
			st, err := dlq.Scan(ctx, br.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: dlq.Filters{ErrorContains: "SQLSTATE 42P01"}}, func(*dlq.Entry) error { return nil })
			if err != nil || st.Matched != total/every {
				b.Fatalf("scan: %+v, %v", st, err)
			}
			scanned += st.Scanned
		}
		b.ReportMetric(float64(scanned)/b.Elapsed().Seconds(), "scanned/s")
	})
	b.Run("scan-all", func(b *testing.B) { // no filter: every value decoded
		var scanned int64
		for b.Loop() {
			st, err := dlq.Scan(ctx, br.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(*dlq.Entry) error { return nil })
			if err != nil || st.Matched != total {
				b.Fatalf("scan: %+v, %v", st, err)
			}
			scanned += st.Scanned
		}
		b.ReportMetric(float64(scanned)/b.Elapsed().Seconds(), "scanned/s")
	})
	b.Run("retry", func(b *testing.B) {
		var scanned, replayed int64
		for b.Loop() {
			b.StopTimer()
			f.ledger = kafkatest.TopicName(b, "ledger")
			l, err := dlq.OpenLedger(ctx, br.Opts(), dlq.LedgerConfig{Topic: f.ledger})
			if err != nil {
				b.Fatal(err)
			}
			r, err := dlq.NewReplayer(br.Opts(), l, dlq.ReplayConfig{EventsTopic: f.events, DLQTopic: f.dlqTopic, Filters: filters})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			res, err := r.Retry(ctx)
			if err != nil || res.Replayed != total/every {
				b.Fatalf("retry: %s, %v", res, err)
			}
			l.Close()
			scanned += res.Scan.Scanned
			replayed += int64(res.Replayed)
		}
		b.ReportMetric(float64(scanned)/b.Elapsed().Seconds(), "scanned/s")
		b.ReportMetric(float64(replayed)/b.Elapsed().Seconds(), "replayed/s")
	})
}

// ReplayRecord rebuilds the event of a dead letter for the events topic:
// the causet.dlq.* headers and those of an earlier replay are dropped, the
// replay headers added.
func ExampleReplayRecord() {
	e := &dlq.Entry{
		Partition: 2, Offset: 17, Key: []byte("user-123"), ReplayCount: 1, OriginalPartition: 5,
		Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			{Key: dlq.HeaderReplayCountOut, Value: []byte("1")},
			{Key: dlq.HeaderProjection, Value: []byte("artist_followers")},
		},
		Message: dlq.Message{
			OriginalEvent:  []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-123"}`),
			ProjectionName: "artist_followers",
			FirstFailedAt:  1719331200123,
		},
	}
	partition, fromHeader := dlq.NewReplayPartitioner(8).Partition(e.OriginalPartition, e.Key)
	rec := dlq.ReplayRecord(e, "causet.projection-events.v1", partition)
	fmt.Printf("%s[%d] (from header: %t) key=%s\n%s\n", rec.Topic, rec.Partition, fromHeader, rec.Key, rec.Value)
	for _, h := range rec.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	// Output:
	// causet.projection-events.v1[5] (from header: true) key=user-123
	// {"eventType":"ARTIST_FOLLOWED","entityId":"user-123"}
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// causet.replay.projection: artist_followers
	// causet.replay.source: 2:17
	// causet.replay.count: 2
	// causet.replay.first-failed-at: 1719331200123
}

func ExampleFilters_Match() {
	e := &dlq.Entry{ForkID: "production", Projection: "artist_followers",
		Message: dlq.Message{Error: `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`, FailedAt: 1719331200000}}
	since := time.UnixMilli(1719331200000)
	fmt.Println(dlq.Filters{ForkID: "production", Projection: "artist_followers"}.Match(e))
	fmt.Println(dlq.Filters{ErrorContains: "DOES NOT EXIST", Since: since}.Match(e))
	fmt.Println(dlq.Filters{ForkID: "production", Until: since}.Match(e))
	// Output:
	// true
	// true
	// false
}

func ExampleParseTimeBound() {
	now := time.Date(2024, 6, 26, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"24h", "2024-06-25T08:00:00-04:00"} {
		t, _ := dlq.ParseTimeBound(s, now)
		fmt.Println(t.UTC().Format(time.RFC3339))
	}
	// Output:
	// 2024-06-25T12:00:00Z
	// 2024-06-25T12:00:00Z
}

func ExampleSummary() {
	s := dlq.NewSummary(dlq.GroupByProjection)
	for _, e := range []*dlq.Entry{
		{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719331200000}},
		{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719334800000}},
		{Projection: "artist_ratings", Message: dlq.Message{Error: "derive stars: division by zero", FailedAt: 1719338400000}},
	} {
		s.Add(e, "") // no ledger decision
	}
	for _, g := range s.Groups() {
		fmt.Println(g.Count, g.Replayed, g.Skipped, g.Key, g.FirstFailedAt, g.LastFailedAt, g.SampleError)
	}
	// Output:
	// 2 0 0 artist_followers 1719331200000 1719334800000 ERROR: column "followed_at" does not exist (SQLSTATE 42703)
	// 1 0 0 artist_ratings 1719338400000 1719338400000 derive stars: division by zero
}

// A dlq-replayer run in code: open the ledger, then retry what a filter
// selects and print the summary line.
func ExampleReplayer_Retry() {
	ctx := context.Background()
	opts := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")}
	ledger, err := dlq.OpenLedger(ctx, opts, dlq.LedgerConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ledger.Close()
	r, err := dlq.NewReplayer(opts, ledger, dlq.ReplayConfig{
		Filters: dlq.Filters{ForkID: "production", Projection: "artist_followers"},
		Actor:   "alice",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := r.Retry(ctx)
	fmt.Println(res, err) // matched=N replayed=N skipped=N already-replayed=N already-skipped=N refused=N failed=N
}

// Scan reads the dead-letter topic up to the end offsets it lists when it
// starts, and passes on the dead letters the filters select.
func ExampleScan() {
	opts := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")}
	st, err := dlq.Scan(context.Background(), opts, dlq.ScanConfig{
		Filters: dlq.Filters{TenantSchema: "acme_concertapp_production", Since: time.Now().Add(-24 * time.Hour)},
	}, func(e *dlq.Entry) error {
		fmt.Println(e.Coordinates(), e.Projection, e.Message.Error)
		return nil
	})
	fmt.Println(st.Scanned, st.Matched, err)
}

// TestRetryRefusesADeadLetterOfAnotherTopic: a dead letter first read from
// another topic than EventsTopic (another worker's, sharing the dead-letter
// topic, or --topic forgotten) is refused with the fix, never sent to
// EventsTopic silently; Force sends it all the same.
func TestRetryRefusesADeadLetterOfAnotherTopic(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 4, 2)
	f.add(deadLetter{key: "user-1", fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
		projection: "artist_followers", originalPartition: 1, topic: "other.events"})
	res, outs := f.retry(dlq.ReplayConfig{Actor: "alice", RunID: "run-1"})
	if res.String() != "matched=1 replayed=0 skipped=0 already-replayed=0 already-skipped=0 refused=1 failed=0" {
		t.Fatalf("result = %s", res)
	}
	if len(outs) != 1 || !strings.Contains(outs[0].Reason, `first read from topic "other.events"`) || !strings.Contains(outs[0].Reason, "--topic other.events") {
		t.Errorf("outcomes = %+v, want the refusal naming the topic and --topic", outs)
	}
	if got := readTopic(t, b, f.events); len(got) != 0 {
		t.Fatalf("events topic has %d records, want none", len(got))
	}
	res, _ = f.retry(dlq.ReplayConfig{Actor: "alice", RunID: "run-2", Force: true})
	if res.String() != "matched=1 replayed=1 skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0" {
		t.Fatalf("with Force: result = %s", res)
	}
}
