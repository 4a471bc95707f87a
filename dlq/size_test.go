package dlq

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestNewRecordTruncatesOversizeDeadLetters(t *testing.T) {
	bigEvent := `{"eventType":"BIG","payload":{"blob":"` + strings.Repeat("x", 3000) + `"}}`
	tests := []struct {
		name          string
		maxBytes      int
		stack, errMsg string
		wantCut       string
		wantError     func(t *testing.T, m Message, errMsg string)
		wantStack     func(t *testing.T, m Message, stack string)
	}{
		{
			name:     "stack trace cut to a prefix",
			maxBytes: 8000,
			stack:    strings.Repeat("goroutine frame é\n", 1000),
			errMsg:   "boom",
			wantCut:  "stackTrace",
			wantStack: func(t *testing.T, m Message, stack string) {
				prefix, marker, ok := strings.Cut(m.StackTrace, "…[truncated ")
				if !ok || prefix == "" || !strings.HasSuffix(marker, " bytes]") {
					t.Fatalf("stackTrace %q is not a prefix and a marker", m.StackTrace)
				}
				full := stackTrace(errors.New("boom"), stack)
				if !strings.HasPrefix(full, prefix) {
					t.Errorf("stackTrace prefix is not a prefix of the full stack")
				}
				if n := fmt.Sprintf("%d bytes]", len(full)-len(prefix)); marker != n {
					t.Errorf("marker says %q, want %q", marker, n)
				}
			},
		},
		{
			name:     "stack trace emptied, error cut",
			maxBytes: 6000,
			stack:    strings.Repeat("s", 5000),
			errMsg:   strings.Repeat("error text ", 1000),
			wantCut:  "stackTrace,error",
			wantStack: func(t *testing.T, m Message, _ string) {
				if m.StackTrace != "" {
					t.Errorf("stackTrace %q, want empty", m.StackTrace)
				}
			},
			wantError: func(t *testing.T, m Message, errMsg string) {
				prefix, _, ok := strings.Cut(m.Error, "…[truncated ")
				if !ok || prefix == "" || !strings.HasPrefix(errMsg, prefix) {
					t.Errorf("error %q is not a prefix of the error and a marker", m.Error)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := testDeadLetter([]byte(bigEvent))
			dl.Err = errors.New(tt.errMsg)
			dl.Stack = tt.stack
			rec := newRecord(t, dl, RecordConfig{MaxBytes: tt.maxBytes})
			if size := recordSize(rec); size > tt.maxBytes {
				t.Errorf("record is %d bytes, over MaxBytes %d", size, tt.maxBytes)
			}
			m := decodeMessage(t, rec.Value)
			if string(m.OriginalEvent) != bigEvent {
				t.Errorf("originalEvent was changed")
			}
			if got, _ := header(rec, HeaderTruncated); got != tt.wantCut {
				t.Errorf("truncated header %q, want %q", got, tt.wantCut)
			}
			if tt.wantStack != nil {
				tt.wantStack(t, m, tt.stack)
			}
			if tt.wantError != nil {
				tt.wantError(t, m, tt.errMsg)
			} else if m.Error != tt.errMsg {
				t.Errorf("error %q was changed", m.Error)
			}
			if got, _ := header(rec, HeaderFingerprint); got != Fingerprint(dl.Projection, dl.Class, "", tt.errMsg) {
				t.Errorf("fingerprint %s is not that of the untruncated error", got)
			}
		})
	}
}

func TestNewRecordFitsExactlyWithoutTruncating(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	full := newRecord(t, dl, RecordConfig{})
	size := recordSize(full)
	rec := newRecord(t, dl, RecordConfig{MaxBytes: size})
	if _, cut := header(rec, HeaderTruncated); cut {
		t.Errorf("record of exactly MaxBytes (%d) was truncated", size)
	}
	rec = newRecord(t, dl, RecordConfig{MaxBytes: size - 1})
	if got, _ := header(rec, HeaderTruncated); got != "stackTrace" {
		t.Errorf("record one byte over MaxBytes: truncated header %q, want stackTrace", got)
	}
	if s := recordSize(rec); s > size-1 {
		t.Errorf("record is %d bytes, over %d", s, size-1)
	}
}

// TestNewRecordLeavesOutAnOriginalTooLargeToFit: an original value that
// cannot fit even with stackTrace and error emptied is left out (JSON or
// not, where base64 grows it by a third): the dead letter is still
// written, valid against the schema, with the error kept, and
// causet.dlq.original-omitted gives the value's size and SHA-256.
func TestNewRecordLeavesOutAnOriginalTooLargeToFit(t *testing.T) {
	for name, value := range map[string][]byte{
		"JSON event": []byte(`{"blob":"` + strings.Repeat("x", 4000) + `"}`),
		"just under the limit, not with the headers": []byte(`{"blob":"` + strings.Repeat("x", 1900) + `"}`),
		"not JSON":      bytes.Repeat([]byte{0xff}, 3000),
		"10 MB garbage": bytes.Repeat([]byte("z"), 10<<20),
	} {
		t.Run(name, func(t *testing.T) {
			dl := testDeadLetter(value)
			rec, err := NewRecord(dl, RecordConfig{MaxBytes: 2048}, testNow)
			if err != nil {
				t.Fatalf("NewRecord: %v, want the dead letter written without its original", err)
			}
			if s := recordSize(rec); s > 2048 {
				t.Errorf("record is %d bytes, over 2048", s)
			}
			m := decodeMessage(t, rec.Value)
			if m.OriginalEvent != nil && string(m.OriginalEvent) != "null" || m.OriginalValueBase64 != "" {
				t.Errorf("originalEvent %s, originalValueBase64 %q; want null and \"\"", m.OriginalEvent, m.OriginalValueBase64)
			}
			sum := sha256.Sum256(value)
			want := fmt.Sprintf("size=%d sha256=%x", len(value), sum)
			if got, _ := header(rec, HeaderOriginalOmitted); got != want {
				t.Errorf("%s = %q, want %q", HeaderOriginalOmitted, got, want)
			}
			if !strings.Contains(m.Error, "SQLSTATE 42703") {
				t.Errorf("error = %q, want the failure kept", m.Error)
			}
		})
	}
}

// TestNewRecordLeavesOutAKeyTooLargeToFit: a key that does not fit is
// left out last (new-user trial: a 5 MB key held the partition): the dead
// letter has no key, keeps the value and headers that fit, and
// causet.dlq.original-key-omitted gives the key's size and SHA-256. A
// forkId or eventType from the wire is cut to 256 bytes in its header, so
// that it cannot make a dead letter too large either.
func TestNewRecordLeavesOutAKeyTooLargeToFit(t *testing.T) {
	dl := testDeadLetter([]byte(testEvent))
	src := *dl.Source
	src.Key = bytes.Repeat([]byte("k"), 3000)
	dl.Source = &src
	dl.ForkID = strings.Repeat("f", 100_000)
	rec, err := NewRecord(dl, RecordConfig{MaxBytes: 2048}, testNow)
	if err != nil {
		t.Fatalf("NewRecord: %v, want the dead letter written without the key", err)
	}
	if s := recordSize(rec); s > 2048 {
		t.Errorf("record is %d bytes, over 2048", s)
	}
	if rec.Key != nil {
		t.Errorf("dead letter key is %d bytes, want none", len(rec.Key))
	}
	want := fmt.Sprintf("size=3000 sha256=%x", sha256.Sum256(src.Key))
	if got, _ := header(rec, HeaderOriginalKeyOmitted); got != want {
		t.Errorf("%s = %q, want %q", HeaderOriginalKeyOmitted, got, want)
	}
	if got, _ := header(rec, "content-type"); got != "application/json" {
		t.Errorf("content-type header %q: the headers fit and are kept", got)
	}
	if m := decodeMessage(t, rec.Value); string(m.OriginalEvent) != testEvent {
		t.Errorf("originalEvent %.60s: the value fits and is kept", m.OriginalEvent)
	}
	if f, _ := header(rec, HeaderForkID); len(f) > 256 || !strings.HasSuffix(f, "…[truncated 99775 bytes]") {
		t.Errorf("%s is %d bytes ending %q, want it cut to 256 with the marker", HeaderForkID, len(f), f[max(0, len(f)-30):])
	}
}

// TestNewRecordRefusesALimitBelowItsOwnFields: a limit smaller than the
// dead letter's own headers and fields (the record's parts left out) is
// ErrTooLarge, saying so.
func TestNewRecordRefusesALimitBelowItsOwnFields(t *testing.T) {
	_, err := NewRecord(testDeadLetter([]byte(testEvent)), RecordConfig{MaxBytes: 600}, testNow)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("NewRecord error %v, want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "the dead letter's 14 headers") {
		t.Errorf("NewRecord error %q, want the dead letter's own headers named", err)
	}
}

// TestNewRecordLeavesOutHeadersTooLargeToFit: a record whose own headers
// do not fit the dead-letter topic is still dead-lettered (before, the
// worker's partition stopped there): its headers are left out, with the
// copy of its traceparent, the value kept when it then fits and left out
// too when it does not, and causet.dlq.original-headers-omitted gives
// their count, size and digest over the documented encoding
// (docs/dead-letters.md). A causet.dlq.* header of the source is neither
// copied nor counted.
func TestNewRecordLeavesOutHeadersTooLargeToFit(t *testing.T) {
	big := kgo.RecordHeader{Key: "x-trace-baggage", Value: bytes.Repeat([]byte("b"), 3000)}
	for name, c := range map[string]struct {
		value     []byte
		valueKept bool
	}{
		"small value kept":    {[]byte(testEvent), true},
		"large value omitted": {[]byte(`{"blob":"` + strings.Repeat("x", 3000) + `"}`), false},
	} {
		t.Run(name, func(t *testing.T) {
			dl := testDeadLetter(c.value)
			dl.Source.Headers = append(dl.Source.Headers, big, kgo.RecordHeader{Key: HeaderWorker, Value: []byte("earlier-worker")})
			rec, err := NewRecord(dl, RecordConfig{MaxBytes: 2048}, testNow)
			if err != nil {
				t.Fatalf("NewRecord: %v, want the dead letter written without the record's headers", err)
			}
			if s := recordSize(rec); s > 2048 {
				t.Errorf("record is %d bytes, over 2048", s)
			}
			for _, k := range []string{"traceparent", "content-type", big.Key, HeaderOriginalTraceparent} {
				if v, ok := header(rec, k); ok {
					t.Errorf("header %s = %.40q kept; want the record's own headers left out", k, v)
				}
			}
			for _, k := range []string{HeaderOriginalTopic, HeaderOriginalOffset, HeaderFingerprint, HeaderErrorClass} {
				if _, ok := header(rec, k); !ok {
					t.Errorf("header %s missing: the dead letter's own headers must stay", k)
				}
			}
			if w, _ := header(rec, HeaderWorker); w == "earlier-worker" {
				t.Errorf("%s is the source's, want this worker's", HeaderWorker)
			}
			// The documented digest: key length, key, value length, value,
			// each length an unsigned varint, for every header but causet.dlq.*.
			var enc []byte
			size := 0
			for _, h := range testSource(nil).Headers {
				enc = append(binary.AppendUvarint(enc, uint64(len(h.Key))), h.Key...)
				enc = append(binary.AppendUvarint(enc, uint64(len(h.Value))), h.Value...)
				size += len(h.Key) + len(h.Value)
			}
			enc = append(binary.AppendUvarint(enc, uint64(len(big.Key))), big.Key...)
			enc = append(binary.AppendUvarint(enc, uint64(len(big.Value))), big.Value...)
			size += len(big.Key) + len(big.Value)
			want := fmt.Sprintf("count=3 size=%d sha256=%x", size, sha256.Sum256(enc))
			if got, _ := header(rec, HeaderOriginalHeadersOmitted); got != want {
				t.Errorf("%s = %q, want %q", HeaderOriginalHeadersOmitted, got, want)
			}
			m := decodeMessage(t, rec.Value)
			_, valueOmitted := header(rec, HeaderOriginalOmitted)
			if kept := string(m.OriginalEvent) == string(c.value); kept != c.valueKept || valueOmitted == c.valueKept {
				t.Errorf("originalEvent %.60s (omitted header %v); want the value kept: %v", m.OriginalEvent, valueOmitted, c.valueKept)
			}
			if !strings.Contains(m.Error, "SQLSTATE 42703") {
				t.Errorf("error = %q, want the failure kept", m.Error)
			}
		})
	}
}

// TestRestoredHeadersGiveWayToTheDeadLettersTrace: the source's headers,
// read again, come before the dead letter's; its traceparent and
// tracestate only when the dead letter has no traceparent of its own (a
// tracing worker's send span took their place, as when headers are kept).
func TestRestoredHeadersGiveWayToTheDeadLettersTrace(t *testing.T) {
	src := []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "traceparent", Value: []byte("src")}, {Key: "tracestate", Value: []byte("s")}}
	keys := func(hs []kgo.RecordHeader) string {
		var ks []string
		for _, h := range hs {
			ks = append(ks, h.Key+"="+string(h.Value))
		}
		return strings.Join(ks, ",")
	}
	for _, c := range []struct {
		dead []kgo.RecordHeader
		want string
	}{
		{[]kgo.RecordHeader{{Key: HeaderFingerprint, Value: []byte("f")}}, "a=1,traceparent=src,tracestate=s," + HeaderFingerprint + "=f"},
		{[]kgo.RecordHeader{{Key: "traceparent", Value: []byte("send")}, {Key: HeaderFingerprint, Value: []byte("f")}}, "a=1,traceparent=send," + HeaderFingerprint + "=f"},
	} {
		if got := keys(restoredHeaders(src, c.dead)); got != c.want {
			t.Errorf("restoredHeaders(%s) = %s, want %s", keys(c.dead), got, c.want)
		}
	}
}
