package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Ledger actions (the "action" field of a Decision).
const (
	// ActionReplayed records that the entry's event was republished to the
	// events topic (and acknowledged).
	ActionReplayed = "replayed"
	// ActionSkipped records that the entry is permanently skipped: it is
	// never replayed.
	ActionSkipped = "skipped"
)

// Decision is the value of a ledger record: what was decided about one dead
// letter, by whom and when. It is JSON
//
//	{"action":"replayed","at":1719331200000,"actor":"alice","runId":"5f0c…","reason":"","replayCount":1}
//
// keyed by the dead letter's "<dlq partition>:<dlq offset>" (SPEC §2), with
// the header HeaderLedgerDLQTopic naming its dead-letter topic. The ledger
// topic is compacted, so the newest decision per dead letter is kept; a
// tombstone (null value) removes the decision, which makes an entry
// replayable again. As the key names no topic, a ledger topic keeps the
// decisions of one dead-letter topic (ErrLedgerOfAnotherTopic).
type Decision struct {
	// Entry is the dead letter decided on: the record key, not part of the
	// JSON value.
	Entry Coordinates `json:"-"`
	// Action is ActionReplayed or ActionSkipped.
	Action string `json:"action"`
	// At is when the decision was taken, epoch milliseconds.
	At int64 `json:"at"`
	// Actor is who took it (--actor; for retry the operator or job name).
	Actor string `json:"actor"`
	// RunID identifies the dlq-replayer run that recorded it.
	RunID string `json:"runId"`
	// Reason explains a skip (--reason); "" for a replay unless given.
	Reason string `json:"reason"`
	// ReplayCount is the causet.replay.count the republished event carried
	// (the entry's causet.dlq.replay-count + 1); 0 for a skip.
	ReplayCount int `json:"replayCount"`
}

// HeaderLedgerDLQTopic is the header of a ledger record naming the
// dead-letter topic of the dead letter it decides on. Records written
// before it was added (December 2026) have none.
const HeaderLedgerDLQTopic = "causet.ledger.dlq-topic"

// ErrLedgerOfAnotherTopic is OpenLedger's error when the ledger topic holds
// a decision about a dead letter of another dead-letter topic than
// LedgerConfig.DLQTopic: a decision is keyed by the dead letter's partition
// and offset only, so the other topic's decisions would be taken for this
// one's (replayer trial: three new dead letters of a second DLQ topic read
// as already replayed, and were never sent), and compaction would keep one
// topic's decision of a key and drop the other's.
var ErrLedgerOfAnotherTopic = errors.New("the ledger topic keeps the decisions of another dead-letter topic")

// anotherTopicError is ErrLedgerOfAnotherTopic with what to fix.
type anotherTopicError struct{ text string }

func (e *anotherTopicError) Error() string        { return e.text }
func (e *anotherTopicError) Is(target error) bool { return target == ErrLedgerOfAnotherTopic }

// AtTime returns At as a time.
func (d Decision) AtTime() time.Time { return time.UnixMilli(d.At) }

// LedgerConfig configures OpenLedger. Zero values take the documented
// defaults; Validate (OpenLedger calls it) fills them in.
type LedgerConfig struct {
	// Topic is the ledger topic. Default DefaultLedgerTopic.
	Topic string
	// DLQTopic is the dead-letter topic whose decisions the ledger keeps:
	// Record names it in each record (HeaderLedgerDLQTopic), and OpenLedger
	// fails with ErrLedgerOfAnotherTopic when a record names another. It
	// must exist: OpenLedger checks first, and fails with an error wrapping
	// ErrTopicNotFound before it creates or reads the ledger topic (a
	// mistyped topic was blamed on the ledger, and left a ledger topic
	// created for it: operator trial). Default "": records name none, and
	// none is refused.
	DLQTopic string
	// DLQTopicSetting names where DLQTopic was set, for that error (e.g.
	// "--dlq-topic (DLQ_TOPIC)"). Default: "the dead-letter topic".
	DLQTopicSetting string
	// ReadOnly opens the ledger for lookups only (dlq-replayer list and
	// summary): a missing topic is read as an empty ledger and is not
	// created, and Record fails. Default false: a missing topic is created,
	// compacted (cleanup.policy=compact), with Partitions partitions.
	ReadOnly bool
	// Partitions is the partition count of a ledger topic created by
	// OpenLedger. Default (also for a negative value) LedgerPartitions (1),
	// as EnsureTopics creates it.
	Partitions int32
	// ReplicationFactor of a created ledger topic. Default -1: the broker's
	// default.replication.factor.
	ReplicationFactor int16
	// Logger receives warnings about undecodable ledger records and a
	// ledger topic that did not exist when opened. Default:
	// discard.
	Logger *slog.Logger
	// TopicSetting names where Topic was set, for that warning (e.g.
	// "--ledger-topic (LEDGER_TOPIC)"). Default: "the ledger topic".
	TopicSetting string
	// BeforeRead, when not nil and the ledger is not read-only, is called
	// once the topic exists and before it is read; the release it returns
	// is called by Close (and at once when OpenLedger fails after it). A
	// run that takes the replay lock here (LockReplays) reads the decisions
	// of every run that held the lock before it. Its error ends OpenLedger.
	BeforeRead func(ctx context.Context) (release func(), err error)
}

