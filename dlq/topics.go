package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/causet/projection-worker/internal/topicready"
	"github.com/causet/projection-worker/retry"
)

// DefaultPartitions is the default TopicConfig.Partitions.
const DefaultPartitions = 8

// LedgerPartitions is the partition count of a replay ledger topic created
// by EnsureTopics: one, so that the replayer reads every decision in one
// total order from one partition. The ledger holds one small compacted
// entry per decision, far below what one partition handles.
const LedgerPartitions = 1

// TopicConfig names the topics EnsureTopics creates. Every field but
// EventsTopic has a default, filled in by Validate.
type TopicConfig struct {
	// EventsTopic is the projection events topic. Required (no default in
	// this package: the worker's is projection.DefaultEventsTopic).
	EventsTopic string
	// DLQTopic is the dead-letter topic. Default DefaultTopic
	// ("causet.projection-dlq.v1").
	DLQTopic string
	// LedgerTopic is the replay ledger topic. Default DefaultLedgerTopic
	// ("causet.projection-dlq-ledger.v1").
	LedgerTopic string
	// Partitions is the partition count of the events topic when
	// EnsureTopics creates it; an existing events topic keeps its own.
	// Default 8. The dead-letter topic always gets the events topic's
	// count.
	Partitions int32
	// ReplicationFactor is the replication factor of every topic
	// EnsureTopics creates. Default -1: the broker's
	// default.replication.factor (needs Kafka 2.4+). Trap: on a
	// single-broker dev cluster anything above 1 fails.
	ReplicationFactor int16
}

// Validate fills in the defaults of the zero fields and returns an error
// naming the first field that is out of range: a missing events topic, an
// illegal or repeated topic name, Partitions below 1, or ReplicationFactor
// below -1.
func (c *TopicConfig) Validate() error {
	if c.DLQTopic == "" {
		c.DLQTopic = DefaultTopic
	}
	if c.LedgerTopic == "" {
		c.LedgerTopic = DefaultLedgerTopic
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = -1
	}
	if c.EventsTopic == "" {
		return errors.New("events topic: required")
	}
	for _, t := range [...]struct{ field, name string }{
		{"events topic", c.EventsTopic},
		{"dead-letter topic", c.DLQTopic},
		{"ledger topic", c.LedgerTopic},
	} {
		if err := validTopicName(t.name); err != nil {
			return fmt.Errorf("%s: %w", t.field, err)
		}
	}
	if c.EventsTopic == c.DLQTopic || c.EventsTopic == c.LedgerTopic || c.DLQTopic == c.LedgerTopic {
		return fmt.Errorf("events (%q), dead-letter (%q) and ledger (%q) topics must differ", c.EventsTopic, c.DLQTopic, c.LedgerTopic)
	}
	if c.Partitions < 1 {
		return fmt.Errorf("events topic partitions must be >= 1, got %d", c.Partitions)
	}
	if c.ReplicationFactor < -1 {
		return fmt.Errorf("replication factor must be -1 (broker default) or >= 1, got %d", c.ReplicationFactor)
	}
	return nil
}

// TopicReport is what EnsureTopics found and did. The caller logs a
// warning and exports a metric when DLQRetentionTooShort is set (SPEC §2).
type TopicReport struct {
	// Created lists the topics EnsureTopics created, in the order events,
	// dead-letter, ledger; empty when all existed.
	Created []string
	// EventsPartitions and DLQPartitions are the partition counts of the
	// events and dead-letter topics. They differ only for a dead-letter
	// topic that existed with another count.
	EventsPartitions, DLQPartitions int
	// DLQRetention is the dead-letter topic's retention.ms as a duration:
	// -1 for infinite retention (retention.ms=-1, or more than the 292
	// years a Duration holds), 0 when the broker did not report it.
	DLQRetention time.Duration
	// DLQRetentionTooShort reports a known, finite DLQRetention below
	// MinRetention (30 days, from the Causet DLQ guide).
	DLQRetentionTooShort bool
	// DLQMaxMessageBytes is the dead-letter topic's max.message.bytes, 0
	// when the broker did not report it. RecordConfig.MaxBytes should not
	// exceed it.
	DLQMaxMessageBytes int
	// Missing lists the topics CheckTopics did not find, in the order
	// events, dead-letter, ledger. EnsureTopics creates them instead, so
	// its report leaves Missing empty.
	Missing []string
}

// retentionMs is the retention.ms EnsureTopics gives a dead-letter topic it
// creates: MinRetention (2592000000 ms, 30 days).
var retentionMs = strconv.FormatInt(MinRetention.Milliseconds(), 10)

// TopicMaxMessageBytes is the max.message.bytes EnsureTopics gives a
// dead-letter topic it creates: 4 MiB. A dead letter holds its event
// verbatim, or base64-encoded (4/3 larger) when it is not a JSON object,
// plus the error and stack, so an event of the broker's default 1 MiB
// limit must fit.
const TopicMaxMessageBytes = 4 << 20

