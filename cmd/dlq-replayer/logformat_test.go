package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestLogDurationsInMilliseconds: the replayer logs durations (a scan's
// elapsed time) as key_ms, a number of milliseconds, as the worker does.
func TestLogDurationsInMilliseconds(t *testing.T) {
	for format, want := range map[string]string{"json": `"elapsed_ms":1500`, "text": `elapsed_ms=1500`} {
		t.Run(format, func(t *testing.T) {
			var b bytes.Buffer
			s := settings{logFormat: format}
			log, _, err := s.logger(&b, false)
			if err != nil {
				t.Fatal(err)
			}
			log.Info("retry finished", "elapsed", 1500*time.Millisecond)
			if !strings.Contains(b.String(), want) {
				t.Errorf("log %s lacks %s", b.String(), want)
			}
		})
	}
}
