package dlq

import "fmt"

// OutcomeKind is what happened to one selected dead letter.
type OutcomeKind string

// Outcome kinds. Their names are the counters of the summary line.
const (
	// OutcomeReplayed: republished and acknowledged, then recorded in the
	// ledger (in a dry run: would be republished).
	OutcomeReplayed OutcomeKind = "replayed"
	// OutcomeSkipped: the skip was recorded (Skip), or the ledger says
	// "skipped" (Outcome.Decided; Retry: not sent; Skip: the first decision
	// kept), counted as Result.AlreadySkipped.
	OutcomeSkipped OutcomeKind = "skipped"
	// OutcomeAlreadyReplayed: the ledger says "replayed" (Retry: and
	// IncludeReplayed is off), so it was not sent (Retry) or not marked
	// skipped (Skip).
	OutcomeAlreadyReplayed OutcomeKind = "already-replayed"
	// OutcomeRefused: not sent because the event was replayed MaxReplays
	// times already (without Force), or because originalEvent is null.
	OutcomeRefused OutcomeKind = "refused"
	// OutcomeFailed: the produce, or the ledger write after it, failed.
	OutcomeFailed OutcomeKind = "failed"
)

// Outcome reports what Retry or Skip did with one selected dead letter.
type Outcome struct {
	Entry *Entry
	Kind  OutcomeKind
	// DryRun is set when nothing was sent or recorded.
	DryRun bool
	// Decided is set when the ledger's earlier decision stands: a skipped
	// outcome that this run neither recorded nor would record.
	Decided bool
	// Topic and Partition are where the event was (or would be, or failed
	// to be) republished; Partition is -1 when nothing was to be sent.
	Topic     string
	Partition int32
	// FromHeader reports that Partition came from the
	// causet.dlq.original-partition header (else: murmur2 of the key).
	FromHeader bool
	// Reason explains a refusal, a skip or a failure.
	Reason string
	// Err is the produce or ledger error of a failure.
	Err error
}

// Result counts the outcomes of a Retry or Skip run.
type Result struct {
	Matched         int
	Replayed        int
	Skipped         int
	AlreadyReplayed int
	// AlreadySkipped counts the dead letters the ledger had skipped before
	// the run (OutcomeSkipped with Decided): not sent (Retry), the first
	// decision kept (Skip). Skipped counts only this run's skips.
	AlreadySkipped int
	Refused        int
	Failed         int
	// Action is what the run does to the selected dead letters:
	// OutcomeReplayed for Retry, OutcomeSkipped for Skip.
	Action OutcomeKind
	// DryRun is set when nothing was sent or recorded; the counter of
	// Action (Replayed for Retry, Skipped for Skip) then counts what would
	// have been.
	DryRun bool
	// Scan is what was read from the dead-letter topic.
	Scan ScanStats
}

// CounterNames returns the names of the replayed and skipped counters:
// "replayed" and "skipped", except in a dry run, where the counter of what
// would have been done is "would-replay" (Retry) or "would-skip" (Skip).
func (r Result) CounterNames() (replayed, skipped string) {
	replayed, skipped = "replayed", "skipped"
	if r.DryRun {
		switch r.Action {
		case OutcomeReplayed:
			replayed = "would-replay"
		case OutcomeSkipped:
			skipped = "would-skip"
		}
	}
	return replayed, skipped
}

// NotDone returns how many matched dead letters have no outcome: those a
// run that stopped before the end (an error, or interrupted) had selected
// but had neither finished nor recorded (sent and not yet acknowledged,
// waiting for --rate, or in a batch not yet written). 0 for a run that
// reached the end.
func (r Result) NotDone() int {
	return r.Matched - (r.Replayed + r.Skipped + r.AlreadyReplayed + r.AlreadySkipped + r.Refused + r.Failed)
}

// String returns the summary line
// "matched=N replayed=N skipped=N already-replayed=N already-skipped=N
// refused=N failed=N", the counters adding up to matched, and then
// " not-done=N" when NotDone is not 0 (a run stopped before the end; new-user
// trial: an interrupted retry said matched=121 replayed=120 and nothing
// else).
// In a dry run the counter of what would have been done is named for it:
// "would-replay=N" in place of "replayed=N" (Retry), "would-skip=N" in
// place of "skipped=N" (Skip).
func (r Result) String() string {
	replayed, skipped := r.CounterNames()
	line := fmt.Sprintf("matched=%d %s=%d %s=%d already-replayed=%d already-skipped=%d refused=%d failed=%d",
		r.Matched, replayed, r.Replayed, skipped, r.Skipped, r.AlreadyReplayed, r.AlreadySkipped, r.Refused, r.Failed)
	if n := r.NotDone(); n != 0 {
		line += fmt.Sprintf(" not-done=%d", n)
	}
	return line
}

func (r *Result) count(o Outcome) {
	switch o.Kind {
	case OutcomeReplayed:
		r.Replayed++
	case OutcomeSkipped:
		if o.Decided { // the ledger's decision, not this run's (new-user trial: a second skip said skipped=1)
			r.AlreadySkipped++
		} else {
			r.Skipped++
		}
	case OutcomeAlreadyReplayed:
		r.AlreadyReplayed++
	case OutcomeRefused:
		r.Refused++
	case OutcomeFailed:
		r.Failed++
	}
}