// EnsureTopics creates the missing topics of cfg and reports on the
// dead-letter topic (SPEC §2):
//
//   - the events topic, with cfg.Partitions partitions and the broker's
//     default configs;
//   - the dead-letter topic, with the events topic's partition count,
//     retention.ms=2592000000 (MinRetention, 30 days) and
//     max.message.bytes=4194304 (TopicMaxMessageBytes);
//   - the ledger topic, with LedgerPartitions (1) partition and
//     cleanup.policy=compact;
//
// each with cfg.ReplicationFactor. An existing topic is never altered.
// It then reads the dead-letter topic's retention.ms and max.message.bytes
// (DescribeConfigs) into the report.
//
// A TOPIC_ALREADY_EXISTS answer (another worker created the topic first)
// counts as success; the topic is then looked up again. Topic metadata is
// requested from a broker directly rather than from kgo's metadata cache,
// which remembers a missing topic as missing for MetadataMinAge (5 s), so a
// second call right after the first sees what the first created.
//
// It returns an error, with the report filled as far as it got, when cfg
// is invalid, a request fails, or the broker refuses a topic (for example
// TOPIC_AUTHORIZATION_FAILED or INVALID_REPLICATION_FACTOR), naming the
// topic. A configs lookup that still fails, after a few seconds of
// retries, on a dead-letter topic this call just created is not an error:
// the report then holds the retention that was requested and a
// DLQMaxMessageBytes of 0.
func EnsureTopics(ctx context.Context, adm *kadm.Client, cfg TopicConfig) (TopicReport, error) {
	var rep TopicReport
	cfg, partitions, err := lookUpTopics(ctx, adm, cfg)
	if err != nil {
		return rep, fmt.Errorf("ensure topics: %w", err)
	}
	ensure := func(topic string, n int32, configs map[string]*string) (int, bool, error) {
		if have, ok := partitions[topic]; ok {
			return have, false, nil
		}
		return createTopic(ctx, adm, topic, n, cfg.ReplicationFactor, configs)
	}

	var created bool
	if rep.EventsPartitions, created, err = ensure(cfg.EventsTopic, cfg.Partitions, nil); err != nil {
		return rep, err
	}
	if created {
		rep.Created = append(rep.Created, cfg.EventsTopic)
	}
	var dlqCreated bool
	if rep.DLQPartitions, dlqCreated, err = ensure(cfg.DLQTopic, int32(rep.EventsPartitions), map[string]*string{
		"retention.ms":      kadm.StringPtr(retentionMs),
		"max.message.bytes": kadm.StringPtr(strconv.Itoa(TopicMaxMessageBytes)),
	}); err != nil {
		return rep, err
	}
	if dlqCreated {
		rep.Created = append(rep.Created, cfg.DLQTopic)
	}
	if _, created, err = ensure(cfg.LedgerTopic, LedgerPartitions, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"),
	}); err != nil {
		return rep, err
	}
	if created {
		rep.Created = append(rep.Created, cfg.LedgerTopic)
	}

	if err := topicready.Wait(ctx, adm, rep.Created...); err != nil {
		return rep, fmt.Errorf("ensure topics: %w", err)
	}
	if err := describeDLQ(ctx, adm, cfg.DLQTopic, dlqCreated, &rep); err != nil {
		if !dlqCreated {
			return rep, fmt.Errorf("ensure topics: %w", err)
		}
		rep.DLQRetention = MinRetention
		rep.DLQRetentionTooShort = false
	}
	return rep, nil
}

// CheckTopics reports on the topics of cfg as EnsureTopics does, but
// creates and alters nothing: for a caller that must not create topics
// (the worker's --create-topics=false). It fills the partition counts of
// the topics that exist, lists the others in Missing, and reads the
// dead-letter topic's retention.ms and max.message.bytes (DescribeConfigs)
// when it exists, setting DLQRetentionTooShort for a retention under 30
// days (MinRetention, SPEC §2). A missing topic is not an error: the caller
// decides what it needs.
//
// It returns an error, with the report filled as far as it got, when cfg
// is invalid or a request fails (for example TOPIC_AUTHORIZATION_FAILED),
// naming the topic.
func CheckTopics(ctx context.Context, adm *kadm.Client, cfg TopicConfig) (TopicReport, error) {
	var rep TopicReport
	cfg, partitions, err := lookUpTopics(ctx, adm, cfg)
	if err != nil {
		return rep, fmt.Errorf("check topics: %w", err)
	}
	for _, t := range [...]string{cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic} {
		if _, ok := partitions[t]; !ok {
			rep.Missing = append(rep.Missing, t)
		}
	}
	rep.EventsPartitions, rep.DLQPartitions = partitions[cfg.EventsTopic], partitions[cfg.DLQTopic]
	if _, ok := partitions[cfg.DLQTopic]; !ok {
		return rep, nil
	}
	if err := describeDLQ(ctx, adm, cfg.DLQTopic, false, &rep); err != nil {
		return rep, fmt.Errorf("check topics: %w", err)
	}
	return rep, nil
}

