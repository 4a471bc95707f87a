package dlq

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	segjson "github.com/segmentio/encoding/json"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/retry"
)

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
// tenantSchema), its originalEvent (forkId, eventType, also when the
// header holds one cut to 256 bytes) or, for the fingerprint, to
// Fingerprint recomputed from the message.
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
	// OriginalTopic is the topic the failed record was read from (header
	// causet.dlq.original-topic), "" when unknown.
	OriginalTopic string
	// OriginalPartition is the events-topic partition the failed record was
	// read from (header causet.dlq.original-partition), -1 when unknown.
	OriginalPartition int32
	// OriginalOffset is the failed record's offset in OriginalTopic
	// (header causet.dlq.original-offset), -1 when unknown.
	OriginalOffset int64
	// ReplayCount is how many times the event had been replayed from the DLQ
	// before this failure (header causet.dlq.replay-count, 0 when absent).
	ReplayCount int
	// Omitted is the original value left out of the dead letter because it
	// did not fit the topic (header causet.dlq.original-omitted, with the
	// causet.dlq.original-topic, -partition and -offset headers); nil when
	// the message carries the original.
	Omitted *OmittedOriginal
	// OmittedHeaders are the source record's own headers, left out of the
	// dead letter because they did not fit the topic (header
	// causet.dlq.original-headers-omitted, with the original topic,
	// partition and offset headers); nil when the dead letter carries them.
	OmittedHeaders *OmittedHeaders
	// OmittedKey is the source record's key, left out of the dead letter
	// (which has none) because it did not fit the topic (header
	// causet.dlq.original-key-omitted, with the original topic, partition
	// and offset headers); nil when the dead letter carries it.
	OmittedKey *OmittedKey
	// HeaderError says which header locating a part left out for size
	// (causet.dlq.original-omitted, -headers-omitted, -key-omitted, or the
	// original topic, partition and offset they need) is malformed, or
	// which of causet.dlq.projection and causet.dlq.tenant-schema
	// disagrees with the message (projectionName, tenantSchema); nil when
	// none. Such a dead letter is listed and summarised, and never
	// replayed.
	HeaderError error
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

// headerValues are the causet.dlq.* headers of one record.
type headerValues struct {
	projection, tenant, fork, eventType, fingerprint, class, sqlstate  string
	hasProjection, hasTenant, hasFork, hasEventType, hasFingerprint    bool
	originalPartition                                                  int32
	replayCount                                                        int
	originalTopic, originalOffset, omitted, omittedHeaders, omittedKey string
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
			// One that is not 16 hex digits is recomputed (replayer trial:
			// summary showed NOTHEX, which --fingerprint then refused).
			if isFingerprint(h.Value) {
				hv.fingerprint, hv.hasFingerprint = string(h.Value), true
			}
		case HeaderErrorClass:
			hv.class = string(h.Value)
		case HeaderSQLState:
			hv.sqlstate = string(h.Value)
		case HeaderOriginalPartition:
			hv.originalPartition = parseOriginalPartition(h.Value)
		case HeaderOriginalTopic:
			hv.originalTopic = string(h.Value)
		case HeaderOriginalOffset:
			hv.originalOffset = string(h.Value)
		case HeaderOriginalOmitted:
			hv.omitted = string(h.Value)
		case HeaderOriginalHeadersOmitted:
			hv.omittedHeaders = string(h.Value)
		case HeaderOriginalKeyOmitted:
			hv.omittedKey = string(h.Value)
		case HeaderReplayCount:
			hv.replayCount, _ = ParseReplayCount(h.Value)
		}
	}
	return hv
}

