package projection

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// wantSPECDefinitions is testdata/defs/valid.yaml, the SPEC §4 example.
func wantSPECDefinitions() *Definitions {
	return &Definitions{
		IRVersion: "v42",
		Projections: []ProjectionDef{{
			Name:       "artist_followers",
			Table:      "artist_followers",
			PrimaryKey: []string{"artist_id", "user_id"},
			Columns: map[string]ColumnDef{
				"artist_id":   {Type: "text", From: "payload.artist_id"},
				"user_id":     {Type: "text", From: "payload.user_id"},
				"followed_at": {Type: "timestamptz", From: "ts"},
				"score":       {Type: "bigint", Derive: "payload.points / payload.games"},
			},
			ColumnNames: []string{"artist_id", "user_id", "followed_at", "score"},
			Events:      map[string]Op{"ARTIST_FOLLOWED": OpUpsert, "ARTIST_UNFOLLOWED": OpDelete},
		}},
	}
}

func TestLoadDefinitionsValidFiles(t *testing.T) {
	for _, path := range []string{"testdata/defs/valid.yaml", "testdata/defs/valid.json"} {
		t.Run(path, func(t *testing.T) {
			d, err := LoadDefinitions(path)
			if err != nil {
				t.Fatalf("LoadDefinitions: %v", err)
			}
			if diff := cmp.Diff(wantSPECDefinitions(), d, cmpopts.IgnoreUnexported(Definitions{})); diff != "" {
				t.Errorf("definitions (-want +got):\n%s", diff)
			}
			if _, ok := d.programs["payload.points / payload.games"]; !ok {
				t.Errorf("derive not compiled at load")
			}
		})
	}
}

func TestLoadDefinitionsExamplesFile(t *testing.T) {
	d, err := LoadDefinitions("../examples/projections.yaml")
	if err != nil {
		t.Fatalf("LoadDefinitions: %v", err)
	}
	// The SPEC §4 example, with its score derive guarded so that the SPEC §3
	// event (which has no points or games) projects too.
	want := wantSPECDefinitions().Projections[0]
	score := want.Columns["score"]
	score.Derive = "has(payload.games) ? payload.points / payload.games : null"
	want.Columns["score"] = score
	if diff := cmp.Diff(want, d.Projections[0]); diff != "" {
		t.Errorf("first projection is not the SPEC §4 example (-want +got):\n%s", diff)
	}
	if len(d.Projections) < 2 {
		t.Fatalf("want a second projection, got %d", len(d.Projections))
	}
	if _, err := NewTableProjections(d); err != nil {
		t.Fatalf("NewTableProjections: %v", err)
	}
}

