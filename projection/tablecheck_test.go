package projection

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/retry"
)

// checkValueTests are the cases of TestCheckValue: a value, the column
// type, and checkValue's reason ("" when accepted).
type checkValueTest struct {
	typ  string
	in   any
	want string
}

// TestCheckValue checks, type by type, that checkValue refuses what
// PostgreSQL's input function for the column type refuses (the reason in
// PostgreSQL's words where it has them) and takes what it takes. The
// accepted values are applied by TestCheckValueAgreesWithPostgres too.
func TestCheckValue(t *testing.T) {
	for _, tt := range checkValueTests() {
		t.Run(fmt.Sprintf("%s %#v", tt.typ, tt.in), func(t *testing.T) {
			if got := checkValue(kindOf(tt.typ), tt.typ, tt.in); got != tt.want {
				t.Errorf("checkValue(%s, %#v) = %q, want %q", tt.typ, tt.in, got, tt.want)
			}
		})
	}
}

// TestCheckValueAgreesWithPostgres sends every value of TestCheckValue
// that toParam converts to PostgreSQL, cast as Plan casts it
// ($1::text::<type>): PostgreSQL must take exactly what checkValue takes.
func TestCheckValueAgreesWithPostgres(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, tt := range checkValueTests() {
		if tt.in == "0x1F" {
			continue // PostgreSQL 16 takes it, older versions do not
		}
		if s, ok := tt.in.(string); ok && strings.Contains(s, "T24:") {
			continue // PostgreSQL takes it; the definitions format takes RFC 3339
		}
		param, err := toParam(tt.typ, tt.in)
		if err != nil {
			continue // refused by the conversion itself
		}
		var ok bool
		_, dbErr := pool.Exec(ctx, "SELECT $1::text::"+tt.typ, param)
		ok = dbErr == nil
		if ok != (tt.want == "") {
			t.Errorf("%s %#v: checkValue says %q, PostgreSQL says %v", tt.typ, tt.in, tt.want, dbErr)
		}
	}
}

