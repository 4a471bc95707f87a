package soak

import "testing"

// TestCheckFinalCountsExplainedDuplicatesApart: a pair's dead letter
// written twice is a violation unless a fault explains it (an abrupt death,
// a client rewind, a timed-out write attempt), and then it is counted on
// its own row.
func TestCheckFinalCountsExplainedDuplicatesApart(t *testing.T) {
	tests := []struct {
		name    string
		explain func(m *Model, id PairID)
		bad     int
	}{
		{"unexplained", func(*Model, PairID) {}, 1},
		{"write timed out", func(m *Model, id PairID) { m.WriteTimedOut(id) }, 0},
		{"client rewind", func(m *Model, id PairID) { m.Rewound(id.Partition, id.Offset-1) }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewModel()
			r := &Record{Value: []byte("x"), Kind: "poison:not-json", Invalid: true, Partition: 2, Offset: 7}
			m.Add(r)
			id := PairID{Partition: 2, Offset: 7}
			dl := func(failedAt string) DeadLetter {
				return DeadLetter{Pair: id, Worker: "w1", Class: "permanent", Value: []byte(`{"failedAt":` + failedAt + `}`)}
			}
			tt.explain(m, id)
			f := CheckFinal(m, State{}, []DeadLetter{dl("1"), dl("2")}, map[int32]int64{2: 8},
				func(string) bool { return false }, func(DeadLetter, []byte) error { return nil })
			if len(f.Violations) != tt.bad {
				t.Errorf("violations = %v, want %d", f.Violations, tt.bad)
			}
			explained := len(f.TimedOutDuplicates) + len(f.RewoundDuplicates)
			if tt.bad == 0 && (explained != 1 || len(f.Duplicates) != 0) {
				t.Errorf("explained %v %v, unexplained %v", f.TimedOutDuplicates, f.RewoundDuplicates, f.Duplicates)
			}
		})
	}
}