// TestLoadDefinitionsBadFiles checks that each bad definition is refused with
// a message naming the file, the projection and the field (SPEC §4).
func TestLoadDefinitionsBadFiles(t *testing.T) {
	tests := []struct {
		file string
		want []string // lines of the error, each exactly
	}{
		{"empty_values.yaml", []string{
			`testdata/defs/empty_values.yaml: irVersion: is empty (line 3)`,
			`testdata/defs/empty_values.yaml: projections[0]: name: is empty (line 5)`,
			`testdata/defs/empty_values.yaml: projections[0]: table: is empty (line 6)`,
			`testdata/defs/empty_values.yaml: projections[0]: primaryKey: is empty (line 7)`,
			`testdata/defs/empty_values.yaml: projections[0]: events.E: is empty (line 8)`,
			`testdata/defs/empty_values.yaml: projections[0]: columns.id: type: is empty (line 10)`,
			`testdata/defs/empty_values.yaml: projections[0]: columns.id: from: is empty (line 10)`,
			`testdata/defs/empty_values.yaml: projections[0]: columns.n: derive: is empty (line 11)`,
		}},
		{"irversion_control.yaml", []string{
			`testdata/defs/irversion_control.yaml: irVersion: "v1\x00x" holds a character that is not a visible one (a control, format or space character) (line 3)`,
		}},
		{"unknown_pk_column.yaml", []string{
			`testdata/defs/unknown_pk_column.yaml: projection "artist_followers": primaryKey: unknown column "artist" (line 5)`,
		}},
		{"bad_cel.yaml", []string{
			`testdata/defs/bad_cel.yaml: projection "artist_followers": columns.bonus: derive: "points * 2" does not compile: 1:1: undeclared reference to 'points' (in container '') (line 9)`,
			`testdata/defs/bad_cel.yaml: projection "artist_followers": columns.score: derive: "payload.points / " does not compile: 1:18: Syntax error: `,
		}},
		{"unknown_type.yaml", []string{
			`testdata/defs/unknown_type.yaml: projection "artist_followers": columns.followers: type: unknown type "integr" (want one of text, bigint, integer, smallint, numeric, double precision, real, boolean, timestamptz, date, jsonb, uuid) (line 8)`,
		}},
		{"type_modifiers.yaml", []string{ // new-user trial: "unknown type \"numeric(10\"" and a key "2)"
			`testdata/defs/type_modifiers.yaml: projection "artist_ratings": columns.average: unknown key "2)" (want one of derive, from, notNull, type) (line 8)`,
			`testdata/defs/type_modifiers.yaml: projection "artist_ratings": columns.average: type: "numeric(10": type modifiers are not supported: write numeric (in a { } mapping, the comma of numeric(10,2) also starts a key) (line 8)`,
			`testdata/defs/type_modifiers.yaml: projection "artist_ratings": columns.votes: type: "bigint(20)": type modifiers are not supported: write bigint (line 10)`,
		}},
		{"duplicate_projection.yaml", []string{
			`testdata/defs/duplicate_projection.yaml: projections[1] ("artist_followers"): name: duplicate projection name (also projections[0]) (line 10)`,
		}},
		{"unknown_key.yaml", []string{
			`testdata/defs/unknown_key.yaml: projection "artist_followers": columns.artist_id: unknown key "form" (want one of derive, from, notNull, type) (line 7)`,
			`testdata/defs/unknown_key.yaml: projection "artist_followers": columns.artist_id: neither from nor derive is set; set exactly one (line 7)`,
		}},
		// New-user trial: validated, then every event dead-lettered.
		{"number_into_uuid.yaml", []string{
			`testdata/defs/number_into_uuid.yaml: projection "artist_followers": columns.at: from: ts is a JSON number, which a uuid column never takes (docs/definitions.md); use timestamptz (the event time) or bigint (line 9)`,
			`testdata/defs/number_into_uuid.yaml: projection "artist_followers": columns.version: from: sequenceNumber is a JSON number, which a uuid column never takes (docs/definitions.md); use bigint (line 8)`,
		}},
		// New-user trial: validated, then every event dead-lettered. A
		// numeric (nan) or uuid (32 hex digits) may take some names.
		{"tenant_into_integer.yaml", []string{
			`testdata/defs/tenant_into_integer.yaml: projection "artist_followers": columns.tenant_int: from: tenantSchema is a schema name (^[a-z_][a-z0-9_]{0,62}$), which no integer column takes (docs/definitions.md); use text (line 9)`,
			`testdata/defs/tenant_into_integer.yaml: projection "artist_followers": columns.tenant_no: from: tenantSchema is a schema name (^[a-z_][a-z0-9_]{0,62}$), which no bigint column takes (docs/definitions.md); use text (line 8)`,
		}},
		{"from_and_derive.yaml", []string{
			`testdata/defs/from_and_derive.yaml: projection "artist_followers": columns.score: both from and derive are set; set exactly one (line 8)`,
		}},
		// New-user trial: the duplicate name key was said under the
		// second name, the rest under the first; a same-line duplicate
		// said "line 8; first at line 8"; derive: "" was said twice.
		{"duplicate_name.yaml", []string{
			`testdata/defs/duplicate_name.yaml: projection "artist_followers": duplicate key "name" (line 4; first at line 3)`,
			`testdata/defs/duplicate_name.yaml: projection "artist_followers": columns.artist_id: duplicate key "from" (line 8, column 57; first at column 32)`,
			`testdata/defs/duplicate_name.yaml: projection "artist_followers": columns.empty: derive: is empty (line 9)`,
		}},
		{"duplicate_name_empty_derive.yaml", []string{
			`testdata/defs/duplicate_name_empty_derive.yaml: projections[0] ("artist_followers"): columns.empty: derive: is empty (line 8)`,
			`testdata/defs/duplicate_name_empty_derive.yaml: projections[1] ("artist_followers"): name: duplicate projection name (also projections[0]) (line 11)`,
		}},
		{"duplicate_key.yaml", []string{
			`testdata/defs/duplicate_key.yaml: projection "artist_followers": columns: duplicate key "artist_id" (line 8; first at line 7)`,
		}},
		{"many_problems.yaml", []string{
			`testdata/defs/many_problems.yaml: irVersion: missing`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": name: "Artist-Followers" is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$) (line 3)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": table: "_causet_tombstones" starts with the reserved prefix "_causet" (line 4)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": columns.artist_id: from: "paylod.artist_id" does not start with an event field (want one of payload, eventType, entityId, forkId, tenantSchema, irVersion, sequenceNumber, ts) (line 7)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": columns.seen: neither from nor derive is set; set exactly one (line 9)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": columns.ts_seq: from: "ts.seq": event field ts has no subfields (line 10)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": columns.user id: "user id" is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$) (line 8)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": primaryKey: column "artist_id" listed twice (line 5)`,
			`testdata/defs/many_problems.yaml: projection "Artist-Followers": events.ARTIST_UNFOLLOWED: unknown operation "remove" (want upsert or delete) (line 13)`,
			`testdata/defs/many_problems.yaml: projections[1]: name: missing (line 14)`,
			`testdata/defs/many_problems.yaml: projections[1]: columns: none defined (line 16)`,
			`testdata/defs/many_problems.yaml: projections[1]: primaryKey: empty: list the columns that identify a row, e.g. [user_id, artist_id] (line 15)`,
			`testdata/defs/many_problems.yaml: projections[1]: events: none defined (line 17)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			d, err := LoadDefinitions("testdata/defs/" + tt.file)
			if err == nil {
				t.Fatalf("LoadDefinitions = %+v, want an error", d)
			}
			checkErrorLines(t, err, tt.want)
		})
	}
}

// checkErrorLines checks that err has exactly the lines want (a want line
// ending in ": " matches as a prefix).
func checkErrorLines(t *testing.T, err error, want []string) {
	t.Helper()
	got := strings.Split(err.Error(), "\n")
	if len(got) != len(want) {
		t.Errorf("error has %d lines, want %d:\n%v", len(got), len(want), err)
	}
	for i := 0; i < len(got) && i < len(want); i++ {
		if strings.HasSuffix(want[i], ": ") && strings.HasPrefix(got[i], want[i]) {
			continue
		}
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, got[i], want[i])
		}
	}
}

func TestParseDefinitionsProblems(t *testing.T) {
	const head = "irVersion: v1\nprojections:\n  - name: p\n    table: t\n    primaryKey: [id]\n    events: {E: upsert}\n"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		// Nothing of the file read: only that, not what is missing because of it.
		{"empty file", "", []string{
			`d.yaml: empty file`,
		}},
		{"yaml syntax", "irVersion: [", []string{
			`d.yaml: not valid YAML or JSON: did not find expected node content (line 1)`,
		}},
		// The YAML parser numbers its own problems' lines from 0, its
		// scanner's from 1 (fresh-helper trial: an unclosed [ on line 9
		// was reported at line 8); each names the line where the
		// unclosed collection or string starts.
		{"unclosed flow sequence", "irVersion: v1\nprojections:\n  - name: a\n    primaryKey: [id\n    table: t\n", []string{
			`d.yaml: not valid YAML or JSON: did not find expected ',' or ']' (line 4): a [ opened on this line is not closed, or a quote inside it is not`,
		}},
		{"unclosed quote in a flow mapping", "irVersion: v1\nprojections:\n  - name: a\n    # a comment\n    columns: {id: {type: text, derive: \"x}}\n    table: \"t\"\n", []string{
			`d.yaml: not valid YAML or JSON: did not find expected ',' or '}' (line 5): a { opened on this line is not closed, or a quote inside it is not`,
		}},
		{"unclosed quote at the end", "irVersion: v1\nprojections:\n  - name: \"a\n", []string{
			`d.yaml: not valid YAML or JSON: found unexpected end of stream (line 3): the file ends inside a quoted string or a [ or { opened on this line`,
		}},
		// Only that: what the first document lacks may be in the next
		// (new-user trial: "projections: none defined" of a file whose
		// projections followed a "---").
		{"two documents", "irVersion: v1\nprojections: []\n---\nirVersion: v2\n", []string{
			`d.yaml: more than one YAML document (a line "---" starts another): put irVersion and projections in one`,
		}},
		{"projections in the second document", "irVersion: v1\n---\nprojections:\n  - name: a\n", []string{
			`d.yaml: more than one YAML document (a line "---" starts another): put irVersion and projections in one`,
		}},
		{"top-level unknown key", "irVersion: v1\nirversion: v2\nprojections: []\n", []string{
			`d.yaml: unknown key "irversion" (want one of irVersion, projections) (line 2)`,
			`d.yaml: projections: none defined (line 3)`,
		}},
		{"irVersion a number", "irVersion: 42\nprojections: {a: 1}\n", []string{
			`d.yaml: irVersion: must be a string (quote it: "42") (line 1)`,
			`d.yaml: projections: must be a list (line 2)`,
		}},
		{"projections not a list", "irVersion: v1\nprojections: {a: 1}\n", []string{
			`d.yaml: projections: must be a list (line 2)`,
		}},
		{"column not a mapping", head + "    columns:\n      id: text\n", []string{
			`d.yaml: projection "p": columns.id: must be a mapping (line 8)`,
		}},
		{"notNull not a bool", head + "    columns:\n      id: {type: text, from: entityId, notNull: yes}\n", []string{
			`d.yaml: projection "p": columns.id: notNull: must be true or false (line 8)`,
		}},
		{"null value", head + "    columns:\n      id: {type: text, from: ~}\n", []string{
			`d.yaml: projection "p": columns.id: from: must be a string (line 8)`,
		}},
		// A key present with a value of the wrong kind is reported once, as
		// such, never again as missing (new-user trial: "irVersion: missing"
		// for an irVersion that was there).
		{"irVersion a date", "irVersion: 2024-06-01\n" + head[len("irVersion: v1\n"):] + "    columns: {id: {type: text, from: entityId}}\n", []string{
			`d.yaml: irVersion: must be a string (quote it: "2024-06-01") (line 1)`,
		}},
		{"irVersion null", "irVersion:\n" + head[len("irVersion: v1\n"):] + "    columns: {id: {type: text, from: entityId}}\n", []string{
			`d.yaml: irVersion: must be a string (line 1)`,
		}},
		{"table a mapping", "irVersion: v1\nprojections:\n  - {name: p, table: {t: 1}, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n", []string{
			`d.yaml: projection "p": table: must be a string (line 3)`,
		}},
		{"name a list", "irVersion: v1\nprojections:\n  - {name: [p], table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n", []string{
			`d.yaml: projections[0]: name: must be a string (line 3)`,
		}},
		{"projection a string", "irVersion: v1\nprojections:\n  - p\n", []string{
			`d.yaml: projections[0]: must be a mapping (line 3)`,
		}},
		{"primaryKey a string", "irVersion: v1\nprojections:\n  - {name: p, table: t, primaryKey: id, columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n", []string{
			`d.yaml: projection "p": primaryKey: must be a list of column names (line 3)`,
		}},
		{"columns a list", "irVersion: v1\nprojections:\n  - {name: p, table: t, primaryKey: [id], columns: [id], events: {E: upsert}}\n", []string{
			`d.yaml: projection "p": columns: must be a mapping of column name to definition (line 3)`,
		}},
		{"events a list", "irVersion: v1\nprojections:\n  - {name: p, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: [E]}\n", []string{
			`d.yaml: projection "p": events: must be a mapping of event type to upsert or delete (line 3)`,
		}},
		{"type a list", head + "    columns:\n      id: {type: [text], from: entityId}\n", []string{
			`d.yaml: projection "p": columns.id: type: must be a string (line 8)`,
		}},
		// New-user trial: a tab, with the line as the other problems give it.
		{"tab indent", "irVersion: v1\nprojections:\n\t- name: a\n", []string{
			`d.yaml: not valid YAML or JSON: found character that cannot start any token (line 3): the line holds a tab; YAML indents with spaces`,
		}},
		{"file a list", "- irVersion: v1\n", []string{
			`d.yaml: must be a mapping (line 1)`,
		}},
		// A key that is absent is still reported missing, also next to
		// another key's problem.
		{"irVersion misspelt", "irVersoin: v1\n" + head[len("irVersion: v1\n"):] + "    columns: {id: {type: text, from: entityId}}\n", []string{
			`d.yaml: unknown key "irVersoin" (want one of irVersion, projections) (line 1)`,
			`d.yaml: irVersion: missing`,
		}},
		{"empty path segment", head + "    columns:\n      id: {type: text, from: payload..id}\n", []string{
			`d.yaml: projection "p": columns.id: from: "payload..id" has an empty path segment (line 8)`,
		}},
		// A typo far likelier than a key so spelt (definitions trial).
		{"path segment with white space", head + "    columns:\n      id: {type: text, from: entityId}\n      v: {type: text, from: \"payload.v \"}\n      w: {type: text, from: \"payload.\\tw\"}\n", []string{
			`d.yaml: projection "p": columns.v: from: "payload.v ": segment "v " starts or ends with white space; to read a key spelt so, use derive (payload["v "]) (line 9)`,
			`d.yaml: projection "p": columns.w: from: "payload.\tw": segment "\tw" starts or ends with white space; to read a key spelt so, use derive (payload["\tw"]) (line 10)`,
		}},
		// The event field: no derive reads it so (final fresh-user check).
		{"event field with white space", head + "    columns:\n      id: {type: text, from: entityId}\n      v: {type: text, from: \" payload.v\"}\n", []string{
			`d.yaml: projection "p": columns.v: from: " payload.v": segment " payload" starts or ends with white space: remove it (line 9)`,
		}},
		{"reserved column", head + "    columns:\n      id: {type: text, from: entityId}\n      _causet_seq: {type: bigint, from: sequenceNumber}\n", []string{
			`d.yaml: projection "p": columns._causet_seq: "_causet_seq" starts with the reserved prefix "_causet" (line 9)`,
		}},
		{"event type that YAML reads as null or a bool", "irVersion: v1\nprojections:\n  - name: p\n    table: t\n    primaryKey: [id]\n    columns: {id: {type: text, from: entityId}}\n    events: {~: upsert, true: upsert, \"null\": upsert, 123: delete}\n", []string{
			`d.yaml: projection "p": events: key ~ is YAML's null, not an event type name: quote it ("~") if an event type is spelt so (line 7)`,
			`d.yaml: projection "p": events: key true is YAML's bool, not an event type name: quote it ("true") if an event type is spelt so (line 7)`,
		}},
		{"system column", head + "    columns:\n      id: {type: text, from: entityId}\n      xmin: {type: text, from: forkId}\n      ctid: {type: bigint, from: sequenceNumber}\n", []string{
			`d.yaml: projection "p": columns.ctid: "ctid" is the name of a PostgreSQL system column (tableoid, xmin, cmin, xmax, cmax, ctid), which no table column may take; rename it (line 10)`,
			`d.yaml: projection "p": columns.xmin: "xmin" is the name of a PostgreSQL system column (tableoid, xmin, cmin, xmax, cmax, ctid), which no table column may take; rename it (line 9)`,
		}},
		{"event type with white space or an invisible character", "irVersion: v1\nprojections:\n  - name: p\n    table: t\n    primaryKey: [id]\n    columns: {id: {type: text, from: entityId}}\n    events:\n      \" E\": upsert\n      \"E\\t\": upsert\n      \"ORDER\\u200bPLACED\": delete\n      \"ORDER PLACED\": upsert\n", []string{
			`d.yaml: projection "p": events[" E"]: " E" starts or ends with white space, and an event's eventType is matched exactly: remove it (line 8)`,
			`d.yaml: projection "p": events["E\t"]: "E\t" starts or ends with white space, and an event's eventType is matched exactly: remove it (line 9)`,
			`d.yaml: projection "p": events["ORDER\u200bPLACED"]: "ORDER\u200bPLACED" holds a character that is not a visible one (a control or format character), and an event's eventType is matched exactly: remove it (line 10)`,
		}},
		// A contradiction, refused (definition-author trial: validate said
		// ok); notNull: false on another column is the default, said.
		{"primary-key column notNull false", head + "    columns:\n      id: {type: text, from: entityId, notNull: false}\n      v: {type: text, from: forkId, notNull: false}\n", []string{
			`d.yaml: projection "p": columns.id: notNull: false, but the column is in primaryKey, and a primary-key column is always NOT NULL: remove notNull: false (line 8)`,
		}},
		{"payload into a column not jsonb", head + "    columns:\n      id: {type: text, from: entityId}\n      doc: {type: jsonb, from: payload}\n      all: {type: text, from: payload}\n", []string{
			`d.yaml: projection "p": columns.all: from: payload is the whole JSON object, which only a jsonb column takes (docs/definitions.md); make the column jsonb or take a field, payload.<key> (line 10)`,
		}},
		{"identifier too long", head + "    columns:\n      id: {type: text, from: entityId}\n      " + strings.Repeat("c", 64) + ": {type: text, from: forkId}\n", []string{
			`d.yaml: projection "p": columns.` + strings.Repeat("c", 64) + `: "` + strings.Repeat("c", 64) + `" is 64 bytes, longer than the 63 PostgreSQL keeps of a name (want ^[a-z_][a-z0-9_]{0,62}$) (line 9)`,
		}},
		{"YAML merge key", "irVersion: v1\nprojections:\n  - name: p\n    table: t\n    primaryKey: [id]\n    events: {E: upsert}\n    columns:\n      id: &text {type: text, from: entityId}\n      v:\n        <<: *text\n        from: forkId\n", []string{
			`d.yaml: projection "p": columns.v: YAML merge keys (<<) are not supported: write the keys out, or make the whole value an alias (*name) (line 10)`,
			`d.yaml: projection "p": columns.v: type: missing (line 10)`, // as merged in, it is
		}},
		// New-user trial: validated, then every event dead-lettered. A
		// derive whose type the checker knows, and which no value of fits
		// the column; a dyn, a string and a number into a number column
		// may fit, by value.
		{"derive of a type the column never takes", head + "    columns:\n      id: {type: text, from: entityId}\n" +
			"      flag: {type: bigint, derive: 'payload.n > 3'}\n" +
			"      at: {type: integer, derive: \"timestamp('2024-01-01T00:00:00Z')\"}\n" +
			"      tags: {type: text, derive: '[1, 2]'}\n" +
			"      u: {type: uuid, derive: '1 + 2'}\n" +
			"      m: {type: numeric, derive: \"{'a': payload.n}\"}\n" +
			"      ok1: {type: boolean, derive: 'payload.n > 3'}\n" +
			"      ok2: {type: jsonb, derive: \"{'a': [1]}\"}\n" +
			"      ok3: {type: date, derive: \"timestamp('2024-01-01T00:00:00Z')\"}\n" +
			"      ok4: {type: smallint, derive: '1 + 2'}\n" +
			"      ok5: {type: text, derive: 'payload.n > 3'}\n" +
			"      ok6: {type: bigint, derive: 'payload.n'}\n" +
			"      ok7: {type: uuid, derive: \"payload.n > 3 ? 'x' : dyn(null)\"}\n", []string{
			`d.yaml: projection "p": columns.at: derive: "timestamp('2024-01-01T00:00:00Z')" returns a timestamp, and a timestamp cannot be stored in an integer column: every event would be dead-lettered (line 10)`,
			`d.yaml: projection "p": columns.flag: derive: "payload.n > 3" returns a bool, and a JSON boolean cannot be stored in a bigint column: every event would be dead-lettered (line 9)`,
			`d.yaml: projection "p": columns.m: derive: "{'a': payload.n}" returns a map, and a JSON object cannot be stored in a numeric column (only jsonb): every event would be dead-lettered (line 13)`,
			`d.yaml: projection "p": columns.tags: derive: "[1, 2]" returns a list, and a JSON array cannot be stored in a text column (only jsonb): every event would be dead-lettered (line 11)`,
			`d.yaml: projection "p": columns.u: derive: "1 + 2" returns an int, and a JSON number cannot be stored in a uuid column: every event would be dead-lettered (line 12)`,
		}},
		{"derive runtime-only problems compile", head + "    columns:\n      id: {type: text, derive: 'string(payload.a / payload.b)'}\n", nil},
		// New-user trial: '1/0' validated, and every event would have been
		// dead-lettered. An expression of no event field is evaluated
		// once; one that reads a field is left to each event.
		{"derive of no event field that fails", head + "    columns:\n      id: {type: text, from: entityId}\n" +
			"      z: {type: bigint, derive: '1/0'}\n" +
			"      t: {type: bigint, derive: '[1, 2][5]'}\n" +
			"      ok1: {type: bigint, derive: '2 * 3'}\n" +
			"      ok2: {type: bigint, derive: 'payload.n / 0'}\n" +
			"      n: {type: bigint, derive: 'null', notNull: true}\n" +
			"      s: {type: smallint, derive: '100000'}\n" +
			"      u: {type: uuid, derive: \"'x'\"}\n" +
			"      ok3: {type: bigint, derive: 'null'}\n" +
			"      ok4: {type: text, derive: \"'x'\"}\n" +
			"      mi: {type: jsonb, derive: \"{1: 'a'}\"}\n" +
			"      mf: {type: jsonb, derive: \"{1: 'a', 2: payload.?name.orValue('x')}\"}\n" +
			"      lb: {type: jsonb, derive: \"[b'abc']\"}\n" +
			"      ok5: {type: jsonb, derive: \"{'a': 1, 'b': payload.?name.orValue('x')}\"}\n" +
			"      ok6: {type: jsonb, derive: \"dyn({'a': 1})\"}\n" +
			"      nm: {type: jsonb, derive: \"{'a': {1: payload.?name.orValue('x')}}\"}\n" +
			"      nl: {type: jsonb, derive: \"[{true: payload.?name.orValue('x')}]\"}\n" +
			"      ok7: {type: jsonb, derive: \"{'a': {'b': [payload.?name.orValue('x')]}}\"}\n" +
			"      no: {type: jsonb, derive: \"optional.of({1: payload.?name.orValue('x')})\"}\n", []string{
			`d.yaml: projection "p": columns.lb: derive: "[b'abc']" reads no event field and gives a value no column takes: result of type bytes cannot be stored: every event would be dead-lettered (line 20)`,
			`d.yaml: projection "p": columns.mf: derive: "{1: 'a', 2: payload.?name.orValue('x')}" returns a map of int keys, and a JSON object's keys are strings: every event would be dead-lettered (line 19)`,
			`d.yaml: projection "p": columns.mi: derive: "{1: 'a'}" reads no event field and gives a value no column takes: map key 1 is an int, not a string: every event would be dead-lettered (line 18)`,
			`d.yaml: projection "p": columns.n: derive: "null" is always null, and the column is notNull (or in the primary key): every event would be dead-lettered (line 13)`,
			`d.yaml: projection "p": columns.nl: derive: "[{true: payload.?name.orValue('x')}]" returns list(map(bool, dyn)), which holds a map of bool keys, and a JSON object's keys are strings: every event would be dead-lettered (line 24)`,
			`d.yaml: projection "p": columns.nm: derive: "{'a': {1: payload.?name.orValue('x')}}" returns map(string, map(int, dyn)), which holds a map of int keys, and a JSON object's keys are strings: every event would be dead-lettered (line 23)`,
			`d.yaml: projection "p": columns.no: derive: "optional.of({1: payload.?name.orValue('x')})" returns optional_type(map(int, dyn)), which holds a map of int keys, and a JSON object's keys are strings: every event would be dead-lettered (line 26)`,
			`d.yaml: projection "p": columns.s: derive: "100000" always gives number 100000, and value "100000" is out of range for type smallint: every event would be dead-lettered (line 14)`,
			`d.yaml: projection "p": columns.t: derive: "[1, 2][5]" reads no event field and fails: index out of bounds: 5: every event would be dead-lettered (line 10)`,
			`d.yaml: projection "p": columns.u: derive: "'x'" always gives string "x", and invalid input syntax for type uuid: "x": every event would be dead-lettered (line 15)`,
			`d.yaml: projection "p": columns.z: derive: "1/0" reads no event field and fails: division by zero: every event would be dead-lettered (line 9)`,
		}},
		{"duplicate table", "irVersion: v1\nprojections:\n" +
			"  - {name: a, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n" +
			"  - {name: b, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n", []string{
			`d.yaml: projection "b": table: "t" is also the table of projections[0] ("a") (line 4)`,
		}},
		{"duplicate name and table", "irVersion: v1\nprojections:\n" +
			"  - {name: a, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n" +
			"  - {name: a, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n", []string{
			`d.yaml: projections[1] ("a"): name: duplicate projection name (also projections[0]) (line 4)`,
			`d.yaml: projections[1] ("a"): table: "t" is also the table of projections[0] ("a") (line 4)`,
		}},
		// The parser's messages (an unknown key) tell two projections of one name apart too.
		{"duplicate name and an unknown key", "irVersion: v1\nprojections:\n" +
			"  - {name: a, table: t, primaryKey: [id], columns: {id: {type: text, from: entityId}}, events: {E: upsert}}\n" +
			"  - {name: a, table: u, primaryKey: [id], columns: {id: {type: text, from: entityId, colour: red}}, events: {E: upsert}}\n", []string{
			`d.yaml: projections[1] ("a"): columns.id: unknown key "colour" (want one of derive, from, notNull, type) (line 4)`,
			`d.yaml: projections[1] ("a"): name: duplicate projection name (also projections[0]) (line 4)`,
		}},
		{"empty event type", head[:len(head)-len("    events: {E: upsert}\n")] + "    events: {'': upsert}\n    columns: {id: {type: text, from: entityId}}\n", []string{
			`d.yaml: projection "p": events: empty event type (line 6)`,
		}},
		// Security trial: a key holding control characters reached the
		// error raw, a terminal's escape sequence clearing the screen and a
		// new line forging a line; such a key's path is Go-quoted.
		{"control characters in keys", head[:len(head)-len("    events: {E: upsert}\n")] +
			"    events: {\"E\\nX\": upsert2}\n    columns: {id: {type: text, from: entityId}, \"v\\e[2J\\rOK\": {type: text, from: entityId}}\n", []string{
			`d.yaml: projection "p": events["E\nX"]: "E\nX" holds a character that is not a visible one (a control or format character), and an event's eventType is matched exactly: remove it (line 6)`,
			`d.yaml: projection "p": columns["v\x1b[2J\rOK"]: "v\x1b[2J\rOK" is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$) (line 7)`,
			`d.yaml: projection "p": events["E\nX"]: unknown operation "upsert2" (want upsert or delete) (line 6)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseDefinitions("d.yaml", []byte(tt.src))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("ParseDefinitions: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseDefinitions = %+v, want an error", d)
			}
			checkErrorLines(t, err, tt.want)
		})
	}
}

func TestParseDefinitionsNormalisesTypes(t *testing.T) {
	src := `irVersion: v1
projections:
  - name: p
    table: t
    primaryKey: [z_id]
    columns:
      z_id: {type: INT8, from: entityId}
      a:    {type: int4, from: payload.a}
      m:    {type: "Double  Precision", from: payload.m}
      b:    {type: bool, from: payload.b}
      c:    {type: timestamp with time zone, from: ts}
      d:    {type: decimal, from: payload.d}
    events: {E: upsert}
`
	d, err := ParseDefinitions("d.yaml", []byte(src))
	if err != nil {
		t.Fatalf("ParseDefinitions: %v", err)
	}
	pd := d.Projections[0]
	got := map[string]string{}
	for name, c := range pd.Columns {
		got[name] = c.Type
	}
	want := map[string]string{"z_id": "bigint", "a": "integer", "m": "double precision", "b": "boolean", "c": "timestamptz", "d": "numeric"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("types (-want +got):\n%s", diff)
	}
	// File order, not sorted order.
	if diff := cmp.Diff([]string{"z_id", "a", "m", "b", "c", "d"}, pd.ColumnNames); diff != "" {
		t.Errorf("column order (-want +got):\n%s", diff)
	}
}

func TestHandBuiltDefinitionsGetSortedColumnOrder(t *testing.T) {
	d := &Definitions{IRVersion: "v1", Projections: []ProjectionDef{{
		Name: "p", Table: "t", PrimaryKey: []string{"id"},
		Columns: map[string]ColumnDef{
			"id": {Type: "text", From: "entityId"},
			"b":  {Type: "int8", From: "payload.b"},
			"a":  {Type: "jsonb", Derive: "payload"},
		},
		Events: map[string]Op{"E": OpUpsert},
	}}}
	tps, err := NewTableProjections(d)
	if err != nil {
		t.Fatalf("NewTableProjections: %v", err)
	}
	if diff := cmp.Diff([]string{"a", "b", "id"}, d.Projections[0].ColumnNames); diff != "" {
		t.Errorf("column order (-want +got):\n%s", diff)
	}
	if got := d.Projections[0].Columns["b"].Type; got != "bigint" {
		t.Errorf("type of b = %q, want bigint", got)
	}
	if tps[0].Name() != "p" || !tps[0].Handles("E") || tps[0].Handles("F") {
		t.Errorf("Name/Handles wrong: %q", tps[0].Name())
	}

	// A hostile hand-built definition never reaches SQL.
	bad := &Definitions{IRVersion: "v1", Projections: []ProjectionDef{{
		Name: "p", Table: `t"; DROP TABLE x; --`, PrimaryKey: []string{"id"},
		Columns: map[string]ColumnDef{"id": {Type: "text; DROP", From: "entityId"}},
		Events:  map[string]Op{"E": OpUpsert},
	}}}
	_, err = NewTableProjections(bad)
	checkErrorLines(t, err, []string{
		`projection definitions: projection "p": table: "t\"; DROP TABLE x; --" is not a valid identifier (want ^[a-z_][a-z0-9_]{0,62}$)`,
		`projection definitions: projection "p": columns.id: type: unknown type "text; DROP" (want one of text, bigint, integer, smallint, numeric, double precision, real, boolean, timestamptz, date, jsonb, uuid)`,
	})
}

// TestLoadDefinitionsRefusesNonRegularFiles: a device or a FIFO given as the
// definitions file must fail at once, not fill memory or block (a
// /dev/zero path once grew the process to 24 GB).
func TestLoadDefinitionsRefusesNonRegularFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "defs.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxDefinitionsSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", fifo, t.TempDir(), big} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := LoadDefinitions(path); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) {
					t.Errorf("LoadDefinitions(%s) = %v, want an error naming the file", path, err)
				}
				if st, _ := os.Stat(path); st != nil && st.IsDir() && !strings.Contains(err.Error(), "a directory") {
					t.Errorf("LoadDefinitions(%s) = %v, want it called a directory (not its mode bits)", path, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("LoadDefinitions(%s) blocked", path)
			}
		})
	}
}

