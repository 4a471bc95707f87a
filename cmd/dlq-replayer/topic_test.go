package main

import (
	"testing"

	"github.com/causet/projection-worker/projection"
)

// TestDefaultEventsTopicIsTheWorkers: --topic's default is the topic the
// worker reads by default, so a replay reaches it without flags.
func TestDefaultEventsTopicIsTheWorkers(t *testing.T) {
	if defaultEventsTopic != projection.DefaultEventsTopic {
		t.Errorf("defaultEventsTopic = %q, projection.DefaultEventsTopic = %q", defaultEventsTopic, projection.DefaultEventsTopic)
	}
}
