package projection_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
)

// TestWorkerReadySaysWhyTheGroupIsNotJoined: a worker whose SASL user may
// read the topic but not use the consumer group keeps retrying (the ACL may
// be fixed in the broker); meanwhile Ready says why the group is not
// joined, with the broker's error, and an ERROR line says it too (issue 14).
func TestWorkerReadySaysWhyTheGroupIsNotJoined(t *testing.T) {
	t.Parallel()
	topic := kafkatest.TopicName(t, "events")
	allow := func(res kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	b := kafkatest.Fake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-512", "admin", "admin-password"),
		kfake.User("SCRAM-SHA-512", "worker", "worker-password",
			allow(kmsg.ACLResourceTypeTopic, topic, kmsg.ACLOperationRead),
			allow(kmsg.ACLResourceTypeTopic, topic, kmsg.ACLOperationDescribe)),
		kfake.SeedTopics(1, topic))
	sasl := kgo.SASL(scram.Auth{User: "worker", Pass: "worker-password"}.AsSha512Mechanism())
	writer, err := dlq.NewWriter(b.Client(t, sasl), dlq.WriterConfig{RecordConfig: dlq.RecordConfig{Topic: topic + ".dlq", Worker: "test-worker", Generation: "test/v42"}})
	if err != nil {
		t.Fatal(err)
	}
	var log safeBuffer
	w, err := projection.NewWorker(projection.Config{
		Topic: topic, Group: kafkatest.TopicName(t, "group"), Retry: fastRetry,
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	}, []projection.Handler{panicky{}}, pgtest.Pool(t), writer, append(b.Opts(), sasl)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(testTimeout)
	for {
		err := w.Ready()
		if errors.Is(err, kerr.GroupAuthorizationFailed) {
			if !strings.HasPrefix(err.Error(), "consumer group not joined: ") {
				t.Errorf("Ready() = %q, want it to start with \"consumer group not joined: \"", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s Ready() = %v, want it to wrap GROUP_AUTHORIZATION_FAILED\nlog:\n%s", testTimeout, err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l := log.String(); !strings.Contains(l, `level=ERROR msg="consumer group not joined"`) || !strings.Contains(l, "GROUP_AUTHORIZATION_FAILED") {
		t.Errorf("no ERROR line saying the group is not joined because of GROUP_AUTHORIZATION_FAILED\nlog:\n%s", l)
	}
}

// blockingHandler applies an event only once release is closed, whatever
// its context says, and says on entered that it began.
type blockingHandler struct {
	entered chan struct{}
	release chan struct{}
}

func (h *blockingHandler) Name() string                  { return "blocking" }
func (h *blockingHandler) Handles(eventType string) bool { return eventType == "ARTIST_FOLLOWED" }
func (h *blockingHandler) Apply(context.Context, projection.DB, *projection.Event) (projection.Outcome, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
	return projection.Applied, nil
}

// TestWorkerIsNotReadyWhileItShutsDown: once its shutdown begins, Ready
// says so (operator trial: ready through a 20 s shutdown).
func TestWorkerIsNotReadyWhileItShutsDown(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	h := &blockingHandler{entered: make(chan struct{}, 1), release: make(chan struct{})}
	rn := r.start(func(c *projection.Config) { c.CopyMinRows = -1 }, h)
	r.produce("user-1", []byte(r.follow("user-1", "artist-1", 1)))
	select {
	case <-h.entered:
	case <-time.After(testTimeout):
		t.Fatal("the event was not applied")
	}
	if err := rn.w.Ready(); err != nil {
		t.Fatalf("Ready() = %v before the shutdown, want nil", err)
	}
	rn.cancel()
	waitFor(t, "Ready to say the worker shuts down", func() bool {
		err := rn.w.Ready()
		return err != nil && strings.HasPrefix(err.Error(), "shutting down")
	})
	close(h.release)
	if err := rn.stop(t); err != nil {
		t.Errorf("Run = %v", err)
	}
}