func checkValueTests() []checkValueTest {
	n := func(s string) json.Number { return json.Number(s) }
	return []checkValueTest{
		// smallint, integer, bigint: range and syntax.
		{"smallint", n("32767"), ""},
		{"smallint", n("-32768"), ""},
		{"smallint", n("40000"), `value "40000" is out of range for type smallint`},
		{"integer", n("2147483647"), ""},
		{"integer", n("3000000000"), `value "3000000000" is out of range for type integer`},
		{"integer", n("99999999999999999999"), `value "99999999999999999999" is out of range for type integer`},
		{"integer", n("1e+20"), `value "1e+20" is out of range for type integer`},
		{"integer", n("1e400"), `value "1e400" is out of range for type integer`},
		{"integer", n("1.0"), `invalid input syntax for type integer: "1.0"`},
		{"integer", n("1.5"), `invalid input syntax for type integer: "1.5"`},
		{"integer", " 12 ", ""},
		{"integer", "+12", ""},
		{"integer", "abc", `invalid input syntax for type integer: "abc"`},
		{"integer", "", `invalid input syntax for type integer: ""`},
		{"integer", "0x1F", ""}, // PostgreSQL 16 reads it: left to the cast
		{"bigint", n("9223372036854775807"), ""},
		{"bigint", n("9223372036854775808"), `value "9223372036854775808" is out of range for type bigint`},
		{"bigint", n("-9223372036854775809"), `value "-9223372036854775809" is out of range for type bigint`},
		{"bigint", true, "a JSON boolean cannot be stored in a bigint column"},
		{"bigint", []any{n("1")}, "a JSON array cannot be stored in a bigint column (only jsonb)"},
		// numeric: syntax, 131072 digits before the point, 16383 after.
		{"numeric", n("12345678901234567890.0123456789"), ""},
		{"numeric", n("1e131071"), ""},
		{"numeric", n("1e131072"), `value overflows numeric format: "1e131072"`},
		{"numeric", n("1e-16383"), ""},
		{"numeric", n("1.5e-16383"), `value overflows numeric format: "1.5e-16383"`},
		{"numeric", n("1e400"), ""},
		{"numeric", " .5 ", ""},
		{"numeric", "5.", ""},
		{"numeric", "NaN", ""},
		{"numeric", "-Infinity", ""},
		{"numeric", "1.2.3", `invalid input syntax for type numeric: "1.2.3"`},
		{"numeric", "1e", `invalid input syntax for type numeric: "1e"`},
		{"numeric", false, "a JSON boolean cannot be stored in a numeric column"},
		{"uuid", true, "a JSON boolean cannot be stored in a uuid column"}, // not "an uuid" (third new-user trial)
		{"integer", true, "a JSON boolean cannot be stored in an integer column"},
		// double precision and real: range, underflow to zero.
		{"double precision", n("1.5e300"), ""},
		{"double precision", n("1e-320"), ""},
		{"double precision", n("0e-500"), ""},
		{"double precision", n("1e400"), `value "1e400" is out of range for type double precision`},
		{"double precision", n("1e-400"), `value "1e-400" is out of range for type double precision`},
		{"double precision", " nan ", ""},
		{"double precision", "-Infinity", ""},
		{"double precision", "1,5", `invalid input syntax for type double precision: "1,5"`},
		{"real", n("3.4e38"), ""},
		{"real", n("1e39"), `value "1e39" is out of range for type real`},
		{"real", n("1e-46"), `value "1e-46" is out of range for type real`},
		// boolean: PostgreSQL's words and their unique prefixes.
		{"boolean", true, ""},
		{"boolean", " YES ", ""},
		{"boolean", "tr", ""},
		{"boolean", "of", ""},
		{"boolean", "o", `invalid input syntax for type boolean: "o"`},
		{"boolean", "maybe", `invalid input syntax for type boolean: "maybe"`},
		{"boolean", n("1"), ""},
		{"boolean", n("2"), `invalid input syntax for type boolean: "2"`},
		// uuid: 32 hex digits, braces, a hyphen after any group of four.
		{"uuid", "123e4567-e89b-12d3-a456-426614174000", ""},
		{"uuid", "{123E4567E89B12D3A456426614174000}", ""},
		{"uuid", "1234-5678-1234-1234-1234-1234-5678-9abc", ""},
		{"uuid", "123e4567-e89b-12d3-a456-42661417400", `invalid input syntax for type uuid: "123e4567-e89b-12d3-a456-42661417400"`},
		{"uuid", "123e4567--e89b-12d3-a456-426614174000", `invalid input syntax for type uuid: "123e4567--e89b-12d3-a456-426614174000"`},
		{"uuid", " 123e4567-e89b-12d3-a456-426614174000", `invalid input syntax for type uuid: " 123e4567-e89b-12d3-a456-426614174000"`},
		{"uuid", n("1"), "a JSON number cannot be stored in a uuid column"},
		// timestamptz and date: epoch milliseconds in range, RFC 3339.
		{"timestamptz", n(fmt.Sprint(MinTimestampMillis)), ""},
		{"timestamptz", n(fmt.Sprint(MinTimestampMillis - 1)), fmt.Sprintf("epoch milliseconds %d are out of range for type timestamptz", MinTimestampMillis-1)},
		{"timestamptz", n(fmt.Sprint(EndTimestampMillis)), fmt.Sprintf("epoch milliseconds %d are out of range for type timestamptz", EndTimestampMillis)},
		{"timestamptz", n("1.5"), "timestamptz from a number wants integer epoch milliseconds, got 1.5"},
		{"timestamptz", "2024-06-25T16:00:00.5+02:00", ""},
		{"timestamptz", "2024-06-25 16:00:00Z", ""},
		// RFC 3339's lowercase t and z, which PostgreSQL reads too
		// (new-user trial: refused).
		{"timestamptz", "2024-06-25t14:00:00z", ""},
		{"timestamptz", "2024-06-25 14:00:00.5z", ""},
		{"timestamptz", "2024-06-30t23:59:60z", ""},
		{"date", "2024-06-25t23:00:00-05:00", ""},
		{"timestamptz", "2024-06-25t25:00:00z", `date/time field value out of range: "2024-06-25t25:00:00z"`}, // PostgreSQL's words for a time that does not exist (definitions trial)
		{"timestamptz", "infinity", ""},
		// A leap second, which RFC 3339 allows and PostgreSQL reads as the
		// next minute (new-user trial: refused); second 61 is not a time.
		{"timestamptz", "2024-06-25T23:59:60Z", ""},
		{"timestamptz", "2016-12-31 23:59:60.000+05:30", ""},
		{"timestamptz", "2016-12-31T23:59:60.5Z", `date/time field value out of range: "2016-12-31T23:59:60.5Z"`},
		{"timestamptz", "2024-06-25T12:00:61Z", `date/time field value out of range: "2024-06-25T12:00:61Z"`},
		{"timestamptz", "2024-02-30T00:00:00Z", `date/time field value out of range: "2024-02-30T00:00:00Z"`},
		// PostgreSQL's limit of a UTC offset, ±15:59 (definition-author
		// trial: +16:00 reached PostgreSQL, 22009, no column named).
		{"timestamptz", "2024-06-25T10:00:00+15:59", ""},
		{"timestamptz", "2024-06-25T10:00:00+16:00", `time zone displacement out of range: "2024-06-25T10:00:00+16:00"`},
		{"timestamptz", "2024-06-25 10:00:00-16:00", `time zone displacement out of range: "2024-06-25 10:00:00-16:00"`},
		{"date", "2024-06-25T10:00:00+16:00", `time zone displacement out of range: "2024-06-25T10:00:00+16:00"`},
		// Hour 24, which PostgreSQL reads as the next midnight and RFC
		// 3339 does not have: refused in words of its own.
		{"timestamptz", "2024-06-25T24:00:00Z", `hour 24 is not RFC 3339 (hours 00 to 23): write 00:00:00 of the next day: "2024-06-25T24:00:00Z"`},
		{"timestamptz", "2024-13-01T00:00:00Z", `date/time field value out of range: "2024-13-01T00:00:00Z"`},
		{"date", "2024-06-30T23:59:60Z", ""},
		{"timestamptz", "0000-01-01T00:00:00Z", `date/time field value out of range: "0000-01-01T00:00:00Z"`},
		{"timestamptz", "yesterday-ish", `invalid input syntax for type timestamptz: "yesterday-ish" (want RFC 3339, such as 2024-06-25T16:00:00Z)`},
		{"timestamptz", time.Date(2024, 6, 25, 16, 0, 0, 0, time.UTC), ""},
		{"date", n(fmt.Sprint(EndTimestampMillis)), ""},
		{"date", n(fmt.Sprint(endDateMillis)), fmt.Sprintf("epoch milliseconds %d are out of range for type date", endDateMillis)},
		{"date", "2024-06-25", ""},
		{"date", "2024-02-30", `date/time field value out of range: "2024-02-30"`},
		{"date", "2024-06-25T25:00:00Z", `date/time field value out of range: "2024-06-25T25:00:00Z"`},
		{"date", "2024-06-25T23:00:00-05:00", ""},
		// NUL: text and jsonb refuse it anywhere.
		{"text", "a\x00b", `a string with a NUL character (\u0000) cannot be stored in a text column`},
		{"text", n("99999999999999999999"), ""},
		{"text", map[string]any{}, "a JSON object cannot be stored in a text column (only jsonb)"},
		{"jsonb", "a\x00b", `a string with a NUL character (\u0000) cannot be stored in a jsonb column`},
		{"jsonb", map[string]any{"a": []any{"x", "y\x00"}}, `a string with a NUL character (\u0000) cannot be stored in a jsonb column`},
		{"jsonb", map[string]any{"a\x00": n("1")}, `a key with a NUL character (\u0000) cannot be stored in a jsonb column`},
		{"jsonb", map[string]any{"a": n("1e131072")}, `value overflows numeric format: "1e131072"`},
		{"jsonb", map[string]any{"a": []any{n("1e400"), true, nil}}, ""},
	}
}

