package dlq

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestScanSkipsDeadLettersDeletedWhileItReads: records deleted after the
// scan listed its offsets (retention reaching them, DeleteRecords) are
// skipped, and their partition is done: the scan ends rather than waiting
// for offsets that will never come (a real broker's retention check once
// deleted a test's dead letters of a past date in the middle of a scan,
// which then hung until its deadline).
func TestScanSkipsDeadLettersDeletedWhileItReads(t *testing.T) {
	b, topic := newBroker(t, false)
	if b.Fake != nil {
		t.Skip("needs a real broker (make test-kafka): kfake answers a fetch below a log start moved to the end with no records and no error, where a broker answers OFFSET_OUT_OF_RANGE")
	}
	cl := newClient(t, b)
	for i := range 20 { // one record per batch, so that a fetch returns one
		dl := testDeadLetter([]byte(testEvent))
		rec, err := NewRecord(dl, RecordConfig{Topic: topic, Worker: "w", Generation: "g"}, time.Date(2024, 6, 25, 12, i, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		rec.Partition = 0
		if err := cl.ProduceSync(testCtx(t), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	logs := &syncBuffer{}
	seen := 0
	st, err := Scan(ctx, append(b.Opts(), kgo.FetchMaxBytes(1)), ScanConfig{Topic: topic, Logger: slog.New(slog.NewJSONHandler(logs, nil))},
		func(e *Entry) error {
			if seen++; seen == 1 { // delete everything after the first, while reading
				offs := kadm.Offsets{}
				offs.Add(kadm.Offset{Topic: topic, Partition: e.Partition, At: 20})
				if _, err := adm.DeleteRecords(ctx, offs); err != nil {
					t.Errorf("delete records: %v", err)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatalf("Scan: %v (the scan waited for deleted records)", err)
	}
	said := false
	for _, l := range logs.lines(t) {
		said = said || strings.Contains(fmt.Sprint(l["msg"]), "deleted while being read")
	}
	if st.Scanned >= 20 || !said {
		t.Errorf("scanned %d of 20 with the rest deleted, deletion logged %v: want it skipped and said", st.Scanned, said)
	}
}
