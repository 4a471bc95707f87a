package soak

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/projection"
)

// AuditProjection is the soak's projection written in Go (a
// projection.Handler that is not a table projection of the definitions
// file): it records that a user rated an artist, in AuditTable. It panics
// on a payload with "explode": true, the handler panic of SPEC §5.
const (
	AuditProjection = "rating_audit"
	AuditTable      = "rating_audit"
)

// StatementTimeout is the soak database's statement_timeout, and
// SlowStatement how long the audit statement of a "slow" rating sleeps:
// longer, so that it fails with 57014 at every attempt.
const (
	StatementTimeout = 3 * time.Second
	SlowStatement    = 4 * time.Second
)

// Audit is the AuditProjection handler. It is applied one pair at a time
// (it does not implement projection.Planner); PlanningAudit does.
type Audit struct{}

// Name implements projection.Handler.
func (Audit) Name() string { return AuditProjection }

// Handles implements projection.Handler: ARTIST_RATED only.
func (Audit) Handles(eventType string) bool { return eventType == "ARTIST_RATED" }

// Apply upserts (user_id, artist_id) with the event's sequence number, only
// over an older row; it panics on "explode" or "explode_plan".
func (a Audit) Apply(ctx context.Context, db projection.DB, ev *projection.Event) (projection.Outcome, error) {
	st := a.statement(ev)
	tag, err := db.Exec(ctx, st.SQL, st.Args...)
	if err != nil {
		return projection.Applied, err
	}
	return st.Outcome(tag), nil
}

func (Audit) statement(ev *projection.Event) projection.Statement {
	payload := ev.Payload()
	if payload["explode"] == true || payload["explode_plan"] == true {
		panic(fmt.Sprintf("soak: poison rating of %s (sequence number %d)", ev.EntityID, ev.SequenceNumber))
	}
	user, _ := payload["user_id"].(string)
	artist, _ := payload["artist_id"].(string)
	t := pgx.Identifier{ev.TenantSchema, AuditTable}.Sanitize()
	from := ""
	if payload["slow"] == true {
		// Longer than the soak database's statement_timeout: 57014 at
		// every attempt.
		from = " FROM pg_sleep(" + strconv.Itoa(int(SlowStatement/time.Second)) + ")"
	}
	return projection.Statement{
		SQL: "INSERT INTO " + t + " AS a (user_id, artist_id, _causet_seq) SELECT $1::text, $2::text, $3::text::bigint" + from +
			" ON CONFLICT (user_id, artist_id) DO UPDATE SET _causet_seq = EXCLUDED._causet_seq WHERE a._causet_seq <= EXCLUDED._causet_seq",
		Args: []any{user, artist, fmt.Sprint(ev.SequenceNumber)},
	}
}

// PlanningAudit is Audit applied in batches: it implements
// projection.Planner, and its Plan panics on "explode_plan" (issue 8
// finding 4: a panic in Plan must not kill the process).
type PlanningAudit struct{ Audit }

// Plan implements projection.Planner.
func (a PlanningAudit) Plan(ev *projection.Event) (projection.Statement, error) {
	return a.statement(ev), nil
}

// AuditTableSQL creates AuditTable in tenant (the worker never changes DDL;
// the soak migrates it with the tenant's other tables).
// ratingsStarsMax is the largest stars RatingsCheckSQL lets through; the
// stream's good ratings stay far below it.
const ratingsStarsMax = 1_000_000

// RatingsCheckSQL adds to tenant's ratings table a CHECK constraint the
// definitions do not know of (stars at most ratingsStarsMax), so that the
// stream's "23514" poison is refused by PostgreSQL alone, inside a COPY
// group, never at plan time. It is written with a function, LEAST, which
// the worker does not evaluate from the catalog (as it does a plain
// comparison such as stars <= ratingsStarsMax, sending the rows it refuses
// to statements, a path the soak's 22003 and 23502 poison take already):
// the failed COPY group and its isolation stay under the faults.
func RatingsCheckSQL(tenant string) string {
	limit := strconv.Itoa(ratingsStarsMax)
	return "ALTER TABLE " + pgx.Identifier{tenant, "ratings"}.Sanitize() +
		" ADD CONSTRAINT soak_stars_max CHECK (LEAST(stars, " + limit + " + 1) <= " + limit + ")"
}

func AuditTableSQL(tenant string) string {
	return "CREATE TABLE IF NOT EXISTS " + pgx.Identifier{tenant, AuditTable}.Sanitize() +
		" (user_id text NOT NULL, artist_id text NOT NULL, _causet_seq bigint NOT NULL DEFAULT 0, PRIMARY KEY (user_id, artist_id))"
}
