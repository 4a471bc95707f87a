package projection

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"
)

// openRecords returns n open records from offset 1000 on, every other
// offset (the ones between finished), each with a pending pair of one of
// two projections, failed a few ms apart, and the retries made by every
// third.
func openRecords(n int) ([]*recordState, map[pairKey]int) {
	var open []*recordState
	retried := map[pairKey]int{}
	t0 := time.UnixMilli(1_733_150_000_000)
	for i := range n {
		off := int64(1000 + 2*i)
		name := []string{"artist_ratings", "user_follows"}[i%2]
		open = append(open, &recordState{d: &decoded{rec: &kgo.Record{Offset: off}}, pending: map[string]time.Time{name: t0.Add(time.Duration(i*7) * time.Millisecond)}})
		if i%3 == 0 {
			retried[pairKey{off, name}] = 1 + i%5
		}
	}
	return open, retried
}

// TestHandoffHoldsHundredsOfOpenRecords: the hand-off of 300 open records
// fits in Kafka's default 4096 bytes of metadata and reads back as written
// (second new-user trial: the first format held 42, and the finished
// records after the 42nd were processed, and dead-lettered, again); one of
// more records than fit hands off a prefix, UpTo before the first left out.
func TestHandoffHoldsHundredsOfOpenRecords(t *testing.T) {
	open, retried := openRecords(300)
	last := &kgo.Record{Offset: 2000}
	h := newHandoff(open, last, retried)
	if h.UpTo != 2000 || len(h.Open) != 300 {
		t.Fatalf("hand-off of 300 open records: upTo %d, %d open; want 2000, 300", h.UpTo, len(h.Open))
	}
	meta := h.metadata()
	if len(meta) > maxHandoffBytes {
		t.Fatalf("metadata of 300 open records is %d bytes, over %d", len(meta), maxHandoffBytes)
	}
	got, ok := parseHandoff(meta, 1000)
	if !ok {
		t.Fatalf("parseHandoff(%.200s...) failed", meta)
	}
	if diff := cmp.Diff(*h, got); diff != "" {
		t.Errorf("read back (-written +read):\n%s", diff)
	}
	t.Logf("300 open records: %d bytes (%.1f a record)", len(meta), float64(len(meta))/300)

	open, retried = openRecords(2000)
	h = newHandoff(open, &kgo.Record{Offset: 6000}, retried)
	meta = h.metadata()
	n := len(h.Open)
	if len(meta) > maxHandoffBytes || n < 300 || n == 2000 {
		t.Fatalf("hand-off of 2000 open records: %d bytes, %d records; want at most %d bytes, a prefix of 300 or more", len(meta), n, maxHandoffBytes)
	}
	t.Logf("2000 open records: %d handed off in %d bytes", n, len(meta))
	if want := int64(1000+2*n) - 1; h.UpTo != want {
		t.Errorf("upTo %d, want %d (before the first open record left out)", h.UpTo, want)
	}
	if got, ok := parseHandoff(meta, 1000); !ok || len(got.Open) != n || got.UpTo != h.UpTo {
		t.Errorf("read back: %v, %d open, upTo %d", ok, len(got.Open), got.UpTo)
	}
}

// TestParseHandoffReadsBothFormatsAndRefusesOthers: an older owner's
// hand-off (v1, JSON maps) still reads; a hand-off for another offset, or
// one whose pairs do not add up, is none.
func TestParseHandoffReadsBothFormatsAndRefusesOthers(t *testing.T) {
	v1 := handoffPrefix + `{"offset":5,"upTo":9,"open":{"5":{"p":1733150000000},"7":{"":1733150000100}},"retries":{"5":{"p":2}}}`
	got, ok := parseHandoff(v1, 5)
	want := handoff{Offset: 5, UpTo: 9, Open: map[string]map[string]int64{"5": {"p": 1733150000000}, "7": {"": 1733150000100}}, Retries: map[string]map[string]int{"5": {"p": 2}}}
	if !ok || !cmp.Equal(got, want) {
		t.Errorf("v1: %v, %+v; want %+v", ok, got, want)
	}
	if got, ok := parseHandoff(want.metadata(), 5); !ok || !cmp.Equal(got, want) {
		t.Errorf("v2 of the same: %v, %+v", ok, got)
	}
	for _, bad := range []string{
		want.metadata(), // for offset 5, read at 6
		handoffPrefixV2 + `{"offset":6,"upTo":9,"names":["p"],"pairs":[0,0,1]}`,     // not 4 a pair
		handoffPrefixV2 + `{"offset":6,"upTo":9,"names":["p"],"pairs":[0,1,1,0]}`,   // no name 1
		handoffPrefixV2 + `{"offset":6,"upTo":9,"names":["p"],"pairs":[4,0,1,0]}`,   // offset 10 past upTo
		handoffPrefixV2 + `{"offset":6,"upTo":9,"names":["p"],"pairs":[0,0,1,-1]}`,  // retries below 0
		handoffPrefixV2 + `{"offset":6,"upTo":5,"names":[],"pairs":[]}`,             // upTo before offset
		"causet.handoff.v3:" + strings.TrimPrefix(want.metadata(), handoffPrefixV2), // unknown format
	} {
		if h, ok := parseHandoff(bad, 6); ok {
			t.Errorf("parseHandoff(%s, 6) = %+v, want none", bad, h)
		}
	}
}
