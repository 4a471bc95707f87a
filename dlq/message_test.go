package dlq

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestMessageMarshalJSON(t *testing.T) {
	t.Run("base64 present even when empty", func(t *testing.T) {
		b, err := Message{}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want := `{"originalEvent":null,"originalValueBase64":"","projectionName":"","tenantSchema":"","error":"","stackTrace":"","retryCount":0,"firstFailedAt":0,"failedAt":0}`
		if string(b) != want {
			t.Errorf("got  %s\nwant %s", b, want)
		}
	})
	t.Run("no html escaping", func(t *testing.T) {
		b, err := Message{OriginalEvent: json.RawMessage(`{}`), Error: "a < b && c > d", StackTrace: "line\n\ttab \"q\" \u2028"}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"error":"a < b && c > d"`)) {
			t.Errorf("error was escaped: %s", b)
		}
		var m Message
		if err := json.Unmarshal(b, &m); err != nil || m.StackTrace != "line\n\ttab \"q\" \u2028" {
			t.Errorf("round trip: %v, %q", err, m.StackTrace)
		}
	})
	t.Run("not an object", func(t *testing.T) {
		for _, ev := range []string{`[1]`, `{"a":`, `"x"`, "{\"a\":\"\xff\"}"} {
			if b, err := (Message{OriginalEvent: json.RawMessage(ev)}).MarshalJSON(); err == nil {
				t.Errorf("MarshalJSON with originalEvent %q = %s, want an error", ev, b)
			}
		}
	})
}

// TestParseReplayCount: a replay count is a decimal from 1 to
// MaxReplayCount, digits only; anything else is no replay.
func TestParseReplayCount(t *testing.T) {
	for v, want := range map[string]int{"1": 1, "2": 2, "999999": 999999, "1000000": MaxReplayCount} {
		if n, ok := ParseReplayCount([]byte(v)); !ok || n != want {
			t.Errorf("ParseReplayCount(%q) = %d, %v, want %d, true", v, n, ok, want)
		}
	}
	for _, v := range []string{"", "0", "00", "007", "-1", "+1", " 1", "1 ", "1.0", "1e3", "abc", "1000001", "9223372036854775807", "99999999999999999999999"} {
		if n, ok := ParseReplayCount([]byte(v)); ok || n != 0 {
			t.Errorf("ParseReplayCount(%q) = %d, %v, want 0, false", v, n, ok)
		}
	}
}
