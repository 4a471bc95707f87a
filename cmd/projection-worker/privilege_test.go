package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestLeastPrivilegeRoles: a migrator role without CREATE on the database
// migrates a tenant schema that exists (look first: no CREATE SCHEMA), a
// second migrator that owns no table runs `migrate` again with nothing
// missing (no ALTER TABLE), `migrate --grant worker` gives the runtime role
// what it needs, and `run` as that role (USAGE on the schema, DML on its
// tables, nothing else) applies events, COPY batches included, and
// dead-letters poison, while an event trigger records every DDL command:
// the worker's only ones are its session-local COPY staging tables
// (pg_temp), as the README says.
func TestLeastPrivilegeRoles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminURL := pgtest.URL(t)
	suffix := strings.ReplaceAll(strings.ToLower(pgtest.NewSchemaName(t)), "-", "_")
	db, migrator, migrator2, worker := "lp_"+suffix, "lp_mig_"+suffix, "lp_mig2_"+suffix, "lp_run_"+suffix
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	q := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	q(admin, "CREATE DATABASE "+id(db))
	for _, r := range []string{migrator, migrator2, worker} {
		q(admin, "CREATE ROLE "+id(r)+" LOGIN PASSWORD 'pw'")
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), adminURL)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+id(db)+" WITH (FORCE)")
		for _, r := range []string{migrator, migrator2, worker} {
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+id(r))
		}
	})
	urlOf := func(user, password string) string {
		u, err := url.Parse(adminURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, password)
		u.Path = "/" + db
		return u.String()
	}
	adminU, _ := url.Parse(adminURL)
	adminPW, _ := adminU.User.Password()
	dbAdmin, err := pgx.Connect(ctx, urlOf(adminU.User.Username(), adminPW))
	if err != nil {
		t.Fatal(err)
	}
	defer dbAdmin.Close(context.Background())
	const tenant = "acme_lp"
	q(dbAdmin, "REVOKE CREATE ON DATABASE "+id(db)+" FROM PUBLIC")
	q(dbAdmin, "CREATE SCHEMA "+tenant+" AUTHORIZATION "+id(migrator))
	q(dbAdmin, "GRANT USAGE ON SCHEMA "+tenant+" TO "+id(migrator2))
	q(dbAdmin, `CREATE TABLE public.ddl_log (role text, tag text, object text)`)
	q(dbAdmin, `CREATE FUNCTION public.log_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		DECLARE r record;
		BEGIN
			FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
				INSERT INTO public.ddl_log VALUES (session_user, r.command_tag, r.object_identity);
			END LOOP;
		END $$`)
	q(dbAdmin, "CREATE EVENT TRIGGER log_ddl ON ddl_command_end EXECUTE FUNCTION public.log_ddl()")

	migrate := func(user string, extra ...string) result {
		return runCmd(t, time.Minute, append([]string{"migrate", "--database-url", urlOf(user, "pw"),
			"--projections", exampleProjections, "--tenant-schema", tenant}, extra...)...)
	}
	if r := migrate(migrator, "--grant", worker); r.code != 0 {
		t.Fatalf("migrate as %s (no CREATE on the database, the schema exists) exited %d:\n%s", migrator, r.code, r.stderr)
	}
	if r := migrate(migrator2); r.code != 0 {
		t.Fatalf("migrate again as %s (owns no table, nothing missing) exited %d:\n%s", migrator2, r.code, r.stderr)
	}

	b, events, w := startOnKfake(t, 2, "--database-url", urlOf(worker, "pw"))
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	var recs []*kgo.Record
	const n = 100 // one batch of a partition holds >= 32 upserts of a table: COPY
	for i := range n {
		user := fmt.Sprintf("user-%d", i)
		recs = append(recs, &kgo.Record{Key: []byte(user), Value: fmt.Appendf(nil,
			`{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"artist-1"}}`,
			user, tenant, user)})
	}
	recs = append(recs, &kgo.Record{Key: []byte("poison"), Value: poison})
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	followers := func(seq int) int {
		var rows int
		_ = dbAdmin.QueryRow(ctx, "SELECT count(*) FROM "+tenant+".artist_followers WHERE _causet_seq = $1", seq).Scan(&rows)
		return rows
	}
	w.waitFor(t, "every follow applied and the poison dead-lettered", time.Minute, func() bool {
		return followers(1) == n && w.logged("dead-lettered")
	})
	w.shutdown(t)

	rows, err := dbAdmin.Query(ctx, "SELECT role, tag, coalesce(object, '') FROM public.ddl_log ORDER BY 1, 2, 3")
	if err != nil {
		t.Fatal(err)
	}
	var byWorker, byMigrators []string
	for rows.Next() {
		var role, tag, object string
		if err := rows.Scan(&role, &tag, &object); err != nil {
			t.Fatal(err)
		}
		switch {
		case role == worker && tag == "CREATE TABLE" && strings.HasPrefix(object, "pg_temp."):
		case role == worker:
			byWorker = append(byWorker, tag+" "+object)
		default:
			byMigrators = append(byMigrators, role+": "+tag+" "+object)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(byWorker) > 0 {
		t.Errorf("run issued DDL besides its temporary staging tables: %v", byWorker)
	}
	for _, d := range byMigrators {
		if strings.HasPrefix(d, migrator2+":") {
			t.Errorf("the second migrate, with nothing missing, issued DDL: %s", d)
		}
	}
	t.Logf("DDL by the migrators: %v", byMigrators)

	// Without TEMPORARY (revoked from PUBLIC), run says so at start, turns
	// COPY off and applies everything as statements.
	q(dbAdmin, "REVOKE TEMPORARY ON DATABASE "+id(db)+" FROM PUBLIC")
	q(dbAdmin, "TRUNCATE public.ddl_log")
	b2, events2, w2 := startOnKfake(t, 2, "--database-url", urlOf(worker, "pw"))
	prod2 := b2.Client(t, kgo.DefaultProduceTopic(events2), kgo.ProducerLinger(0))
	for i := range recs[:n] {
		recs[i] = &kgo.Record{Key: recs[i].Key, Value: []byte(strings.Replace(string(recs[i].Value), `"sequenceNumber":1`, `"sequenceNumber":2`, 1))}
	}
	if err := prod2.ProduceSync(ctx, recs[:n]...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	w2.waitFor(t, "the warning and every follow applied again", time.Minute, func() bool {
		return followers(2) == n && w2.logged("may not create temporary tables")
	})
	w2.shutdown(t)
	var ddl int
	if err := dbAdmin.QueryRow(ctx, "SELECT count(*) FROM public.ddl_log").Scan(&ddl); err != nil || ddl != 0 {
		t.Errorf("run without TEMPORARY issued %d DDL commands (%v), want none", ddl, err)
	}
}

// TestMigrateGrantToAMissingRoleMigratesNothing: `migrate --grant` naming
// a role the database does not have stops before any schema is migrated
// (status 2, the role named), rather than leaving the schemas migrated
// and not granted.
func TestMigrateGrantToAMissingRoleMigratesNothing(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	dropSchemasAtEnd(t, pool, tenant)
	role := "no_such_role_" + strings.TrimPrefix(tenant, "t_")
	r := runCmd(t, time.Minute, "migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections,
		"--tenant-schema", tenant, "--grant", role)
	if r.code != 2 || !strings.Contains(r.stderr, `--grant "`+role+`": no such role`) {
		t.Errorf("migrate --grant %s = %d, want 2 naming the role\n%s", role, r.code, r)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", tenant).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("tenant schema %s was created although the grant could not be made", tenant)
	}
}

// TestMigrateATenantSchemaGivenTwiceOnce: a tenant schema named twice
// (flags, or TENANT_SCHEMAS) is migrated once, its line printed once
// (new-user trial: twice).
func TestMigrateATenantSchemaGivenTwiceOnce(t *testing.T) {
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	dropSchemasAtEnd(t, pool, tenant)
	r := runCmd(t, time.Minute, "migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections,
		"--tenant-schema", tenant, "--tenant-schema", tenant)
	if r.code != 0 || strings.Count(r.stdout, "migrated tenant schema "+tenant+" ") != 1 {
		t.Errorf("migrate --tenant-schema %s twice = %d, want 0 and one line for it\n%s", tenant, r.code, r)
	}
}

// TestMigrateWarnsAboutWhatItLeaves: a table whose column type was
// changed by hand (or in the file) gets a warning line naming the tenant
// schema, table, column and both types, and migrate still exits 0 (it
// changes no type; new-user trial: "migrated" and nothing else).
func TestMigrateWarnsAboutWhatItLeaves(t *testing.T) {
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	dropSchemasAtEnd(t, pool, tenant)
	args := []string{"migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections, "--tenant-schema", tenant}
	migratedThenChanged(t, pool, args, "ALTER TABLE "+pgx.Identifier{tenant, "artist_followers"}.Sanitize()+" ALTER COLUMN score TYPE integer")
	r := runCmd(t, time.Minute, args...)
	want := "warning: tenant schema " + tenant + ": artist_followers.score: the table's type is integer, the definitions' bigint"
	if r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Errorf("migrate after a type change = %d, want 0 and %q\n%s", r.code, want, r)
	}
}

// TestMigrateFailsOnATableTheWorkerCannotWrite: a table whose primary key
// is not the definitions' gets an error line naming it, and migrate exits
// 1 after migrating every tenant schema given (second new-user trial:
// "migrated", exit 0, then every event dead-lettered with 42P10).
func TestMigrateFailsOnATableTheWorkerCannotWrite(t *testing.T) {
	pool := pgtest.Pool(t)
	bad, good := pgtest.NewSchemaName(t), pgtest.NewSchemaName(t)+"_b"
	dropSchemasAtEnd(t, pool, bad, good)
	base := []string{"migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections}
	migratedThenChanged(t, pool, append(base, "--tenant-schema", bad),
		"ALTER TABLE "+pgx.Identifier{bad, "user_follows"}.Sanitize()+" DROP CONSTRAINT user_follows_pkey, ADD PRIMARY KEY (user_id)")
	r := runCmd(t, time.Minute, append(base, "--tenant-schema", bad, "--tenant-schema", good)...)
	want := "error: tenant schema " + bad + ": user_follows: primary key (user_id) in the table, (user_id, artist_id) in the definitions"
	if r.code != 1 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "migrated tenant schema "+good+" ") ||
		!strings.Contains(r.stderr, "the worker cannot write some tables of tenant schema "+bad) {
		t.Errorf("migrate = %d, want 1, %q, the second tenant schema migrated, and an error naming the first\n%s", r.code, want, r)
	}
}

// TestMigrateNamesTheTenantSchemasItDidNotReach: when a tenant schema's
// migration fails, the error names the ones given after it, which were not
// migrated (second new-user trial: left out silently).
func TestMigrateNamesTheTenantSchemasItDidNotReach(t *testing.T) {
	pool := pgtest.Pool(t)
	first, later := pgtest.NewSchemaName(t), pgtest.NewSchemaName(t)+"_later"
	dropSchemasAtEnd(t, pool, first, later)
	base := []string{"migrate", "--database-url", pgtest.URL(t), "--tenant-schema", first}
	migratedThenChanged(t, pool, append(base, "--projections", exampleProjections),
		"INSERT INTO "+pgx.Identifier{first, "artist_followers"}.Sanitize()+" (artist_id, user_id) VALUES ('a', 'u')")
	src, err := os.ReadFile(exampleProjections)
	if err != nil {
		t.Fatal(err)
	}
	// A notNull column new to a table with a row: its migration fails.
	v2 := strings.Replace(string(src), "      followed_at: { type: timestamptz, from: ts }",
		"      followed_at: { type: timestamptz, from: ts }\n      region: { type: text, from: forkId, notNull: true }", 1)
	if v2 == string(src) {
		t.Fatal("the example definitions changed: the test no longer adds its column")
	}
	r := runCmd(t, time.Minute, append(base, "--projections", writeFile(t, "v2.yaml", v2), "--tenant-schema", later)...)
	if r.code != 1 || !strings.Contains(r.stderr, "not migrated, after it: "+later) {
		t.Errorf("migrate = %d, want 1 naming %s as not migrated\n%s", r.code, later, r)
	}
}

// dropSchemasAtEnd drops the schemas (CASCADE) when t ends.
func dropSchemasAtEnd(t *testing.T, pool *pgxpool.Pool, schemas ...string) {
	t.Cleanup(func() {
		for _, s := range schemas {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
}

// migratedThenChanged runs migrate with args, which must exit 0 without a
// warning, then sql.
func migratedThenChanged(t *testing.T, pool *pgxpool.Pool, args []string, sql string) {
	t.Helper()
	if r := runCmd(t, time.Minute, args...); r.code != 0 || strings.Contains(r.stdout, "warning") {
		t.Fatalf("first migrate = %d, want 0 without a warning\n%s", r.code, r)
	}
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateSaysWhatItChanged: migrate's line for a tenant schema says
// what it created or added, and that nothing was needed when nothing was
// (new-user trial: "migrated" on a second run that changed nothing).
func TestMigrateSaysWhatItChanged(t *testing.T) {
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	dropSchemasAtEnd(t, pool, tenant)
	args := []string{"migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections, "--tenant-schema", tenant}
	steps := []struct {
		sql  string // run before migrate
		want string
	}{
		{"", "migrated tenant schema " + tenant + " to IR v42 (3 projections): created the schema; created table _causet_tombstones; created table artist_followers; created table user_follows; created table artist_ratings\n"},
		{"", "tenant schema " + tenant + ": no table or column to add for IR v42 (3 projections)\n"},
		{"ALTER TABLE " + pgx.Identifier{tenant, "artist_followers"}.Sanitize() + " DROP COLUMN score, DROP COLUMN _causet_seq",
			"migrated tenant schema " + tenant + " to IR v42 (3 projections): added to table artist_followers column(s) score, _causet_seq\n"},
	}
	for i, st := range steps {
		if st.sql != "" {
			if _, err := pool.Exec(context.Background(), st.sql); err != nil {
				t.Fatal(err)
			}
		}
		if r := runCmd(t, time.Minute, args...); r.code != 0 || r.stdout != st.want {
			t.Errorf("migrate #%d = %d, stdout %q; want 0 and %q\n%s", i+1, r.code, r.stdout, st.want, r)
		}
	}
}

// TestMigrateRefusesToGrantABuiltInRole: `migrate --grant pg_read_all_data`
// (any pg_ role) stops at start, status 2, before connecting (new-user
// trial: it gave every member of that read-only role INSERT and DELETE).
func TestMigrateRefusesToGrantABuiltInRole(t *testing.T) {
	for _, role := range []string{"pg_read_all_data", "PG_monitor"} {
		r := runCmd(t, time.Minute, "migrate", "--database-url", "postgres://u@127.0.0.1:1/db", "--projections", exampleProjections,
			"--tenant-schema", "t_never", "--grant", role)
		if r.code != 2 || !strings.Contains(r.stderr, `--grant "`+role+`": a built-in PostgreSQL role`) {
			t.Errorf("migrate --grant %s = %d, want 2 naming the role as built-in\n%s", role, r.code, r)
		}
	}
}
