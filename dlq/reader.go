package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	segjson "github.com/segmentio/encoding/json"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/retry"
)

// ErrTopicNotFound is returned (wrapped) by Scan when the dead-letter topic
// does not exist.
var ErrTopicNotFound = errors.New("topic does not exist")

// ErrStopScan may be returned by the function passed to Scan to stop reading
// early; Scan then returns the statistics so far and a nil error.
var ErrStopScan = errors.New("stop scan")

// Coordinates are the place of a dead letter in the dead-letter topic; they
// identify it in the replay ledger.
type Coordinates struct {
	Partition int32
	Offset    int64
}

// String returns "<partition>:<offset>", the ledger key and the value of the
// causet.replay.source header.
func (c Coordinates) String() string {
	return strconv.FormatInt(int64(c.Partition), 10) + ":" + strconv.FormatInt(c.Offset, 10)
}

// ParseCoordinates parses "<partition>:<offset>" (both decimal, ≥ 0).
func ParseCoordinates(s string) (Coordinates, error) {
	ps, os, ok := strings.Cut(s, ":")
	if !ok {
		return Coordinates{}, fmt.Errorf("dead-letter coordinates %q: want <partition>:<offset>", s)
	}
	p, err := strconv.ParseInt(ps, 10, 32)
	if err != nil || p < 0 {
		return Coordinates{}, fmt.Errorf("dead-letter coordinates %q: bad partition", s)
	}
	o, err := strconv.ParseInt(os, 10, 64)
	if err != nil || o < 0 {
		return Coordinates{}, fmt.Errorf("dead-letter coordinates %q: bad offset", s)
	}
	return Coordinates{Partition: int32(p), Offset: o}, nil
}

// Entry is one dead letter read back from the dead-letter topic.
//
// The context fields (Projection, TenantSchema, ForkID, EventType,
// Fingerprint, ErrorClass, SQLState) come from the causet.dlq.* headers;
// when a header is missing they fall back to the message (projectionName,
// tenantSchema), its originalEvent (forkId, eventType) or, for the
// fingerprint, to Fingerprint recomputed from the message.
type Entry struct {
	// Partition and Offset place the record in the dead-letter topic.
	Partition int32
	Offset    int64
	// Timestamp is the dead-letter record's timestamp.
	Timestamp time.Time
	// Key is the record key: the original record's key (nil when it had
	// none).
	Key []byte
	// Headers are all the record's headers: the original record's plus the
	// causet.dlq.* ones, in record order.
	Headers []kgo.RecordHeader
	// Message is the decoded value.
	Message Message

	Projection   string
	TenantSchema string
	ForkID       string
	EventType    string
	Fingerprint  string
	ErrorClass   string // permanent|projection|infrastructure, "" when unknown
	SQLState     string
	// OriginalPartition is the events-topic partition the failed record was
	// read from (header causet.dlq.original-partition), -1 when unknown.
	OriginalPartition int32
	// ReplayCount is how many times the event had been replayed from the DLQ
	// before this failure (header causet.dlq.replay-count, 0 when absent).
	ReplayCount int
}

// Coordinates returns the entry's place in the dead-letter topic.
func (e *Entry) Coordinates() Coordinates {
	return Coordinates{Partition: e.Partition, Offset: e.Offset}
}

// FailedAt returns Message.FailedAt (epoch ms) as a time.
func (e *Entry) FailedAt() time.Time { return time.UnixMilli(e.Message.FailedAt) }

// FirstFailedAt returns Message.FirstFailedAt (epoch ms) as a time.
func (e *Entry) FirstFailedAt() time.Time { return time.UnixMilli(e.Message.FirstFailedAt) }

// HasOriginalEvent reports whether the dead letter carries an event that can
// be replayed: originalEvent is a JSON object, not null (a value that was not
// a JSON object is kept in originalValueBase64 and cannot be republished
// as an event).
func (e *Entry) HasOriginalEvent() bool {
	b := e.Message.OriginalEvent
	return len(b) > 0 && string(b) != "null"
}