// TestCheckValueNoAllocs checks that an accepted value of every kind is
// checked without allocating (the check is on the hot path of Plan).
func TestCheckValueNoAllocs(t *testing.T) {
	for _, tt := range checkedValues() {
		k := kindOf(tt.typ)
		if n := testing.AllocsPerRun(100, func() { _ = checkValue(k, tt.typ, tt.v) }); n != 0 {
			t.Errorf("checkValue(%s, %#v): %v allocations, want 0", tt.typ, tt.v, n)
		}
	}
}

// checkedValues returns an accepted value of every column kind.
func checkedValues() []struct {
	typ string
	v   any
} {
	return []struct {
		typ string
		v   any
	}{
		{"text", "hello"}, {"integer", json.Number("2147483647")}, {"bigint", " 42 "},
		{"numeric", json.Number("12345678901234567890.0123456789")}, {"double precision", json.Number("1.5e300")},
		{"real", "3.25"}, {"boolean", "Yes"}, {"uuid", "123e4567-e89b-12d3-a456-426614174000"},
		{"timestamptz", json.Number("1719331200000")}, {"timestamptz", "2024-06-25T16:00:00.5+02:00"},
		{"jsonb", map[string]any{"a": []any{json.Number("1"), "x", nil}}},
	}
}

// BenchmarkCheckValue measures the checks of one value of every column
// kind of TestCheckValueNoAllocs (op = 11 values).
func BenchmarkCheckValue(b *testing.B) {
	values := checkedValues()
	b.ReportAllocs()
	for b.Loop() {
		for _, tt := range values {
			if r := checkValue(kindOf(tt.typ), tt.typ, tt.v); r != "" {
				b.Fatal(r)
			}
		}
	}
}

