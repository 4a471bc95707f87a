package soak

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Report is the soak's one table.
type Report struct {
	Seed                     uint64
	Duration                 time.Duration // fault phase
	Drain                    time.Duration // from the last fault to drained (or the bound)
	Events, Pairs            int
	Faults                   map[string]int
	Refusals                 map[string]int // requests the broker refused or left unanswered, by answer
	Lost                     int
	Unprocessed              int // pairs a stalled partition never reached
	CommitsChecked           int
	CommitViolations         int
	CommitsLate              int
	DeadLetters              int
	DeadLettersByCause       map[string]int
	GoodDeadLettered         map[string]int
	ExpectedGoodDeadLettered map[string]int // by a cause the faults explain
	Duplicates               map[string]int
	InFlightDuplicates       map[string]int
	RewoundDuplicates        map[string]int
	TimedOutDuplicates       map[string]int
	Stalls                   []string
	LongestRecovery          time.Duration
	LongestRecoveryAfter     string // the fault kind it followed
	Violations               []Violation
	InstancesStarted, Killed int
	// SpansEnded counts the instances' spans (every record and pair traced).
	SpansEnded int64
}

// Failed reports whether any invariant was broken.
func (r *Report) Failed() bool { return len(r.Violations) > 0 || len(r.Stalls) > 0 }

// Print writes the table, then the violations (at most max of each kind).
func (r *Report) Print(w io.Writer, max int) {
	row := func(k, v string) { fmt.Fprintf(w, "| %-30s | %s\n", k, v) }
	fmt.Fprintf(w, "\n| %-30s | %s\n|%s|%s\n", "soak", "measured", strings.Repeat("-", 32), strings.Repeat("-", 60))
	row("seed", fmt.Sprintf("%d (SOAK_SEED=%d)", r.Seed, r.Seed))
	row("duration", fmt.Sprintf("%s faults + %s drain", r.Duration.Round(time.Second), r.Drain.Round(time.Second)))
	row("events / pairs", fmt.Sprintf("%d / %d", r.Events, r.Pairs))
	row("instances started / killed", fmt.Sprintf("%d / %d", r.InstancesStarted, r.Killed))
	if r.SpansEnded > 0 {
		row("spans ended", fmt.Sprint(r.SpansEnded))
	}
	row("faults injected", counts(r.Faults))
	row("  broker answers", counts(r.Refusals))
	row("lost (invariant 1)", fmt.Sprintf("%d (and %d pairs behind a stall, never committed)", r.Lost, r.Unprocessed))
	row("good pairs dead-lettered", counts(r.GoodDeadLettered))
	row("  as the faults explain", counts(r.ExpectedGoodDeadLettered))
	row("commits checked (invariant 2)", fmt.Sprintf("%d (%d covered records produced a moment later)", r.CommitsChecked, r.CommitsLate))
	row("commit violations", fmt.Sprint(r.CommitViolations))
	row("dead letters", fmt.Sprintf("%d: %s", r.DeadLetters, counts(r.DeadLettersByCause)))
	row("duplicate dead letters (3)", counts(r.Duplicates))
	row("  in flight at abrupt death", counts(r.InFlightDuplicates))
	row("  after a client rewind", counts(r.RewoundDuplicates))
	row("  after a write timed out", counts(r.TimedOutDuplicates))
	row("stalls (invariant 4)", fmt.Sprint(len(r.Stalls)))
	row("longest recovery", fmt.Sprintf("%s (after %s)", r.LongestRecovery.Round(100*time.Millisecond), or(r.LongestRecoveryAfter, "-")))
	byKind := map[string]int{}
	for _, v := range r.Violations {
		byKind[fmt.Sprintf("%d %s", v.Invariant, v.Kind)]++
	}
	row("violations", fmt.Sprintf("%d: %s", len(r.Violations), counts(byKind)))
	verdict := "PASS"
	if r.Failed() {
		verdict = "FAIL"
	}
	row("result", verdict)
	shown := map[string]int{}
	for _, v := range r.Violations {
		k := fmt.Sprintf("%d %s", v.Invariant, v.Kind)
		if shown[k]++; shown[k] <= max {
			fmt.Fprintf(w, "  %s\n", v)
		}
	}
	for _, s := range r.Stalls {
		fmt.Fprintf(w, "  stall: %s\n", s)
	}
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// counts renders a count map as "k=n k=n", largest first; "0" when empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
