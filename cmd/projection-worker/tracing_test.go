package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
)

// exportedSpans returns every span rcv received, by span id (hex).
func exportedSpans(rcv interface {
	ResourceSpans() []*tracepb.ResourceSpans
}) map[string]*tracepb.Span {
	out := map[string]*tracepb.Span{}
	for _, rs := range rcv.ResourceSpans() {
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				out[hexID(sp.SpanId)] = sp
			}
		}
	}
	return out
}

// spanAttrs returns sp's string and int attributes as text.
func spanAttrs(sp *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, a := range sp.Attributes {
		switch v := a.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[a.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[a.Key] = fmt.Sprint(v.IntValue)
		}
	}
	return m
}

func eventNames(sp *tracepb.Span) []string {
	var names []string
	for _, e := range sp.Events {
		names = append(names, e.Name)
	}
	return names
}

// TestRunTraceShape: one batch of one partition holds a good record with a
// traceparent, a record that is not JSON (traceparent), a record for a
// tenant schema that was never migrated (traceparent; retried, then
// dead-lettered) and a good record without headers. The exported trace
// says what happened to each, in the record's own trace:
//   - a "process <topic>" consumer span per record, the child of its
//     header's span (a new trace without one), with the current messaging
//     attributes; the good records' spans end when they are applied, long
//     before the retried record's, whose span lasts its retries;
//   - an "apply <projection>" child span per pair with projection, tenant
//     schema, event type and outcome; the failing pairs with status Error,
//     error.type, db.response.status_code, exception events and a "retry"
//     event per retry;
//   - the dead letters' "send <dlq topic>" spans, children of the failed
//     pair's span (of the record's span for the record that is not JSON),
//     and each dead letter's traceparent is its send span's while the
//     event's own is kept as causet.dlq.original-traceparent;
//   - the batch transaction's span, a root linked to the records it
//     applied, with the database client's spans under it.
func TestRunTraceShape(t *testing.T) {
	t.Run("default", func(t *testing.T) { testTraceShape(t, false) })
	t.Run("every pair", func(t *testing.T) { testTraceShape(t, true) })
}