// TestPlanRefusesWhatPostgresRefuses checks that Plan refuses a value its
// column's type cannot take, before any SQL, with a permanent *ValueError
// naming the projection, column, source and JSON type.
func TestPlanRefusesWhatPostgresRefuses(t *testing.T) {
	_, tps := tblProjections(t)
	tests := []struct {
		name    string
		proj    string
		payload string
		want    ValueError
	}{
		{"integer out of range", "kinds", `{"required":1,"n_int":3000000000}`,
			ValueError{"kinds", "n_int", "from payload.n_int", "number", `value "3000000000" is out of range for type integer`}},
		{"integer beyond int64, kept as sent", "kinds", `{"required":1,"n_int":99999999999999999999}`,
			ValueError{"kinds", "n_int", "from payload.n_int", "number", `value "99999999999999999999" is out of range for type integer`}},
		{"NUL in text", "kinds", `{"required":1,"label":"a\u0000b"}`,
			ValueError{"kinds", "label", "from payload.label", "string", `a string with a NUL character (\u0000) cannot be stored in a text column`}},
		{"NUL in jsonb", "kinds", `{"required":1,"doc":{"k":"\u0000"}}`,
			ValueError{"kinds", "doc", "from payload.doc", "object", `a string with a NUL character (\u0000) cannot be stored in a jsonb column`}},
		{"double out of range", "kinds", `{"required":1,"n_double":1e400}`,
			ValueError{"kinds", "n_double", "from payload.n_double", "number", `value "1e400" is out of range for type double precision`}},
		{"bad uuid", "kinds", `{"required":1,"uid":"not-a-uuid"}`,
			ValueError{"kinds", "uid", "from payload.uid", "string", `invalid input syntax for type uuid: "not-a-uuid"`}},
		{"null into notNull", "kinds", `{}`,
			ValueError{"kinds", "required", `derive "payload.?required.orValue(null)"`, "null", "null value in a notNull column"}},
		{"derive result out of range", "kinds", `{"required":1e300}`,
			ValueError{"kinds", "required", `derive "payload.?required.orValue(null)"`, "number", `value "1e+300" is out of range for type bigint`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := tblEvent(t, "tenant_a", "KIND_SET", 7, 1719331200000, tt.payload)
			_, err := tps[tt.proj].Plan(ev)
			var ve *ValueError
			if !errors.As(err, &ve) {
				t.Fatalf("Plan error = %v, want a *ValueError", err)
			}
			if *ve != tt.want {
				t.Errorf("ValueError = %+v, want %+v", *ve, tt.want)
			}
			if !retry.IsPermanent(err) {
				t.Errorf("class = %v, want permanent", retry.Classify(err))
			}
			wantMsg := fmt.Sprintf("projection %q: column %s (%s, JSON %s): %s", tt.want.Projection, tt.want.Column, tt.want.Source, tt.want.JSONType, tt.want.Reason)
			if err.Error() != wantMsg {
				t.Errorf("error = %q, want %q", err, wantMsg)
			}
		})
	}
}

