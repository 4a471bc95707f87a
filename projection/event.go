// Package projection turns projection events into rows: it decodes and
// validates events (SPEC §3), loads projection definitions (SPEC §4), applies
// them to PostgreSQL as upserts and deletes, and runs the consumer-group worker
// loop that retries and dead-letters failures (SPEC §5).
package projection

// Event is a decoded, validated projection event (SPEC §3).
//
// Fields holds the whole event object as a tree of map[string]any, []any,
// string, bool, nil and encoding/json.Number (numbers keep their exact text;
// they are never converted to float64 on decoding). Unknown fields are kept.
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
	// Fields is the whole event object.
	Fields map[string]any
	// Payload is Fields["payload"].
	Payload map[string]any
}
