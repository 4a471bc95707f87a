package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

func TestSummaryTableAlignsGroupsLargestFirst(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByProjection)
	for _, a := range []struct {
		e      *dlq.Entry
		status string
	}{
		{&dlq.Entry{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719331200000}}, dlq.ActionReplayed},
		{&dlq.Entry{Projection: "artist_followers", Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719334800000}}, ""},
		{&dlq.Entry{Projection: "artist_ratings", Message: dlq.Message{Error: "derive stars: division by zero\nat line 2", FailedAt: 1719338400000}}, dlq.ActionSkipped},
	} {
		s.Add(a.e, a.status)
	}
	tests := []struct {
		name  string
		width int
		wide  bool
		want  string
	}{
		{"default", 100, false, `COUNT  REPLAYED  SKIPPED  PROJECTION        SAMPLE ERROR
2      1         0        artist_followers  ERROR: column "followed_at" does not exist (SQLSTATE 42…
1      0         1        artist_ratings    derive stars: division by zero
`},
		{"narrow terminal", 80, false, `COUNT  REPLAYED  SKIPPED  PROJECTION        SAMPLE ERROR
2      1         0        artist_followers  ERROR: column "followed_at" does no…
1      0         1        artist_ratings    derive stars: division by zero
`},
		{"wide", 0, true, `COUNT  REPLAYED  SKIPPED  FIRST FAILED          LAST FAILED           PROJECTION        SAMPLE ERROR
2      1         0        2024-06-25T16:00:00Z  2024-06-25T17:00:00Z  artist_followers  ERROR: column "followed_at" does not exist (SQLSTATE 42703)
1      0         1        2024-06-25T18:00:00Z  2024-06-25T18:00:00Z  artist_ratings    derive stars: division by zero
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeSummaryTable(&b, s, tt.width, tt.wide); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, b.String()); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSummaryByTenantKeepsTheTenantWhole: grouped by tenant schema, the
// key column is never cut, so that tenants of a long common prefix stay
// apart in a narrow terminal; the sample error gives way instead (second
// new-user trial: "acme_concertapp_produc…" twice).
func TestSummaryByTenantKeepsTheTenantWhole(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByTenant)
	for _, tenant := range []string{"acme_concertapp_production_eu_west", "acme_concertapp_production_us_east"} {
		s.Add(&dlq.Entry{Projection: "artist_followers", TenantSchema: tenant,
			Message: dlq.Message{Error: "ERROR: column \"followed_at\" does not exist (SQLSTATE 42703)", FailedAt: 1719331200000}}, "")
	}
	var b strings.Builder
	if err := writeSummaryTable(&b, s, 80, false); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme_concertapp_production_eu_west", "acme_concertapp_production_us_east"} {
		if !strings.Contains(b.String(), tenant+" ") {
			t.Errorf("tenant %s cut in an 80-column summary:\n%s", tenant, b.String())
		}
	}
}

// TestSummaryNamesTheMissingProjectionInAList: a group whose dead letters
// include records that reached no projection (projection "") lists it as
// "(none)" beside the others; alone it is —, as every missing value (new-user
// trial: "—,artist_fo…" read as a projection named —).
func TestSummaryNamesTheMissingProjectionInAList(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByTenant)
	for _, e := range []struct{ projection, tenant string }{
		{"", "acme_prod"}, {"artist_followers", "acme_prod"}, {"", "acme_staging"},
	} {
		s.Add(&dlq.Entry{Projection: e.projection, TenantSchema: e.tenant,
			Message: dlq.Message{Error: "invalid event: sequenceNumber: -1 is negative", FailedAt: 1719331200000}}, "")
	}
	var b strings.Builder
	if err := writeSummaryTable(&b, s, 200, false); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"acme_prod": "(none),artist_followers", "acme_staging": "—"}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) > 4 && want[f[3]] != "" {
			if f[4] != want[f[3]] {
				t.Errorf("%s: PROJECTIONS %q, want %q:\n%s", f[3], f[4], want[f[3]], b.String())
			}
			delete(want, f[3])
		}
	}
	if len(want) > 0 {
		t.Errorf("no row for %v:\n%s", want, b.String())
	}
}

// TestTableFitsWidth: lines never exceed the width while a shrinkable
// column can give way; the widest shrinkable column gives way first, a
// column never gets narrower than its header, and the others are never
// cut.
func TestTableFitsWidth(t *testing.T) {
	long := strings.Repeat("x", 150)
	tests := []struct {
		name  string
		width int
		rows  [][]string
		want  string
	}{
		{"fits: nothing cut", 40, [][]string{{"0:1", "short", "err"}},
			"DLQ  PROJECTION  ERROR\n0:1  short       err\n"},
		{"the widest shrinks first", 40, [][]string{{"0:1", "artist_followers", long}},
			"DLQ  PROJECTION        ERROR\n0:1  artist_followers  xxxxxxxxxxxxxxxx…\n"},
		{"then the widest of them in turn", 30, [][]string{{"0:1", "artist_followers", long}},
			"DLQ  PROJECTION   ERROR\n0:1  artist_fol…  xxxxxxxxxxx…\n"},
		{"never below the header", 24, [][]string{{"0:12345", "artist_followers", long}},
			"DLQ      PROJECTION  ERROR\n0:12345  artist_fo…  xxxx…\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(tt.width, col("DLQ"), shrinkCol("PROJECTION"), shrinkCol("ERROR"))
			for _, r := range tt.rows {
				tb.add(r...)
			}
			var b strings.Builder
			if err := tb.write(&b); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, b.String()); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCellCutsLongAndControlCharacters(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"a\tb\nc", 10, "a b c"},
		{"ümlautsüber", 5, "ümla…"},
		// Fresh-user trial: U+202E (right-to-left override) from a record
		// key reversed the rest of the terminal line; C1 controls too.
		{"esc\x1b[2J\u202eevil\u2066x\u0085y", 20, "esc [2J evil x y"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := cell(tt.in, tt.n); got != tt.want {
				t.Errorf("cell(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
		})
	}
	if got, want := escapeControls("RED\u202eevil\n"), `RED\u202eevil\n`; got != want {
		t.Errorf("escapeControls = %q, want %q", got, want)
	}
}

// TestListErrorCellLeavesOutItsOwnProjection: the list's ERROR cell (and
// summary's SAMPLE ERROR) drops a leading `projection "<p>": ` or `apply
// <event type> to <p>: ` that names the row's projection (new-user trial:
// at 100 columns only `projection "artist_fo…` showed), and keeps every
// other error whole.
func TestListErrorCellLeavesOutItsOwnProjection(t *testing.T) {
	const valueErr = `projection "artist_followers": column score (from payload.points, JSON number): value "3000000000" is out of range for type integer`
	tests := []struct{ projection, msg, want string }{
		{"artist_followers", valueErr + "\nmore", `column score (from payload.points, JSON number): value "3000000000" is out of range for type integer`},
		{"user_follows", valueErr, valueErr},
		{"", valueErr, valueErr},
		{"artist_followers", `projection "artist_followers": `, `projection "artist_followers":`},
		{"artist_followers", "ERROR: relation \"x\" does not exist (SQLSTATE 42P01)", "ERROR: relation \"x\" does not exist (SQLSTATE 42P01)"},
		// A connection failure's error names the event type and the
		// projection first (second new-user trial: two such groups of
		// summary read alike, `apply ARTIST_FOLLOWED to artist_follo…`).
		{"artist_followers", "apply ARTIST_FOLLOWED to artist_followers: conn closed", "conn closed"},
		{"user_follows", "apply ARTIST_FOLLOWED to artist_followers: conn closed", "apply ARTIST_FOLLOWED to artist_followers: conn closed"},
		{"artist_followers", "apply ARTIST_FOLLOWED to artist_followers: ", "apply ARTIST_FOLLOWED to artist_followers:"},
	}
	for _, tt := range tests {
		if got := errorCell(tt.projection, tt.msg); got != tt.want {
			t.Errorf("errorCell(%q, %q) = %q, want %q", tt.projection, tt.msg, got, tt.want)
		}
	}
	lw, err := newListWriter(io.Discard, "table", 100, false)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	lw.w = &b
	if err := lw.write(&dlq.Entry{Projection: "artist_followers", TenantSchema: "acme_concertapp_production",
		Message: dlq.Message{Error: valueErr, FailedAt: 1719331200000}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := lw.flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "column score (") {
		t.Errorf("a 100-column list does not show the column the error names:\n%s", b.String())
	}
}

// TestSummaryByErrorShowsTheErrorOnce: grouped by error, the key is the
// sample's first line, so SAMPLE ERROR is not shown, and a leading
// `projection "<p>": ` of a group of that one projection is left out
// (PROJECTIONS names it), and a long error is cut in its middle: at 80
// columns the rows differ where their errors do (new-user trial: key and sample both cut to ~23 characters,
// five rows of "invalid event: sequenc…"). Ties come in the order of the
// errors as shown, without the projection prefix the key holds (third
// new-user trial: they looked shuffled).
func TestSummaryByErrorShowsTheErrorOnce(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByError)
	for _, e := range []*dlq.Entry{
		{Projection: "artist_followers", Message: dlq.Message{Error: `projection "artist_followers": column score (from payload.points, JSON number): value "3000000000" is out of range for type integer`}},
		{Projection: "artist_followers", Message: dlq.Message{Error: `projection "artist_followers": column user_id (from payload.user_id, JSON null): null value in a primary key column`}},
		{Projection: "artist_ratings", Message: dlq.Message{Error: "invalid event: sequenceNumber: must be a JSON integer, got string \"7\""}},
		{Projection: "artist_ratings", Message: dlq.Message{Error: "invalid event: sequenceNumber: must be >= 0, got -1"}},
	} {
		s.Add(e, "")
	}
	var b strings.Builder
	if err := writeSummaryTable(&b, s, 80, false); err != nil {
		t.Fatal(err)
	}
	want := `COUNT  REPLAYED  SKIPPED  ERROR                                 PROJECTIONS
1      0         0        column score (fro…e for type integer  artist_followers
1      0         0        column user_id (f…primary key column  artist_followers
1      0         0        invalid event: se…st be >= 0, got -1  artist_ratings
1      0         0        invalid event: se…er, got string "7"  artist_ratings
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

// TestSummaryByErrorSaysWhenCutRowsLookAlike: two errors that differ only
// in their middle are cut to one text at 100 columns; the table says so,
// and how to see them whole (operator trial: two rows of `ERROR: relation
// "trial49_no…s not exist (SQLSTATE 42P01)`). Rows that look different say
// nothing more.
func TestSummaryByErrorSaysWhenCutRowsLookAlike(t *testing.T) {
	const note = "(rows cut alike differ in the part cut out: --wide or --output json shows them whole)" // within 100 columns
	missing := func(tenant string) string {
		return `projection "artist_followers": ERROR: relation "` + tenant + `.artist_followers" does not exist (SQLSTATE 42P01)`
	}
	for _, tt := range []struct {
		name   string
		errors []string
		want   bool
	}{
		{"alike", []string{missing("trial49_nomig"), missing("trial49_nomig2")}, true},
		{"not alike", []string{missing("trial49_nomig"), `projection "artist_followers": column score (from payload.points, JSON number): value "3000000000" is out of range for type integer`}, false},
	} {
		s := dlq.NewSummary(dlq.GroupByError)
		for _, e := range tt.errors {
			s.Add(&dlq.Entry{Projection: "artist_followers", Message: dlq.Message{Error: e}}, "")
		}
		var b strings.Builder
		if err := writeSummaryTable(&b, s, 70, false); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.String(), note); got != tt.want {
			t.Errorf("%s: the note is there: %t, want %t\n%s", tt.name, got, tt.want, b.String())
		}
	}
}

// TestSummaryByFingerprintLeavesOutTheProjectionPrefix: the worker's
// errors begin `projection "<p>": `; grouped by fingerprint, a group of
// that one projection shows its sample error without it, so that groups
// of one projection differ where their errors do (second new-user trial:
// five rows of `projection "artist_followers": derive…`).
func TestSummaryByFingerprintLeavesOutTheProjectionPrefix(t *testing.T) {
	s := dlq.NewSummary(dlq.GroupByFingerprint)
	for _, e := range []*dlq.Entry{
		{Projection: "artist_followers", Fingerprint: "0bc0e90fe23c6108", Message: dlq.Message{Error: `projection "artist_followers": derive score: division by zero`}},
		{Projection: "artist_followers", Fingerprint: "1a2892427bfb7847", Message: dlq.Message{Error: `projection "artist_followers": column user_id (from payload.user_id, JSON null): null value in a primary key column`}},
	} {
		s.Add(e, "")
	}
	var b strings.Builder
	if err := writeSummaryTable(&b, s, 100, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0bc0e90fe23c6108  artist_followers  derive score: division by zero", "1a2892427bfb7847  artist_followers  column user_id"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table does not have %q:\n%s", want, b.String())
		}
	}
}

