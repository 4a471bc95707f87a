package projection

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/retry"
)

// migrateLockKey is the pg_advisory_xact_lock key that serialises Migrate
// runs across processes, so that two migrations of one tenant schema do not
// race on CREATE SCHEMA/TABLE IF NOT EXISTS (which can fail with 23505 when
// run concurrently). It spells "causetmg" in ASCII.
const migrateLockKey = 0x6361757365746d67

// MigrateDB is what Migrate needs of the database: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx satisfy it.
type MigrateDB interface {
	DB
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Migrate creates what defs needs in tenantSchema (SPEC §4,
// `projection-worker migrate --tenant-schema S`) and nothing else: it looks
// at the catalog first and runs only the statements for what is missing —
// the schema, the tombstone side table _causet_tombstones, each
// projection's table (primary key columns NOT NULL, PRIMARY KEY,
// _causet_seq bigint NOT NULL DEFAULT 0) and each missing column (ALTER
// TABLE ... ADD COLUMN, NOT NULL when notNull). So a migration with nothing
// to do needs no privilege beyond reading the catalog: neither CREATE on
// the database (the schema exists) nor ownership of the tables (no ALTER
// TABLE). It never drops or alters an existing column: a column whose type
// changed must be migrated by hand, and adding a notNull column to a table
// that has rows fails with 23502 (PostgreSQL's "column contains null
// values").
//
// It runs in one transaction (db's own when db is a pgx.Tx) holding a
// transaction-level advisory lock, so concurrent runs queue up and the
// catalog cannot change between the look and the statements. The worker
// never calls Migrate on its own.
//
// It returns an error naming tenantSchema when it is not a valid identifier
// (^[a-z_][a-z0-9_]{0,62}$), is one of PostgreSQL's own schemas (public,
// information_schema, pg_*; see ValidTenantSchema), or defs do not
// validate, before touching db.
func Migrate(ctx context.Context, db MigrateDB, defs *Definitions, tenantSchema string) error {
	_, err := MigrateChanges(ctx, db, defs, tenantSchema)
	return err
}

// MigrateChanges is Migrate that also returns what it changed, in order:
// "created the schema", "created table <table>", "added to table <table>
// column(s) <a>, <b>"; none when tenantSchema already had everything defs
// need (what Migrate leaves as it is, Drift reports). On an error nothing
// was changed (one transaction) and changes is nil.
func MigrateChanges(ctx context.Context, db MigrateDB, defs *Definitions, tenantSchema string) (changes []string, err error) {
	if err := checkMigration(defs, tenantSchema); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			changes, err = nil, fmt.Errorf("migrate tenant schema %s: %w", tenantSchema, err)
		}
	}()
	if b, ok := db.(Beginner); ok {
		tx, err := b.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		changes, err := migrate(ctx, tx, defs, tenantSchema)
		if err != nil {
			return nil, err
		}
		return changes, tx.Commit(ctx)
	}
	return migrate(ctx, db, defs, tenantSchema)
}

