package projection

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a Handler needs of PostgreSQL. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Outcome is the result of applying one event to one projection.
type Outcome int

const (
	// Applied means the event changed (or re-wrote) the projection.
	Applied Outcome = iota
	// Stale means the projection already holds a newer sequence number for the
	// row (or a newer tombstone); the event was a successful no-op.
	Stale
)

// Handler applies events to one projection. The YAML/JSON projections of a
// definitions file are one implementation (*TableProjection); a projection
// written in Go is any type that implements Handler.
//
// Apply must be idempotent: the worker may apply the same event again after a
// rebalance or a restart. An error it returns is classified by retry.Classify;
// return an error marked with retry.MarkPermanent when retrying cannot help.
type Handler interface {
	// Name is the projection's name, unique in a worker (projectionName in
	// dead letters).
	Name() string
	// Handles reports whether events of eventType are applied by this
	// projection.
	Handles(eventType string) bool
	// Apply applies ev inside ev.TenantSchema.
	Apply(ctx context.Context, db DB, ev *Event) (Outcome, error)
}