// isFingerprint reports whether v is a fingerprint as Fingerprint writes
// it: 16 hex digits (either case).
func isFingerprint(v []byte) bool {
	if len(v) != 16 {
		return false
	}
	for _, c := range v {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
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
		OriginalTopic:     hv.originalTopic,
		OriginalPartition: hv.originalPartition,
		ReplayCount:       hv.replayCount,
	}
	// segmentio's decoder: about twice as fast as encoding/json here, and
	// it copies originalEvent's bytes verbatim into the RawMessage too.
	if err := segjson.Unmarshal(r.Value, &e.Message); err != nil {
		return nil, fmt.Errorf("decode dead-letter message: %w", err)
	}
	e.Message.OriginalEvent = verbatimOriginal(r.Value, e.Message.OriginalEvent)
	if e.Message.Error == "" || e.Message.FailedAt == 0 {
		// Any JSON object decodes; every dead letter has both, as the
		// schema requires (new-user trials: --dlq-topic naming the events
		// topic listed its events as dead letters with empty fields; an
		// object with an error alone was listed as failed at 0).
		return nil, errors.New(`not a dead-letter message: a JSON object without "error" or "failedAt" (is --dlq-topic the dead-letter topic?)`)
	}
	// Where a value or headers left out for size are read again.
	off, err := strconv.ParseInt(hv.originalOffset, 10, 64)
	placed := err == nil && off >= 0 && hv.originalTopic != "" && hv.originalPartition >= 0
	e.OriginalOffset = -1
	if placed {
		e.OriginalOffset = off
	}
	malformed := func(header, v string) error {
		return fmt.Errorf("dead letter at %s: header %s %q or the original topic, partition and offset headers are malformed, so where the part left out for size is cannot be known", e.Coordinates(), header, v)
	}
	// A malformed one keeps the dead letter an entry, not replayable
	// (replayer trial: it was ignored as "not a dead-letter message", and
	// counted as a dead letter by a filter that read only its headers).
	if hv.omitted != "" {
		e.Omitted = &OmittedOriginal{Topic: hv.originalTopic, Partition: hv.originalPartition, Offset: off}
		if !placed || !parseOmitted(hv.omitted, e.Omitted) {
			e.Omitted, e.HeaderError = nil, malformed(HeaderOriginalOmitted, hv.omitted)
		}
	}
	if hv.omittedKey != "" {
		e.OmittedKey = &OmittedKey{OmittedOriginal{Topic: hv.originalTopic, Partition: hv.originalPartition, Offset: off}}
		if !placed || !parseOmitted(hv.omittedKey, &e.OmittedKey.OmittedOriginal) {
			e.OmittedKey, e.HeaderError = nil, cmp.Or(e.HeaderError, malformed(HeaderOriginalKeyOmitted, hv.omittedKey))
		}
	}
	if hv.omittedHeaders != "" {
		e.OmittedHeaders = &OmittedHeaders{Topic: hv.originalTopic, Partition: hv.originalPartition, Offset: off}
		if !placed || !parseOmittedHeaders(hv.omittedHeaders, e.OmittedHeaders) {
			e.OmittedHeaders, e.HeaderError = nil, cmp.Or(e.HeaderError, malformed(HeaderOriginalHeadersOmitted, hv.omittedHeaders))
		}
	}
	if !hv.hasProjection {
		e.Projection = e.Message.ProjectionName
	}
	if !hv.hasTenant {
		e.TenantSchema = e.Message.TenantSchema
	}
	// The headers select, the message is what a replay sends: when they
	// disagree (a dead letter made by hand), neither is trusted (replayer
	// trial: selected as user_follows by its header, it would have been
	// replayed as artist_followers, its projectionName).
	disagree := func(header, h, field, m string) error {
		return fmt.Errorf("dead letter at %s: header %s %q and the message's %s %q disagree", e.Coordinates(), header, h, field, m)
	}
	switch m := &e.Message; {
	case e.HeaderError != nil:
	case m.ProjectionName != "" && e.Projection != m.ProjectionName:
		e.HeaderError = disagree(HeaderProjection, e.Projection, "projectionName", m.ProjectionName)
	case m.TenantSchema != "" && e.TenantSchema != m.TenantSchema:
		e.HeaderError = disagree(HeaderTenantSchema, e.TenantSchema, "tenantSchema", m.TenantSchema)
	}
	// A label the header holds cut (CapLabel) is read whole from the
	// original event when the dead letter carries it.
	_, _, forkCut := cutLabel(hv.fork)
	_, _, typeCut := cutLabel(hv.eventType)
	forkFromEvent, typeFromEvent := !hv.hasFork || forkCut, !hv.hasEventType || typeCut
	if (forkFromEvent || typeFromEvent) && e.HasOriginalEvent() {
		var ev struct {
			ForkID    json.RawMessage `json:"forkId"`
			EventType json.RawMessage `json:"eventType"`
		}
		if json.Unmarshal(e.Message.OriginalEvent, &ev) == nil {
			if forkFromEvent {
				e.ForkID = jsonString(ev.ForkID)
			}
			if typeFromEvent {
				e.EventType = jsonString(ev.EventType)
			}
		}
	}
	if !hv.hasFingerprint {
		e.Fingerprint = Fingerprint(e.Projection, parseClass(e.ErrorClass), e.SQLState, e.Message.Error)
	}
	return e, nil
}

// verbatimOriginal returns value's originalEvent as the dead letter holds
// it, with the whitespace around the object that a JSON decoder drops
// (decoded is what the decoder gave): the bytes of value from just after
// `{"originalEvent":` to the `,` after the object, when they are decoded
// with JSON whitespace around it; else decoded. The worker embeds a
// record's value verbatim, the whitespace around its object included, and
// retry republishes these bytes (new-user trial: an event ending in a
// newline was replayed a byte shorter).
func verbatimOriginal(value []byte, decoded json.RawMessage) json.RawMessage {
	const space = " \t\n\r"
	if isNullEvent(decoded) || !bytes.HasPrefix(value, []byte(originalPrefix)) {
		return decoded
	}
	rest := value[len(originalPrefix):]
	start := len(rest) - len(bytes.TrimLeft(rest, space))
	end := start + len(decoded)
	if end > len(rest) || !bytes.Equal(rest[start:end], decoded) {
		return decoded
	}
	end += len(rest[end:]) - len(bytes.TrimLeft(rest[end:], space))
	switch {
	case end == len(rest) || rest[end] != ',':
		return decoded // not Message.encode's layout
	case end == len(decoded):
		return decoded // no whitespace around it
	}
	return bytes.Clone(rest[:end])
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
