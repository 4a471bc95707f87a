package dlq

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// GroupBy is how Summary groups dead letters.
type GroupBy string

// Summary groupings (dlq-replayer summary --by).
const (
	GroupByFingerprint GroupBy = "fingerprint"
	GroupByProjection  GroupBy = "projection"
	GroupByTenant      GroupBy = "tenant"
	GroupByError       GroupBy = "error"
)

// ParseGroupBy returns the grouping named s: fingerprint, projection, tenant
// or error.
func ParseGroupBy(s string) (GroupBy, error) {
	switch g := GroupBy(s); g {
	case GroupByFingerprint, GroupByProjection, GroupByTenant, GroupByError:
		return g, nil
	}
	return "", fmt.Errorf("%q is not fingerprint, projection, tenant or error", s)
}

// Group is one row of a summary.
type Group struct {
	// Key is the fingerprint, projection, tenant schema or first line of the
	// error message the group shares.
	Key string `json:"key"`
	// Count is the number of dead letters in the group.
	Count int `json:"count"`
	// Replayed and Skipped count the dead letters of the group whose newest
	// ledger decision is ActionReplayed or ActionSkipped; the others
	// (Count − Replayed − Skipped) have none.
	Replayed int `json:"replayed"`
	Skipped  int `json:"skipped"`
	// FirstFailedAt is the smallest firstFailedAt (epoch ms) in the group,
	// when its earliest pair first failed (failedAt for a dead letter
	// without one), and LastFailedAt the largest failedAt, when its latest
	// dead letter was written (day-2 trial: FIRST FAILED was the earliest
	// failedAt, seconds of retries after the first failure).
	FirstFailedAt int64 `json:"firstFailedAt"`
	LastFailedAt  int64 `json:"lastFailedAt"`
	// Projections are the projections in the group, sorted.
	Projections []string `json:"projections"`
	// SampleError is the error of the group's first dead letter.
	SampleError string `json:"sampleError"`
}

// Summary counts dead letters by group. Add entries, then read Groups.
type Summary struct {
	by     GroupBy
	groups map[string]*Group
	projs  map[string]map[string]bool
}

// NewSummary returns an empty summary grouping by by.
func NewSummary(by GroupBy) *Summary {
	return &Summary{by: by, groups: map[string]*Group{}, projs: map[string]map[string]bool{}}
}

// Add counts e in its group, with ledgerStatus the action of its newest
// ledger decision (Ledger.Status: ActionReplayed, ActionSkipped, or "" for
// none).
func (s *Summary) Add(e *Entry, ledgerStatus string) {
	var key string
	switch s.by {
	case GroupByProjection:
		key = e.Projection
	case GroupByTenant:
		key = e.TenantSchema
	case GroupByError:
		key = firstLine(e.Message.Error)
	default:
		key = e.Fingerprint
	}
	g := s.groups[key]
	if g == nil {
		g = &Group{Key: key, FirstFailedAt: firstFailedAt(e), LastFailedAt: e.Message.FailedAt, SampleError: e.Message.Error}
		s.groups[key] = g
		s.projs[key] = map[string]bool{}
	}
	g.Count++
	switch ledgerStatus {
	case ActionReplayed:
		g.Replayed++
	case ActionSkipped:
		g.Skipped++
	}
	g.FirstFailedAt = min(g.FirstFailedAt, firstFailedAt(e))
	g.LastFailedAt = max(g.LastFailedAt, e.Message.FailedAt)
	if !s.projs[key][e.Projection] {
		s.projs[key][e.Projection] = true
		g.Projections = append(g.Projections, e.Projection)
	}
}

// firstFailedAt is e's firstFailedAt, or its failedAt when that is
// earlier or the first is unset (0).
func firstFailedAt(e *Entry) int64 {
	if f := e.Message.FirstFailedAt; f > 0 && f < e.Message.FailedAt {
		return f
	}
	return e.Message.FailedAt
}

// Groups returns the groups, largest first (ties by key).
func (s *Summary) Groups() []Group {
	out := make([]Group, 0, len(s.groups))
	for _, g := range s.groups {
		c := *g
		c.Projections = slices.Clone(g.Projections)
		slices.Sort(c.Projections)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Group) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out
}

// By returns the grouping of the summary.
func (s *Summary) By() GroupBy { return s.by }

// firstLine is the first line of s, trimmed: the key of GroupByError.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}
