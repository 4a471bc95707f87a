package dlq

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	ratelimit "golang.org/x/time/rate"

	"github.com/causet/projection-worker/internal/jsonstrict"
)

// DefaultMaxReplays is how many times an event may be replayed from the DLQ
// (and fail again) before Retry refuses it without Force (SPEC §7).
const DefaultMaxReplays = 3

// ReplayRecord returns the record that replays e to topic at partition:
// value originalEvent byte for byte, key the original key, and the original
// headers (those of the dead letter without the causet.dlq.* ones and
// without causet.replay.* ones of an earlier replay) plus
//
//   - causet.replay.projection: the entry's projectionName, so the worker
//     applies the event to that projection only; omitted when projectionName
//     is "" (an input error no projection saw), so every projection that
//     handles the event type sees it;
//   - causet.replay.source: "<dlq partition>:<dlq offset>";
//   - causet.replay.count: the entry's replay count + 1;
//   - causet.replay.first-failed-at: firstFailedAt (epoch ms; failedAt when
//     firstFailedAt is 0).
func ReplayRecord(e *Entry, topic string, partition int32) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(e.Headers)+4)
	for _, h := range e.Headers {
		if strings.HasPrefix(h.Key, "causet.dlq.") || strings.HasPrefix(h.Key, "causet.replay.") {
			continue
		}
		hs = append(hs, h)
	}
	if p := e.Message.ProjectionName; p != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderReplayProjection, Value: []byte(p)})
	}
	first := e.Message.FirstFailedAt
	if first == 0 {
		first = e.Message.FailedAt
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderReplaySource, Value: []byte(e.Coordinates().String())},
		kgo.RecordHeader{Key: HeaderReplayCountOut, Value: strconv.AppendInt(nil, int64(min(e.ReplayCount+1, MaxReplayCount)), 10)},
		kgo.RecordHeader{Key: HeaderReplayFirstFailedAt, Value: strconv.AppendInt(nil, first, 10)},
	)
	return &kgo.Record{
		Topic:     topic,
		Partition: partition,
		Key:       e.Key,
		Value:     []byte(e.Message.OriginalEvent),
		Headers:   hs,
	}
}

// ReplayConfig configures a Replayer. Zero values take the documented
// defaults; Validate (NewReplayer calls it) fills them in and checks the
// rest.
type ReplayConfig struct {
	// EventsTopic receives replayed events. Required (no default in this
	// package: the worker's is projection.DefaultEventsTopic).
	EventsTopic string
	// DLQTopic is read. Default DefaultTopic.
	DLQTopic string
	// Filters select the dead letters; the zero value selects all (the
	// command requires --all for that).
	Filters Filters
	// DryRun reports what would be sent (OnOutcome) and sends and records
	// nothing.
	DryRun bool
	// IncludeReplayed replays entries the ledger already marks replayed.
	// Skipped entries are never replayed.
	IncludeReplayed bool
	// MaxReplays refuses an entry whose event was already replayed that
	// many times (its causet.dlq.replay-count) unless Force. Default
	// DefaultMaxReplays (3); 0 means the default.
	MaxReplays int
	// Force replays entries over MaxReplays, entries first read from
	// another topic than EventsTopic, and entries Unreplayable refuses.
	Force bool
	// Unreplayable, when not nil, returns why the worker would refuse an
	// original event again whatever was fixed (its bytes fail the event
	// validation of SPEC §3: a tenant schema such as public, a missing
	// field), else nil; Retry refuses such an entry unless Force. Default
	// nil: every event is replayed.
	Unreplayable func(originalEvent []byte) error
	// Rate caps replays per second; 0 means unlimited.
	Rate float64
	// Actor is recorded in ledger decisions. Default "dlq-replayer"; Skip
	// requires it.
	Actor string
	// Reason is recorded in ledger decisions; Skip requires it.
	Reason string
	// RunID is recorded in ledger decisions. Default: 16 random hex digits.
	RunID string
	// BatchSize is the number of records produced (and then recorded) per
	// round trip. Default 256; with Rate, at most Rate/10 so a batch leaves
	// every 100 ms.
	BatchSize int
	// Progress is passed to Scan (called after each fetch).
	Progress func(scanned, total int64)
	// OnOutcome, when not nil, is called with the outcome of every selected
	// dead letter, in the order they are decided (replays after they are
	// acknowledged and recorded), from the goroutine running Retry/Skip.
	OnOutcome func(Outcome)
	// Logger receives one line per failure (ERROR) and, unless OnOutcome
	// reports the outcomes, one per refusal (WARN). Default: discard.
	Logger *slog.Logger
	// Now is the clock for decision times. Default time.Now.
	Now func() time.Time
}

