package projection

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
)

// TestDeadLetterCarriesWhatTheDecoderLearnt: the worker tells dlq whether
// the record value is a strict JSON object (DeadLetter.ValueShape), from
// its decoding, so that NewRecord does not read the value again; and the
// dead letter is the one NewRecord builds when it reads the value itself.
func TestDeadLetterCarriesWhatTheDecoderLearnt(t *testing.T) {
	tests := []struct {
		name  string
		value string
		want  dlq.ValueShape
	}{
		{"accepted event", testEventJSON(nil), dlq.ValueStrictObject},
		{"missing ts", testEventJSON(map[string]string{"ts": ""}), dlq.ValueStrictObject},
		{"quoted sequenceNumber", testEventJSON(map[string]string{"sequenceNumber": `"7"`}), dlq.ValueStrictObject},
		{"not a tenant", testEventJSON(map[string]string{"tenantSchema": `"public"`}), dlq.ValueStrictObject},
		{"duplicate key", testEventJSON(map[string]string{"payload": `{"a":1,"a":2}`}), dlq.ValueNotStrictObject},
		{"unpaired surrogate", testEventJSON(map[string]string{"payload": `{"s":"\ud800"}`}), dlq.ValueNotStrictObject},
		{"too deep", testEventJSON(map[string]string{"payload": `{"a":` + strings.Repeat("[", maxEventDepth) + strings.Repeat("]", maxEventDepth) + `}`}), dlq.ValueNotStrictObject},
		{"array", `[{}]`, dlq.ValueNotStrictObject},
		{"not JSON", `{"a":`, dlq.ValueNotStrictObject},
		{"not UTF-8", "{\"a\":\"\xff\"}", dlq.ValueNotStrictObject},
		{"tombstone", ``, dlq.ValueNotStrictObject},
	}
	w := &Worker{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &decoded{rec: &kgo.Record{Topic: "events", Value: []byte(tt.value)}}
			d.ev, d.err = DecodeEvent(d.rec.Value)
			f := pairFailure{d: d, err: d.err, firstAt: time.UnixMilli(1)}
			if d.ev != nil {
				// A replay for a projection this worker lacks: a dead
				// letter of a decoded event (newDeadLetter).
				d.replay.projection = "gone"
				f.err = errors.New("no projection gone")
			}
			dl := w.immediateDeadLetter(f)
			if dl.ValueShape != tt.want {
				t.Fatalf("ValueShape = %d, want %d", dl.ValueShape, tt.want)
			}
			known, err := dlq.NewRecord(dl, dlq.RecordConfig{}, time.UnixMilli(2))
			if err != nil {
				t.Fatal(err)
			}
			dl.ValueShape = dlq.ValueUnchecked
			read, err := dlq.NewRecord(dl, dlq.RecordConfig{}, time.UnixMilli(2))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(known.Value, read.Value) {
				t.Errorf("dead letter with the decoder's verdict:\n%.300s\nwith the value read by dlq:\n%.300s", known.Value, read.Value)
			}
		})
	}
}

// TestFetchErrorAttrsNameAPartitionOnlyForItsErrors: a client's own poll
// error (topic "") is logged without topic and partition; before, the
// group's join failure was logged with "partition":0, which misled a log
// query by partition (new-user trial).
func TestFetchErrorAttrsNameAPartitionOnlyForItsErrors(t *testing.T) {
	err := errors.New("boom")
	if got := fetchErrorAttrs("", 0, err); len(got) != 2 || got[0] != "error" {
		t.Errorf("client error: %v, want the error alone", got)
	}
	if got := fetchErrorAttrs("events", 3, err); len(got) != 6 || got[1] != "events" || got[3] != int32(3) {
		t.Errorf("partition error: %v, want topic events, partition 3 and the error", got)
	}
}