// ScanConfig configures Scan. Zero values take the documented defaults;
// Validate (Scan calls it) fills them in.
type ScanConfig struct {
	// Topic is the dead-letter topic. Default DefaultTopic.
	Topic string
	// Filters select the entries passed on; the zero value selects all.
	Filters Filters
	// Progress, when not nil, is called from Scan's goroutine after each
	// fetch with the offsets covered so far and the total to cover (the sum
	// over partitions of end offset − start offset at the start of Scan).
	Progress func(scanned, total int64)
	// Logger receives warnings (undecodable dead letters, data loss).
	// Default: discard.
	Logger *slog.Logger
}

// Validate fills in the defaults of the zero fields. Every value is
// valid, so it returns nil; it exists so that every Config of the project
// is completed the same way.
func (c *ScanConfig) Validate() error {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// ScanStats counts what a Scan read.
type ScanStats struct {
	// Scanned is the number of dead-letter records read.
	Scanned int64
	// Matched is the number of entries that passed the filters (and were
	// given to the callback).
	Matched int64
	// Undecodable is the number of records whose value is not a dead-letter
	// message; they are logged and never matched.
	Undecodable int64
	// Partitions is the number of partitions that had records to read.
	Partitions int
	// Elapsed is the wall time of the scan.
	Elapsed time.Duration
}

// Scan reads the dead-letter topic from the start of every partition up to
// the end offsets (high watermarks) listed when it starts, and calls fn, in
// offset order within each partition, for every dead letter that passes
// cfg.Filters. Records appended while it runs are not read, so Scan
// terminates even while workers keep dead-lettering. It consumes the
// partitions directly (no consumer group) and never commits offsets.
//
// opts are the franz-go connection options (seed brokers, TLS, SASL,
// logger); Scan adds the consumer options it needs. Header filters are
// checked before the value is decoded, so records ruled out by their
// causet.dlq.* headers cost no JSON decoding.
//
// fn may return ErrStopScan to stop early (Scan then returns nil). Scan
// returns fn's other errors, an error wrapping ErrTopicNotFound when the
// topic does not exist, ctx's error, or a Kafka error.
func Scan(ctx context.Context, opts []kgo.Opt, cfg ScanConfig, fn func(*Entry) error) (ScanStats, error) {
	if err := cfg.Validate(); err != nil {
		return ScanStats{}, err
	}
	log := cfg.Logger
	start := time.Now()
	var st ScanStats
	sel := newSelector(cfg.Filters)
	parts, err := readToEnd(ctx, opts, cfg.Topic, cfg.Progress, func(r *kgo.Record) error {
		st.Scanned++
		e, err := sel.entry(r)
		if err != nil {
			st.Undecodable++
			log.Warn("dead letter is not a dead-letter message; ignored",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return nil
		}
		if e == nil {
			return nil
		}
		st.Matched++
		return fn(e)
	})
	st.Partitions = parts
	st.Elapsed = time.Since(start)
	if errors.Is(err, ErrStopScan) {
		err = nil
	}
	return st, err
}

// readToEnd calls each for every record of topic from the start offsets to
// the end offsets listed when it starts, in offset order per partition, and
// returns the number of partitions that had records. Control records are
// fetched (so a transaction marker at the end of a partition is seen) but
// not passed on.
func readToEnd(ctx context.Context, opts []kgo.Opt, topic string, progress func(scanned, total int64), each func(*kgo.Record) error) (int, error) {
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	adm := kadm.NewClient(admCl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
	}
	admCl.Close()
	if err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return 0, fmt.Errorf("list offsets of %s: %w", topic, ErrTopicNotFound)
		}
		return 0, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	if len(ends[topic]) == 0 {
		return 0, fmt.Errorf("list offsets of %s: %w", topic, ErrTopicNotFound)
	}

	type span struct{ start, end, next int64 }
	spans := map[int32]*span{}
	consume := map[int32]kgo.Offset{}
	var total int64
	for p, e := range ends[topic] {
		s, ok := starts.Lookup(topic, p)
		if !ok || s.Offset < 0 || e.Offset < 0 {
			// Never read a partition as empty because its offsets are
			// unknown (a broker restarting, metadata changing between the
			// two listings): fail, and let the operator run again.
			return 0, fmt.Errorf("list offsets of %s partition %d: start %d, end %d: offsets unknown", topic, p, s.Offset, e.Offset)
		}
		if e.Offset <= s.Offset {
			continue
		}
		spans[p] = &span{start: s.Offset, end: e.Offset, next: s.Offset}
		consume[p] = kgo.NewOffset().At(s.Offset)
		total += e.Offset - s.Offset
	}
	if progress != nil {
		progress(0, total)
	}
	if len(spans) == 0 {
		return 0, nil
	}

	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: consume}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // records deleted meanwhile: go on from the new start
		kgo.KeepControlRecords(),
		kgo.FetchMaxPartitionBytes(8<<20),
	)...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	remaining := len(spans)
	for remaining > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return len(spans), err
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			var loss *kgo.ErrDataLoss
			if errors.As(err, &loss) {
				return // informational: consuming continues at the new start
			}
			if ferr == nil {
				ferr = fmt.Errorf("read %s partition %d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return len(spans), ferr
		}
		var perr error
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			sp := spans[fp.Partition]
			if perr != nil || sp == nil || sp.next >= sp.end {
				return
			}
			for _, r := range fp.Records {
				if r.Offset >= sp.end {
					break
				}
				if r.Offset < sp.next {
					continue // re-delivered after a reset
				}
				sp.next = r.Offset + 1
				if r.Attrs.IsControl() {
					continue
				}
				if err := each(r); err != nil {
					perr = err
					return
				}
			}
			if sp.next >= sp.end {
				remaining--
				cl.PauseFetchPartitions(map[string][]int32{topic: {fp.Partition}})
			}
		})
		if perr != nil {
			return len(spans), perr
		}
		if progress != nil {
			var done int64
			for _, sp := range spans {
				done += sp.next - sp.start
			}
			progress(done, total)
		}
	}
	return len(spans), nil
}

