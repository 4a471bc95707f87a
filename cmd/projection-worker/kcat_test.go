package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/internal/testtool"
	"github.com/causet/projection-worker/schemas"
)

// requireTool returns the path of a command-line tool the test needs; see
// testtool.Require.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return testtool.Require(t, name)
}

// kcatMessage is one line of `kcat -C -J`: kcat 1.7 prints the key and
// the value (payload) as JSON strings, or null when absent, and the headers
// as one flat array [key1, value1, key2, value2, ...], absent when the
// record has none.
type kcatMessage struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Timestamp int64     `json:"ts"`
	Key       *string   `json:"key"`
	Payload   *string   `json:"payload"`
	Headers   *[]string `json:"headers"`
}

// header returns the value of the first header named key.
func (m kcatMessage) header(key string) (string, bool) {
	if m.Headers == nil {
		return "", false
	}
	h := *m.Headers
	for i := 0; i+1 < len(h); i += 2 {
		if h[i] == key {
			return h[i+1], true
		}
	}
	return "", false
}

// shell runs a copyable command line with bash (pipefail: a failing kcat
// before a jq fails the line) and returns its stdout; stderr is only shown
// when the command fails.
func shell(ctx context.Context, t *testing.T, stdin []byte, cmdline string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", cmdline)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("$ %s\n%v\nstdout:\n%s\nstderr:\n%s", cmdline, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// specExample is the SPEC §3 example event on one line (kcat -P sends one
// record per input line), with the tenant schema as %s.
const specExample = `{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}}`

// divideByZero fails the artist_followers derive (points / games with games
// 0, a permanent error) and applies to user_follows.
const divideByZero = `{"eventType":"ARTIST_FOLLOWED","entityId":"user-789","forkId":"production","tenantSchema":%q,"irVersion":"v42","sequenceNumber":7,"ts":1719331200000,"payload":{"user_id":"user-789","artist_id":"artist-456","points":10,"games":0}}`

// poison is a record value that is not JSON: the worker dead-letters it at
// once with originalEvent null and the bytes in originalValueBase64.
var poison = []byte(`this is not JSON {"eventType":`)

// TestKcatInteroperability runs the worker on records produced by kcat and
// reads its dead letters back with kcat, as an operator would: a client
// nobody here wrote (librdkafka), on kfake or on the real broker of
// KAFKA_BROKERS. It checks that the SPEC example is projected; that the
// poison record's dead letter is the documented JSON, validates against
// schemas/projection-dlq.v1.schema.json, keeps the original key and the
// original kcat header and carries every causet.dlq.* header; and that the
// README's kcat and jq command lines work. The commands are logged for the
// README.
func TestKcatInteroperability(t *testing.T) {
	requireTool(t, "kcat")
	b := kafkatest.New(t)
	dbURL := pgtest.URL(t)
	pool := pgtest.Pool(t)
	tenant := pgtest.NewSchemaName(t)
	brokers := strings.Join(b.Addrs, ",")
	events := kafkatest.TopicName(t, "events")
	dlqTopic := kafkatest.TopicName(t, "dlq")
	ledger := kafkatest.TopicName(t, "ledger")
	group := kafkatest.TopicName(t, "group")
	b.CreateTopic(t, events, 2, nil)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{tenant}.Sanitize()+" CASCADE")
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if r := runCmd(t, time.Minute, "migrate", "--database-url", dbURL, "--projections", exampleProjections, "--tenant-schema", tenant); r.code != 0 {
		t.Fatalf("migrate: %s", r)
	}

	// Produce with kcat: the SPEC example, the poison record, and an event
	// that one projection dead-letters (for the jq filter by projection).
	type produced struct {
		key   string
		value []byte
	}
	records := []produced{
		{"user-123", []byte(fmt.Sprintf(specExample, tenant))},
		{"poison-1", poison},
		{"user-789", []byte(fmt.Sprintf(divideByZero, tenant))},
	}
	for _, rec := range records {
		if bytes.ContainsAny(rec.value, "\n") {
			t.Fatalf("kcat -P would split the value of %s at its newline", rec.key)
		}
		shell(ctx, t, rec.value, fmt.Sprintf("kcat -P -b %s -t %s -k %s -H trace-id=abc123", brokers, events, rec.key))
	}
	t.Logf("produced %d records with: printf '%%s' \"$EVENT\" | kcat -P -b %s -t %s -k KEY -H trace-id=abc123", len(records), brokers, events)
	adm := kadm.NewClient(b.Client(t))
	if n := topicRecords(ctx, t, adm, events); n != int64(len(records)) {
		t.Fatalf("events topic holds %d records after kcat -P, want %d", n, len(records))
	}

	// Run the worker in-process until both dead letters are acknowledged
	// and both rows are there.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"run",
			"--brokers", brokers, "--database-url", dbURL, "--projections", exampleProjections,
			"--topic", events, "--dlq-topic", dlqTopic, "--ledger-topic", ledger, "--group", group,
			"--http-addr", "127.0.0.1:0", "--worker-id", "kcat-test", "--log-format", "text",
			"--max-retries", "2", "--retry-initial", "10ms", "--retry-max-interval", "50ms",
			"--shutdown-grace", "20s",
		}, &stdout, &stderr)
	}()
	followers := pgx.Identifier{tenant, "artist_followers"}.Sanitize()
	follows := pgx.Identifier{tenant, "user_follows"}.Sanitize()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var rows int
		err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+followers+") + (SELECT count(*) FROM "+follows+")").Scan(&rows)
		if err != nil {
			t.Fatal(err)
		}
		// 1 artist_followers + 2 user_follows rows, 2 dead letters.
		if rows == 3 && topicRecords(ctx, t, adm, dlqTopic) == 2 {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("the worker exited early with %d\nstderr:\n%s", code, stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s: %d rows, %d dead letters; want 3 and 2\nstderr:\n%s", rows, topicRecords(ctx, t, adm, dlqTopic), stderr.String())
		}
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("the worker exited %d after cancel, want 0\nstderr:\n%s", code, stderr.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("the worker did not stop within 40s of cancel\nstderr:\n%s", stderr.String())
	}
	checkCommitted(ctx, t, adm, group, events)

	// The SPEC example's row.
	var followedAt time.Time
	var seq int64
	q := "SELECT followed_at, _causet_seq FROM " + followers + " WHERE artist_id = 'artist-456' AND user_id = 'user-123'"
	if err := pool.QueryRow(ctx, q).Scan(&followedAt, &seq); err != nil {
		t.Fatalf("the SPEC example's artist_followers row: %v", err)
	}
	if want := time.UnixMilli(1719331200000); !followedAt.Equal(want) || seq != 1891 {
		t.Errorf("artist_followers row = (%s, %d), want (%s, 1891)", followedAt.UTC(), seq, want.UTC())
	}

	// Read the dead letters with kcat -J.
	validator, err := schemas.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	readAll := fmt.Sprintf("kcat -C -b %s -t %s -o beginning -e -J", brokers, dlqTopic)
	out := shell(ctx, t, nil, readAll)
	t.Logf("$ %s\n%s", readAll, out)
	var msgs []kcatMessage
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var m kcatMessage
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("kcat -J line is not the JSON this test expects (headers a flat array of strings?): %v\n%s", err, sc.Text())
		}
		if m.Headers != nil && len(*m.Headers)%2 != 0 {
			t.Fatalf("kcat -J headers have an odd length, want [k1, v1, k2, v2, ...]: %q", *m.Headers)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 {
		t.Fatalf("kcat read %d dead letters, want 2:\n%s", len(msgs), out)
	}
	byKey := map[string]kcatMessage{}
	for _, m := range msgs {
		if m.Key == nil || m.Payload == nil {
			t.Fatalf("dead letter without key or value: %+v", m)
		}
		byKey[*m.Key] = m
	}

	t.Run("poison dead letter", func(t *testing.T) {
		m, ok := byKey["poison-1"]
		if !ok {
			t.Fatalf("no dead letter keyed by the original key poison-1: keys %v", keys(byKey))
		}
		value := []byte(*m.Payload)
		if err := validator.ValidateDeadLetter(value); err != nil {
			t.Errorf("dead letter does not validate against schemas/projection-dlq.v1.schema.json: %v\n%s", err, value)
		}
		var msg dlq.Message
		dec := json.NewDecoder(bytes.NewReader(value))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&msg); err != nil {
			t.Fatalf("dead letter is not the documented JSON shape: %v\n%s", err, value)
		}
		if string(msg.OriginalEvent) != "null" {
			t.Errorf("originalEvent = %s, want null for a value that is not JSON", msg.OriginalEvent)
		}
		raw, err := base64.StdEncoding.DecodeString(msg.OriginalValueBase64)
		if err != nil || !bytes.Equal(raw, poison) {
			t.Errorf("originalValueBase64 = %q decodes to %q (%v), want %q", msg.OriginalValueBase64, raw, err, poison)
		}
		if msg.ProjectionName != "" || msg.TenantSchema != "" || msg.RetryCount != 0 || msg.Error == "" {
			t.Errorf("dead letter = projection %q tenant %q retries %d error %q; want \"\", \"\", 0 and an error",
				msg.ProjectionName, msg.TenantSchema, msg.RetryCount, msg.Error)
		}
		if msg.FirstFailedAt <= 0 || msg.FailedAt < msg.FirstFailedAt {
			t.Errorf("firstFailedAt %d, failedAt %d: want epoch ms, first <= failed", msg.FirstFailedAt, msg.FailedAt)
		}
		checkHeaders(t, m, map[string]string{
			"trace-id":              "abc123",
			dlq.HeaderOriginalTopic: events,
			dlq.HeaderProjection:    "",
			dlq.HeaderTenantSchema:  "",
			dlq.HeaderErrorClass:    "permanent",
			dlq.HeaderSQLState:      "",
			dlq.HeaderWorker:        "kcat-test",
			dlq.HeaderGeneration:    buildVersion() + "/v42",
			dlq.HeaderReplayCount:   "0",
		})
	})

	t.Run("projection dead letter", func(t *testing.T) {
		m, ok := byKey["user-789"]
		if !ok {
			t.Fatalf("no dead letter keyed by user-789: keys %v", keys(byKey))
		}
		value := []byte(*m.Payload)
		if err := validator.ValidateDeadLetter(value); err != nil {
			t.Errorf("dead letter does not validate: %v\n%s", err, value)
		}
		var msg dlq.Message
		if err := json.Unmarshal(value, &msg); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf(divideByZero, tenant); string(msg.OriginalEvent) != want {
			t.Errorf("originalEvent = %s, want the kcat value verbatim %s", msg.OriginalEvent, want)
		}
		if msg.ProjectionName != "artist_followers" || msg.TenantSchema != tenant || !strings.Contains(msg.Error, "division by zero") {
			t.Errorf("dead letter = projection %q tenant %q error %q; want artist_followers, %s, division by zero",
				msg.ProjectionName, msg.TenantSchema, msg.Error, tenant)
		}
		checkHeaders(t, m, map[string]string{
			"trace-id":             "abc123",
			dlq.HeaderProjection:   "artist_followers",
			dlq.HeaderTenantSchema: tenant,
			dlq.HeaderForkID:       "production",
			dlq.HeaderEventType:    "ARTIST_FOLLOWED",
		})
	})

	t.Run("README commands", func(t *testing.T) {
		// issue 2's line: key, headers (k=v,k=v) and value.
		fmtLine := fmt.Sprintf(`kcat -b %s -t %s -C -o beginning -e -f '%%k %%h %%s\n'`, brokers, dlqTopic)
		out := shell(ctx, t, nil, fmtLine)
		for _, want := range []string{"poison-1 trace-id=abc123,", "causet.dlq.projection=artist_followers", "user-789 trace-id=abc123,", `"originalValueBase64":`} {
			if !strings.Contains(out, want) {
				t.Errorf("$ %s\nlacks %q:\n%s", fmtLine, want, out)
			}
		}
		t.Logf("works: %s", readmeForm(fmtLine, brokers, dlqTopic))

		requireTool(t, "jq")
		jqTests := []struct {
			what    string
			jq      string
			want    []string // the output lines, in DLQ order by key
			exactly bool
		}{
			{
				what: "filter by projection, headers read by position (kcat -J headers are [k1, v1, k2, v2, ...])",
				jq:   `jq -c 'select(.headers | index("causet.dlq.projection") as $i | .[$i+1] == "artist_followers") | .key'`,
				want: []string{`"user-789"`}, exactly: true,
			},
			{
				what: "filter by projection, headers turned into an object first (also right when a header is missing)",
				jq:   `jq -c '(.headers // [] | [range(0; length; 2) as $i | {key: .[$i], value: .[$i+1]}] | from_entries) as $h | select($h["causet.dlq.projection"] == "artist_followers") | .key'`,
				want: []string{`"user-789"`}, exactly: true,
			},
			{
				what: "filter by projection on the DLQ message itself, printing the message",
				jq:   `jq -c '.payload | fromjson | select(.projectionName == "artist_followers")'`,
				want: []string{`"projectionName":"artist_followers"`, `"error":`, `division by zero`},
			},
			{
				what: "one line per dead letter: offset, key, error class, projection, error",
				jq:   `jq -r '(.headers // [] | [range(0; length; 2) as $i | {key: .[$i], value: .[$i+1]}] | from_entries) as $h | [.partition, .offset, .key, $h["causet.dlq.error-class"], $h["causet.dlq.projection"], (.payload | fromjson | .error)] | @tsv'`,
				want: []string{"\tpoison-1\tpermanent\t\t", "\tuser-789\tpermanent\tartist_followers\t"},
			},
		}
		for _, jt := range jqTests {
			line := readAll + " | " + jt.jq
			got := shell(ctx, t, nil, line)
			lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
			if jt.exactly {
				if len(lines) != len(jt.want) || lines[0] != jt.want[0] {
					t.Errorf("$ %s\n= %q, want %q", line, lines, jt.want)
				}
			} else {
				for _, w := range jt.want {
					if !strings.Contains(got, w) {
						t.Errorf("$ %s\nlacks %q:\n%s", line, w, got)
					}
				}
			}
			t.Logf("works (%s):\n  %s\n  output: %s", jt.what, readmeForm(line, brokers, dlqTopic), strings.TrimSpace(got))
		}
	})
	if t.Failed() {
		t.Logf("worker stderr:\n%s", stderr.String())
	}
}

