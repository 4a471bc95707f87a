package projection

import (
	"context"
	"fmt"
	"strings"
)

// migrateLockKey is the pg_advisory_xact_lock key that serialises Migrate
// runs across processes, so that two migrations of one tenant schema do not
// race on CREATE SCHEMA/TABLE IF NOT EXISTS (which can fail with 23505 when
// run concurrently). It spells "causetmg" in ASCII.
const migrateLockKey = 0x6361757365746d67

// Migrate creates what defs needs in tenantSchema (SPEC §4,
// `projection-worker migrate --tenant-schema S`): the schema, the tombstone
// side table _causet_tombstones, each projection's table (primary key
// columns NOT NULL, PRIMARY KEY, _causet_seq bigint NOT NULL DEFAULT 0) and
// every column that is missing (ALTER TABLE ... ADD COLUMN IF NOT EXISTS,
// NOT NULL when notNull). It never drops or alters an existing column: a
// column whose type changed must be migrated by hand, and adding a notNull
// column to a table that has rows fails with 23502 (PostgreSQL's "column
// contains null values").
//
// The statements are sent in one multi-statement query (pgx's simple
// protocol, used for Exec without arguments), which PostgreSQL runs as one
// transaction, or inside the caller's transaction when db is a pgx.Tx; they
// hold a transaction-level advisory lock so concurrent runs queue up. The
// worker never calls Migrate on its own.
//
// It returns an error naming tenantSchema when it is not a valid identifier
// (^[a-z_][a-z0-9_]{0,62}$), is one of PostgreSQL's own schemas (public,
// information_schema, pg_*; see ValidTenantSchema), or defs do not
// validate, before touching db.
func Migrate(ctx context.Context, db DB, defs *Definitions, tenantSchema string) error {
	sql, err := MigrationSQL(defs, tenantSchema)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("migrate tenant schema %s: %w", tenantSchema, err)
	}
	return nil
}

// MigrationSQL returns the statements Migrate runs, separated by ";\n", for
// review (a dry run) or for a migration tool. It validates tenantSchema and
// defs as Migrate does.
func MigrationSQL(defs *Definitions, tenantSchema string) (string, error) {
	if err := tenantSchemaError(tenantSchema); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	if defs == nil {
		return "", fmt.Errorf("migrate tenant schema %s: no projection definitions", tenantSchema)
	}
	if err := defs.Validate(); err != nil {
		return "", fmt.Errorf("migrate tenant schema %s: %w", tenantSchema, err)
	}
	schema := ident(tenantSchema)
	stmts := []string{
		fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", migrateLockKey),
		"CREATE SCHEMA IF NOT EXISTS " + schema,
		"CREATE TABLE IF NOT EXISTS " + schema + "." + ident(tombstoneTable) +
			" (table_name text NOT NULL, pk text[] NOT NULL, " + seqColumn + " bigint NOT NULL," +
			" PRIMARY KEY (table_name, pk))",
	}
	for _, pd := range defs.Projections {
		// Validate checked every name and type used below.
		table := schema + "." + ident(pd.Table)
		isKey := map[string]bool{}
		var keys []string
		for _, k := range pd.PrimaryKey {
			isKey[k] = true
			keys = append(keys, ident(k))
		}
		var defsSQL, adds []string
		for _, name := range pd.ColumnNames {
			col := pd.Columns[name]
			d := ident(name) + " " + col.Type
			if col.NotNull || isKey[name] {
				d += " NOT NULL"
			}
			defsSQL = append(defsSQL, d)
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+d)
		}
		seq := seqColumn + " bigint NOT NULL DEFAULT 0"
		defsSQL = append(defsSQL, seq, "PRIMARY KEY ("+strings.Join(keys, ", ")+")")
		adds = append(adds, "ADD COLUMN IF NOT EXISTS "+seq)
		stmts = append(stmts,
			"CREATE TABLE IF NOT EXISTS "+table+" ("+strings.Join(defsSQL, ", ")+")",
			"ALTER TABLE "+table+" "+strings.Join(adds, ", "))
	}
	return strings.Join(stmts, ";\n"), nil
}
