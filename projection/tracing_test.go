package projection

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestCopyBatchSpanLinksEachRecordOnce: a COPY transaction yields its pairs
// table by table (groupPairs), so a record handled by two tables comes
// twice, apart. Its batch span links each record once: with the link limit
// the worker sets (--max-batch-records), a full batch of such records lost
// the first half of its links (the SDK evicts the oldest, copying the rest
// at every eviction) and linked the second half twice.
func TestCopyBatchSpanLinksEachRecordOnce(t *testing.T) {
	const records = 5
	rec := tracetest.NewSpanRecorder()
	limits := sdktrace.NewSpanLimits()
	limits.LinkCountLimit = records // as the worker: --max-batch-records
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSpanLimits(limits))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := newTracing(Config{TracerProvider: tp, Topic: "causet.projection-events.v1", Group: "projection-worker"})
	base := tr.partitionAttrs(0)

	var ds []*decoded
	want := map[string]bool{}
	for i := range records {
		d := &decoded{idx: i, rec: &kgo.Record{Offset: int64(i), Value: []byte(`{}`)}}
		d.span = tr.startRecord(d, base)
		want[d.span.SpanContext().SpanID().String()] = true
		ds = append(ds, d)
	}
	var followers, follows copyGroup // two tables, every record in both
	for _, d := range ds {
		followers.all = append(followers.all, pair{d: d})
		follows.all = append(follows.all, pair{d: d})
	}
	groups := []*copyGroup{&followers, &follows}
	_, span := tr.startBatch(context.Background(), "copy batch", groupsSize(groups), groupPairs(groups))
	endBatch(span, nil)

	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want the batch span alone", len(ended))
	}
	batch := ended[0]
	if batch.DroppedLinks() != 0 {
		t.Errorf("batch span dropped %d links (limit %d for %d records)", batch.DroppedLinks(), records, records)
	}
	got := map[string]int{}
	for _, l := range batch.Links() {
		got[l.SpanContext.SpanID().String()]++
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("record span %s linked %d times, want once", id, got[id])
		}
	}
	if len(batch.Links()) != records {
		t.Errorf("batch span has %d links, want %d (one per record)", len(batch.Links()), records)
	}
}

// TestSpanTextIsUTF8AndBounded: a span's error text is valid UTF-8 (OTLP
// refuses a request holding one invalid string) and at most maxSpanText
// bytes, cut in its middle at rune boundaries.
func TestSpanTextIsUTF8AndBounded(t *testing.T) {
	long := strings.Repeat("é", maxSpanText) + "END"
	for _, in := range []string{"plain", "bad \xff\xfe bytes", long} {
		got := spanText(in)
		if !utf8.ValidString(got) || len(got) > maxSpanText {
			t.Errorf("spanText(%.20q...) = %d bytes, valid UTF-8 %v; want valid, at most %d", in, len(got), utf8.ValidString(got), maxSpanText)
		}
	}
	if got := spanText(long); !strings.HasPrefix(got, "éé") || !strings.HasSuffix(got, "éEND") || !strings.Contains(got, " [...] ") {
		t.Errorf("spanText of a long text keeps neither end: %.40q ... %q", got, got[len(got)-10:])
	}
	if got := spanText("plain"); got != "plain" {
		t.Errorf("spanText(plain) = %q", got)
	}
}
