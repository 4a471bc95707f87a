package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
)

// TestScanTerminatesWhileDeadLettersKeepArriving appends dead letters from a
// goroutine during the whole scan: Scan stops at the end offsets it listed
// when it started.
func TestScanTerminatesWhileDeadLettersKeepArriving(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 3)
	for i := range 300 {
		f.add(deadLetter{key: "user-" + strconv.Itoa(i), fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	}

	ctx, stop := context.WithCancel(testCtx(t))
	var appended atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by this test; exits when stop is called
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			rec, err := dlq.NewRecord(dlq.DeadLetter{
				Source:     &kgo.Record{Topic: f.events, Key: []byte("late-" + strconv.Itoa(i)), Value: event("production", "acme_prod", "E", "late")},
				Projection: "p", Err: errors.New("boom"),
			}, dlq.RecordConfig{Topic: f.dlqTopic}, time.Now())
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := f.cl.ProduceSync(ctx, rec).First(); err == nil {
				appended.Add(1)
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()
	for appended.Load() < 20 {
		time.Sleep(time.Millisecond)
	}

	var progressCalls int
	var lastScanned, lastTotal int64
	before := appended.Load()
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Progress: func(scanned, total int64) {
		progressCalls++
		lastScanned, lastTotal = scanned, total
	}}, func(e *dlq.Entry) error {
		time.Sleep(50 * time.Microsecond) // let the writer get ahead
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after := appended.Load()
	if st.Scanned < 300+before || st.Scanned > 300+after || st.Scanned != st.Matched {
		t.Errorf("stats %+v: want %d..%d scanned, all matched", st, 300+before, 300+after)
	}
	if progressCalls < 2 || lastScanned != lastTotal || lastTotal != st.Scanned {
		t.Errorf("progress: %d calls, last %d/%d, scanned %d", progressCalls, lastScanned, lastTotal, st.Scanned)
	}
	if after == before {
		t.Log("the writer appended nothing during the scan")
	}
}

// TestScanProgressMovesWithEachRecordRead: the dead letters of one
// partition arrive in one fetch, yet Progress reports every record read
// (0, 1, ..., n of n), so a progress bar moves during a long fetch instead
// of jumping from 0 % to 100 % (issue 12).
func TestScanProgressMovesWithEachRecordRead(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	const n = 50
	for i := range n {
		f.add(deadLetter{key: "user-" + strconv.Itoa(i), fork: "production", tenant: "acme_prod", eventType: "E", projection: "p"})
	}
	var got []int64
	var seenAtEntry []int64 // the progress reported when each entry is passed on
	_, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Progress: func(scanned, total int64) {
		if total != n {
			t.Errorf("progress total %d, want %d", total, n)
		}
		got = append(got, scanned)
	}}, func(e *dlq.Entry) error {
		seenAtEntry = append(seenAtEntry, got[len(got)-1])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int64, n+1)
	for i := range want {
		want[i] = int64(i)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[:n], seenAtEntry); diff != "" {
		t.Errorf("progress when each entry is passed on (-want +got):\n%s", diff)
	}
}

func TestScanEntryFields(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 4, 1)
	first := t0.Add(-time.Hour)
	at := f.add(deadLetter{key: "user-1", fork: "production", tenant: "acme_prod", eventType: "ARTIST_FOLLOWED",
		projection: "artist_followers", originalPartition: 2, replayCount: 1, firstFailedAt: first})
	var got []*dlq.Entry
	if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("got %d entries", len(got))
	}
	e := got[0]
	type fields struct {
		Coords                                                    dlq.Coordinates
		Key, Projection, Tenant, Fork, EventType, Class, SQLState string
		OriginalPartition                                         int32
		ReplayCount, RetryCount                                   int
		FailedAt, FirstFailedAt                                   time.Time
		HasEvent                                                  bool
	}
	want := fields{at, "user-1", "artist_followers", "acme_prod", "production", "ARTIST_FOLLOWED", "projection", "42703",
		2, 1, 5, t0, first, true}
	gotf := fields{e.Coordinates(), string(e.Key), e.Projection, e.TenantSchema, e.ForkID, e.EventType, e.ErrorClass, e.SQLState,
		e.OriginalPartition, e.ReplayCount, e.Message.RetryCount, e.FailedAt().UTC(), e.FirstFailedAt().UTC(), e.HasOriginalEvent()}
	if diff := cmp.Diff(want, gotf); diff != "" {
		t.Errorf("entry (-want +got):\n%s", diff)
	}
	if len(e.Fingerprint) != 16 {
		t.Errorf("fingerprint %q", e.Fingerprint)
	}
}