// selector builds entries from records and applies the filters, checking
// headers (and, for ErrorContains, the raw value) before decoding the value.
type selector struct {
	f Filters
	// rawNeedle is ErrorContains in lower case when every JSON encoder
	// writes it unescaped (printable ASCII other than " \ / < > &), so
	// that a value whose bytes do not contain it, ignoring ASCII case,
	// cannot hold it in its error; nil when that shortcut is unsafe.
	rawNeedle []byte
	lower     []byte // scratch for the lower-cased value
}

func newSelector(f Filters) *selector {
	s := &selector{f: f}
	if n := f.ErrorContains; n != "" && strings.IndexFunc(n, func(r rune) bool {
		return r < ' ' || r > '~' || strings.ContainsRune(`"\\/<>&`, r)
	}) < 0 {
		s.rawNeedle = []byte(strings.ToLower(n))
	}
	return s
}

// rawReject reports whether the raw value cannot match ErrorContains.
func (s *selector) rawReject(v []byte) bool {
	if s.rawNeedle == nil {
		return false
	}
	// A \u escape or a non-ASCII character (some lower-case to ASCII) in
	// the value could spell the needle in the decoded error without
	// spelling it in the bytes: decode such values.
	if bytes.Contains(v, []byte(`\u`)) {
		return false
	}
	s.lower = append(s.lower[:0], v...)
	for i, c := range s.lower {
		switch {
		case c >= 0x80:
			return false
		case 'A' <= c && c <= 'Z':
			s.lower[i] = c + ('a' - 'A')
		}
	}
	return !bytes.Contains(s.lower, s.rawNeedle)
}

// headerValues are the causet.dlq.* headers of one record.
type headerValues struct {
	projection, tenant, fork, eventType, fingerprint, class, sqlstate string
	hasProjection, hasTenant, hasFork, hasEventType, hasFingerprint   bool
	originalPartition                                                 int32
	replayCount                                                       int
}

func readHeaders(hs []kgo.RecordHeader) headerValues {
	hv := headerValues{originalPartition: -1}
	for i := range hs {
		h := &hs[i]
		if !strings.HasPrefix(h.Key, "causet.dlq.") {
			continue
		}
		switch h.Key {
		case HeaderProjection:
			hv.projection, hv.hasProjection = string(h.Value), true
		case HeaderTenantSchema:
			hv.tenant, hv.hasTenant = string(h.Value), true
		case HeaderForkID:
			hv.fork, hv.hasFork = string(h.Value), true
		case HeaderEventType:
			hv.eventType, hv.hasEventType = string(h.Value), true
		case HeaderFingerprint:
			hv.fingerprint, hv.hasFingerprint = string(h.Value), true
		case HeaderErrorClass:
			hv.class = string(h.Value)
		case HeaderSQLState:
			hv.sqlstate = string(h.Value)
		case HeaderOriginalPartition:
			hv.originalPartition = parseOriginalPartition(h.Value)
		case HeaderReplayCount:
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n > 0 {
				hv.replayCount = n
			}
		}
	}
	return hv
}

