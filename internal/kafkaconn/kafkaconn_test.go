package kafkaconn

import (
	"errors"
	"strings"
	"testing"

	"github.com/causet/projection-worker/internal/flagenv"
)

// TestOptsRefusesSASLCredentialsWithoutAMechanism: a SASL user or password
// without a mechanism is a usage error naming the flags, not dropped (the
// client would connect without authenticating: new-user trial); a
// mechanism without a user is one too; a complete setting is taken.
func TestOptsRefusesSASLCredentialsWithoutAMechanism(t *testing.T) {
	for _, tt := range []struct {
		s    Settings
		want string // in the error; "" none
	}{
		{Settings{Brokers: "k:9092", SASLUser: "bob"}, "without --kafka-sasl-mechanism"},
		{Settings{Brokers: "k:9092", SASLPassword: "pw"}, "without --kafka-sasl-mechanism"},
		{Settings{Brokers: "k:9092", SASLMechanism: "plain"}, "--kafka-sasl-user (KAFKA_SASL_USER) is required"},
		{Settings{Brokers: "k:9092", SASLMechanism: "plain", SASLUser: "bob", SASLPassword: "pw"}, ""},
		{Settings{Brokers: "k:9092"}, ""},
	} {
		_, err := tt.s.Opts()
		var ue *flagenv.UsageError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: Opts error %v, want none", tt.s, err)
		case tt.want != "" && (err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: Opts error %v, want a usage error with %q", tt.s, err, tt.want)
		}
	}
}