// Validate returns an error naming the first field that is out of range
// (a missing EventsTopic, a negative MaxReplays, Rate or BatchSize), else
// fills in the defaults of the zero fields.
func (c *ReplayConfig) Validate() error {
	switch {
	case c.EventsTopic == "":
		return errors.New("events topic: required")
	case c.MaxReplays < 0:
		return fmt.Errorf("max replays must be >= 0, got %d", c.MaxReplays)
	case c.Rate < 0:
		return fmt.Errorf("rate must be >= 0 records/s, got %g", c.Rate)
	case c.BatchSize < 0:
		return fmt.Errorf("batch size must be >= 0, got %d", c.BatchSize)
	}
	if c.DLQTopic == "" {
		c.DLQTopic = DefaultTopic
	}
	if c.MaxReplays == 0 {
		c.MaxReplays = DefaultMaxReplays
	}
	if c.Actor == "" {
		c.Actor = "dlq-replayer"
	}
	if c.RunID == "" {
		c.RunID = NewRunID()
	}
	if c.BatchSize == 0 {
		c.BatchSize = 256
	}
	if c.Rate > 0 {
		c.BatchSize = max(1, min(c.BatchSize, int(c.Rate/10)))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// NewRunID returns 16 random hex digits identifying a run in the ledger.
func NewRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// Replayer republishes and skips dead letters (SPEC §7).
type Replayer struct {
	opts   []kgo.Opt
	ledger *Ledger
	cfg    ReplayConfig
}

// NewReplayer returns a Replayer that connects with opts (franz-go
// connection options: seed brokers, TLS, SASL, logger) and records its
// decisions in ledger, which must have been opened writable unless only dry
// runs are made. It fills in cfg's defaults with Validate and returns its
// error for a bad cfg.
func NewReplayer(opts []kgo.Opt, ledger *Ledger, cfg ReplayConfig) (*Replayer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ledger == nil {
		return nil, errors.New("replayer needs a ledger")
	}
	return &Replayer{opts: opts, ledger: ledger, cfg: cfg}, nil
}

// RunID returns the run id recorded in the ledger.
func (r *Replayer) RunID() string { return r.cfg.RunID }

// Retry reads the selected dead letters and republishes each one's
// originalEvent to the events topic with ReplayRecord, at the partition
// ReplayPartitioner picks for the topic's current partition count. An entry
// is recorded in the ledger as "replayed" only after Kafka acknowledged its
// record (acks=all). Not sent: entries the ledger marks skipped (never), or
// replayed (unless IncludeReplayed); entries replayed MaxReplays times
// already (the count of the entry's causet.dlq.replay-count header, or of
// the ledger's last replay of the entry when that is higher: replaying one
// entry again counts up) and entries first read from another topic than EventsTopic
// (unless Force), and entries whose originalEvent is null, are refused. In a dry run nothing is sent or recorded and Replayed counts what
// would be.
//
// A failed produce or ledger write is counted in Result.Failed (reported
// through OnOutcome and the logger) and the run goes on; Retry returns an
// error only when it cannot run (dead-letter or events topic missing, Kafka
// unreachable, ctx done), with the counts so far.
func (r *Replayer) Retry(ctx context.Context) (Result, error) {
	cfg := &r.cfg
	log := cfg.Logger
	res := Result{Action: OutcomeReplayed, DryRun: cfg.DryRun}

	nparts, maxBytes, err := eventsTopicLimits(ctx, r.opts, cfg.EventsTopic)
	if err != nil {
		return res, err
	}
	parter := NewReplayPartitioner(nparts)

	// An event as large as the events topic takes (kgo's default batch
	// limit, 1,000,012 bytes, refused larger ones before they reached the
	// broker). kgo counts a batch before compression, the broker after:
	// an event larger than the limit uncompressed, which the topic took
	// compressed, is produced on its own (oneByOne), by a client with no
	// such limit and the strongest codec the broker takes, and the broker
	// says whether it fits (third new-user trial: a 3 MiB key, dead-lettered
	// without it, could not be replayed).
	batchMax := max(maxBytes, defaultProducerBatchMaxBytes)
	newProducer := func(extra ...kgo.Opt) (*kgo.Client, error) {
		return kgo.NewClient(append(append(append([]kgo.Opt{
			kgo.RecordDeliveryTimeout(2 * time.Minute),
			kgo.ProducerLinger(0),
		}, r.opts...),
			kgo.RecordPartitioner(kgo.ManualPartitioner()),
			kgo.RequiredAcks(kgo.AllISRAcks()),
		), extra...)...)
	}
	var prod, oneByOne *kgo.Client
	if !cfg.DryRun {
		if prod, err = newProducer(kgo.ProducerBatchMaxBytes(batchMax)); err != nil {
			return res, fmt.Errorf("kafka client: %w", err)
		}
		defer prod.Close()
		defer func() {
			if oneByOne != nil {
				oneByOne.Close()
			}
		}()
	}
	produce := func(recs []*kgo.Record) kgo.ProduceResults {
		var small, large []*kgo.Record
		for _, rec := range recs {
			if recordSize(rec) > int(batchMax) {
				large = append(large, rec)
			} else {
				small = append(small, rec)
			}
		}
		out := prod.ProduceSync(ctx, small...)
		for _, rec := range large {
			if oneByOne == nil {
				c, err := newProducer(kgo.ProducerBatchMaxBytes(maxOneByOneBytes),
					kgo.ProducerBatchCompression(kgo.ZstdCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.NoCompression()))
				if err != nil {
					out = append(out, kgo.ProduceResult{Record: rec, Err: fmt.Errorf("kafka client: %w", err)})
					continue
				}
				oneByOne = c
			}
			out = append(out, oneByOne.ProduceSync(ctx, rec)...)
		}
		return out
	}

	emit := func(o Outcome) {
		res.count(o)
		switch o.Kind {
		case OutcomeFailed:
			log.Error("replay failed", "partition", o.Entry.Partition, "offset", o.Entry.Offset,
				"projection", o.Entry.Projection, "tenant_schema", o.Entry.TenantSchema, "reason", o.Reason, "err", o.Err)
		case OutcomeRefused:
			if cfg.OnOutcome != nil {
				break // the caller reports it (dlq-replayer: a line on stdout; new-user trial: twice)
			}
			log.Warn("replay refused", "partition", o.Entry.Partition, "offset", o.Entry.Offset,
				"projection", o.Entry.Projection, "tenant_schema", o.Entry.TenantSchema, "reason", o.Reason)
		}
		if cfg.OnOutcome != nil {
			cfg.OnOutcome(o)
		}
	}

	type pendingReplay struct {
		e          *Entry
		rec        *kgo.Record
		fromHeader bool
	}
	var pending []pendingReplay
	flush := func() {
		if len(pending) == 0 {
			return
		}
		recs := make([]*kgo.Record, len(pending))
		for i, p := range pending {
			recs[i] = p.rec
		}
		prodErrs := map[*kgo.Record]error{}
		for _, pr := range produce(recs) {
			if pr.Err != nil {
				prodErrs[pr.Record] = pr.Err
			}
		}
		var decisions []Decision
		var acked []pendingReplay
		now := cfg.Now().UnixMilli()
		for _, p := range pending {
			if err := prodErrs[p.rec]; err != nil {
				if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
					// Not sent: the run was interrupted. Not-done, not
					// failed (replayer trial: failed=6 for 6 never sent).
					continue
				}
				reason := "produce to the events topic failed; not recorded in the ledger"
				if errors.Is(err, kerr.MessageTooLarge) {
					reason = fmt.Sprintf("the event (%d bytes with its key and headers, before compression) is larger than the events topic %s takes (max.message.bytes %s, compressed): raise it, then run again; not recorded in the ledger",
						recordSize(p.rec), cfg.EventsTopic, limitText(maxBytes))
				}
				emit(Outcome{Entry: p.e, Kind: OutcomeFailed, Topic: cfg.EventsTopic, Partition: p.rec.Partition,
					FromHeader: p.fromHeader, Reason: reason, Err: err})
				continue
			}
			acked = append(acked, p)
			decisions = append(decisions, Decision{Entry: p.e.Coordinates(), Action: ActionReplayed, At: now,
				Actor: cfg.Actor, RunID: cfg.RunID, Reason: cfg.Reason, ReplayCount: p.e.ReplayCount + 1})
		}
		// The replays Kafka acknowledged are recorded even when the run
		// was interrupted meanwhile: unrecorded, the next run would send
		// them again.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerWriteTimeout)
		ledgerErrs := r.ledger.record(lctx, decisions)
		cancel()
		for i, p := range acked {
			o := Outcome{Entry: p.e, Kind: OutcomeReplayed, Topic: cfg.EventsTopic, Partition: p.rec.Partition, FromHeader: p.fromHeader}
			if err := ledgerErrs[i]; err != nil {
				o.Kind, o.Err = OutcomeFailed, err
				o.Reason = "republished, but the ledger write failed: a later retry will send it again"
			}
			emit(o)
		}
		pending = pending[:0]
	}

	pace := newLimiter(cfg.Rate)
	chains := newReplayChains()
	sent := map[Coordinates]Coordinates{} // chain → the dead letter of it this run sends
	st, err := Scan(ctx, r.opts, ScanConfig{Topic: cfg.DLQTopic, Filters: cfg.Filters, Progress: cfg.Progress, Logger: log}, func(e *Entry) error {
		res.Matched++
		o := Outcome{Entry: e, DryRun: cfg.DryRun, Topic: cfg.EventsTopic, Partition: -1}
		chain := chains.of(e)
		sibling, chainSent := sent[chain]
		d, decided := r.ledger.Lookup(e.Coordinates())
		if f, copied := chains.copies[e.Coordinates()]; copied && !decided {
			// A dead letter written again: the decision of the first
			// copy is its own (a run after the one that replayed it
			// would send the same failure again).
			d, decided = r.ledger.Lookup(f)
		}
		var omittedErr, invalid error
		wanted := !decided || d.Action == ActionReplayed && cfg.IncludeReplayed
		if wanted && decided {
			// Replayed before (IncludeReplayed): each replay of this entry
			// counts, not only the chain of dead letters its header counts
			// (new-user trial: retry --include-replayed sent one dead
			// letter five times, each with causet.replay.count 1, and
			// --max-replays never refused it).
			e.ReplayCount = max(e.ReplayCount, d.ReplayCount)
		}
		if (e.Omitted != nil || e.OmittedHeaders != nil || e.OmittedKey != nil) && wanted {
			// Read again only for an entry that would be replayed.
			omittedErr = r.restoreOmitted(ctx, e)
		}
		if cfg.Unreplayable != nil && !cfg.Force && wanted && omittedErr == nil && e.HasOriginalEvent() {
			invalid = cfg.Unreplayable(e.Message.OriginalEvent)
		}
		switch {
		case decided && d.Action == ActionSkipped:
			o.Kind, o.Decided, o.Reason = OutcomeSkipped, true, fmt.Sprintf("skipped by %s: %s", d.Actor, d.Reason)
		case decided && d.Action == ActionReplayed && !cfg.IncludeReplayed:
			o.Kind = OutcomeAlreadyReplayed
			o.Reason = fmt.Sprintf("replayed at %s by %s (run %s)", d.AtTime().UTC().Format(time.RFC3339), d.Actor, d.RunID)
		case e.HeaderError != nil:
			o.Kind, o.Reason = OutcomeRefused, e.HeaderError.Error()+": it cannot be replayed; skip it"
		case omittedErr != nil:
			o.Kind, o.Reason = OutcomeRefused, omittedErr.Error()
		case !e.HasOriginalEvent():
			// Its bytes may be in originalValueBase64, but the worker would
			// refuse them again at once: the same bytes, nothing a fix of
			// the worker changes (new-user trial: "nothing to replay" read
			// as if the bytes were lost).
			// Its bytes: in originalValueBase64, or, left out for size, at
			// their offset (new-user trial: the reason pointed at an empty
			// originalValueBase64).
			kept := "originalValueBase64 keeps its bytes"
			if e.Omitted != nil {
				kept = "its bytes, left out of the dead letter for size, are at " + e.Omitted.String()
			}
			o.Kind, o.Reason = OutcomeRefused, "originalEvent is null: the record value is not an event the worker reads (empty, not valid UTF-8, not JSON, not an object, a duplicate key, an unpaired surrogate escape, or nested too deeply: the dead letter's error says which; "+kept+"), so a replay of it would be dead-lettered again at once, --force or not; skip it"
		case invalid != nil:
			o.Kind = OutcomeRefused
			o.Reason = fmt.Sprintf("the event fails validation, which a replay cannot change (%v): the worker would dead-letter it again at once; skip it (--force to replay it all the same)", invalid)
		case e.OriginalTopic != "" && e.OriginalTopic != cfg.EventsTopic && !cfg.Force:
			// Another worker's topic, or the right one under another name:
			// never a silent guess.
			o.Kind = OutcomeRefused
			o.Reason = fmt.Sprintf("first read from topic %q, not %q: replay it with --topic %s (or --force to send it to %s all the same)",
				e.OriginalTopic, cfg.EventsTopic, e.OriginalTopic, cfg.EventsTopic)
		case e.ReplayCount >= cfg.MaxReplays && !cfg.Force:
			o.Kind = OutcomeRefused
			times := "times"
			if e.ReplayCount == 1 {
				times = "time"
			}
			o.Reason = fmt.Sprintf("event already replayed %d %s (--max-replays %d; --force to replay it all the same)", e.ReplayCount, times, cfg.MaxReplays)
		case chainSent:
			// One replay of an event per run: a replay that failed again
			// made this dead letter, or this one's replay made the one
			// sent (new-user trial: retry --include-replayed sent both,
			// and the copies doubled with each run: 1, 2, 4, 8).
			o.Kind = OutcomeRefused
			o.Reason = fmt.Sprintf("the same event as dead letter %s, which this run replays (they are dead letters of one event and its replays, chain from %s): one replay of an event per run", sibling, chain)
			if f, copied := chains.copies[e.Coordinates()]; copied && f == sibling {
				// Not a replay's (second trial: a copy read as one).
				o.Reason = fmt.Sprintf("a copy of dead letter %s, which this run replays (one dead letter written twice): one replay of an event per run", sibling)
			}
		default:
			sent[chain] = e.Coordinates()
			p, fromHeader := parter.Partition(e.OriginalPartition, e.Key)
			if cfg.DryRun {
				o.Kind, o.Partition, o.FromHeader = OutcomeReplayed, p, fromHeader
				break
			}
			if err := pace.Wait(ctx); err != nil {
				return err
			}
			pending = append(pending, pendingReplay{e: e, rec: ReplayRecord(e, cfg.EventsTopic, p), fromHeader: fromHeader})
			if len(pending) >= cfg.BatchSize {
				flush()
			}
			return nil
		}
		emit(o)
		return nil
	})
	if !cfg.DryRun {
		flush()
	}
	res.Scan = st
	if err != nil {
		return res, fmt.Errorf("replay from %s: %w", cfg.DLQTopic, err)
	}
	return res, nil
}

// replayChains finds, for each dead letter, the first of its chain: a
// dead letter whose event was replayed and failed again has a successor,
// whose original headers hold the causet.replay.source of the replayed
// record (ReplayRecord), the predecessor's coordinates. It maps the
// dead letters seen with a source to the first of their chain, so that
// a chain is followed across runs of replays (a source not seen, filtered
// out or in a partition read later, is taken as the first). Two dead
// letters of one record and projection that are no replay's (a dead
// letter written again after a crash) are one chain too. A record's dead
// letters share its key, so they are in one partition, read in order.
type replayChains struct {
	first map[Coordinates]Coordinates
	// copies maps a dead letter written again to the first read of it.
	copies map[Coordinates]Coordinates
	// byOriginal maps a failed record and projection (originalKey) to
	// the first dead letter read of it that is no replay's.
	byOriginal map[originalKey]Coordinates
}

// originalKey identifies a failed record (where it was read), the
// projection it failed for and what its dead letter holds of it (value,
// and the digests of what was left out), as one SHA-256, 32 bytes a dead
// letter whatever their size: a dead letter claiming the record with
// other bytes is no copy of it, and is checked on its own.
type originalKey [sha256.Size]byte

// originalKeyOf is e's originalKey; false when e does not say where its
// record was read.
func originalKeyOf(e *Entry) (originalKey, bool) {
	if e.OriginalTopic == "" || e.OriginalPartition < 0 || e.OriginalOffset < 0 {
		return originalKey{}, false
	}
	h := sha256.New()
	field := func(b []byte) { // length-prefixed: no two field lists hash alike
		h.Write(strconv.AppendInt(nil, int64(len(b)), 10))
		h.Write([]byte{':'})
		h.Write(b)
	}
	field([]byte(e.OriginalTopic))
	field(strconv.AppendInt(nil, int64(e.OriginalPartition), 10))
	field(strconv.AppendInt(nil, e.OriginalOffset, 10))
	field([]byte(e.Projection))
	field(e.Message.OriginalEvent)
	field([]byte(e.Message.OriginalValueBase64))
	for _, hd := range e.Headers {
		switch hd.Key {
		case HeaderOriginalOmitted, HeaderOriginalHeadersOmitted, HeaderOriginalKeyOmitted:
			field([]byte(hd.Key))
			field(hd.Value)
		}
	}
	var k originalKey
	h.Sum(k[:0])
	return k, true
}

func newReplayChains() *replayChains {
	return &replayChains{first: map[Coordinates]Coordinates{}, copies: map[Coordinates]Coordinates{}, byOriginal: map[originalKey]Coordinates{}}
}

// of returns the first dead letter of e's chain: for a replay's dead
// letter, its causet.replay.source's chain; for another, the first dead
// letter read of the same record and projection (a worker that stopped
// after writing a dead letter and before committing writes it again: SPEC
// §3, at least once; operator trial: both copies were replayed), else e's
// own coordinates.
func (c *replayChains) of(e *Entry) Coordinates {
	src, ok := replaySource(e)
	if !ok {
		src = e.Coordinates()
		if k, ok := originalKeyOf(e); ok {
			if f, seen := c.byOriginal[k]; seen {
				src = f
				c.copies[e.Coordinates()] = f
			} else {
				c.byOriginal[k] = src
			}
		}
	}
	if f, ok := c.first[src]; ok {
		src = f
	}
	c.first[e.Coordinates()] = src
	return src
}

// replaySource returns the coordinates in the causet.replay.source header
// of e's original record (its last one), and false when it has none or
// it does not parse.
func replaySource(e *Entry) (Coordinates, bool) {
	for i := len(e.Headers) - 1; i >= 0; i-- {
		if e.Headers[i].Key == HeaderReplaySource {
			c, err := ParseCoordinates(string(e.Headers[i].Value))
			return c, err == nil
		}
	}
	return Coordinates{}, false
}

// restoreOmitted reads e's original record again from its topic, once,
// when its value, its own headers or its key were left out of the dead
// letter (readOriginal: refused once the topic no longer retains it), and
// checks what was left out (the value's and key's size and SHA-256; the
// headers' count, size and HeadersDigest). A key goes in e.Key. A value
// goes in e.Message.OriginalEvent when it is a JSON object every strict
// parser reads; a value that is not stays out, and the entry is refused as not an
// event. Headers go in e.Headers before the dead letter's own, as a dead
// letter that kept them holds them: without the record's traceparent and
// tracestate when the dead letter has its own (the send span's).
func (r *Replayer) restoreOmitted(ctx context.Context, e *Entry) error {
	var at originalPlace
	size := 0
	if o := e.OmittedKey; o != nil {
		at, size = o, o.Size
	}
	if o := e.OmittedHeaders; o != nil {
		at, size = o, size+o.Size
	}
	if o := e.Omitted; o != nil {
		at, size = o, size+o.Size
	}
	rec, err := readOriginal(ctx, r.opts, at, size)
	if err != nil {
		return err
	}
	if o := e.Omitted; o != nil {
		if err := o.check(rec); err != nil {
			return err
		}
	}
	if o := e.OmittedKey; o != nil {
		if err := o.check(rec); err != nil {
			return err
		}
		e.Key = rec.Key
	}
	if o := e.OmittedHeaders; o != nil {
		if err := o.check(rec); err != nil {
			return err
		}
		e.Headers = restoredHeaders(copiedHeaders(rec.Headers), e.Headers)
	}
	if e.Omitted != nil && jsonstrict.IsObject(rec.Value) {
		e.Message.OriginalEvent = json.RawMessage(rec.Value)
	}
	return nil
}

// ledgerWriteTimeout bounds the recording of the replays Kafka acknowledged
// once the run is interrupted: the ledger client's RecordDeliveryTimeout.
const ledgerWriteTimeout = time.Minute

// restoredHeaders returns a dead letter's headers with the source record's
// own, read again, in front: own followed by dead, own without traceparent
// and tracestate when dead has a traceparent of its own (a tracing
// worker's send span, which NewRecord puts in place of the source's, as
// in a dead letter that kept the source's headers).
func restoredHeaders(own, dead []kgo.RecordHeader) []kgo.RecordHeader {
	ownTrace := slices.ContainsFunc(dead, func(h kgo.RecordHeader) bool { return traceHeader(h.Key) == 0 })
	out := make([]kgo.RecordHeader, 0, len(own)+len(dead))
	for _, h := range own {
		if ownTrace && traceHeader(h.Key) >= 0 {
			continue
		}
		out = append(out, h)
	}
	return append(out, dead...)
}

// Skip records a "skipped" decision (Actor, Reason, RunID) in the ledger for
// every selected dead letter, so Retry never sends it; in a dry run it only
// reports them. A dead letter the ledger already has a decision for keeps
// it, so that the ledger never loses who decided what: one replayed
// already is counted as already-replayed (its event was sent; skipping it
// now would hide that), one skipped already is counted as skipped with the
// first decision's actor and reason. Reason and Actor are required. Ledger
// write failures are counted in Result.Failed; Skip returns an error only
// when it cannot run.
func (r *Replayer) Skip(ctx context.Context) (Result, error) {
	cfg := &r.cfg
	res := Result{Action: OutcomeSkipped, DryRun: cfg.DryRun}
	if strings.TrimSpace(cfg.Reason) == "" || strings.TrimSpace(cfg.Actor) == "" {
		return res, errors.New("skip needs a reason and an actor")
	}
	emit := func(o Outcome) {
		res.count(o)
		if o.Kind == OutcomeFailed {
			cfg.Logger.Error("skip failed", "partition", o.Entry.Partition, "offset", o.Entry.Offset, "err", o.Err)
		}
		if cfg.OnOutcome != nil {
			cfg.OnOutcome(o)
		}
	}
	var pending []*Entry
	flush := func() {
		if len(pending) == 0 || ctx.Err() != nil {
			return // interrupted: the selected ones are not-done
		}
		now := cfg.Now().UnixMilli()
		ds := make([]Decision, len(pending))
		for i, e := range pending {
			ds[i] = Decision{Entry: e.Coordinates(), Action: ActionSkipped, At: now, Actor: cfg.Actor, RunID: cfg.RunID, Reason: cfg.Reason}
		}
		for i, err := range r.ledger.record(ctx, ds) {
			o := Outcome{Entry: pending[i], Kind: OutcomeSkipped, Partition: -1, Reason: cfg.Reason}
			if err != nil {
				o.Kind, o.Err, o.Reason = OutcomeFailed, err, "ledger write failed"
			}
			emit(o)
		}
		pending = pending[:0]
	}
	st, err := Scan(ctx, r.opts, ScanConfig{Topic: cfg.DLQTopic, Filters: cfg.Filters, Progress: cfg.Progress, Logger: cfg.Logger}, func(e *Entry) error {
		res.Matched++
		if d, decided := r.ledger.Lookup(e.Coordinates()); decided {
			o := Outcome{Entry: e, DryRun: cfg.DryRun, Partition: -1, Decided: true}
			switch d.Action {
			case ActionReplayed:
				o.Kind = OutcomeAlreadyReplayed
				o.Reason = fmt.Sprintf("replayed at %s by %s (run %s); not skipped", d.AtTime().UTC().Format(time.RFC3339), d.Actor, d.RunID)
			default:
				o.Kind = OutcomeSkipped
				o.Reason = fmt.Sprintf("skipped by %s: %s", d.Actor, d.Reason)
			}
			emit(o)
			return nil
		}
		if cfg.DryRun {
			emit(Outcome{Entry: e, Kind: OutcomeSkipped, DryRun: true, Partition: -1, Reason: cfg.Reason})
			return nil
		}
		pending = append(pending, e)
		if len(pending) >= cfg.BatchSize {
			flush()
		}
		return nil
	})
	if !cfg.DryRun {
		flush()
	}
	res.Scan = st
	if err != nil {
		return res, fmt.Errorf("skip from %s: %w", cfg.DLQTopic, err)
	}
	return res, nil
}

// maxOneByOneBytes is the batch limit of the client that produces, one by
// one, the events larger than the events topic's limit before compression:
// 96 MiB, under kgo's BrokerMaxWriteBytes (100 MiB, Kafka's default
// socket.request.max.bytes), which it must not exceed.
const maxOneByOneBytes = 96 << 20

// defaultProducerBatchMaxBytes is kgo's default ProducerBatchMaxBytes.
const defaultProducerBatchMaxBytes = 1_000_012

// eventsTopicLimits returns the partition count of the events topic and
// its max.message.bytes (DescribeConfigs), 0 when that cannot be read (no
// permission to describe it): the replayer then produces with kgo's
// default batch limit. It returns an error when the topic does not exist
// or cannot be listed.
func eventsTopicLimits(ctx context.Context, opts []kgo.Opt, topic string) (int32, int32, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := listTopic(ctx, adm, topic)
	if err != nil {
		return 0, 0, fmt.Errorf("describe events topic %s: %w", topic, err)
	}
	var maxBytes int32
	if rcs, err := adm.DescribeTopicConfigs(ctx, topic); err == nil {
		if rc, err := rcs.On(topic, nil); err == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil {
					if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil && n > 0 {
						maxBytes = int32(n)
					}
				}
			}
		}
	}
	return int32(len(td.Partitions)), maxBytes, nil
}

// listTopic returns the details of topic: an error wrapping
// ErrTopicNotFound when it does not exist (or has no partitions), or the
// error listing it.
func listTopic(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicDetail, error) {
	tds, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return kadm.TopicDetail{}, err
	}
	td, ok := tds[topic]
	switch {
	case ok && td.Err != nil && !errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return td, td.Err
	case !ok || td.Err != nil || len(td.Partitions) == 0:
		return td, ErrTopicNotFound
	}
	return td, nil
}

// limitText is a max.message.bytes as read (0: unknown).
func limitText(n int32) string {
	if n <= 0 {
		return "unknown"
	}
	return strconv.Itoa(int(n))
}

// newLimiter returns the limiter pacing replays to rate per second, one
// at a time (burst 1: a pause is not made up for by a burst afterwards);
// rate 0 means unlimited.
func newLimiter(rate float64) *ratelimit.Limiter {
	if rate <= 0 {
		return ratelimit.NewLimiter(ratelimit.Inf, 1)
	}
	return ratelimit.NewLimiter(ratelimit.Limit(rate), 1)
}