// Validate fills in the defaults of the zero fields. It returns an error
// for a ReplicationFactor below -1.
func (c *LedgerConfig) Validate() error {
	if c.Topic == "" {
		c.Topic = DefaultLedgerTopic
	}
	if c.Partitions <= 0 {
		c.Partitions = LedgerPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = -1
	}
	if c.ReplicationFactor < -1 {
		return fmt.Errorf("replication factor must be -1 (broker default) or >= 1, got %d", c.ReplicationFactor)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Ledger is the replay ledger (SPEC §2, §7): the newest decision for every
// dead letter that was replayed or skipped, read from the compacted ledger
// topic when it is opened and kept up to date by Record. Its methods are safe
// for concurrent use.
type Ledger struct {
	topic    string
	dlqTopic string // LedgerConfig.DLQTopic
	// foreign is the first other dead-letter topic a record named
	// (HeaderLedgerDLQTopic), while the ledger is read.
	foreign  string
	readOnly bool
	cl       *kgo.Client // producer; nil when read-only
	release  func()      // LedgerConfig.BeforeRead's; nil when none

	mu        sync.RWMutex
	decisions map[Coordinates]Decision
}

// OpenLedger reads the ledger topic from its start up to the end offsets
// listed when it starts (creating the topic first unless cfg.ReadOnly) and
// returns the ledger. opts are the franz-go connection options. Ledger
// records whose key is not "<partition>:<offset>" or whose value is not a
// decision are logged and ignored. It fails with an error wrapping
// ErrTopicNotFound, before anything else, when cfg.DLQTopic does not exist.
// Close the ledger when done.
func OpenLedger(ctx context.Context, opts []kgo.Opt, cfg LedgerConfig) (_ *Ledger, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	// One admin client for the dead-letter topic's check and the ledger
	// topic's creation.
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	adm := kadm.NewClient(admCl)
	defer admCl.Close()
	if cfg.DLQTopic != "" {
		if _, err := listTopic(ctx, adm, cfg.DLQTopic); err != nil {
			return nil, fmt.Errorf("describe dead-letter topic %s: %w", cfg.DLQTopic, err)
		}
	}
	log := cfg.Logger
	l := &Ledger{topic: cfg.Topic, dlqTopic: cfg.DLQTopic, readOnly: cfg.ReadOnly, decisions: map[Coordinates]Decision{}}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	var created bool
	if !cfg.ReadOnly {
		var err error
		if created, err = createLedgerTopic(ctx, adm, cfg); err != nil {
			return nil, err
		}
		if cfg.BeforeRead != nil {
			if l.release, err = cfg.BeforeRead(ctx); err != nil {
				return nil, err
			}
		}
	}
	if !created { // a topic just created is empty
		err = l.read(ctx, opts, cfg.Topic, log)
	}
	missing := cfg.ReadOnly && errors.Is(err, ErrTopicNotFound)
	if err == nil && l.foreign != "" {
		ledgerSetting, dlqSetting := "the ledger topic", "the dead-letter topic"
		if cfg.TopicSetting != "" {
			ledgerSetting = cfg.TopicSetting
		}
		if cfg.DLQTopicSetting != "" {
			dlqSetting = cfg.DLQTopicSetting
		}
		return nil, &anotherTopicError{fmt.Sprintf("%s %q holds decisions about the dead letters of %q, keyed by partition and offset only, so it cannot also keep those of %s %q: give each dead-letter topic a ledger topic of its own (%s)",
			ledgerSetting, cfg.Topic, l.foreign, dlqSetting, cfg.DLQTopic, ledgerSetting)}
	}
	if err != nil && !missing {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	if created || missing {
		// Said, since a mistyped topic looks the same: every dead letter
		// then reads as never replayed nor skipped (new-user trials).
		what := "the ledger topic does not exist"
		if created {
			what = "the ledger topic did not exist and was created empty"
		}
		check := "the ledger topic"
		if cfg.TopicSetting != "" {
			check = cfg.TopicSetting
		}
		log.Warn(what+": no dead letter is known replayed or skipped; if replays or skips were made before, they are in another ledger topic: check "+check,
			"topic", cfg.Topic, "created", created)
	}
	if !cfg.ReadOnly {
		l.cl, err = kgo.NewClient(append(append([]kgo.Opt{}, opts...),
			kgo.DefaultProduceTopic(cfg.Topic),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(0),
			kgo.RecordDeliveryTimeout(time.Minute),
		)...)
		if err != nil {
			return nil, fmt.Errorf("kafka client: %w", err)
		}
	}
	return l, nil
}

// read loads the decisions of the ledger topic up to its end offsets.
func (l *Ledger) read(ctx context.Context, opts []kgo.Opt, topic string, log *slog.Logger) error {
	_, err := readToEnd(ctx, opts, topic, log, nil, func(r *kgo.Record) error {
		c, err := ParseCoordinates(string(r.Key))
		if err != nil {
			log.Warn("ledger record has a bad key; ignored", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return nil
		}
		for _, h := range r.Headers {
			if h.Key == HeaderLedgerDLQTopic && l.dlqTopic != "" && string(h.Value) != l.dlqTopic && l.foreign == "" {
				l.foreign = string(h.Value)
			}
		}
		if r.Value == nil {
			delete(l.decisions, c)
			return nil
		}
		var d Decision
		if err := json.Unmarshal(r.Value, &d); err != nil || (d.Action != ActionReplayed && d.Action != ActionSkipped) {
			log.Warn("ledger record is not a decision; ignored", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return nil
		}
		d.Entry = c
		l.decisions[c] = d
		return nil
	})
	return err
}

// createLedgerTopic creates the compacted ledger topic unless it exists and
// reports whether it created it.
func createLedgerTopic(ctx context.Context, adm *kadm.Client, cfg LedgerConfig) (bool, error) {
	topics, err := adm.ListTopics(ctx, cfg.Topic)
	if err != nil {
		return false, fmt.Errorf("describe ledger topic %s: %w", cfg.Topic, err)
	}
	if td, ok := topics[cfg.Topic]; ok && td.Err == nil {
		return false, nil
	}
	_, err = adm.CreateTopic(ctx, cfg.Partitions, cfg.ReplicationFactor,
		map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, cfg.Topic)
	switch {
	case errors.Is(err, kerr.TopicAlreadyExists):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("create ledger topic %s: %w", cfg.Topic, err)
	}
	return true, nil
}

// Topic returns the ledger topic's name.
func (l *Ledger) Topic() string { return l.topic }

// Lookup returns the newest decision for the dead letter at c.
func (l *Ledger) Lookup(c Coordinates) (Decision, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	d, ok := l.decisions[c]
	return d, ok
}

// Status returns the action of the newest decision for c ("replayed",
// "skipped"), or "" when there is none.
func (l *Ledger) Status(c Coordinates) string {
	d, _ := l.Lookup(c)
	return d.Action
}

// Len returns the number of dead letters with a decision.
func (l *Ledger) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.decisions)
}

// Record writes decisions to the ledger topic and waits until Kafka has
// acknowledged them (acks=all, idempotent producer); each acknowledged one
// then replaces the entry's decision in memory. It returns nil when all were
// written, else the errors of the failed ones joined (those are not
// recorded). It fails on a read-only ledger.
func (l *Ledger) Record(ctx context.Context, decisions ...Decision) error {
	return errors.Join(l.record(ctx, decisions)...)
}

// record is Record with one error (or nil) per decision.
func (l *Ledger) record(ctx context.Context, decisions []Decision) []error {
	errs := make([]error, len(decisions))
	if len(decisions) == 0 {
		return errs
	}
	if l.readOnly {
		for i := range errs {
			errs[i] = errors.New("ledger opened read-only")
		}
		return errs
	}
	recs := make([]*kgo.Record, len(decisions))
	for i, d := range decisions {
		v, err := json.Marshal(d)
		if err != nil { // cannot happen: plain fields
			errs[i] = err
			continue
		}
		recs[i] = &kgo.Record{Topic: l.topic, Key: []byte(d.Entry.String()), Value: v}
		if l.dlqTopic != "" {
			recs[i].Headers = []kgo.RecordHeader{{Key: HeaderLedgerDLQTopic, Value: []byte(l.dlqTopic)}}
		}
	}
	send := make([]*kgo.Record, 0, len(recs))
	for _, r := range recs {
		if r != nil {
			send = append(send, r)
		}
	}
	results := l.cl.ProduceSync(ctx, send...)
	failed := map[*kgo.Record]error{}
	for _, res := range results {
		if res.Err != nil {
			failed[res.Record] = res.Err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range recs {
		if r == nil {
			continue
		}
		if err := failed[r]; err != nil {
			errs[i] = fmt.Errorf("record %s decision for %s in %s: %w", decisions[i].Action, decisions[i].Entry, l.topic, err)
			continue
		}
		l.decisions[decisions[i].Entry] = decisions[i]
	}
	return errs
}

// Close releases the ledger's Kafka client. Decisions stay readable.
func (l *Ledger) Close() {
	if l.cl != nil {
		l.cl.Close()
	}
	if l.release != nil {
		l.release()
		l.release = nil
	}
}
