package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// badConnStrings are connection strings pgx cannot parse, or (the '@' one)
// parses with part of the password as the host, each with the parts of its
// password that must never be printed (issue 14).
var badConnStrings = []struct {
	name, connString string
	secrets          []string
}{
	{"key=value, spaces around = and a bad sslmode", "host=127.0.0.1 port=5432 user=u password = Kv-Spaced-5521 dbname=db sslmode=disabel",
		[]string{"Kv-Spaced-5521"}},
	{"key=value, unquoted password with a space", "host=127.0.0.1 user=u password=Half1-pw Half2-pw dbname=db",
		[]string{"Half1-pw", "Half2-pw"}},
	{"key=value, quoted password, bad connect_timeout", "host=h user=u password='Quoted pw-7710' connect_timeout=x",
		[]string{"Quoted pw-7710", "pw-7710"}},
	{"URL, unencoded '@' in the password", "postgres://u:Sekr@t-7Hq2@127.0.0.1:5432/db?sslmode=disable",
		[]string{"Sekr@t-7Hq2", "t-7Hq2"}},
	{"URL, unencoded '/' in the password", "postgres://u:Slsh1/ash-88Qz@127.0.0.1:5432/db",
		[]string{"Slsh1", "ash-88Qz"}},
	{"URL, password in the query and a bad sslmode", "postgres://u@127.0.0.1/db?password=Qry-pw-3311&sslmode=bogus",
		[]string{"Qry-pw-3311"}},
	{"URL, password with a bad percent-encoding", "postgres://u:Pct%zz-pw-4242@127.0.0.1/db",
		[]string{"Pct%zz-pw-4242", "zz-pw-4242"}},
	{"URL, stray query parameter", "postgres://u:Stray-pw-1357@127.0.0.1/db?sslmode=disable&bogus",
		[]string{"Stray-pw-1357"}},
	// Third new-user trial: the URL parser quoted the part after the
	// first '@' of the password (7 bytes or fewer, not masked by its text).
	{"URL, unencoded '@' and a space in the password", "postgres://acme:hunter2xy@abc def@127.0.0.1:47432/acme",
		[]string{"abc def", "hunter2xy"}},
	{"URL, unencoded '@' and a space in a short password", "postgres://acme:ab@c d@127.0.0.1:47432/acme",
		[]string{"c d"}},
	// New-user trial: these parsed, and the password's pieces became the
	// host and the database name in every log line, /readyz and dead letter.
	{"URL, unencoded '/' and '@' in the password", "postgres://wk:Tr0ub4dor@vault-pw/Zx9q7Lm2@127.0.0.1:47311/wdb?sslmode=disable",
		[]string{"vault-pw", "Zx9q7Lm2"}},
	{"URL, unencoded '@', '/', ':', '#' and '?' in the password", "postgres://wk:W0rkerS3cretP@ss/wd:#?@127.0.0.1:47311/wdb",
		[]string{"W0rkerS3cretP", "ss/wd"}},
	// Security trial: the URL parser quoted the part of the password after
	// an unencoded '?' or '&', which names no whole secret.
	{"URL, unencoded '@', ':', '/', '?' and '#' in the password", "postgres://trial52a_role:S3cr3t@p:a/s?s#W0rd@127.0.0.1:55432/trial52a_db",
		[]string{"S3cr3t", "s#W0rd", "W0rd"}},
	{"URL, unencoded '&' in a query password", "postgres://wk@127.0.0.1:47020/wkdb?password=S3cr&W0rdXyz",
		[]string{"W0rdXyz"}},
}

// TestParsePostgresNeverPrintsThePassword: whatever is wrong with a
// connection string, ParsePostgres refuses it with a reason that holds no
// part of the password.
func TestParsePostgresNeverPrintsThePassword(t *testing.T) {
	for _, tt := range badConnStrings {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePostgres(tt.connString)
			if err == nil {
				t.Fatalf("ParsePostgres(%q) = nil error, want a refusal", tt.connString)
			}
			for _, s := range tt.secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q holds the secret %q", err, s)
				}
			}
			t.Logf("%v", err)
		})
	}
}

// TestParsePostgresIgnoresWhiteSpaceAround: a connection string with a
// newline after it (a Secret made from a file) or white space before it
// parses as without (fresh-user trial: the newline became part of the
// database name, a leading space made the URL read as key=value).
func TestParsePostgresIgnoresWhiteSpaceAround(t *testing.T) {
	for _, s := range []string{"postgres://u:pw@127.0.0.1:5432/db\n", " postgres://u:pw@127.0.0.1:5432/db", "\thost=127.0.0.1 user=u dbname=db\r\n"} {
		cfg, err := ParsePostgres(s)
		if err != nil || cfg.ConnConfig.Database != "db" || cfg.ConnConfig.Host != "127.0.0.1" {
			t.Errorf("ParsePostgres(%q): %v; want host 127.0.0.1, database db", s, err)
			continue
		}
	}
}

