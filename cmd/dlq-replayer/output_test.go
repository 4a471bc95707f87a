package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/causet/projection-worker/dlq"
)

func TestSummaryTableAlignsGroupsLargestFirst(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByProjection)
	for _, e := range []*dlq.Entry{
		{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719331200000}},
		{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719334800000}},
		{Projection: "artist_ratings", Message: dlq.Message{Error: "derive stars: division by zero\nat line 2", FailedAt: 1719338400000}},
	} {
		s.Add(e)
	}
	var b strings.Builder
	if err := writeSummaryTable(&b, s); err != nil {
		t.Fatal(err)
	}
	want := `COUNT  FIRST FAILED          LAST FAILED           PROJECTION        PROJECTIONS       SAMPLE ERROR
2      2024-06-25T16:00:00Z  2024-06-25T17:00:00Z  artist_followers  artist_followers  ERROR: column "followed_at" does not exist (SQLSTATE 42703)
1      2024-06-25T18:00:00Z  2024-06-25T18:00:00Z  artist_ratings    artist_ratings    derive stars: division by zero
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestCellCutsLongAndControlCharacters(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"a\tb\nc", 10, "a b c"},
		{"ümlautsüber", 5, "ümla…"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := cell(tt.in, tt.n); got != tt.want {
				t.Errorf("cell(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
		})
	}
}