// lookUpTopics checks adm and cfg and returns cfg with its defaults and
// the partition count of each of its topics that exists.
func lookUpTopics(ctx context.Context, adm *kadm.Client, cfg TopicConfig) (TopicConfig, map[string]int, error) {
	if adm == nil {
		return cfg, nil, errors.New("nil admin client")
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	partitions, err := topicPartitions(ctx, adm, cfg.EventsTopic, cfg.DLQTopic, cfg.LedgerTopic)
	return cfg, partitions, err
}

// topicPartitions returns the partition count of each of topics that
// exists, asking a broker rather than kgo's metadata cache (authorized
// operations are never served from the cache).
func topicPartitions(ctx context.Context, adm *kadm.Client, topics ...string) (map[string]int, error) {
	details, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), topics...)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	out := make(map[string]int, len(topics))
	for _, t := range topics {
		d, ok := details[t]
		switch {
		case !ok, errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			continue
		case d.Err != nil:
			return nil, fmt.Errorf("describe topic %s: %w", t, d.Err)
		case len(d.Partitions) == 0:
			// Still being created by someone else: partitions unknown.
			continue
		}
		out[t] = len(d.Partitions)
	}
	return out, nil
}

// createTopic creates topic and returns its partition count and whether
// this call created it. When another client created it first, it looks
// the topic up until its partitions show (at most about 6 s).
func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int32, rf int16, configs map[string]*string) (int, bool, error) {
	resp, err := adm.CreateTopic(ctx, partitions, rf, configs, topic)
	switch {
	case err == nil:
		if resp.NumPartitions > 0 {
			return int(resp.NumPartitions), true, nil
		}
		return int(partitions), true, nil
	case !errors.Is(err, kerr.TopicAlreadyExists):
		if resp.ErrMessage != "" {
			return 0, false, fmt.Errorf("create topic %s: %w: %s", topic, err, resp.ErrMessage)
		}
		return 0, false, fmt.Errorf("create topic %s: %w", topic, err)
	}
	var n int
	_, err = topicLookupRetry(8).Do(ctx, func(ctx context.Context) error {
		found, err := topicPartitions(ctx, adm, topic)
		if err != nil {
			return retry.MarkPermanent(err)
		}
		var ok bool
		if n, ok = found[topic]; ok {
			return nil
		}
		return errNoPartitionsYet
	}, nil)
	switch {
	case err == nil:
		return n, false, nil
	case ctx.Err() != nil:
		return 0, false, fmt.Errorf("create topic %s: already exists, waiting for its partitions: %w", topic, ctx.Err())
	case errors.Is(err, errNoPartitionsYet):
		return 0, false, fmt.Errorf("create topic %s: already exists but reports no partitions", topic)
	default:
		return 0, false, fmt.Errorf("create topic %s: already exists: %w", topic, err)
	}
}

// errNoPartitionsYet is createTopic's lookup of a topic that another client
// created and whose partitions do not show yet.
var errNoPartitionsYet = errors.New("no partitions yet")

// topicLookupRetry paces the lookups of a topic just created, which a
// broker may not know yet: tries attempts, waiting 50 ms, then twice as
// long each time (8 tries: about 6 s of waits), without jitter.
func topicLookupRetry(tries int) retry.Policy {
	return retry.Policy{Initial: 50 * time.Millisecond, Multiplier: 2, MaxInterval: 10 * time.Second, MaxRetries: tries - 1}
}

// describeDLQ reads retention.ms and max.message.bytes of topic into rep,
// and sets rep.DLQRetentionTooShort.
// A topic just created may not be known yet to the broker that answers
// (KRaft propagates new topics asynchronously): an UNKNOWN_TOPIC_OR_PARTITION
// answer is asked again, for at most about 6 s when created, else once.
func describeDLQ(ctx context.Context, adm *kadm.Client, topic string, created bool, rep *TopicReport) error {
	tries := 2
	if created {
		tries = 8
	}
	var rc kadm.ResourceConfig
	_, err := topicLookupRetry(tries).Do(ctx, func(ctx context.Context) error {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err == nil {
			rc, err = rcs.On(topic, nil)
		}
		if err != nil {
			return retry.MarkPermanent(err)
		}
		if rc.Err != nil && !errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
			return retry.MarkPermanent(rc.Err)
		}
		return rc.Err
	}, nil)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return fmt.Errorf("describe configs of %s: %w", topic, ctx.Err())
	default:
		return fmt.Errorf("describe configs of %s: %w", topic, err)
	}
	for _, c := range rc.Configs {
		if c.Value == nil {
			continue
		}
		switch c.Key {
		case "retention.ms":
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return fmt.Errorf("%s retention.ms %q: %w", topic, *c.Value, err)
			}
			if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
				rep.DLQRetention = -1 // infinite, or beyond what a Duration holds (292 years)
			} else {
				rep.DLQRetention = time.Duration(ms) * time.Millisecond
			}
		case "max.message.bytes":
			n, err := strconv.Atoi(*c.Value)
			if err != nil {
				return fmt.Errorf("%s max.message.bytes %q: %w", topic, *c.Value, err)
			}
			rep.DLQMaxMessageBytes = n
		}
	}
	rep.DLQRetentionTooShort = rep.DLQRetention > 0 && rep.DLQRetention < MinRetention
	return nil
}