// TestParsePostgresSaysToPercentEncode: a URL whose password holds an
// unencoded '@', '/', '?' or '#' is refused with the hint to
// percent-encode, whether pgx parses it or not, and a query's '@' after a
// password is such a sign; a query's '@' without a password is a value
// (final fresh-user check: the first two said only `missing key/value
// separator "=" ...: "xxxxx"` and `invalid port`, the third was taken,
// the rest of its password becoming application_name).
func TestParsePostgresSaysToPercentEncode(t *testing.T) {
	for _, s := range []string{
		"postgres://u:S3cr3t@p:a/s?s#W0rd@127.0.0.1:55432/x",
		"postgres://u:S3cr3t@p:a/s@127.0.0.1:55432/x",
		"postgres://u:S3cr3t@p/s?application_name=W0rd@127.0.0.1:55432/x",
		"postgres://u:S3cr3t@p?application_name=W0rd@127.0.0.1:55432/x",
	} {
		_, err := ParsePostgres(s)
		if err == nil || !strings.Contains(err.Error(), "must be percent-encoded (%40 for '@'") {
			t.Errorf("ParsePostgres(%q) = %v, want the hint to percent-encode", s, err)
		}
		if err != nil && (strings.Contains(err.Error(), "S3cr3t") || strings.Contains(err.Error(), "W0rd")) {
			t.Errorf("ParsePostgres(%q): %v shows the password", s, err)
		}
	}
	if _, err := ParsePostgres("postgres://127.0.0.1/db?user=me@server"); err != nil {
		t.Errorf("a user with '@' in the query and no password before the host: %v, want it taken", err)
	}
	// With a password before the host, a query's '@' cannot be told from
	// the rest of that password: refused, to be percent-encoded (%40).
	if _, err := ParsePostgres("postgres://me%40server:pw@127.0.0.1/db?application_name=a@b"); err == nil {
		t.Error("a password before the host and '@' in the query: taken, want the hint to percent-encode")
	}
}

// TestParsePostgresAcceptsEveryForm: the forms pgx accepts still parse,
// and PostgresSecrets names their password.
func TestParsePostgresAcceptsEveryForm(t *testing.T) {
	tests := []struct{ name, connString, password string }{
		{"URL", "postgres://u:Url-pw-1@127.0.0.1:5432/db?sslmode=disable", "Url-pw-1"},
		{"URL, encoded '@'", "postgres://u:Enc%40oded-5150@127.0.0.1:5432/db", "Enc@oded-5150"},
		{"URL, password query parameter", "postgresql://u@127.0.0.1/db?password=Qry-2", "Qry-2"},
		{"key=value", "host=127.0.0.1 user=u password=Kv-3 dbname=db", "Kv-3"},
		{"key=value, spaces around =", "host=127.0.0.1 user=u password = Kv-Sp-4 dbname=db", "Kv-Sp-4"},
		{"key=value, quoted", `host=127.0.0.1 user=u password='Kv \'q\' 5' dbname=db`, "Kv 'q' 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParsePostgres(tt.connString)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ConnConfig.Password != tt.password {
				t.Fatalf("password %q, want %q", cfg.ConnConfig.Password, tt.password)
			}
			if !slices.Contains(PostgresSecrets(tt.connString), tt.password) {
				t.Errorf("PostgresSecrets does not name the password %q", tt.password)
			}
			if d := Describe(&cfg.ConnConfig.Config); strings.Contains(d, tt.password) || !strings.Contains(d, "host=127.0.0.1") {
				t.Errorf("Describe = %q", d)
			}
		})
	}
}