// TestDeriveNumberBeyondDouble checks that a JSON number beyond float64's
// range read by a derive is a permanent error naming the payload path, not
// Infinity stored.
func TestDeriveNumberBeyondDouble(t *testing.T) {
	p := inlineProjection(t, `d: { type: double precision, derive: "double(payload.x) * 2.0" }`)
	for _, x := range []string{"1e400", "-1e400", `{"y":1e400}`} {
		ev := tblEvent(t, "tenant_a", "E", 7, 1719331200000, `{"x":`+x+`}`)
		st, err := p.Plan(ev)
		if strings.HasPrefix(x, "{") {
			// Not a number CEL reads: the map is no double.
			if err == nil || errors.Is(err, errNumberRange) {
				t.Errorf("x = %s: Plan = %v, %v; want a no-overload error", x, st.Args, err)
			}
			continue
		}
		if err == nil {
			t.Fatalf("x = %s: Plan succeeded with args %v, want an error", x, st.Args)
		}
		want := fmt.Sprintf(`projection "p": derive d: payload.x: %q: number beyond the range of a CEL double (±1.8e308; nonzero nearer 0 than 4.9e-324)`, x)
		if !retry.IsPermanent(err) || !errors.Is(err, errNumberRange) || err.Error() != want {
			t.Errorf("x = %s: error = %q (class %v), want permanent %q", x, err, retry.Classify(err), want)
		}
	}
}

// TestApplyNamesTheColumnOfPostgresErrors checks that a PostgreSQL error
// naming a column (ColumnName) or the parameter that carries it (Where
// "unnamed portal parameter $N") comes back as a *ColumnError with the
// column's source and the value's JSON type, PostgreSQL's error unchanged
// inside it.
func TestApplyNamesTheColumnOfPostgresErrors(t *testing.T) {
	pool, schema, tps := tblTenant(t)
	ctx := context.Background()
	// A constraint the definitions do not know.
	if _, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "kinds"}.Sanitize()+" ALTER COLUMN first_tag SET NOT NULL"); err != nil {
		t.Fatal(err)
	}
	type testCase struct {
		name     string
		ev       func() *Event
		want     ColumnError // Err not compared
		sqlState string
		noDelete bool // applied by kinds without its delete (a key its tombstone would not fit)
	}
	tests := []testCase{
		{"not-null violation names the column", func() *Event {
			return tblEvent(t, schema, "KIND_SET", 7, 1719331200000, `{"required":1}`)
		}, ColumnError{Projection: "kinds", Column: "first_tag", Source: "from payload.tags.0", JSONType: "null"}, "23502", false},
		{"invalid encoding names the parameter", func() *Event {
			ev := tblEvent(t, schema, "KIND_SET", 7, 1719331200000, `{"required":1,"tags":["t"],"label":"x"}`)
			// DecodeEvent refuses invalid UTF-8: changed in the tree.
			i, ok := ev.tree.Member(ev.payload, "label")
			if !ok {
				t.Fatal("no payload.label")
			}
			ev.tree.SetString(i, "a\xffb")
			return ev
		}, ColumnError{Projection: "kinds", Column: "label", Source: "from payload.label", JSONType: "string"}, "22021", false},
		// A hex literal Plan leaves to PostgreSQL: 15 refuses its syntax
		// (22P02), 16 its range (22003); both quote the value only.
		{"a data exception quoting the value names its column", func() *Event {
			return tblEvent(t, schema, "KIND_SET", 7, 1719331200000, `{"required":1,"n_small":"0x7FFFFFFFFFFF"}`)
		}, ColumnError{Projection: "kinds", Column: "n_small", Source: "from payload.n_small", JSONType: "string"}, "", false},
	}
	// A key longer than its index can hold (54000, new-user trial): random
	// hex, which compression cannot bring under the limits.
	hugeKey := func(n int, alsoLabel bool) func() *Event {
		return func() *Event {
			key, label := randomHex(t, n), "x"
			if alsoLabel {
				label = key
			}
			raw := fmt.Sprintf(`{"eventType":"KIND_SET","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":7,"ts":1719331200000,"payload":{"required":1,"tags":["t"],"label":%q}}`,
				key, schema, label)
			ev, err := DecodeEvent([]byte(raw))
			if err != nil {
				t.Fatal(err)
			}
			return ev
		}
	}
	// PostgreSQL's 54000 for such a key comes from a projection without a
	// delete: with one, Plan refuses the key first, as its tombstone would
	// not fit (TestTombstoneEntrySizeIsPostgreSQLs).
	d, _ := tblProjections(t)
	for i := range d.Projections {
		if d.Projections[i].Name == "kinds" {
			delete(d.Projections[i].Events, "KIND_DELETED")
		}
	}
	withoutDelete, err := NewTableProjections(d)
	if err != nil {
		t.Fatal(err)
	}
	var kindsWithoutDelete *TableProjection
	for _, p := range withoutDelete {
		if p.Name() == "kinds" {
			kindsWithoutDelete = p
		}
	}
	tests = append(tests,
		testCase{"a key over the btree limit names its column", hugeKey(3000, false),
			ColumnError{Projection: "kinds", Column: "id", Source: "from entityId", JSONType: "string"}, "54000", true},
		testCase{"a key over the index row limit names its column", hugeKey(40000, false),
			ColumnError{Projection: "kinds", Column: "id", Source: "from entityId", JSONType: "string"}, "54000", true},
		// The same value in a column that is not the key (new-user trial:
		// a jsonb column of the whole payload; no column was named).
		testCase{"a key over the limit, its value in another column too, names the key", hugeKey(3000, true),
			ColumnError{Projection: "kinds", Column: "id", Source: "from entityId", JSONType: "string"}, "54000", true})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tps["kinds"]
			if tt.noDelete {
				p = kindsWithoutDelete
			}
			_, err := p.Apply(ctx, pool, tt.ev())
			var ce *ColumnError
			var pgErr *pgconn.PgError
			if !errors.As(err, &ce) || !errors.As(err, &pgErr) {
				t.Fatalf("Apply error = %v, want a *ColumnError around a *pgconn.PgError", err)
			}
			got := *ce
			got.Err = nil
			if got != tt.want {
				t.Errorf("ColumnError = %+v, want %+v", got, tt.want)
			}
			if tt.sqlState != "" && pgErr.Code != tt.sqlState || !strings.HasPrefix(pgErr.Code, "22") && pgErr.Code != "23502" && pgErr.Code != "54000" {
				t.Errorf("SQLSTATE = %s, want %s", pgErr.Code, cmp.Or(tt.sqlState, "class 22"))
			}
			if wantClass := map[bool]retry.Class{true: retry.Projection, false: retry.Permanent}[pgErr.Code == "23502"]; retry.Classify(err) != wantClass {
				t.Errorf("class = %s, want %s (%v)", retry.Classify(err), wantClass, err)
			}
			want := fmt.Sprintf("projection %q: column %s (%s, JSON %s): %s", tt.want.Projection, tt.want.Column, tt.want.Source, tt.want.JSONType, pgErr.Error())
			if err.Error() != want {
				t.Errorf("error = %q, want %q", err, want)
			}
		})
	}
}

