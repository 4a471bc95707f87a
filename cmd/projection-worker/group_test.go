package main

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestGroupMembershipOptions: --group-instance-id and --session-timeout
// reach the consumer group as kgo.InstanceID and kgo.SessionTimeout; an
// empty id keeps dynamic membership; the bounds are accepted.
func TestGroupMembershipOptions(t *testing.T) {
	tests := []struct {
		id      string
		session time.Duration
	}{
		{"", defaultSessionTimeout},
		{"projection-worker-0", minSessionTimeout},
		{"A.b_c-9", maxSessionTimeout},
		{strings.Repeat("p", maxInstanceIDLen), 2 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.id+" "+tt.session.String(), func(t *testing.T) {
			s := settings{groupInstanceID: tt.id, sessionTimeout: tt.session}
			if err := s.checkGroupMembership(); err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(append(s.groupOpts(), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			id, _ := cl.OptValue(kgo.InstanceID).(string)
			session, _ := cl.OptValue(kgo.SessionTimeout).(time.Duration)
			if id != tt.id || session != tt.session {
				t.Errorf("instance id %q, session timeout %s; want %q, %s", id, session, tt.id, tt.session)
			}
		})
	}
}