// TestIRVersionIsShortAndVisible: an irVersion longer than maxIRVersion,
// or with a character that shows as nothing (a right-to-left override, a
// space), is refused naming irVersion (second new-user trial: taken into
// every dead letter's generation header); an ordinary one is taken.
func TestIRVersionIsShortAndVisible(t *testing.T) {
	file := func(ir string) []byte {
		return []byte("irVersion: " + strconv.Quote(ir) + `
projections:
  - name: p
    table: t
    primaryKey: [id]
    events: { E: upsert }
    columns:
      id: { type: text, from: entityId }
`)
	}
	for ir, want := range map[string]string{
		"v42\u202e":             `irVersion: "v42\u202e" holds a character that is not a visible one`,
		"v 42":                  `holds a character that is not a visible one`,
		strings.Repeat("v", 65): "irVersion: is 65 bytes, longer than 64",
		"v42":                   "",
		"2024-06.ünïcode":       "",
	} {
		_, err := ParseDefinitions("d.yaml", file(ir))
		switch {
		case want == "" && err != nil:
			t.Errorf("irVersion %q: %v, want none", ir, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("irVersion %q: %v, want %q", ir, err, want)
		}
	}
}

// TestLoadDefinitionsOfWhatIsNotAFile: a directory or a device given as
// the definitions file is refused in words (second new-user trial:
// /dev/null gave "not a regular file (Dc---------)").
func TestLoadDefinitionsOfWhatIsNotAFile(t *testing.T) {
	for path, want := range map[string]string{
		t.TempDir(): "a directory, not a definitions file",
		os.DevNull:  "not a regular file (a device): give the definitions file's path",
	} {
		if _, err := LoadDefinitions(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadDefinitions(%s) error = %v, want %q", path, err, want)
		}
	}
}

// TestPrimaryKeyMissingOrEmpty: a projection without primaryKey is told
// it is missing; one with primaryKey: [] is told it is empty and what to
// list (new-user trial: both read "missing").
func TestPrimaryKeyMissingOrEmpty(t *testing.T) {
	for key, want := range map[string]string{
		"":                     "primaryKey: missing",
		"primaryKey: []\n    ": "primaryKey: empty: list the columns that identify a row",
	} {
		src := "irVersion: v1\nprojections:\n  - name: p\n    table: p\n    " + key +
			"columns:\n      k: { type: text, from: entityId }\n    events: { E: upsert }\n"
		_, err := ParseDefinitions("p.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", key, err, want)
		}
	}
}