// TestDeriveNoSuchOverloadNamesTheIntegerBeyondInt64 checks that a derive
// failing on an integer beyond int64 (read by CEL as a double) says which
// payload number it was, not only "no such overload".
func TestDeriveNoSuchOverloadNamesTheIntegerBeyondInt64(t *testing.T) {
	p := inlineProjection(t, `n: { type: bigint, derive: "payload.stars + 1" }`)
	_, err := p.Plan(tblEvent(t, "tenant_a", "E", 7, 1719331200000, `{"stars":99999999999999999999}`))
	want := `projection "p": derive n: no such overload: operator + applied to (double, int) at 1:15 in payload.stars + 1 (payload.stars is 99999999999999999999, an integer beyond int64, which CEL reads as a double)`
	if err == nil || err.Error() != want || !retry.IsPermanent(err) {
		t.Errorf("Plan error = %v, want permanent %q", err, want)
	}
}

// TestDeriveNoSuchOverloadNamesTheCallAndTypes: a derive that no overload
// accepts at plan time says which function or operator, with which argument
// types, where in the expression and the call as CEL prints it (so the
// fields it read: new-user trial), for which projection and column (new-user
// trial: only "no such overload"), with what the event holds at each
// payload path the call reads (new-user trial: which field was the string
// had to be guessed); an integer beyond int64 is named only when a double
// is involved.
func TestDeriveNoSuchOverloadNamesTheCallAndTypes(t *testing.T) {
	const payload = `{"name":"x","n":3,"tags":["a"],"big":99999999999999999999}`
	tests := []struct{ derive, want string }{
		{"payload.name + payload.n", `operator + applied to (string, int) at 1:14 in payload.name + payload.n (payload.name is "x", a JSON string; payload.n is 3, a JSON number)`},
		{"payload.name * payload.n", `operator * applied to (string, int) at 1:14 in payload.name * payload.n (payload.name is "x", a JSON string; payload.n is 3, a JSON number)`},
		{"-payload.name", `operator - applied to (string) at 1:1 in -payload.name (payload.name is "x", a JSON string)`},
		{"size(payload.n)", "function size applied to (int) at 1:5 in size(payload.n) (payload.n is 3, a JSON number)"},
		{"payload.n.startsWith('x')", `function startsWith applied to (int, string) at 1:21 in payload.n.startsWith("x") (payload.n is 3, a JSON number)`},
		{"payload.tags[0] + 1", `operator + applied to (string, int) at 1:17 in payload.tags[0] + 1 (payload.tags[0] is "a", a JSON string)`},
	}
	for _, tt := range tests {
		t.Run(tt.derive, func(t *testing.T) {
			p := inlineProjection(t, `n: { type: text, derive: "`+tt.derive+`" }`)
			_, err := p.Plan(tblEvent(t, "tenant_a", "E", 7, 1719331200000, payload))
			want := `projection "p": derive n: no such overload: ` + tt.want
			if err == nil || err.Error() != want || !retry.IsPermanent(err) {
				t.Errorf("Plan error = %v, want permanent %q", err, want)
			}
		})
	}
}

