package pgtest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/causet/projection-worker/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestURLAndPool(t *testing.T) {
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if got, again := pgtest.URL(t), pgtest.URL(t); got != again {
		t.Errorf("URL changed between calls: %q, %q", got, again)
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
	t.Run("parallel pools share the server", func(t *testing.T) {
		for _, name := range []string{"a", "b", "c"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				schema := pgtest.NewSchemaName(t)
				p := pgtest.Pool(t)
				if _, err := p.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
					t.Fatalf("create schema %s: %v", schema, err)
				}
			})
		}
	})
}

func TestNewSchemaName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tests := []struct {
		name   string
		prefix string // wanted start of the schema name, given t.Name()
	}{
		{name: "plain", prefix: "t_testnewschemaname_plain_"},
		{name: "Mixed Case & spaces", prefix: "t_testnewschemaname_mixed_case_spaces_"},
		{name: "ünïcödé/ünd-dash", prefix: "t_testnewschemaname_n_c_d_nd_dash_"},
		{name: strings.Repeat("long", 40), prefix: "t_testnewschemaname_longlong"},
		{name: "trailing___", prefix: "t_testnewschemaname_trailing_"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 20 {
				got := pgtest.NewSchemaName(t)
				if !valid.MatchString(got) {
					t.Fatalf("NewSchemaName = %q, not a valid tenant schema", got)
				}
				if !strings.HasPrefix(got, tt.prefix) {
					t.Errorf("NewSchemaName = %q, want prefix %q", got, tt.prefix)
				}
				if seen[got] {
					t.Errorf("NewSchemaName returned %q twice", got)
				}
				seen[got] = true
			}
		})
	}
	t.Run("accepted by PostgreSQL", func(t *testing.T) {
		pool := pgtest.Pool(t)
		name := pgtest.NewSchemaName(t)
		if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+name); err != nil {
			t.Fatalf("CREATE SCHEMA %s (unquoted): %v", name, err)
		}
		var got string
		if err := pool.QueryRow(t.Context(), `SELECT nspname FROM pg_namespace WHERE nspname = $1`, name).Scan(&got); err != nil {
			t.Fatalf("schema %s not found as written: %v", name, err)
		}
	})
}