// TestOutcomeLineCutsALongKey: a key over 120 bytes is quoted cut, with
// its size (third new-user trial: a 3 MiB key made a 3 MB line); a short
// one whole.
func TestOutcomeLineCutsALongKey(t *testing.T) {
	for key, want := range map[string]string{
		"user-1":                  ` key="user-1" `,
		strings.Repeat("k", 5000): ` key="` + strings.Repeat("k", 120) + `"…(5000 bytes) `,
	} {
		line := outcomeLine(dlq.Outcome{Entry: &dlq.Entry{Key: []byte(key)}, Kind: dlq.OutcomeReplayed, DryRun: true, Partition: -1})
		if !strings.Contains(line, want) || len(line) > 400 {
			t.Errorf("outcome line of a %d-byte key: %.200q, want %q", len(key), line, want)
		}
	}
}

// TestOutcomeLineEscapesTheLedgersReason: an already-skipped line quotes
// the ledger's actor and reason, which skip takes as given; their control
// characters are escaped, so that the line stays one line and the
// terminal plain (new-user trial: a reason with "\n" and "\x1b[31m").
func TestOutcomeLineEscapesTheLedgersReason(t *testing.T) {
	o := dlq.Outcome{Entry: &dlq.Entry{}, Kind: dlq.OutcomeSkipped, Decided: true, Partition: -1,
		Reason: "skipped by eve\tx: line1\nline2\x1b[31mRED\u0085"}
	line := outcomeLine(o)
	want := `: skipped by eve\tx: line1\nline2\x1b[31mRED\u0085`
	if !strings.HasSuffix(line, want) || strings.ContainsFunc(line, unicode.IsControl) {
		t.Errorf("outcomeLine = %q, want it to end %q, with no control character", line, want)
	}
}