// headerReject reports whether a header that is present already fails a
// filter, so the value need not be decoded.
func (s *selector) headerReject(hv *headerValues) bool {
	f := &s.f
	return f.Projection != "" && hv.hasProjection && hv.projection != f.Projection ||
		f.TenantSchema != "" && hv.hasTenant && hv.tenant != f.TenantSchema ||
		f.ForkID != "" && hv.hasFork && hv.fork != f.ForkID ||
		f.EventType != "" && hv.hasEventType && hv.eventType != f.EventType ||
		f.Fingerprint != "" && hv.hasFingerprint && !strings.EqualFold(hv.fingerprint, f.Fingerprint)
}

// entry returns the entry for r when it passes the filters, nil when it does
// not, and an error when its value is not a dead-letter message.
func (s *selector) entry(r *kgo.Record) (*Entry, error) {
	hv := readHeaders(r.Headers)
	if s.headerReject(&hv) || s.rawReject(r.Value) {
		return nil, nil
	}
	e, err := newEntry(r, &hv)
	if err != nil {
		return nil, err
	}
	if !s.f.Match(e) {
		return nil, nil
	}
	return e, nil
}

// NewEntry decodes a dead-letter record read from the dead-letter topic. It
// returns an error when the value is not a dead-letter message.
func NewEntry(r *kgo.Record) (*Entry, error) {
	hv := readHeaders(r.Headers)
	return newEntry(r, &hv)
}

func newEntry(r *kgo.Record, hv *headerValues) (*Entry, error) {
	e := &Entry{
		Partition:         r.Partition,
		Offset:            r.Offset,
		Timestamp:         r.Timestamp,
		Key:               r.Key,
		Headers:           r.Headers,
		Projection:        hv.projection,
		TenantSchema:      hv.tenant,
		ForkID:            hv.fork,
		EventType:         hv.eventType,
		Fingerprint:       hv.fingerprint,
		ErrorClass:        hv.class,
		SQLState:          hv.sqlstate,
		OriginalPartition: hv.originalPartition,
		ReplayCount:       hv.replayCount,
	}
	// segmentio's decoder: about twice as fast as encoding/json here, and
	// it copies originalEvent's bytes verbatim into the RawMessage too.
	if err := segjson.Unmarshal(r.Value, &e.Message); err != nil {
		return nil, fmt.Errorf("decode dead-letter message: %w", err)
	}
	if !hv.hasProjection {
		e.Projection = e.Message.ProjectionName
	}
	if !hv.hasTenant {
		e.TenantSchema = e.Message.TenantSchema
	}
	if (!hv.hasFork || !hv.hasEventType) && e.HasOriginalEvent() {
		var ev struct {
			ForkID    json.RawMessage `json:"forkId"`
			EventType json.RawMessage `json:"eventType"`
		}
		if json.Unmarshal(e.Message.OriginalEvent, &ev) == nil {
			if !hv.hasFork {
				e.ForkID = jsonString(ev.ForkID)
			}
			if !hv.hasEventType {
				e.EventType = jsonString(ev.EventType)
			}
		}
	}
	if !hv.hasFingerprint {
		e.Fingerprint = Fingerprint(e.Projection, parseClass(e.ErrorClass), e.SQLState, e.Message.Error)
	}
	return e, nil
}

// jsonString returns the string a JSON string holds, "" for anything else.
func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// parseClass maps a causet.dlq.error-class value back to its class; unknown
// values are retry.Projection, the class of anything unknown.
func parseClass(s string) retry.Class {
	switch s {
	case retry.Permanent.String():
		return retry.Permanent
	case retry.Infrastructure.String():
		return retry.Infrastructure
	}
	return retry.Projection
}