// testTraceShape: with everyPair (--trace-every-pair) the good records'
// pairs have spans too, else only the pairs that failed an attempt.
func testTraceShape(t *testing.T, everyPair bool) {
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	absent := pgtest.NewSchemaName(t) // never migrated
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{tenant}.Sanitize()+" CASCADE")
	})
	if r := runCmd(t, time.Minute, "migrate", "--database-url", pgtest.URL(t), "--projections", exampleProjections, "--tenant-schema", tenant); r.code != 0 {
		t.Fatalf("migrate: %s", r)
	}
	dlqTopic := kafkatest.TopicName(t, "dlq")
	group := kafkatest.TopicName(t, "group")
	args := []string{"--dlq-topic", dlqTopic, "--group", group,
		"--max-retries", "2", "--retry-initial", "700ms", "--retry-max-interval", "1s"}
	if everyPair {
		args = append(args, "--trace-every-pair")
	}
	b, events, w := startOnKfake(t, 3, args...)

	const (
		goodParent    = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		poisonParent  = "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
		retriedParent = "00-2cf7651916cd43dd8448eb211c80319c-d7ad6b7169203331-01"
	)
	event := func(entity, schema string, seq int) []byte {
		return fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":%d,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"artist-456"}}`,
			entity, schema, seq, entity)
	}
	tp := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: "traceparent", Value: []byte(v)}} }
	recs := []*kgo.Record{
		{Key: []byte("good"), Value: event("user-1", tenant, 1), Headers: tp(goodParent)},
		{Key: []byte("poison"), Value: poison, Headers: tp(poisonParent)},
		{Key: []byte("retried"), Value: event("user-2", absent, 1), Headers: tp(retriedParent)},
		{Key: []byte("headerless"), Value: event("user-3", tenant, 1)},
	}
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil { // one produce: one batch of partition 0
		t.Fatal(err)
	}
	cons := b.Client(t, kgo.ConsumeTopics(dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var dls []*kgo.Record
	for len(dls) < 3 { // the poison record's, and one per projection of the retried record
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d dead letters within a minute, want 3\nstderr:\n%s", len(dls), w.stderr.String())
		}
		dls = append(dls, fs.Records()...)
	}
	byName := func(spans map[string]*tracepb.Span, prefix string) []*tracepb.Span {
		var out []*tracepb.Span
		for _, sp := range spans {
			if strings.HasPrefix(sp.Name, prefix) {
				out = append(out, sp)
			}
		}
		return out
	}
	var spans map[string]*tracepb.Span
	w.waitFor(t, "4 record spans and 3 send spans exported", 30*time.Second, func() bool {
		spans = exportedSpans(rcv)
		return len(byName(spans, "process "+events)) == 4 && len(byName(spans, "send "+dlqTopic)) == 3
	})
	w.shutdown(t)
	spans = exportedSpans(rcv)
	defer func() {
		if t.Failed() { // the whole trace, to see what went wrong
			for _, sp := range spans {
				t.Logf("span %s %s parent %s %v events %v links %d", hexID(sp.SpanId), sp.Name, hexID(sp.ParentSpanId), spanAttrs(sp), eventNames(sp), len(sp.Links))
			}
		}
	}()

	record := map[string]*tracepb.Span{} // by record key
	for _, sp := range byName(spans, "process "+events) {
		a := spanAttrs(sp)
		record[a["messaging.kafka.message.key"]] = sp
		if sp.Kind != tracepb.Span_SPAN_KIND_CONSUMER || a["messaging.system"] != "kafka" || a["messaging.operation.type"] != "process" ||
			a["messaging.destination.name"] != events || a["messaging.consumer.group.name"] != group || a["messaging.destination.partition.id"] != "0" {
			t.Errorf("record span %s: kind %v attributes %v, want a consumer span with the current messaging attributes", sp.Name, sp.Kind, a)
		}
	}
	for key, parent := range map[string]string{"good": goodParent, "poison": poisonParent, "retried": retriedParent} {
		sp := record[key]
		if sp == nil {
			t.Fatalf("no span for record %q; spans: %v", key, record)
		}
		if got := "00-" + hexID(sp.TraceId) + "-" + hexID(sp.ParentSpanId) + "-01"; got != parent {
			t.Errorf("record %q: span's trace/parent %s, want its header's %s", key, got, parent)
		}
	}
	headerless := record["headerless"]
	if headerless == nil || len(headerless.ParentSpanId) != 0 {
		t.Fatalf("header-less record's span %v: want a root span", headerless)
	}
	for key, sp := range record {
		if key != "headerless" && hexID(sp.TraceId) == hexID(headerless.TraceId) {
			t.Errorf("header-less record shares trace %s with record %q", hexID(sp.TraceId), key)
		}
	}
	// The good records' spans end when they are applied, not when the
	// batch's retried record is dead-lettered (≥ 700 ms of retries later).
	retried := record["retried"]
	for _, key := range []string{"good", "headerless"} {
		sp := record[key]
		if sp.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR || spanAttrs(sp)["causet.outcome"] != "applied" {
			t.Errorf("record %q: status %v outcome %q, want unset and applied", key, sp.Status, spanAttrs(sp)["causet.outcome"])
		}
		if sp.EndTimeUnixNano+uint64(500*time.Millisecond) > retried.EndTimeUnixNano {
			t.Errorf("record %q's span ends %v before the retried record's: it lasted as long as another record's work",
				key, time.Duration(retried.EndTimeUnixNano-sp.EndTimeUnixNano))
		}
	}
	for _, key := range []string{"poison", "retried"} {
		sp := record[key]
		if sp.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || spanAttrs(sp)["causet.outcome"] != "dead_lettered" {
			t.Errorf("record %q: status %v outcome %q, want Error and dead_lettered", key, sp.Status, spanAttrs(sp)["causet.outcome"])
		}
	}
	// The retried pair's WARN line leads to its trace.
	logged := false
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		logged = logged || strings.Contains(line, "projection failed, retrying") && strings.Contains(line, "trace_id="+hexID(retried.TraceId))
	}
	if !logged {
		t.Errorf("no \"projection failed, retrying\" line carries the retried record's trace_id %s", hexID(retried.TraceId))
	}
	if names := eventNames(record["poison"]); len(names) == 0 || names[0] != "exception" {
		t.Errorf("the not-JSON record's span has events %v, want its error recorded", names)
	}

	// Pair spans.
	pairsOf := map[string][]*tracepb.Span{}
	for _, sp := range byName(spans, "apply ") {
		if sp.Name == "apply batch" {
			continue
		}
		for key, r := range record {
			if hexID(sp.ParentSpanId) == hexID(r.SpanId) {
				pairsOf[key] = append(pairsOf[key], sp)
			}
		}
	}
	for _, key := range []string{"good", "retried", "headerless"} {
		want := 2 // artist_followers, user_follows
		if key != "retried" && !everyPair {
			want = 0 // applied at once: told by the record's span and the batch's
		}
		if len(pairsOf[key]) != want {
			t.Errorf("record %q has %d pair spans, want %d", key, len(pairsOf[key]), want)
		}
	}
	for _, sp := range pairsOf["retried"] {
		if sp.StartTimeUnixNano != retried.StartTimeUnixNano {
			t.Errorf("pair span %s starts %v after its record's: want from when the record was taken", sp.Name,
				time.Duration(sp.StartTimeUnixNano-retried.StartTimeUnixNano))
		}
	}
	for _, sp := range pairsOf["good"] {
		a := spanAttrs(sp)
		if a["causet.tenant_schema"] != tenant || a["causet.event_type"] != "ARTIST_FOLLOWED" || "apply "+a["causet.projection"] != sp.Name ||
			(a["causet.outcome"] != "applied" && a["causet.outcome"] != "copied") {
			t.Errorf("good pair span %s attributes %v", sp.Name, a)
		}
	}
	for _, sp := range pairsOf["retried"] {
		a := spanAttrs(sp)
		retries := 0
		exceptions := 0
		for _, e := range sp.Events {
			switch e.Name {
			case "retry":
				retries++
			case "exception":
				exceptions++
			}
		}
		if sp.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || a["causet.outcome"] != "dead_lettered" || a["error.type"] != "projection" ||
			a["db.response.status_code"] != "42P01" || a["causet.retry.count"] != "2" || retries != 2 || exceptions != 3 {
			t.Errorf("retried pair span %s: status %v, attributes %v, %d retry and %d exception events; want Error, dead_lettered, projection, 42P01, 2 retries, 3 failed attempts",
				sp.Name, sp.Status, a, retries, exceptions)
		}
	}

	// Dead letters: send spans under the failed pair (or record), the dead
	// letter's traceparent theirs, the original kept.
	sends := map[string]*tracepb.Span{}
	for _, sp := range byName(spans, "send "+dlqTopic) {
		sends[hexID(sp.SpanId)] = sp
	}
	for _, dl := range dls {
		var tp, orig string
		for _, h := range dl.Headers {
			switch h.Key {
			case "traceparent":
				tp = string(h.Value)
			case dlq.HeaderOriginalTraceparent:
				orig = string(h.Value)
			}
		}
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || sends[parts[2]] == nil {
			t.Errorf("dead letter %s: traceparent %q is no send span's", dl.Key, tp)
			continue
		}
		send := sends[parts[2]]
		parent := spans[hexID(send.ParentSpanId)]
		wantParent := map[string]string{"poison": poisonParent, "retried": retriedParent}[string(dl.Key)]
		if orig != wantParent {
			t.Errorf("dead letter %s: %s %q, want the event's %q", dl.Key, dlq.HeaderOriginalTraceparent, orig, wantParent)
		}
		switch {
		case parent == nil:
			t.Errorf("dead letter %s: its send span's parent was not exported", dl.Key)
		case string(dl.Key) == "poison" && parent != record["poison"]:
			t.Errorf("not-JSON record's send span's parent is %s, want the record's span", parent.Name)
		case string(dl.Key) == "retried" && hexID(parent.ParentSpanId) != hexID(retried.SpanId):
			t.Errorf("retried record's send span's parent is %s, want one of its pair spans", parent.Name)
		}
		if hexID(send.TraceId) != parts[1] || !strings.Contains(wantParent, parts[1]) {
			t.Errorf("dead letter %s: trace %s, want the event's own trace (%s)", dl.Key, parts[1], wantParent)
		}
	}

	// The batch transaction: a root span linked to the records it applied,
	// the database client's spans under it.
	var linked bool
	for _, sp := range spans {
		if sp.Name != "apply batch" && !strings.HasPrefix(sp.Name, "copy batch") {
			continue
		}
		if len(sp.ParentSpanId) != 0 {
			t.Errorf("batch span %s has a parent; want a root linked to its records", sp.Name)
		}
		links := map[string]bool{}
		for _, l := range sp.Links {
			links[hexID(l.SpanId)] = true
		}
		if links[hexID(record["good"].SpanId)] && links[hexID(headerless.SpanId)] {
			linked = true
			var db int
			for _, c := range spans {
				if hexID(c.ParentSpanId) == hexID(sp.SpanId) && spanAttrs(c)["db.system.name"] == "postgresql" {
					db++
				}
			}
			if db == 0 {
				t.Errorf("batch span %s has no database spans under it", sp.Name)
			}
		}
	}
	if !linked {
		t.Errorf("no batch span links both good records' spans")
	}
	// rootLinks counts the links to target's span from the spans named
	// name, each of which must be a root.
	rootLinks := func(name string, target *tracepb.Span) int {
		n := 0
		for _, sp := range spans {
			if sp.Name != name {
				continue
			}
			if len(sp.ParentSpanId) != 0 {
				t.Errorf("%s span has a parent; want a root linked to its records", name)
			}
			for _, l := range sp.Links {
				if hexID(l.SpanId) == hexID(target.SpanId) {
					n++
				}
			}
		}
		return n
	}
	// The sweep after the batch's commit (artist_followers has a delete):
	// a root span linked to the records it swept.
	if rootLinks("sweep", record["good"]) == 0 {
		t.Errorf("no sweep span links the good record's span")
	}
	// The retried record's retries: root spans of one round trip each,
	// linked to it.
	retries := rootLinks("retry statements", retried)
	if retries == 0 {
		t.Errorf("no retry statements span links the retried record's span")
	}
}