// TestDeriveOverloadAtLoadNamesTheCallAndTypes: a derive whose types are
// known at load and that no overload accepts is refused at load, naming the
// projection, the column, the operator and the argument types.
func TestDeriveOverloadAtLoadNamesTheCallAndTypes(t *testing.T) {
	_, err := ParseDefinitions("d.yaml", inlineDefinitions(`n: { type: bigint, derive: "size(payload.tags) + 'x'" }`))
	want := `d.yaml: projection "p": columns.n: derive: "size(payload.tags) + 'x'" does not compile: 1:20: found no matching overload for '_+_' applied to '(int, string)' (line 8)`
	if err == nil || err.Error() != want {
		t.Errorf("ParseDefinitions error = %v, want %q", err, want)
	}
}

// TestDeriveWithAnInvalidLiteralIsRefusedAtLoad: a literal regexp,
// duration or timestamp that fails every evaluation is refused at load,
// naming the projection, column and what is wrong (new-user trial: the
// file validated and every event was dead-lettered).
func TestDeriveWithAnInvalidLiteralIsRefusedAtLoad(t *testing.T) {
	for derive, want := range map[string]string{
		`payload.name.matches('(') ? 'a' : 'b'`:                      `invalid matches argument`,
		`string(duration('1x'))`:                                     `invalid duration argument`,
		`string(timestamp('2024-13-01T00:00:00Z'))`:                  `invalid timestamp argument`,
		`payload.name.matches('^[a-z]+$') ? 'a' : 'b'`:               ``,
		`string(timestamp('2024-06-25T12:00:00Z') + duration('1h'))`: ``,
	} {
		_, err := ParseDefinitions("d.yaml", inlineDefinitions(`n: { type: text, derive: "`+derive+`" }`))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: ParseDefinitions error = %v, want none", derive, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), `projection "p": columns.n: derive: `) || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: ParseDefinitions error = %v, want one naming the column and %q", derive, err, want)
		}
	}
}

// inlineDefinitions returns the definitions file of inlineProjection.
func inlineDefinitions(column string) []byte {
	return []byte(`irVersion: v1
projections:
  - name: p
    table: t
    primaryKey: [id]
    columns:
      id: { type: text, from: entityId }
      ` + column + `
    events: { E: upsert }
`)
}

// inlineProjection returns projection "p" of table t, keyed by entityId
// (column id), with one more column (YAML "name: {...}") and upserting
// events of type E.
func inlineProjection(t testing.TB, column string) *TableProjection {
	t.Helper()
	d, err := ParseDefinitions("inline.yaml", inlineDefinitions(column))
	if err != nil {
		t.Fatal(err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		t.Fatal(err)
	}
	return tps[0]
}

// TestDeriveErrorQuotesALongExpressionShort: an error about a derive
// longer than maxQuotedExpr quotes its start and its length, not the whole
// of it (new-user trial: 10–40 KB echoed).
func TestDeriveErrorQuotesALongExpressionShort(t *testing.T) {
	expr := strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300)
	_, err := ParseDefinitions("d.yaml", inlineDefinitions(`n: { type: bigint, derive: "`+expr+`" }`))
	if err == nil || !strings.Contains(err.Error(), `… (601 bytes) does not compile`) || len(err.Error()) > 500 {
		t.Errorf("ParseDefinitions error = %v, want the expression's start and length", err)
	}
}

