package projection

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestNoticeRewindLogsRecordsDeliveredAgain(t *testing.T) {
	var buf bytes.Buffer
	pc := &partition{w: &Worker{log: slog.New(slog.NewTextHandler(&buf, nil))}, partition: 3, lastTaken: -1}
	pc.noticeRewind([]*kgo.Record{{Offset: 5}, {Offset: 6}})
	if buf.Len() != 0 {
		t.Fatalf("records in order logged: %s", buf.String())
	}
	pc.noticeRewind([]*kgo.Record{{Offset: 7}, {Offset: 2}, {Offset: 3}})
	out := buf.String()
	if !strings.Contains(out, "records delivered again") || !strings.Contains(out, "partition=3 offset=2 last_offset=7") {
		t.Errorf("log = %q, want a rewind from 7 to 2 on partition 3", out)
	}
	if pc.lastTaken != 3 {
		t.Errorf("lastTaken = %d, want 3", pc.lastTaken)
	}
}