// readmeForm rewrites a tested command line for the README: the default
// broker of `make run` and the default dead-letter topic.
func readmeForm(line, brokers, dlqTopic string) string {
	line = strings.ReplaceAll(line, "-b "+brokers, "-b 127.0.0.1:9092")
	return strings.ReplaceAll(line, "-t "+dlqTopic, "-t "+dlq.DefaultTopic)
}

var fingerprintRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// checkHeaders checks that m carries every causet.dlq.* header of SPEC §6
// (all of them, in the order of dlq/message.go) with well-formed values,
// and the values in want ("" for a header only required to exist).
func checkHeaders(t *testing.T, m kcatMessage, want map[string]string) {
	t.Helper()
	all := []string{
		dlq.HeaderOriginalTopic, dlq.HeaderOriginalPartition, dlq.HeaderOriginalOffset,
		dlq.HeaderOriginalTimestamp, dlq.HeaderProjection, dlq.HeaderForkID, dlq.HeaderTenantSchema,
		dlq.HeaderEventType, dlq.HeaderErrorClass, dlq.HeaderSQLState, dlq.HeaderFingerprint,
		dlq.HeaderWorker, dlq.HeaderGeneration, dlq.HeaderReplayCount,
	}
	for _, k := range all {
		if _, ok := m.header(k); !ok {
			t.Errorf("header %s missing; kcat -J headers: %q", k, *m.Headers)
		}
	}
	if _, ok := m.header(dlq.HeaderTruncated); ok {
		t.Errorf("header %s set on a small dead letter", dlq.HeaderTruncated)
	}
	for k, v := range want {
		if got, ok := m.header(k); !ok || (v != "" && got != v) {
			t.Errorf("header %s = %q (present %t), want %q", k, got, ok, v)
		}
	}
	for _, k := range []string{dlq.HeaderOriginalPartition, dlq.HeaderOriginalOffset, dlq.HeaderOriginalTimestamp} {
		v, _ := m.header(k)
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			t.Errorf("header %s = %q, want a decimal >= 0", k, v)
		}
	}
	if v, _ := m.header(dlq.HeaderFingerprint); !fingerprintRE.MatchString(v) {
		t.Errorf("header %s = %q, want 16 hex digits", dlq.HeaderFingerprint, v)
	}
}

func keys(m map[string]kcatMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// topicRecords returns the records in topic (end minus start offsets, all
// partitions).
func topicRecords(ctx context.Context, t *testing.T, adm *kadm.Client, topic string) int64 {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("start offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil {
			return
		}
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Err == nil {
			n += e.Offset - s.Offset
		}
	})
	return n
}

// checkCommitted checks that the worker, having been stopped, committed
// every partition of topic up to its end offset: each record was applied
// or dead-lettered before its offset was committed.
func checkCommitted(ctx context.Context, t *testing.T, adm *kadm.Client, group, topic string) {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsetsForTopics(ctx, group, topic)
	if err != nil {
		t.Fatalf("committed offsets of %s: %v", group, err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, e.Partition)
		got := int64(-1)
		if ok && c.Err == nil {
			got = c.At
		}
		if e.Offset > 0 && got != e.Offset {
			t.Errorf("partition %d: committed offset %d, want the end offset %d", e.Partition, got, e.Offset)
		}
	})
}
