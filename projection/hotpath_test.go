package projection

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/causet/projection-worker/internal/jsonstrict"
	"github.com/causet/projection-worker/internal/pgcopy"
)

// The benchmarks in this file measure the worker's per-event CPU on the
// shapes of the throughput benchmark (internal/bench: dataset_test.go's
// appendValue and testdata/projections.yaml) and of examples/: decoding one
// record value, planning each projection's statement, and grouping and
// encoding a batch's upserts for COPY. Run them with
//
//	go test ./projection -run '^$' -bench 'Hot' -benchmem
//
// and compare ns/op and allocs/op before and after a change.

// hotFollowed and hotRated are record values as internal/bench's
// appendValue writes them (about 435 bytes, payload about 250).
const (
	hotFollowed = `{"eventType":"ARTIST_FOLLOWED","entityId":"user-0012345","forkId":"production",` +
		`"tenantSchema":"bench_tenant","irVersion":"v42","sequenceNumber":17,"ts":1772366400007,` +
		`"payload":{"user_id":"user-0012345","artist_id":"artist-004242","points":73512,"games":311,"tier":"plus",` +
		`"campaign":"summer-tour-2026","followed_via":"search","source":"android-app",` +
		`"device":{"os":"android","model":"Pixel 8","app_version":"5.12.1","locale":"de-DE"}}}`
	hotRated = `{"eventType":"ARTIST_RATED","entityId":"user-0054321","forkId":"production",` +
		`"tenantSchema":"bench_tenant","irVersion":"v42","sequenceNumber":3,"ts":1772366400014,` +
		`"payload":{"user_id":"user-0054321","artist_id":"artist-011111","stars":4,` +
		`"review":"Sound was muddy from the balcony but the setlist was perfect.","venue_id":"venue-0042",` +
		`"source":"web","device":{"os":"web","browser":"firefox","app_version":"2026.3.1","locale":"fr-FR"}}}`
)

// hotDefinitions are the definition files the benchmarks plan with.
var hotDefinitions = []struct{ name, path string }{
	{"bench", "../internal/bench/testdata/projections.yaml"},
	{"examples", "../examples/projections.yaml"},
}

func hotProjections(tb testing.TB, path string) []*TableProjection {
	tb.Helper()
	d, err := LoadDefinitions(path)
	if err != nil {
		tb.Fatal(err)
	}
	tps, err := NewTableProjections(d)
	if err != nil {
		tb.Fatal(err)
	}
	return tps
}

func hotEvent(tb testing.TB, value string) *Event {
	tb.Helper()
	ev, err := DecodeEvent([]byte(value))
	if err != nil {
		tb.Fatal(err)
	}
	return ev
}

