// Package projection turns projection events into rows: it decodes and
// validates events (SPEC §3), loads projection definitions (SPEC §4), applies
// them to PostgreSQL as upserts and deletes, and runs the consumer-group worker
// loop that retries and dead-letters failures (SPEC §5).
package projection

import (
	"strconv"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// Event is a decoded, validated projection event (SPEC §3).
//
// The whole event object is kept as read by the decoder (a
// jsonstrict.Tree: numbers keep their exact text; they are never converted
// to float64), unknown fields included; Fields and Payload return it as
// map[string]any trees. Build an Event with DecodeEvent.
type Event struct {
	// Raw is the record value, verbatim.
	Raw []byte
	// EventType, EntityID and ForkID are non-empty.
	EventType string
	EntityID  string
	ForkID    string
	// TenantSchema matches ^[a-z_][a-z0-9_]{0,62}$; it is a PostgreSQL schema
	// name from the wire and is always quoted with pgx.Identifier.
	TenantSchema string
	// IRVersion is the IR version the event was produced for (may be "").
	IRVersion string
	// SequenceNumber is ≥ 0; it orders the events of one entity.
	SequenceNumber int64
	// TS is the event time in epoch milliseconds, inside PostgreSQL's
	// timestamptz range.
	TS int64

	tree    *jsonstrict.Tree // the event object, node 0
	payload int32            // the payload object's node in tree

	// seqArg and tsArg are what every statement Plan makes of the event
	// takes, made once for all its projections (prepareArgs; nil until
	// then): the sequence number's text and ts as a timestamptz's text.
	seqArg, tsArg any
}

// prepareArgs sets ev.seqArg and ev.tsArg. processBatch calls it before
// the first Plan of ev, in the goroutine that decoded it (Plan only reads
// them), so that an event of several projections formats them once.
func (ev *Event) prepareArgs() {
	ev.seqArg = strconv.FormatInt(ev.SequenceNumber, 10)
	if inTimeRange(kindTimestamptz, ev.TS) {
		ev.tsArg = formatMillis(ev.TS, false)
	}
}

// Fields returns the whole event object as a tree of map[string]any, []any,
// string, bool, nil and encoding/json.Number (the number's exact text),
// built anew on each call; nil for an Event not made by DecodeEvent.
func (ev *Event) Fields() map[string]any {
	if ev.tree == nil {
		return nil
	}
	m, _ := ev.tree.Any(0).(map[string]any)
	return m
}

// Payload returns the payload object as Fields does.
func (ev *Event) Payload() map[string]any {
	if ev.tree == nil {
		return nil
	}
	m, _ := ev.tree.Any(ev.payload).(map[string]any)
	return m
}