// TestDerivePassesNumbersThroughAsSent checks that a number a CEL double
// does not hold, passed through a derive, is planned as the event sent it
// (definitions trial: numeric, jsonb and text columns stored it rounded,
// and a bigint's error quoted the double), as a from path plans it; and
// that when two numbers of the event read as the one double, the pair
// fails rather than guess.
func TestDerivePassesNumbersThroughAsSent(t *testing.T) {
	const payload = `{"n":12345678901234567890,"d":123456789.123456789123,"o":{"a":2e-1,"b":[18446744073709551616]},"big":9223372036854775808}`
	tests := []struct {
		column, want, wantErr string
	}{
		{`v: { type: numeric, derive: "has(payload.n) ? payload.n : dyn(null)" }`, "12345678901234567890", ""},
		{`v: { type: numeric, derive: "payload.?d.orValue(dyn(null))" }`, "123456789.123456789123", ""},
		{`v: { type: text, derive: "payload.n" }`, "12345678901234567890", ""},
		{`v: { type: jsonb, derive: "payload.o" }`, `{"a":0.2,"b":[18446744073709551616]}`, ""}, // 2e-1 is a double that is its value
		{`v: { type: jsonb, derive: "[payload.n, payload.d]" }`, `[12345678901234567890,123456789.123456789123]`, ""},
		{`v: { type: numeric, derive: "payload.n * 2.0" }`, "2.4691357802469134e+19", ""}, // computed: a double
		{`v: { type: bigint, derive: "payload.big" }`, "", `value "9223372036854775808" is out of range for type bigint`},
	}
	for _, tt := range tests {
		p := inlineProjection(t, tt.column)
		st, err := p.Plan(tblEvent(t, "tenant_a", "E", 7, 1719331200000, payload))
		if tt.wantErr != "" {
			if err == nil || !strings.HasSuffix(err.Error(), tt.wantErr) {
				t.Errorf("%s: Plan = %v, %v; want an error ending %q", tt.column, st.Args, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: Plan: %v", tt.column, err)
			continue
		}
		if got := st.Args[1]; got != tt.want {
			t.Errorf("%s: planned %v, want %q", tt.column, got, tt.want)
		}
	}

	p := inlineProjection(t, `v: { type: numeric, derive: "payload.a" }`)
	for _, c := range []struct{ payload, want, wantErr string }{
		// One value spelt twice is not two numbers.
		{`{"a":12345678901234567890,"b":1.2345678901234567890e19}`, "12345678901234567890", ""},
		{`{"a":12345678901234567890,"b":12345678901234567891}`, "", "the event's numbers 12345678901234567890 and 12345678901234567891 both read as this CEL double"},
	} {
		st, err := p.Plan(tblEvent(t, "tenant_a", "E", 7, 1719331200000, c.payload))
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !retry.IsPermanent(err)):
			t.Errorf("%s: Plan = %v, %v; want a permanent error containing %q", c.payload, st.Args, err, c.wantErr)
		case c.wantErr == "" && (err != nil || st.Args[1] != c.want):
			t.Errorf("%s: Plan = %v, %v; want %q", c.payload, st.Args, err, c.want)
		}
	}
}

// TestFromPathIndexesAreDecimal: a from path's segment reads an array's
// element only when it is a decimal index as JSON writes an integer: 0,
// 1, 12, not +1, 01 or -0 (definitions trial: payload.arr.+1 and
// payload.arr.01 read element 1); an object's member of that name is
// still read.
func TestFromPathIndexesAreDecimal(t *testing.T) {
	ev := tblEvent(t, "tenant_a", "E", 7, 1719331200000, `{"arr":["a","b","c"],"obj":{"01":"x","+1":"y"}}`)
	for _, tt := range []struct {
		path string
		want any
	}{
		{"payload.arr.0", "a"},
		{"payload.arr.1", "b"},
		{"payload.arr.+1", nil},
		{"payload.arr.01", nil},
		{"payload.arr.-0", nil},
		{"payload.arr.1e0", nil},
		{"payload.arr.3", nil},
		{"payload.obj.01", "x"},
		{"payload.obj.+1", "y"},
	} {
		p := inlineProjection(t, `v: { type: text, from: "`+tt.path+`" }`)
		st, err := p.Plan(ev)
		if err != nil || st.Args[1] != tt.want {
			t.Errorf("%s: Plan = %v, %v; want %v", tt.path, st.Args, err, tt.want)
		}
	}
}
