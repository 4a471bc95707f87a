package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPeerRowsAreJSONWithTheirSchema checks the flat records of the peer
// benchmark: valid JSON whose schema names exactly the payload's fields (the
// table's columns, _causet_seq included), and, for a poisoned event, a score
// the bigint column rejects.
func TestPeerRowsAreJSONWithTheirSchema(t *testing.T) {
	d := newDataset(2*poisonEvery, derivePoison)
	wantCols := [tables][]string{
		{"artist_id", "user_id", "followed_at", "score", "source", "_causet_seq"},
		{"user_id", "artist_id", "fork_id", "followed_at", "tier", "device", "_causet_seq"},
		{"artist_id", "user_id", "stars", "review", "rated_at", "_causet_seq"},
	}
	seen := map[string]bool{}
	for i := range d.events {
		e := &d.events[i]
		rows := []int{2}
		if e.typ == followed {
			rows = []int{0, 1}
		}
		for _, tbl := range rows {
			var rec struct {
				Schema struct {
					Name   string `json:"name"`
					Fields []struct {
						Field string `json:"field"`
						Type  string `json:"type"`
					} `json:"fields"`
				} `json:"schema"`
				Payload map[string]any `json:"payload"`
			}
			raw := appendRow(nil, e, tbl)
			if err := json.Unmarshal(raw, &rec); err != nil {
				t.Fatalf("event %d, table %s: %v\n%s", i, tableNames[tbl], err, raw)
			}
			var cols []string
			types := map[string]string{}
			for _, f := range rec.Schema.Fields {
				cols = append(cols, f.Field)
				types[f.Field] = f.Type
			}
			if diff := cmp.Diff(wantCols[tbl], cols); diff != "" || rec.Schema.Name != tableNames[tbl] {
				t.Fatalf("event %d: schema %q fields (-want +got):\n%s", i, rec.Schema.Name, diff)
			}
			if len(rec.Payload) != len(cols) {
				t.Fatalf("event %d, table %s: payload has %d fields, schema %d", i, tableNames[tbl], len(rec.Payload), len(cols))
			}
			if tbl == 0 {
				want := map[bool]string{false: "int64", true: "string"}[e.poisonedPair(projFollowers)]
				if types["score"] != want || (e.poisonedPair(projFollowers) && rec.Payload["score"] != "NaN") {
					t.Fatalf("event %d (poisoned %t): score %s %v", i, e.poisonedPair(projFollowers), types["score"], rec.Payload["score"])
				}
				seen[want] = true
			}
		}
	}
	if !seen["int64"] || !seen["string"] {
		t.Fatalf("the sample holds no clean or no poisoned artist_followers row: %v", seen)
	}
}

// TestPollNext: runWorker reads /metrics every 100 ms until the rest
// should take less than 200 ms at the rate so far, then at half that,
// down to 5 ms.
func TestPollNext(t *testing.T) {
	for _, tt := range []struct {
		done, pairs int64
		took, want  time.Duration
	}{
		{0, 1000, 0, pollEvery},                              // nothing yet
		{500, 1000, time.Second, pollEvery},                  // half: 1 s to go
		{900, 1000, time.Second, 55555555 * time.Nanosecond}, // 111 ms to go
		{999, 1000, time.Second, 5 * time.Millisecond},       // 1 ms to go
		{1000, 1000, time.Second, pollEvery},                 // done
	} {
		if got := pollNext(tt.done, tt.pairs, tt.took); got != tt.want {
			t.Errorf("pollNext(%d, %d, %s) = %s, want %s", tt.done, tt.pairs, tt.took, got, tt.want)
		}
	}
}
