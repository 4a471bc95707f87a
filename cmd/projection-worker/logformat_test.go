package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestLogDurationsInMilliseconds: the worker logs a duration (a retry's
// wait) as wait_ms, a number of milliseconds, in JSON and text (new-user
// trial: JSON showed integer nanoseconds).
func TestLogDurationsInMilliseconds(t *testing.T) {
	for format, want := range map[string]string{"json": `"wait_ms":212.5`, "text": `wait_ms=212.5`} {
		t.Run(format, func(t *testing.T) {
			var b bytes.Buffer
			s := settings{logFormat: format, logLevel: "info"}
			log, err := s.logger(&b)
			if err != nil {
				t.Fatal(err)
			}
			log.Warn("projection failed, retrying", "retry", 1, "wait", 212500*time.Microsecond)
			if !strings.Contains(b.String(), want) {
				t.Errorf("log %s lacks %s", b.String(), want)
			}
		})
	}
}
