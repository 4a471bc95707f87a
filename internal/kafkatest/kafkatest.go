// Package kafkatest gives integration tests a Kafka broker: the real one
// named by KAFKA_BROKERS when it is set (make test-kafka), else an in-process
// franz-go kfake cluster. Tests that need kfake-only fault injection ask for
// Fake and are skipped, by name and with the reason, against a real broker.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/topicready"
)

// Broker is a Kafka cluster for one test.
type Broker struct {
	// Addrs are the seed brokers.
	Addrs []string
	// Fake is the in-process cluster, nil against a real broker.
	Fake *kfake.Cluster
}

// Real reports whether KAFKA_BROKERS names a real broker for the tests.
func Real() bool { return os.Getenv("KAFKA_BROKERS") != "" }

// New returns the broker for t: KAFKA_BROKERS when set, else a fresh kfake
// cluster closed at the end of the test.
func New(t testing.TB, opts ...kfake.Opt) *Broker {
	t.Helper()
	if Real() {
		return &Broker{Addrs: strings.Split(os.Getenv("KAFKA_BROKERS"), ",")}
	}
	return Fake(t, opts...)
}

// Fake returns a fresh kfake cluster; against a real broker (KAFKA_BROKERS
// set) the test is skipped, because it relies on kfake's fault injection.
func Fake(t testing.TB, opts ...kfake.Opt) *Broker {
	t.Helper()
	if Real() {
		t.Skipf("%s needs kfake fault injection; skipped against the real broker %s", t.Name(), os.Getenv("KAFKA_BROKERS"))
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Broker{Addrs: c.ListenAddrs(), Fake: c}
}

// Opts returns client options that reach the broker.
func (b *Broker) Opts() []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(b.Addrs...)}
}

// Client returns a client closed at the end of the test.
func (b *Broker) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(b.Opts(), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

var unsafe = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// TopicName returns a topic name unique to this test run: prefix, the test's
// name and a random suffix.
func TopicName(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + "." + unsafe.ReplaceAllString(t.Name(), "_") + "." + hex.EncodeToString(b[:])
	if len(name) > 240 {
		name = name[len(name)-240:]
	}
	return name
}

// CreateTopic creates topic with the given partitions and configs and fails
// the test on error. Unless configs say otherwise, the topic keeps its
// records forever (retention.ms -1): tests write records with timestamps of
// the past, which a real broker's retention would delete at its next check;
// a nil retention.ms asks for the broker's default.
func (b *Broker) CreateTopic(t testing.TB, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	adm := kadm.NewClient(b.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	configs = maps.Clone(configs)
	if configs == nil {
		configs = map[string]*string{}
	}
	switch v, set := configs["retention.ms"]; {
	case !set:
		// Tests write records with timestamps of the past (fixed dates):
		// a real broker's retention check (every 5 minutes) would delete
		// them in the middle of a test.
		configs["retention.ms"] = kadm.StringPtr("-1")
	case v == nil:
		delete(configs, "retention.ms") // the broker's default, asked for
	}
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if err := topicready.Wait(ctx, adm, topic); err != nil {
		t.Fatal(err)
	}
}

// RefuseProduce makes the kfake cluster answer produce requests that write
// to topic ("" for any topic) with the error code instead of storing them,
// for as long as refuse returns true; refuse gets the number the request
// would have among the refused ones (1 for the first). It returns the count
// of refused requests. It fails t against a real broker (use Fake).
func (b *Broker) RefuseProduce(t testing.TB, topic string, code int16, refuse func(n int64) bool) *atomic.Int64 {
	t.Helper()
	if b.Fake == nil {
		t.Fatal("RefuseProduce needs kfake (kafkatest.Fake)")
	}
	var id [16]byte
	if topic != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tds, err := kadm.NewClient(b.Client(t)).ListTopics(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		id = tds[topic].ID
	}
	var refused atomic.Int64
	b.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.Fake.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		ours := topic == ""
		for _, pt := range pr.Topics {
			// Produce v13+ names topics by ID only.
			ours = ours || pt.Topic == topic || pt.TopicID == id
		}
		if !ours || !refuse(refused.Load()+1) {
			return nil, nil, false
		}
		refused.Add(1)
		return ProduceError(pr, code), nil, true
	})
	return &refused
}

// ProduceError returns the answer to pr that refuses every partition it
// writes to with the error code, as a broker would: for a kfake control
// function that refuses a produce request instead of storing it.
func ProduceError(pr *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = pr.Version
	for _, pt := range pr.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = pt.Topic, pt.TopicID
		for _, pp := range pt.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = pp.Partition
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// CommitError returns the answer to cr that refuses every partition it
// commits with the error code, as a coordinator would: for a kfake control
// function that refuses an offset commit instead of storing it.
func CommitError(cr *kmsg.OffsetCommitRequest, code int16) *kmsg.OffsetCommitResponse {
	resp := cr.ResponseKind().(*kmsg.OffsetCommitResponse)
	resp.Version = cr.Version
	for _, ct := range cr.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = ct.Topic, ct.TopicID
		for _, cp := range ct.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = cp.Partition
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// RefuseSASL makes the kfake cluster (started with kfake.EnableSASL) refuse
// SCRAM authentications at their final step with SASL_AUTHENTICATION_FAILED
// and the message Apache Kafka sends for a wrong password: every one while
// refuse returns true (nil: always). kfake itself closes the connection on
// a wrong password, which clients see only as EOF.
func (b *Broker) RefuseSASL(refuse func() bool) {
	b.Fake.ControlKey(int16(kmsg.SASLAuthenticate), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		b.Fake.KeepControl()
		req := kreq.(*kmsg.SASLAuthenticateRequest)
		// Only the client-final message carries the proof.
		if !strings.Contains(string(req.SASLAuthBytes), ",p=") || (refuse != nil && !refuse()) {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.Version = req.Version
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
}