// TestScanSkipsRecordsThatAreNotDeadLetters: a value that is not JSON,
// and a JSON object without a dead letter's error and failedAt (an event:
// new-user trial, --dlq-topic naming the events topic listed its events
// as dead letters with empty fields), are not dead letters.
func TestScanSkipsRecordsThatAreNotDeadLetters(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	f.add(deadLetter{key: "user-1", projection: "p"})
	f.produce(&kgo.Record{Topic: f.dlqTopic, Value: []byte("garbage")})
	f.produce(&kgo.Record{Topic: f.dlqTopic, Value: event("production", "acme_prod", "E", "user-9")})
	f.add(deadLetter{key: "user-2", projection: "p"})
	var keys []string
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		keys = append(keys, string(e.Key))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"user-1", "user-2"}, keys); diff != "" || st.Undecodable != 2 || st.Scanned != 4 {
		t.Errorf("keys (-want +got):\n%s\nstats %+v", diff, st)
	}
}

func TestScanStop(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	for i := range 5 {
		f.add(deadLetter{key: "user-" + strconv.Itoa(i), projection: "p"})
	}
	n := 0
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		n++
		if n == 2 {
			return dlq.ErrStopScan
		}
		return nil
	})
	if err != nil || n != 2 || st.Matched != 2 {
		t.Errorf("stopped scan: err %v, %d calls, stats %+v", err, n, st)
	}
	boom := errors.New("boom")
	if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(*dlq.Entry) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("callback error: got %v", err)
	}
}

func TestScanEmptyAndMissingTopics(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 3)
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(*dlq.Entry) error { return nil })
	if err != nil || st.Scanned != 0 {
		t.Errorf("empty topic: %+v, %v", st, err)
	}
	_, err = dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: kafkatest.TopicName(t, "missing")}, func(*dlq.Entry) error { return nil })
	if !errors.Is(err, dlq.ErrTopicNotFound) {
		t.Errorf("missing topic: got %v, want ErrTopicNotFound", err)
	}
}