// TestListJSONIsOneLinePerDeadLetter: `list --output json` writes one JSON
// object per line even when the original event holds newlines, inside its
// object (written over several lines) or around it (a trailing newline,
// which the dead letter and a replay keep byte for byte; new-user trial),
// and each line reads back as the same original event.
func TestListJSONIsOneLinePerDeadLetter(t *testing.T) {
	var out bytes.Buffer
	lw, err := newListWriter(&out, "json", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	originals := []string{`{"a":1}`, "{\n  \"a\": 1,\n  \"b\": \"x\\ny\"\n}", "{\"a\":1}\r\n", " \n\t{\"a\": [1,\n2]} \n"}
	for i, o := range originals {
		e := &dlq.Entry{Offset: int64(i), Message: dlq.Message{OriginalEvent: json.RawMessage(o), Error: "boom", FailedAt: 1}}
		if err := lw.write(e, nil); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(originals) {
		t.Fatalf("%d lines for %d dead letters:\n%s", len(lines), len(originals), out.String())
	}
	for i, l := range lines {
		var v struct {
			OriginalEvent json.RawMessage `json:"originalEvent"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		var got, want any
		if json.Unmarshal(v.OriginalEvent, &got) != nil || json.Unmarshal([]byte(originals[i]), &want) != nil || !cmp.Equal(got, want) {
			t.Errorf("line %d: originalEvent %s, want the value of %q", i, v.OriginalEvent, originals[i])
		}
	}
}

// TestNoMatchTextCountsInTheSingular: one record that is not a dead letter
// is said in the singular (replayer trial: "and 1 records that are not
// dead letters").
func TestNoMatchTextCountsInTheSingular(t *testing.T) {
	for _, tt := range []struct {
		st   dlq.ScanStats
		want string
	}{
		{dlq.ScanStats{Scanned: 4, Undecodable: 1}, "(3 dead letters scanned, and 1 record that is not a dead letter)"},
		{dlq.ScanStats{Scanned: 5, Undecodable: 2}, "(3 dead letters scanned, and 2 records that are not dead letters)"},
	} {
		if got := noMatchText(tt.st); !strings.HasSuffix(got, tt.want) {
			t.Errorf("noMatchText(%+v) = %q, want it to end %q", tt.st, got, tt.want)
		}
	}
}

// TestListJSONKeepsAKeyThatIsNotUTF8: list --output json gives a record key
// that is not UTF-8 in keyBase64 too, its bytes whole ("every value
// whole"; fresh-user trial: key ff fe 6b 65 79 read "\ufffd\ufffdkey" with
// nothing else holding it); a UTF-8 key has no keyBase64.
func TestListJSONKeepsAKeyThatIsNotUTF8(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	f.add(t, "user-1", "production", "acme_prod", "artist_followers", columnErr, t0)
	key := []byte{0xff, 0xfe, 'k', 'e', 'y'}
	rec, err := dlq.NewRecord(dlq.DeadLetter{
		Source: &kgo.Record{Topic: f.events, Partition: 2, Offset: 99, Key: key,
			Value: []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"e","forkId":"production","tenantSchema":"acme_prod","irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":"u","artist_id":"a-1"}}`)},
		Projection: "artist_followers", TenantSchema: "acme_prod", ForkID: "production", EventType: "ARTIST_FOLLOWED",
		Class: retry.Classify(columnErr), Err: columnErr, Retries: 5,
	}, dlq.RecordConfig{Topic: f.dlqTopic}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r := runCmd(t, f.env, "list", "--all", "--output", "json")
	if r.code != 0 {
		t.Fatalf("list: exit %d\n%s", r.code, r.stderr)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var v struct {
			Key       *string `json:"key"`
			KeyBase64 *string `json:"keyBase64"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("json line %q: %v", l, err)
		}
		b64 := "-"
		if v.KeyBase64 != nil {
			b64 = *v.KeyBase64
		}
		got = append(got, b64)
	}
	if want := []string{"-", base64.StdEncoding.EncodeToString(key)}; !slices.Equal(got, want) {
		t.Errorf("keyBase64 of the two lines %q, want %q", got, want)
	}
}
