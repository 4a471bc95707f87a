package projection_test

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/kafkatest"
)

// Real-broker counterparts of the kfake fault-injection tests (issue 4).

// TestWorkerRealBrokerDeadLetterTopicRefusesWrites is the real-broker
// counterpart of TestWorkerDeadLetterProduceFailureKeepsOffset: the
// dead-letter topic refuses every write (max.message.bytes lowered below
// any dead letter) until it is restored. Meanwhile the poison record's
// offset must not be committed; afterwards it is dead-lettered exactly once.
func TestWorkerRealBrokerDeadLetterTopicRefusesWrites(t *testing.T) {
	if !kafkatest.Real() {
		t.Skip("real-broker counterpart of TestWorkerDeadLetterProduceFailureKeepsOffset; runs with KAFKA_BROKERS (make test-kafka)")
	}
	t.Parallel()
	r := newRig(t, rigOptions{})
	adm := kadm.NewClient(r.broker.Client(t))
	ctx := context.Background()
	setMax := func(v string) {
		t.Helper()
		resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr(v)}}, r.dlqTopic)
		if err == nil {
			_, err = resp.On(r.dlqTopic, nil)
		}
		if err != nil {
			t.Fatalf("alter %s max.message.bytes=%s: %v", r.dlqTopic, v, err)
		}
	}
	setMax("64")
	rn := r.start(nil)
	r.produce("good-1", []byte(r.follow("good-1", "artist-1", 1)))
	r.produce("poison", []byte("not json"))
	r.produce("good-2", []byte(r.follow("good-2", "artist-1", 1)))
	// The good event before the poison is applied; the one after it is
	// applied too when the three share a batch, else it waits for the dead
	// letter (records of a partition are finished in order).
	deadline := time.Now().Add(testTimeout)
	for r.count("artist_followers") < 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a wrong commit would have happened by now
	if got := r.committed(); got > 1 {
		t.Fatalf("committed offset %d while the dead letter of offset 1 was refused", got)
	}
	for time.Now().Before(deadline) && !strings.Contains(fmt.Sprint(rn.w.Ready()), "stuck") {
		time.Sleep(20 * time.Millisecond)
	}
	if err := rn.w.Ready(); err == nil || !strings.Contains(err.Error(), "partition 0 stuck") {
		t.Errorf("Ready() while the dead-letter topic refuses writes = %v, want partition 0 stuck", err)
	}
	setMax("1048588")
	r.waitCommitted(testTimeout)
	if dls := r.deadLetters(); len(dls) != 1 {
		t.Errorf("dead letters = %d, want exactly 1", len(dls))
	}
	if n := r.count("artist_followers"); n != 2 {
		t.Errorf("rows = %d, want 2", n)
	}
}

// TestWorkerRealBrokerRestartMidStream stops and restarts the broker of
// `make kafka-up` while events are produced and processed: afterwards every
// event is projected or dead-lettered, none is lost and none is
// dead-lettered twice. It restarts the shared broker, so it runs only with
// KAFKA_RESTART_TEST=1 (make test-kafka runs it on its own, after the suite).
func TestWorkerRealBrokerRestartMidStream(t *testing.T) {
	if !kafkatest.Real() || os.Getenv("KAFKA_RESTART_TEST") != "1" {
		t.Skip("restarts the real broker of make kafka-up; runs with KAFKA_BROKERS and KAFKA_RESTART_TEST=1 (make test-kafka)")
	}
	r := newRig(t, rigOptions{partitions: 3})
	// A producer that rides out the outage.
	r.producer = r.broker.Client(t, kgo.DefaultProduceTopic(r.topic), kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(3*time.Minute), kgo.RecordRetries(1<<20), kgo.UnknownTopicRetries(-1))
	r.start(nil)

	const n, poisonEvery = 300, 10
	var wg sync.WaitGroup
	errs := make(chan error, n)
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			user := fmt.Sprintf("user-%d", i)
			v := []byte(r.follow(user, "artist-1", 1))
			if i%poisonEvery == 0 {
				v = []byte("not json " + user)
			}
			wg.Add(1)
			r.producer.Produce(context.Background(), &kgo.Record{Key: []byte(user), Value: v}, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					errs <- err
				}
			})
			time.Sleep(5 * time.Millisecond)
		}
	}
	produce(0, n/2)
	script := func(name string) {
		t.Helper()
		cmd := osexec.Command("bash", "../scripts/"+name)
		cmd.Env = append(os.Environ(), "KAFKA_START_TIMEOUT=180")
		out, err := cmd.CombinedOutput()
		t.Logf("%s: %s", name, out)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	script("kafka-down.sh")
	time.Sleep(2 * time.Second)
	script("kafka-up.sh")
	produce(n/2, n)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("produce: %v", err)
	}
	r.produced = n
	r.waitCommitted(3 * time.Minute)

	wantRows := n - n/poisonEvery
	if got := r.count("artist_followers"); got != wantRows {
		t.Errorf("rows = %d, want %d", got, wantRows)
	}
	dls := r.deadLetters()
	seen := map[string]int{}
	for _, d := range dls {
		seen[d.key]++
	}
	if len(seen) != n/poisonEvery {
		t.Errorf("dead-lettered keys = %d, want %d", len(seen), n/poisonEvery)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("key %s dead-lettered %d times, want once", k, c)
		}
	}
}