func TestParseCoordinates(t *testing.T) {
	tests := []struct {
		in      string
		want    dlq.Coordinates
		wantErr bool
	}{
		{"0:0", dlq.Coordinates{}, false},
		{"3:1891", dlq.Coordinates{Partition: 3, Offset: 1891}, false},
		{"3", dlq.Coordinates{}, true},
		{"-1:2", dlq.Coordinates{}, true},
		{"1:x", dlq.Coordinates{}, true},
		{"", dlq.Coordinates{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := dlq.ParseCoordinates(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseCoordinates(%q) = %v, %v", tt.in, got, err)
			}
			if err == nil && got.String() != tt.in {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
}

// TestScanErrorContainsDecodesWhatTheBytesHide: --error-contains skips
// values whose bytes lack the text, but not values where an escape or a
// non-ASCII character could spell it once decoded.
func TestScanErrorContainsDecodesWhatTheBytesHide(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	want := []dlq.Coordinates{
		f.add(deadLetter{key: "kelvin", projection: "p", err: errors.New("bad \u212Aey")}), // KELVIN SIGN lower-cases to k
		f.add(deadLetter{key: "control", projection: "p", err: errors.New("\x01Key")}),     // written as \u0001Key
		f.add(deadLetter{key: "plain", projection: "p", err: errors.New("missing KEY")}),
	}
	f.add(deadLetter{key: "other", projection: "p", err: errors.New("boom")})
	escaped := dlq.Message{OriginalEvent: []byte(`{"a":1}`), ProjectionName: "p", Error: "x", FailedAt: 1}
	v, err := escaped.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	v = bytes.Replace(v, []byte(`"error":"x"`), []byte(`"error":"\u006bey"`), 1) // another writer's escapes
	want = append(want, f.produce(&kgo.Record{Topic: f.dlqTopic, Value: v}))

	for _, needle := range []string{"KEY", "key"} {
		var got []dlq.Coordinates
		if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: dlq.Filters{ErrorContains: needle}}, func(e *dlq.Entry) error {
			got = append(got, e.Coordinates())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("--error-contains %s (-want +got):\n%s", needle, diff)
		}
	}
}

// TestScanLogsTheFirstRecordsThatAreNotDeadLetters: of a topic of records
// that are not dead letters (a --dlq-topic naming another topic), the
// first ten are logged one by one, then one line says the rest are
// counted, and a line at the end counts them all.
func TestScanLogsTheFirstRecordsThatAreNotDeadLetters(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 1, 1)
	for i := range 15 {
		f.produce(&kgo.Record{Topic: f.dlqTopic, Value: event("production", "acme_prod", "E", "user-"+strconv.Itoa(i))})
	}
	var logged bytes.Buffer
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Logger: slog.New(slog.NewTextHandler(&logged, nil))},
		func(*dlq.Entry) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	out := logged.String()
	if n := strings.Count(out, "record is not a dead-letter message; ignored"); n != 10 || st.Undecodable != 15 ||
		strings.Count(out, "more records that are not dead-letter messages") != 1 ||
		!strings.Contains(out, "records that are not dead-letter messages were ignored") || !strings.Contains(out, "ignored=15") {
		t.Errorf("%d lines one by one (want 10), %d undecodable (want 15); log:\n%s", n, st.Undecodable, out)
	}
}

// TestScanFiltersByALabelTheHeaderCut: --fork-id and --event-type select
// the dead letters of a forkId or eventType longer than a header holds
// (cut to its first bytes and "…[truncated N bytes]"), and only those,
// read whole from the original event (replayer trial: a 320-byte forkId's
// dead letters matched no filter but the cut text); without the original
// event, the cut text matches the labels it was cut from.
func TestScanFiltersByALabelTheHeaderCut(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 4, 1)
	fork, eventType := strings.Repeat("longfork", 40), strings.Repeat("E", 300)
	twin := fork[:len(fork)-1] + "X" // the same first bytes and length
	at := f.add(deadLetter{key: "k1", fork: fork, tenant: "acme_prod", eventType: eventType, projection: "artist_followers"})
	f.add(deadLetter{key: "k2", fork: twin, tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
	f.add(deadLetter{key: "k3", fork: fork[:300], tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
	for _, tt := range []struct {
		f    dlq.Filters
		want []dlq.Coordinates
	}{
		{dlq.Filters{ForkID: fork}, []dlq.Coordinates{at}},
		{dlq.Filters{EventType: eventType}, []dlq.Coordinates{at}},
		{dlq.Filters{ForkID: fork, EventType: eventType}, []dlq.Coordinates{at}},
		{dlq.Filters{ForkID: fork[:len(fork)-1]}, nil},
		{dlq.Filters{EventType: eventType + "E"}, nil},
	} {
		var got []dlq.Coordinates
		if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: tt.f}, func(e *dlq.Entry) error {
			if len(e.ForkID) < 300 {
				t.Errorf("entry %s: fork %q, want it whole", e.Coordinates(), e.ForkID)
			}
			got = append(got, e.Coordinates())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("fork %d bytes, event type %d bytes: selected %v, want %v", len(tt.f.ForkID), len(tt.f.EventType), got, tt.want)
		}
	}
}

// TestLabelMatchesACutHeader: a label's cut header text matches the
// labels it can have been cut from, and no other.
func TestLabelMatchesACutHeader(t *testing.T) {
	long := strings.Repeat("ü", 160) // 320 bytes: cut on a rune boundary
	h := dlq.CapLabel(long)
	if !strings.HasSuffix(h, " bytes]") || len(h) > 256 {
		t.Fatalf("CapLabel = %q", h)
	}
	for _, tt := range []struct {
		want string
		ok   bool
	}{
		{long, true},
		{long[:len(long)-2] + "ab", true}, // the same kept bytes and length: the header cannot tell
		{long[:len(long)-2], false},
		{long + "x", false},
		{"x" + long[1:], false},
		{h, true},
	} {
		if got := dlq.LabelMatches(h, tt.want); got != tt.ok {
			t.Errorf("LabelMatches(cut, %d bytes %q…) = %v, want %v", len(tt.want), tt.want[:4], got, tt.ok)
		}
	}
	// A label of 256 bytes or fewer that ends like a cut one is itself.
	own := "fork…[truncated 999 bytes]"
	if dlq.LabelMatches(own, "fork"+strings.Repeat("x", 999)) || !dlq.LabelMatches(own, own) {
		t.Errorf("a short label ending like a cut one matched what it was not")
	}
}

// TestScanRecomputesAFingerprintHeaderThatIsNotOne: a causet.dlq.fingerprint
// header that is not 16 hex digits is replaced by the fingerprint
// recomputed from the message, which selects the dead letter (replayer
// trial: summary showed NOTHEX, which --fingerprint refuses).
func TestScanRecomputesAFingerprintHeaderThatIsNotOne(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 1)
	good := f.add(deadLetter{key: "k1", fork: "production", tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
	var want string
	if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		want = e.Fingerprint
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d := deadLetter{key: "k2", fork: "production", tenant: "acme_prod", eventType: "E", projection: "artist_followers"}
	rec := f.record(d)
	for i, h := range rec.Headers {
		if h.Key == dlq.HeaderFingerprint {
			rec.Headers[i].Value = []byte("NOTHEX")
		}
	}
	bad := f.produce(rec)
	var got []dlq.Coordinates
	if _, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic, Filters: dlq.Filters{Fingerprint: want}}, func(e *dlq.Entry) error {
		got = append(got, e.Coordinates())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []dlq.Coordinates{good, bad}) {
		t.Errorf("fingerprint %s selected %v, want %v", want, got, []dlq.Coordinates{good, bad})
	}
}

// TestADeadLetterWithAMalformedOmittedHeaderIsListedNotReplayed: a dead
// letter whose causet.dlq.original-omitted header is malformed is an entry
// (listed, counted, matched by --all as by any filter) that retry refuses
// with the header named, not a record ignored as "not a dead-letter
// message" (replayer trial: summary --all left it out while a filter on
// its headers counted it as a dead letter).
func TestADeadLetterWithAMalformedOmittedHeaderIsListedNotReplayed(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 1)
	rec := f.record(deadLetter{key: "k1", fork: "production", tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: dlq.HeaderOriginalOmitted, Value: []byte("whatever")})
	at := f.produce(rec)
	var got []*dlq.Entry
	st, err := dlq.Scan(testCtx(t), b.Opts(), dlq.ScanConfig{Topic: f.dlqTopic}, func(e *dlq.Entry) error {
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Undecodable != 0 || len(got) != 1 || got[0].HeaderError == nil || !strings.Contains(got[0].HeaderError.Error(), `header causet.dlq.original-omitted "whatever"`) {
		t.Fatalf("scan: %+v, entries %d; want the dead letter as an entry with its header error", st, len(got))
	}
	res, outs := f.retry(dlq.ReplayConfig{})
	if res.Refused != 1 || len(outs) != 1 || outs[0].Entry.Coordinates() != at || !strings.Contains(outs[0].Reason, "cannot be replayed; skip it") {
		t.Errorf("retry: %s %+v; want it refused, naming the header", res, outs)
	}
	if recs := readTopic(t, b, f.events); len(recs) != 0 {
		t.Errorf("%d events sent, want none", len(recs))
	}
}

// TestADeadLetterWhoseHeadersTheMessageContradictsIsNotReplayed: a dead
// letter made by hand whose causet.dlq.projection or tenant-schema header
// says another projection or tenant than its message is listed, and retry
// refuses it (replayer trial: selected as user_follows by its header, it
// would have been replayed as artist_followers); the worker's own dead
// letters agree, and are replayed.
func TestADeadLetterWhoseHeadersTheMessageContradictsIsNotReplayed(t *testing.T) {
	b := kafkatest.New(t)
	f := newFixture(t, b, 3, 1)
	f.add(deadLetter{key: "k0", fork: "production", tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
	for _, h := range []struct{ key, value string }{{dlq.HeaderProjection, "user_follows"}, {dlq.HeaderTenantSchema, "tenant_zzz"}} {
		rec := f.record(deadLetter{key: "k-" + h.value, fork: "production", tenant: "acme_prod", eventType: "E", projection: "artist_followers"})
		for i := range rec.Headers {
			if rec.Headers[i].Key == h.key {
				rec.Headers[i].Value = []byte(h.value)
			}
		}
		f.produce(rec)
	}
	res, outs := f.retry(dlq.ReplayConfig{Filters: dlq.Filters{ForkID: "production"}})
	if res.Replayed != 1 || res.Refused != 2 {
		t.Fatalf("retry: %s; want the worker's dead letter replayed, the two contradicted refused", res)
	}
	var reasons []string
	for _, o := range outs {
		if o.Kind == dlq.OutcomeRefused {
			reasons = append(reasons, o.Reason)
		}
	}
	for i, want := range []string{`header causet.dlq.projection "user_follows" and the message's projectionName "artist_followers" disagree`, `header causet.dlq.tenant-schema "tenant_zzz" and the message's tenantSchema "acme_prod" disagree`} {
		if !strings.Contains(reasons[i], want) {
			t.Errorf("refusal %d: %q, want it to say %q", i, reasons[i], want)
		}
	}
}