// TestPostgresSecretsFromTheEnvironment: a password from PGPASSWORD or the
// passfile is a secret too.
func TestPostgresSecretsFromTheEnvironment(t *testing.T) {
	t.Setenv("PGPASSWORD", "Env-pw-7781")
	if s := New(PostgresSecrets("postgres://u@127.0.0.1/db")...).String("x Env-pw-7781 y"); s != "x "+Mask+" y" {
		t.Errorf("PGPASSWORD not redacted: %q", s)
	}
	t.Setenv("PGPASSWORD", "")
	passfile := t.TempDir() + "/pgpass"
	if err := writeFile(passfile, "127.0.0.1:5432:*:u:File-pw-9912\n"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSFILE", passfile)
	if s := New(PostgresSecrets("host=127.0.0.1 port=5432 user=u dbname=db")...).String("File-pw-9912"); s != Mask {
		t.Errorf("passfile password not redacted: %q", s)
	}
}

// TestErrorRedactsAndStillClassifies: a redacted error keeps its chain for
// errors.Is/As, and the PgError errors.As finds is redacted too.
func TestErrorRedactsAndStillClassifies(t *testing.T) {
	r := New("Sek-9-long")
	pgErr := &pgconn.PgError{Severity: "FATAL", Code: "28000", Message: `role "Sek-9-long" does not exist`}
	err := r.Error(fmt.Errorf("connect: %w", pgErr))
	if strings.Contains(err.Error(), "Sek-9") {
		t.Errorf("error text %q holds the secret", err)
	}
	var got *pgconn.PgError
	if !errors.As(err, &got) || got.Code != "28000" {
		t.Fatalf("errors.As PgError = %v, want the SQLSTATE 28000 error", got)
	}
	if strings.Contains(got.Error(), "Sek-9") {
		t.Errorf("PgError text %q holds the secret", got.Error())
	}
	if !errors.Is(err, pgErr) {
		t.Error("errors.Is lost the original error")
	}
	if plain := errors.New("nothing secret"); r.Error(plain) != plain {
		t.Error("an error without a secret must be returned unchanged")
	}
}

// TestHandlerRedactsEveryValue: messages, strings, errors, Stringers and
// groups are redacted, at every level: a secret of MinSubstringLen bytes
// or more wherever it appears.
func TestHandlerRedactsEveryValue(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New("Sekret-99").Handler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	log = log.With("conn", "pw=Sekret-99")
	log.Debug("dial Sekret-99", "error", errors.New("bad Sekret-99"), slog.Group("g", "s", "Sekret-99"), "list", []string{"Sekret-99"}, "n", 3)
	if strings.Contains(buf.String(), "Sekret-99") || !strings.Contains(buf.String(), `"n":3`) {
		t.Errorf("log %s", buf.String())
	}
}

// TestShortSecretMaskedOnlyAsASecret: a password shorter than
// MinSubstringLen (here one letter, as in the new-user trial) is masked
// where it appears as the password, and the rest of the text is left
// readable instead of losing every occurrence of that letter.
func TestShortSecretMaskedOnlyAsASecret(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	r := New(append(PostgresSecrets("postgres://worker:a@127.0.0.1:5432/app?sslmode=disable"), "s")...)
	tests := []struct{ name, in, want string }{
		{"plain text", "a projection failed, retrying after a wait", "a projection failed, retrying after a wait"},
		{"the connection string", "postgres://worker:a@127.0.0.1:5432/app?sslmode=disable", Mask},
		{"another URL's userinfo", "dial postgres://worker:a@db.internal:5432/app: refused", "dial postgres://worker:" + Mask + "@db.internal:5432/app: refused"},
		{"userinfo with an unencoded '@'", "at kafka://u:p@ss@h:9092/x", "at kafka://u:" + Mask + "@h:9092/x"},
		{"key=value", "host=h user=worker password=a dbname=app", "host=h user=worker password=" + Mask + " dbname=app"},
		{"key = 'quoted value'", "host=h password = 'a b' dbname=app", "host=h password = " + Mask + " dbname=app"},
		{"URL query", "postgres://h/app?sslpassword=a&sslmode=require", "postgres://h/app?sslpassword=" + Mask + "&sslmode=require"},
		{"flag", "--kafka-sasl-password=s was set", "--kafka-sasl-password=" + Mask + " was set"},
		{"JSON field", `{"user":"worker","Password":"a"}`, `{"user":"worker","Password":"` + Mask + `"}`},
		// Elsewhere the same text is not the password: a value or a name
		// that an error quotes stays (new-user trial: "got string
		// \"xxxxx\"" for an event's "5", projection "xxxxx"); so does a
		// role named so (second trial: a masked role "xxxxx" beside pgx's
		// user=acme told the password).
		{"a role quoted", `FATAL: role "a" does not exist (user=a)`, `FATAL: role "a" does not exist (user=a)`},
		{"a value quoted", `invalid event: sequenceNumber: must be a JSON integer, got string "a"`, `invalid event: sequenceNumber: must be a JSON integer, got string "a"`},
		{"a name quoted", `defs.yaml: projection "a": primaryKey: unknown column "s" (line 5)`, `defs.yaml: projection "a": primaryKey: unknown column "s" (line 5)`},
		{"the whole text", "s", "s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.String(tt.in); got != tt.want {
				t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	var buf bytes.Buffer
	log := slog.New(r.Handler(slog.NewTextHandler(&buf, nil)))
	log.Info("partition assigned", "topic", "causet.projection-events.v1", "tenant_schema", "acme_sales", "projection", "a")
	if !strings.Contains(buf.String(), `msg="partition assigned" topic=causet.projection-events.v1 tenant_schema=acme_sales projection=a`) {
		t.Errorf("log line shredded: %s", buf.String())
	}
	buf.Reset()
	log.Info("configured", "kafka_sasl_password", "s", "sslpassword", "not a known secret", "password", "", "user", "s")
	if want := `msg=configured kafka_sasl_password=` + Mask + ` sslpassword=` + Mask + ` password="" user=s`; !strings.Contains(buf.String(), want) {
		t.Errorf("log line %q, want it to hold %q (an attribute keyed ...password masked whatever its value)", buf.String(), want)
	}
}

func writeFile(name, content string) error { return os.WriteFile(name, []byte(content), 0o600) }

// TestWithoutPassword: the connection string of a command line keeps what
// names the server, database and user, and loses the password alone, also
// when the user is named as the password (new-user trial: psql 'xxxxx').
func TestWithoutPassword(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"postgres://postgres:postgres@127.0.0.1:55432/trial_db", "postgres://postgres@127.0.0.1:55432/trial_db"},
		{"postgresql://app:s%40cret@db:5432/app?sslmode=require", "postgresql://app@db:5432/app?sslmode=require"},
		{"postgres://app@db/app?password=pw&sslmode=disable", "postgres://app@db/app?sslmode=disable"},
		{"postgres://db/app", "postgres://db/app"},
		// key=value: the pair goes (a masked value would be sent as the
		// password; second new-user trial).
		{"host=db user=app password='p w' dbname=app", "host=db user=app dbname=app"},
		{"password = pw host=db application_name='a  b'", "host=db application_name='a  b'"},
		{"host=db sslpassword=x user=app PASSWORD='it\\'s'", "host=db user=app"},
		{"postgres://app:pw@db:bad-port/app", Mask},
	} {
		if got := WithoutPassword(tt.in); got != tt.want {
			t.Errorf("WithoutPassword(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestSecretInsideAURLSchemeLeavesTheScheme: a password that is also part
// of a URL scheme ("postgres", the README's test URL's) is masked
// everywhere but in the scheme, so a message's own hint stays readable
// (new-user trial: "want xxxxx:// or xxxxxql://"); as the user and in a
// URL's userinfo it is masked still.
func TestSecretInsideAURLSchemeLeavesTheScheme(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	r := New(PostgresSecrets("postgres://postgres:postgres@127.0.0.1:55432/postgres?sslmode=disable")...)
	tests := []struct{ in, want string }{
		{`scheme "mysql" is not PostgreSQL's: want postgres:// or postgresql://, or a key=value string`,
			`scheme "mysql" is not PostgreSQL's: want postgres:// or postgresql://, or a key=value string`},
		{"dial postgres://postgres:postgres@db:5432/app: refused", "dial postgres://" + Mask + ":" + Mask + "@db:5432/app: refused"},
		{"user=postgres database=postgres", "user=" + Mask + " database=" + Mask},
		{"postgres", Mask},
	}
	for _, tt := range tests {
		if got := r.String(tt.in); got != tt.want {
			t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestSecretQuotedByAnErrorIsMasked: an error that quotes the value it
// refuses (%q, JSON) escapes the secret's '"' and '\', and the text itself
// no longer appears (new-user trial: an event carrying the password
// Qu0te"Back\slash<&>ñ8 as a value printed it in the dead letter's error
// and the WARN line). A secret shorter than MinSubstringLen is not masked
// by its text (TestShortSecretMaskedOnlyAsASecret).
func TestSecretQuotedByAnErrorIsMasked(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	const long = `Qu0te"Back\slash<&>ñ8`
	r := New(long)
	for _, in := range []string{
		fmt.Sprintf("invalid input syntax for type bigint: %q", long),
		fmt.Sprintf("got %+q", long),
		`{"error":"` + strings.Trim(mustJSON(t, long), `"`) + `"}`,
	} {
		got := r.String(in)
		if !strings.Contains(got, Mask) || strings.Contains(got, "Back") || strings.Contains(got, `q\"`) {
			t.Errorf("String(%s) = %s: the secret is not masked", in, got)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