// TestRunTracesRecordsWhateverTheirKeysAndValues: OTLP carries strings as
// UTF-8, and one string that is not fails the export of every span sent
// with it (tracing trial: a record keyed k\xff\xfe\x00 lost the spans of
// the 300 records after it). A key that is not UTF-8 is given in
// hexadecimal, a key longer than the attribute value length limit (1024 by
// default) is cut, and an error quoting a value's bytes is made UTF-8; the
// other records' spans arrive.
func TestRunTracesRecordsWhateverTheirKeysAndValues(t *testing.T) {
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100000")
	b, events, w := startOnKfake(t, 1)
	long := strings.Repeat("k", 5000)
	recs := []*kgo.Record{
		{Key: []byte("k\xff\xfe\x00"), Value: poison},
		{Key: []byte(long), Value: poison},
		{Key: []byte("bad-bytes"), Value: []byte("{\"eventType\": \"\xff\xfe\"")},
		{Key: []byte("plain"), Value: poison},
		{Key: []byte("unhandled"), Value: []byte(`{"eventType":"NOBODY_HANDLES","entityId":"e-1","forkId":"production","tenantSchema":"t_any","irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{}}`)},
	}
	prod := b.Client(t, kgo.DefaultProduceTopic(events), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{} // key: outcome
	w.waitFor(t, "the 5 records' spans exported", 30*time.Second, func() bool {
		clear(keys)
		for _, sp := range exportedSpans(rcv) {
			if sp.Name == "process "+events {
				keys[spanAttrs(sp)["messaging.kafka.message.key"]] = spanAttrs(sp)["causet.outcome"]
			}
		}
		return len(keys) == 5
	})
	for _, want := range []string{"6bfffe00", long[:1024], "bad-bytes", "plain"} {
		if keys[want] != "dead_lettered" {
			t.Errorf("no record span has messaging.kafka.message.key %.40q (len %d) and outcome dead_lettered; got %d keys", want, len(want), len(keys))
		}
	}
	// A record no projection handles is committed without a write: its
	// outcome says so (it said applied).
	if got := keys["unhandled"]; got != "unhandled" {
		t.Errorf("record span of an event type no projection handles: causet.outcome %q, want unhandled", got)
	}
	if strings.Contains(w.stderr.String(), "msg=opentelemetry") {
		t.Errorf("an export failed:\n%s", w.stderr.String())
	}
	w.shutdown(t)
}