// BenchmarkHotDecode decodes and validates one record value.
func BenchmarkHotDecode(b *testing.B) {
	var tenants *TenantSchemas // SPEC §3's pattern alone, as in the bench
	var slab jsonstrict.NodeSlab
	var kept keptStrings
	for _, v := range []struct{ name, value string }{{"followed", hotFollowed}, {"rated", hotRated}} {
		for _, d := range []struct {
			name   string
			decode func([]byte) (*Event, error)
		}{{"", func(v []byte) (*Event, error) { return tenants.decodeRecord(v, &slab, &kept) }}, {"_copy", DecodeEvent}} {
			// decodeRecord is the worker's (its nodes from the batch's
			// slab); DecodeEvent copies the value.
			b.Run(v.name+d.name, func(b *testing.B) {
				value := []byte(v.value)
				b.ReportAllocs()
				b.SetBytes(int64(len(value)))
				for b.Loop() {
					if _, err := d.decode(value); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkHotPlan plans the statement of each projection of each
// definitions file for the event type it handles, of events prepared as
// processBatch prepares them (prepareArgs: the arguments every statement
// of an event takes, made once for all its projections).
func BenchmarkHotPlan(b *testing.B) {
	events := []*Event{hotEvent(b, hotFollowed), hotEvent(b, hotRated)}
	for _, ev := range events {
		ev.prepareArgs()
	}
	for _, defs := range hotDefinitions {
		for _, p := range hotProjections(b, defs.path) {
			for _, ev := range events {
				if !p.Handles(ev.EventType) {
					continue
				}
				b.Run(defs.name+"/"+p.Name(), func(b *testing.B) {
					if _, err := p.Plan(ev); err != nil {
						b.Fatal(err)
					}
					b.ReportAllocs()
					for b.Loop() {
						if _, err := p.Plan(ev); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkHotHandles is processBatch's match of one record with the
// projections: Handles of each projection of the bench's definitions, for
// an event of each of its two types.
func BenchmarkHotHandles(b *testing.B) {
	events := []*Event{hotEvent(b, hotFollowed), hotEvent(b, hotRated)}
	tps := hotProjections(b, hotDefinitions[0].path)
	b.ReportAllocs()
	matched := 0
	for b.Loop() {
		for _, ev := range events {
			for _, p := range tps {
				if p.Handles(ev.EventType) {
					matched++
				}
			}
		}
	}
	if matched == 0 {
		b.Fatal("no projection handles the events")
	}
}

// hotBatch returns the planned upserts of n events of the bench shapes
// (60 % followed, as in internal/bench), keys spread over distinct users.
func hotBatch(tb testing.TB, n int) []pair {
	tb.Helper()
	tps := hotProjections(tb, hotDefinitions[0].path)
	var planned []pair
	for i := range n {
		value := hotRated
		if i%5 < 3 {
			value = hotFollowed
		}
		value = strings.Replace(value, "0012345", fmt.Sprintf("%07d", i), 2)
		value = strings.Replace(value, "0054321", fmt.Sprintf("%07d", i), 2)
		d := &decoded{idx: i, ev: hotEvent(tb, value)}
		for _, p := range tps {
			if !p.Handles(d.ev.EventType) {
				continue
			}
			st, err := p.Plan(d.ev)
			if err != nil {
				tb.Fatal(err)
			}
			planned = append(planned, pair{d: d, h: p, stmt: st})
		}
	}
	return planned
}

// BenchmarkHotCopy measures, for a batch of 500 events (about 800
// upserts), the work of the COPY path in this process: grouping the
// upserts (copyGroups; checked against tables stricter than their
// definitions, copyGroupsChecked) and encoding their rows in COPY's binary
// format (every temporary-table column is text): with package pgcopy, as
// the worker does, and as pgx's CopyFrom would. Figures are per upsert.
func BenchmarkHotCopy(b *testing.B) {
	planned := hotBatch(b, 500)
	per := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(planned)), "ns/upsert")
	}
	b.Run("group", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if groups, rest := copyGroups(planned, 32); len(groups) != 3 || len(rest) != 0 {
				b.Fatalf("copyGroups: %d groups, %d left", len(groups), len(rest))
			}
		}
		per(b)
	})
	b.Run("group checked", func(b *testing.B) {
		// The tables of internal/bench's benchConstraints: every upsert of
		// artist_followers and artist_ratings checked, none suspect.
		stricter := map[string]map[string]catalogColumn{
			"artist_followers": {"score": parseCatalogType("integer")},
			"artist_ratings":   {"review": {typ: "text", known: true, notNull: true}},
		}
		check := func(g *copyGroup) *rowCheck { return newRowCheck(g.p, stricter[g.p.Table()]) }
		b.ReportAllocs()
		for b.Loop() {
			if groups, rest, suspects := copyGroupsChecked(planned, 32, check); len(groups) != 3 || len(rest)+len(suspects) != 0 {
				b.Fatalf("copyGroupsChecked: %d groups, %d left", len(groups), len(rest))
			}
		}
		per(b)
	})
	b.Run("group checked 1pct suspect", func(b *testing.B) {
		// As make bench's poison scenarios: 1 % of the upserts (every
		// hundredth of each group) refused by the table's column type,
		// so that each group loses its suspect keys.
		check := func(g *copyGroup) *rowCheck {
			seen := 0
			return &rowCheck{cols: []colCheck{{i: g.p.pk[0], refuses: func(string) bool {
				seen++
				return seen%100 == 1
			}}}}
		}
		want := 0
		for _, g := range func() []*copyGroup { gs, _ := copyGroups(planned, 32); return gs }() {
			want += (len(g.all) + 99) / 100
		}
		b.ReportAllocs()
		for b.Loop() {
			if groups, _, suspects := copyGroupsChecked(planned, 32, check); len(groups) != 3 || len(suspects) != want {
				b.Fatalf("copyGroupsChecked: %d groups, %d suspects, want %d", len(groups), len(suspects), want)
			}
		}
		per(b)
	})
	b.Run("encode pgcopy", func(b *testing.B) {
		// What the worker does (copyFrom, package pgcopy), into io.Discard.
		groups, _ := copyGroups(planned, 32)
		b.ReportAllocs()
		for b.Loop() {
			for _, g := range groups {
				fields := len(g.p.cols) + 1
				if _, err := pgcopy.Write(io.Discard, fields, len(g.pairs), func(i int, r *pgcopy.Row) {
					for _, v := range g.pairs[i].stmt.Args[:fields] {
						r.Text(v)
					}
				}); err != nil {
					b.Fatal(err)
				}
			}
		}
		per(b)
	})
	b.Run("encode", func(b *testing.B) {
		// What pgx's CopyFrom does.
		groups, _ := copyGroups(planned, 32)
		m := pgtype.NewMap()
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = buf[:0]
			for _, g := range groups {
				for _, pr := range g.pairs {
					row := pr.stmt.Args[:len(g.p.cols)+1]
					buf = append(buf, 0, byte(len(row)))
					for _, v := range row {
						var err error
						if buf, err = hotEncodeCopyValue(m, buf, v); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		}
		per(b)
	})
}

// hotEncodeCopyValue appends v as a field of a binary COPY row into a text
// column, as pgx's encodeCopyValue does: a 4-byte length (−1 for NULL),
// then the value.
func hotEncodeCopyValue(m *pgtype.Map, buf []byte, v any) ([]byte, error) {
	sp := len(buf)
	buf = append(buf, 0xff, 0xff, 0xff, 0xff)
	out, err := m.Encode(pgtype.TextOID, pgtype.BinaryFormatCode, v, buf)
	if err != nil || out == nil {
		return buf, err
	}
	n := len(out) - sp - 4
	out[sp], out[sp+1], out[sp+2], out[sp+3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return out, nil
}