func migrate(ctx context.Context, db MigrateDB, defs *Definitions, tenantSchema string) ([]string, error) {
	if _, err := db.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockKey)); err != nil {
		return nil, err
	}
	var schemaExists bool
	columns := map[string]map[string]bool{} // table -> its columns
	// Every relation of the schema: a name a view (or an index, a
	// sequence...) holds is not created as a table, nor said to be
	// (new-user trial: "created table artist_followers" on every run over
	// a view of that name; Drift reports it).
	rows, err := db.Query(ctx, `SELECT n.nspname IS NOT NULL, c.relname, c.relkind IN ('r', 'p'), a.attname
		FROM (SELECT 1) one
		LEFT JOIN pg_namespace n ON n.nspname = $1
		LEFT JOIN pg_class c ON c.relnamespace = n.oid
		LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped`, tenantSchema)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var table, column *string
		var isTable *bool
		if err := rows.Scan(&schemaExists, &table, &isTable, &column); err != nil {
			rows.Close()
			return nil, err
		}
		if table != nil && !*isTable {
			columns[*table] = map[string]bool{notATable: true}
			continue
		}
		if table != nil {
			if columns[*table] == nil {
				columns[*table] = map[string]bool{}
			}
			if column != nil {
				columns[*table][*column] = true
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var changes []string
	for _, step := range migrationStatements(defs, tenantSchema, schemaExists, columns) {
		if _, err := db.Exec(ctx, step.sql); err != nil {
			if retry.SQLState(err) == "23502" && strings.Contains(step.sql, "ADD COLUMN") {
				// A notNull column new to a table with rows (new-user trial:
				// PostgreSQL's error alone).
				return nil, fmt.Errorf("%w: a notNull column cannot be added to a table that has rows: add it without notNull, migrate, fill it, then ALTER TABLE ... ALTER COLUMN ... SET NOT NULL and add notNull back (nothing of this tenant schema was migrated)", err)
			}
			return nil, err
		}
		changes = append(changes, step.what)
	}
	return changes, nil
}

// TableDrift is one way a table of a tenant schema differs from its
// definition in what Migrate leaves as it is.
type TableDrift struct {
	Table  string
	Column string // "" for the table itself
	// Problem says what differs and what to do, for example "the table's
	// type is integer, the definitions' bigint (...)".
	Problem string
	// Blocks reports that the worker cannot write the table so: every
	// upsert of it would fail (no primary key, another one, not a table,
	// a NOT NULL column it does not fill).
	Blocks bool
}

func (d TableDrift) String() string {
	if d.Column == "" {
		return d.Table + ": " + d.Problem
	}
	return d.Table + "." + d.Column + ": " + d.Problem
}

// driftTableSQL is the kind of relation $1 is (pg_class.relkind) and its
// primary key columns in key order; no row when it does not exist.
const driftTableSQL = `SELECT c.relkind::text, coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord)
		FROM pg_catalog.pg_index i
		CROSS JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = c.oid AND i.indisprimary), '{}')
	FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1)`

// driftRequiredSQL is the columns of table $1 that an INSERT must fill: NOT
// NULL, without a default, not an identity or generated column.
const driftRequiredSQL = `SELECT a.attname FROM pg_catalog.pg_attribute a
	WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
	ORDER BY a.attnum`

// Drift returns how the tables of defs in tenantSchema differ from the
// definitions in what Migrate leaves as it is (it only creates schemas,
// tables and missing columns), by projection in the file's order:
//   - blocking (TableDrift.Blocks), since every upsert of the table would
//     fail: a relation of the table's name that is not a table (a view);
//     a table without the definitions' primary key, or with another one
//     (the upsert's ON CONFLICT needs it: 42P10); a NOT NULL column
//     without a default that the definitions do not fill (23502);
//     a column of another type than the definitions' that PostgreSQL
//     cannot write the definitions' type into (no assignment cast, 42804:
//     jsonb into numeric, text into timestamptz) or, for a primary-key
//     column, compare with it (42883: uuid = text), as writeCheck finds;
//   - not blocking: a column whose type, as PostgreSQL's format_type
//     spells it, is not the definitions' (another type, or a modifier such
//     as numeric(10,2)), which PostgreSQL converts; a notNull column that
//     the table lets be NULL. A
//     table made stricter by hand (integer for bigint, NOT NULL added) is
//     reported too: the worker reads such a table's catalog and leaves
//     what it would refuse to statements (README), so it may be meant.
//
// A table or column that does not exist is none (Migrate makes it). It
// returns a catalog query's error.
func Drift(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, defs *Definitions, tenantSchema string) ([]TableDrift, error) {
	var out []TableDrift
	for _, pd := range defs.Projections {
		qualified := pgx.Identifier{tenantSchema, pd.Table}.Sanitize()
		fail := func(err error) ([]TableDrift, error) {
			return nil, fmt.Errorf("drift of %s.%s: %w", tenantSchema, pd.Table, err)
		}
		rows, err := db.Query(ctx, driftTableSQL, qualified)
		if err != nil {
			return fail(err)
		}
		var kind string
		var pk []string
		found := false
		if _, err := pgx.ForEachRow(rows, []any{&kind, &pk}, func() error { found = true; return nil }); err != nil {
			return fail(err)
		}
		if !found {
			continue // Migrate makes it
		}
		if kind != "r" && kind != "p" {
			out = append(out, TableDrift{Table: pd.Table, Blocks: true,
				Problem: fmt.Sprintf("a relation of kind %q (pg_class.relkind; v is a view), not a table: the worker cannot upsert into it; drop or rename it, then migrate again", kind)})
			continue
		}
		switch want := strings.Join(pd.PrimaryKey, ", "); {
		case len(pk) == 0:
			out = append(out, TableDrift{Table: pd.Table, Blocks: true,
				Problem: fmt.Sprintf("no primary key, the definitions' is (%s): every upsert fails (42P10, ON CONFLICT needs it); ALTER TABLE ... ADD PRIMARY KEY (%s)", want, want)})
		case !sameSet(pk, pd.PrimaryKey): // ON CONFLICT infers the index from the set of its columns
			out = append(out, TableDrift{Table: pd.Table, Blocks: true,
				Problem: fmt.Sprintf("primary key (%s) in the table, (%s) in the definitions: every upsert fails (42P10); change one of them to the other", strings.Join(pk, ", "), want)})
		}
		cols, err := readColumns(ctx, db, qualified)
		if err != nil {
			return fail(err)
		}
		for _, name := range pd.ColumnNames {
			def, cat := pd.Columns[name], cols[name]
			if cat.typ == "" {
				continue // no such column: Migrate adds it
			}
			if kindOf(def.Type) != cat.kind || cat.length > 0 || cat.precision > 0 || !cat.known {
				key := slices.Contains(pd.PrimaryKey, name)
				switch err := writeCheck(ctx, db, qualified, name, def.Type, key); {
				case err == nil:
					out = append(out, TableDrift{Table: pd.Table, Column: name,
						Problem: fmt.Sprintf("the table's type is %s, the definitions' %s (migrate changes no column's type: ALTER TABLE it by hand if the definitions are right)", cat.typ, def.Type)})
				case strings.HasPrefix(retry.SQLState(err), "42"):
					// Definition-author trial: jsonb against numeric,
					// text against timestamptz and uuid were warnings,
					// and every event was dead-lettered.
					out = append(out, TableDrift{Table: pd.Table, Column: name, Blocks: true,
						// The statement to run whole (fresh-user trial: with
						// no USING, PostgreSQL refused it for a jsonb column),
						// converting through text, which every type reads
						// and writes (numeric has no cast to jsonb).
						Problem: fmt.Sprintf("the table's type is %s, the definitions' %s, which PostgreSQL cannot convert: every upsert fails (%v); ALTER TABLE %s ALTER COLUMN %s TYPE %s USING %s::text::%s, or give the definitions the table's type",
							cat.typ, def.Type, err, qualified, ident(name), def.Type, ident(name), def.Type)})
				default:
					return fail(err)
				}
			}
			if def.NotNull && !cat.notNull && !slices.Contains(pd.PrimaryKey, name) {
				out = append(out, TableDrift{Table: pd.Table, Column: name,
					Problem: "notNull in the definitions, NULL allowed in the table (migrate adds no NOT NULL: ALTER TABLE ... SET NOT NULL by hand once no row holds NULL)"})
			}
		}
		rows, err = db.Query(ctx, driftRequiredSQL, qualified)
		if err != nil {
			return fail(err)
		}
		var name string
		if _, err := pgx.ForEachRow(rows, []any{&name}, func() error {
			if _, ok := pd.Columns[name]; !ok && name != seqColumn {
				out = append(out, TableDrift{Table: pd.Table, Column: name, Blocks: true,
					Problem: "NOT NULL without a default, and not in the definitions: every upsert fails (23502); drop the column, give it a default, or add it to the definitions"})
			}
			return nil
		}); err != nil {
			return fail(err)
		}
	}
	return out, nil
}

// writeCheck returns PostgreSQL's error when a value of the definitions'
// type typ, as the worker sends it (param), cannot be written into column
// col of table qualified (42804, no assignment cast: jsonb into numeric)
// or, when key (a primary-key column, which deletes compare), cannot be
// compared with it (42883, no operator: uuid = text); nil when both can.
// The statements are prepared (PREPARE, then DEALLOCATE, in one round
// trip), never run.
func writeCheck(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, qualified, col, typ string, key bool) error {
	stmts := []string{"INSERT INTO " + qualified + " (" + ident(col) + ") VALUES (" + param(1, typ) + ")"}
	if key {
		stmts = append(stmts, "SELECT 1 FROM "+qualified+" WHERE "+ident(col)+" = "+param(1, typ))
	}
	name := ident(reservedPrefix + "_drift_check")
	for _, st := range stmts {
		// No arguments: the simple protocol, both statements on one
		// connection of a pool.
		if _, err := db.Exec(ctx, "PREPARE "+name+" AS "+st+"; DEALLOCATE "+name); err != nil {
			return err
		}
	}
	return nil
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// migrationStatements returns the DDL that creates what defs needs in
// tenantSchema, given what exists: whether the schema does and the columns
// of each of its tables, a name another relation holds marked notATable
// (nil: look at nothing, create everything with IF NOT EXISTS, as
// MigrationSQL prints it).
func migrationStatements(defs *Definitions, tenantSchema string, schemaExists bool, columns map[string]map[string]bool) []migrationStep {
	all := columns == nil
	schema := ident(tenantSchema)
	var stmts []migrationStep
	if all {
		stmts = append(stmts, migrationStep{sql: fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", migrateLockKey)})
	}
	if all || !schemaExists {
		stmts = append(stmts, migrationStep{"CREATE SCHEMA IF NOT EXISTS " + schema, "created the schema"})
	}
	if all || columns[tombstoneTable] == nil { // taken by another relation: Drift says so
		stmts = append(stmts, migrationStep{"CREATE TABLE IF NOT EXISTS " + schema + "." + ident(tombstoneTable) +
			" (table_name text NOT NULL, pk text[] NOT NULL, " + seqColumn + " bigint NOT NULL," +
			" PRIMARY KEY (table_name, pk))", "created table " + tombstoneTable})
	}
	for _, pd := range defs.Projections {
		// Validate checked every name and type used below.
		table := schema + "." + ident(pd.Table)
		have := columns[pd.Table]
		isKey := map[string]bool{}
		var keys []string
		for _, k := range pd.PrimaryKey {
			isKey[k] = true
			keys = append(keys, ident(k))
		}
		var defsSQL, adds, added []string
		for _, name := range pd.ColumnNames {
			col := pd.Columns[name]
			d := ident(name) + " " + col.Type
			if col.NotNull || isKey[name] {
				d += " NOT NULL"
			}
			defsSQL = append(defsSQL, d)
			if all || !have[name] {
				adds = append(adds, "ADD COLUMN IF NOT EXISTS "+d)
				added = append(added, name)
			}
		}
		seq := seqColumn + " bigint NOT NULL DEFAULT 0"
		defsSQL = append(defsSQL, seq, "PRIMARY KEY ("+strings.Join(keys, ", ")+")")
		if all || !have[seqColumn] {
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+seq)
			added = append(added, seqColumn)
		}
		create := migrationStep{"CREATE TABLE IF NOT EXISTS " + table + " (" + strings.Join(defsSQL, ", ") + ")", "created table " + pd.Table}
		alter := migrationStep{"ALTER TABLE " + table + " " + strings.Join(adds, ", "), "added to table " + pd.Table + " column(s) " + strings.Join(added, ", ")}
		switch {
		case all:
			stmts = append(stmts, create, alter)
		case have[notATable]:
			// Another relation holds the name: nothing to create or add
			// (Drift reports it).
		case have == nil:
			stmts = append(stmts, create)
		case len(adds) > 0:
			stmts = append(stmts, alter)
		}
	}
	return stmts
}

// notATable marks, in migrate's map of a schema's tables and their
// columns, a name held by a relation that is not a table (a view, an
// index, a sequence): no column has it, "" not being a name.
const notATable = ""

// migrationStep is one statement of a migration and what it changes, for
// Migrate's report.
type migrationStep struct {
	sql  string
	what string // e.g. "created table artist_followers"
}

// GrantSQL returns the statements that grant role what `projection-worker
// run` needs in tenantSchema for defs, and nothing more: USAGE on the
// schema, and SELECT, INSERT, UPDATE and DELETE on each projection table and
// on _causet_tombstones. (The COPY path also creates session-local
// temporary tables: PostgreSQL grants TEMPORARY on every database to PUBLIC
// unless it was revoked.) It validates tenantSchema and defs as Migrate
// does; role is quoted as an identifier.
func GrantSQL(defs *Definitions, tenantSchema, role string) ([]string, error) {
	if err := checkMigration(defs, tenantSchema); err != nil {
		return nil, err
	}
	if role == "" {
		return nil, fmt.Errorf("grant on tenant schema %s: empty role name", tenantSchema)
	}
	schema, r := ident(tenantSchema), ident(role)
	tables := []string{schema + "." + ident(tombstoneTable)}
	for _, pd := range defs.Projections {
		tables = append(tables, schema+"."+ident(pd.Table))
	}
	return []string{
		"GRANT USAGE ON SCHEMA " + schema + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE " + strings.Join(tables, ", ") + " TO " + r,
	}, nil
}

// MigrationSQL returns the statements Migrate runs, separated by ";\n", for
// review (a dry run) or for a migration tool. It validates tenantSchema and
// defs as Migrate does.
func MigrationSQL(defs *Definitions, tenantSchema string) (string, error) {
	if err := checkMigration(defs, tenantSchema); err != nil {
		return "", err
	}
	var stmts []string
	for _, st := range migrationStatements(defs, tenantSchema, false, nil) {
		stmts = append(stmts, st.sql)
	}
	return strings.Join(stmts, ";\n"), nil
}

// checkMigration returns an error naming tenantSchema when it is not a
// tenant schema or defs are missing or invalid.
func checkMigration(defs *Definitions, tenantSchema string) error {
	if err := tenantSchemaError(tenantSchema); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if defs == nil {
		return fmt.Errorf("migrate tenant schema %s: no projection definitions", tenantSchema)
	}
	if err := defs.Validate(); err != nil {
		return fmt.Errorf("migrate tenant schema %s: %w", tenantSchema, err)
	}
	return nil
}
