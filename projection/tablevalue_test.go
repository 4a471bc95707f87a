package projection

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// timeSamples are epoch milliseconds across PostgreSQL's timestamptz
// range, its ends and the date range's end.
var timeSamples = []int64{
	MinTimestampMillis - 1, MinTimestampMillis, MinTimestampMillis + 1,
	-62135596800001, -62135596800000, // 1 BC / 1 AD
	-1, 0, 1, 999, 1719331200000, 1719331200123, 1772366400007,
	253402300799999, 253402300800000, // 9999 / 10000
	endDateMillis - 1, endDateMillis, EndTimestampMillis - 1, EndTimestampMillis,
}

// referenceTime is formatTime written the slow way, from time.Format.
func referenceTime(ms int64, dateOnly bool) string {
	t := time.UnixMilli(ms).UTC()
	y := t.Year()
	bc := ""
	if y <= 0 {
		y, bc = 1-y, " BC"
	}
	if dateOnly {
		return fmt.Sprintf("%04d-%s%s", y, t.Format("01-02"), bc)
	}
	frac := strings.TrimRight(fmt.Sprintf("%09d", t.Nanosecond()), "0")
	for len(frac) < 3 {
		frac += "0"
	}
	return fmt.Sprintf("%04d-%s.%sZ%s", y, t.Format("01-02T15:04:05"), frac, bc)
}

func TestFormatTime(t *testing.T) {
	for _, ms := range timeSamples {
		for _, dateOnly := range []bool{false, true} {
			if got, want := formatTime(time.UnixMilli(ms), dateOnly), referenceTime(ms, dateOnly); got != want {
				t.Errorf("formatTime(%d, %v) = %q, want %q", ms, dateOnly, got, want)
			}
		}
	}
	at := time.Date(2024, 6, 25, 16, 0, 0, 123456789, time.UTC)
	if got := formatTime(at, false); got != "2024-06-25T16:00:00.123456789Z" {
		t.Errorf("formatTime(%v) = %q", at, got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = formatTime(at, false) }); n != 1 {
		t.Errorf("formatTime: %v allocations, want 1 (the string)", n)
	}
}

// TestFormatMillis checks formatMillis against formatTime: at the
// samples, at each day's first and last millisecond over four centuries
// of dates around each end of the ranges and the epoch (leap years, the
// century years, 1 BC / 1 AD), and at random milliseconds across the date
// range.
func TestFormatMillis(t *testing.T) {
	check := func(ms int64) {
		t.Helper()
		for _, dateOnly := range []bool{false, true} {
			if got, want := formatMillis(ms, dateOnly), formatTime(time.UnixMilli(ms), dateOnly); got != want {
				t.Fatalf("formatMillis(%d, %v) = %q, want %q", ms, dateOnly, got, want)
			}
		}
	}
	for _, ms := range timeSamples {
		check(ms)
	}
	const days400y = 146097
	for _, from := range []int64{MinTimestampMillis, -62135596800000 - days400y/2*msPerDay, -days400y / 2 * msPerDay,
		endDateMillis - days400y*msPerDay, EndTimestampMillis - days400y*msPerDay} {
		for d := range int64(days400y) {
			day := from - (from%msPerDay+msPerDay)%msPerDay + d*msPerDay // a day's first millisecond
			check(day)
			check(day + msPerDay - 1)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		check(MinTimestampMillis + rng.Int64N(endDateMillis-MinTimestampMillis))
	}
	if n := testing.AllocsPerRun(100, func() { _ = formatMillis(1772366400007, false) }); n != 1 {
		t.Errorf("formatMillis: %v allocations, want 1 (the string)", n)
	}
}

// BenchmarkFormatMillis compares formatMillis with formatTime of the same
// milliseconds, a second apart from 2026-03-01.
func BenchmarkFormatMillis(b *testing.B) {
	b.Run("formatMillis", func(b *testing.B) {
		ms := int64(1772366400007)
		for b.Loop() {
			_ = formatMillis(ms, false)
			ms += 1013
		}
	})
	b.Run("formatTime", func(b *testing.B) {
		ms := int64(1772366400007)
		for b.Loop() {
			_ = formatTime(time.UnixMilli(ms), false)
			ms += 1013
		}
	})
}

// TestFromTSMatchesTheGeneralPath checks Plan's shortcut for a from: ts
// column of type timestamptz or date against the general path (lookupPath,
// checkValue, toParam): the same text where the general path accepts
// Event.TS, and no shortcut where it refuses it; and the timestamptz text
// processBatch makes once per event (prepareArgs).
func TestFromTSMatchesTheGeneralPath(t *testing.T) {
	for _, typ := range []string{"timestamptz", "date"} {
		k := kindOf(typ)
		for _, ms := range timeSamples {
			ev := &Event{TS: ms}
			v := lookupPath(ev, []string{"ts"})
			if r := checkValue(k, typ, v); r != "" {
				if inTimeRange(k, ms) {
					t.Errorf("%s %d: general path refuses (%s), shortcut takes it", typ, ms, r)
				}
				if ev.prepareArgs(); k == kindTimestamptz && ev.tsArg != nil {
					t.Errorf("%s %d: general path refuses (%s), prepareArgs gives %v", typ, ms, r, ev.tsArg)
				}
				continue
			}
			want, err := toParam(typ, v)
			if err != nil || !inTimeRange(k, ms) || formatTime(time.UnixMilli(ms), k == kindDate) != want {
				t.Errorf("%s %d: general path %v, %v; shortcut in range %v", typ, ms, want, err, inTimeRange(k, ms))
			}
			if ev.prepareArgs(); k == kindTimestamptz && ev.tsArg != want {
				t.Errorf("%s %d: general path %v; prepareArgs %v", typ, ms, want, ev.tsArg)
			}
		}
	}
}

// TestToParamAllocations checks that a string for a text column is passed
// on as the event holds it (no new allocation) and that a number costs one
// (its text as an argument).
func TestToParamAllocations(t *testing.T) {
	var s any = "artist-004242"
	if n := testing.AllocsPerRun(100, func() { _, _ = toParam("text", s) }); n != 0 {
		t.Errorf("toParam(text, string): %v allocations, want 0", n)
	}
	var num any = json.Number("73512")
	if n := testing.AllocsPerRun(100, func() { _, _ = toParam("bigint", num) }); n != 1 {
		t.Errorf("toParam(bigint, number): %v allocations, want 1", n)
	}
}
