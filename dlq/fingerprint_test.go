package dlq

import (
	"regexp"
	"testing"

	"github.com/causet/projection-worker/retry"
)

func TestMaskLiterals(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"integer", "value 42 out of range", "value <num> out of range"},
		{"negative", "got -7 for score", "got <num> for score"},
		{"decimal", "ratio 3.25 too big", "ratio <num> too big"},
		{"exponent", "got -1.5e-3 and 2E10", "got <num> and <num>"},
		{"big integer", "sequence 9007199254740993 too large", "sequence <num> too large"},
		{"unit glued to number", "timed out after 1500ms", "timed out after <num>"},
		{"digits inside words kept", "column v42 of int4 in _causet_seq2", "column v42 of int4 in _causet_seq2"},
		{"hyphenated id", "entity user-123 failed", "entity user-<num> failed"},
		{"uuid", "row 3f2b8c1e-9d4a-4b7e-8f00-0123456789ab missing", "row <uuid> missing"},
		{"uppercase uuid starting with a letter", "id=ABCDEF01-2345-6789-ABCD-EF0123456789.", "id=<uuid>."},
		{"single quoted", "invalid input 'abc' here", "invalid input '<str>' here"},
		{"single quoted with doubled quote", "bad 'it''s' value", "bad '<str>' value"},
		{"empty single quoted", "empty '' value", "empty '<str>' value"},
		{"apostrophe is not a quote", "can't parse 'x'", "can't parse '<str>'"},
		{"double quoted value", `invalid input syntax for type integer: "abc"`, `invalid input syntax for type integer: "<str>"`},
		{"double quoted with escape", `bad "a\"b" here`, `bad "<str>" here`},
		{"identifiers kept", `column "followed_at" of relation "artist_followers" does not exist`, `column "followed_at" of relation "artist_followers" does not exist`},
		// A schema is a tenant's: data (pathological-stream trial).
		{"schema qualifier masked", `relation "t_300.artist_followers" does not exist`, `relation "<schema>.artist_followers" does not exist`},
		{"schema masked", `schema "t_300" does not exist`, `schema "<str>" does not exist`},
		{"constraint kept", `duplicate key value violates unique constraint "artist_followers_pkey"`, `duplicate key value violates unique constraint "artist_followers_pkey"`},
		{"field kept", `field "eventType" must be a non-empty string`, `field "eventType" must be a non-empty string`},
		{"unterminated quote kept", `bad "abc`, `bad "abc`},
		{"timestamp", "ts 2024-06-25T12:00:00Z out of range", "ts <num>-<num>-<num>:<num>:<num> out of range"},
		{"unicode kept", "naïve café 5", "naïve café <num>"},
		{"numbers after unicode letters kept", "é5", "é5"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MaskLiterals(tt.in); got != tt.want {
				t.Errorf("MaskLiterals(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestFingerprintGroupsTheSameBugWhateverTheData(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"different numbers", "division by zero at sequence 1891", "division by zero at sequence 77"},
		{"different quoted values", `invalid input syntax for type uuid: "abc"`, `invalid input syntax for type uuid: "not-a-uuid-42"`},
		{"different uuids", "no row for 3f2b8c1e-9d4a-4b7e-8f00-0123456789ab", "no row for 00000000-0000-0000-0000-000000000000"},
		{"different decimals and signs", "value 7.5 exceeds -3", "value 1200.25 exceeds -99"},
		{"different single quoted", "key 'user-1' unknown", "key 'artist-456' unknown"},
		{"different tenants not migrated", `ERROR: relation "t_300.artist_followers" does not exist (SQLSTATE 42P01)`, `ERROR: relation "acme_prod.artist_followers" does not exist (SQLSTATE 42P01)`},
		{"different tenants without a schema", `ERROR: schema "t_300" does not exist (SQLSTATE 3F000)`, `ERROR: schema "acme_prod" does not exist (SQLSTATE 3F000)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fa := Fingerprint("artist_followers", retry.Projection, "22P02", tt.a)
			fb := Fingerprint("artist_followers", retry.Projection, "22P02", tt.b)
			if fa != fb {
				t.Errorf("fingerprints differ: %s for %q, %s for %q", fa, tt.a, fb, tt.b)
			}
		})
	}
}

func TestFingerprintSeparatesDifferentBugs(t *testing.T) {
	const msg = `ERROR: column "followed_at" of relation "artist_followers" does not exist (SQLSTATE 42703)`
	base := Fingerprint("artist_followers", retry.Projection, "42703", msg)
	tests := []struct {
		name                      string
		projection, sqlstate, msg string
		class                     retry.Class
	}{
		{"other projection", "artist_stats", "42703", msg, retry.Projection},
		{"other class", "artist_followers", "42703", msg, retry.Permanent},
		{"other sqlstate", "artist_followers", "42P01", msg, retry.Projection},
		{"other column", "artist_followers", "42703", `ERROR: column "score" of relation "artist_followers" does not exist (SQLSTATE 42703)`, retry.Projection},
		{"fields shifted across the separator", "artist_followers4", "2703", msg, retry.Projection},
		{"empty projection", "", "42703", msg, retry.Projection},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Fingerprint(tt.projection, tt.class, tt.sqlstate, tt.msg); got == base {
				t.Errorf("fingerprint %s equals the base fingerprint", got)
			}
		})
	}
}

func TestFingerprintShape(t *testing.T) {
	fp := Fingerprint("p", retry.Infrastructure, "", "connection refused")
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(fp) {
		t.Errorf("fingerprint %q is not 16 lowercase hex digits", fp)
	}
	if again := Fingerprint("p", retry.Infrastructure, "", "connection refused"); again != fp {
		t.Errorf("fingerprint not stable: %s then %s", fp, again)
	}
}
