package soak

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStrictJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"object", `{"a":1,"b":{"a":[1,{"a":2}]}}`, true},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, true},
		{"escaped backslash before u", `{"a":"\\ud800"}`, true},
		{"lone high surrogate", `{"a":"\ud800x"}`, false},
		{"lone low surrogate", `{"a":"\udc00"}`, false},
		{"high then high", `{"a":"\ud800\ud800"}`, false},
		{"duplicate key", `{"a":1,"a":2}`, false},
		{"duplicate nested key", `{"a":{"b":1,"b":2}}`, false},
		{"same key in two objects", `[{"a":1},{"a":2}]`, true},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", false},
		{"not JSON", `{"a":`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := StrictJSON([]byte(tc.in)); (err == nil) != tc.ok {
				t.Errorf("StrictJSON(%s) = %v, want ok %v", tc.in, err, tc.ok)
			}
		})
	}
}

// TestCheckFinal checks the final comparison on a hand-made model: a pair
// newer than its row and not dead-lettered is lost unless no commit passed
// it; a worker's own duplicate is never excused, another owner's after an
// abrupt death is.
func TestCheckFinal(t *testing.T) {
	key := RowKey{TenantMain, "ratings", "a1", "u1"}
	m := NewModel()
	rate := func(off int64, seq int64, stars string) *Record {
		return &Record{Partition: 0, Offset: off, Kind: "rate", Value: []byte("{}"), Pairs: []Pair{
			{Projection: "ratings", Row: key, Seq: seq, Columns: map[string]string{"stars": stars}},
		}}
	}
	m.Add(rate(0, 1, "1"))
	m.Add(rate(1, 2, "2"))
	m.Add(rate(2, 3, "3"))
	m.Add(&Record{Partition: 0, Offset: 3, Kind: "poison:not-json", Invalid: true, Value: []byte("x")})
	st := State{Rows: map[RowKey]Row{key: {Seq: 2, Columns: map[string]string{"stars": "2"}}}, Tombs: map[RowKey]int64{}}
	dl := func(off int64, proj, worker string) DeadLetter {
		return DeadLetter{Pair: PairID{0, off, proj}, Worker: worker, Class: "permanent"}
	}
	noCheck := func(DeadLetter, []byte) error { return nil }
	abrupt := func(w string) bool { return w == "dead" }

	for _, tc := range []struct {
		name      string
		committed int64
		dls       []DeadLetter
		lost      int
		unproc    int
		dups      map[string]int
		inFlight  map[string]int
	}{
		{"record 2 and the invalid record lost", 4, nil, 2, 0, map[string]int{}, map[string]int{}},
		{"behind the committed offset: unprocessed", 2, nil, 0, 2, map[string]int{}, map[string]int{}},
		{"dead-lettered", 4, []DeadLetter{dl(2, "ratings", "w1"), dl(3, "", "w1")}, 0, 0, map[string]int{}, map[string]int{}},
		{"own duplicate", 4, []DeadLetter{dl(2, "ratings", "dead"), dl(2, "ratings", "dead"), dl(3, "", "w1")}, 0, 0,
			map[string]int{"permanent, same worker": 1}, map[string]int{}},
		{"next owner after an abrupt death", 4, []DeadLetter{dl(2, "ratings", "dead"), dl(2, "ratings", "w2"), dl(3, "", "w1")}, 0, 0,
			map[string]int{}, map[string]int{"permanent, across workers": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := CheckFinal(m, st, tc.dls, map[int32]int64{0: tc.committed}, abrupt, noCheck)
			got := []any{f.Lost, f.Unprocessed, f.Duplicates, f.InFlightDuplicates}
			want := []any{tc.lost, tc.unproc, tc.dups, tc.inFlight}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("lost, unprocessed, duplicates, in flight (-want +got):\n%s\nviolations: %v", diff, f.Violations)
			}
		})
	}
}
