package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/causet/projection-worker/internal/logfold"
	"github.com/causet/projection-worker/retry"
)

// WriterConfig configures a Writer. Zero values take the documented
// defaults; Validate (NewWriter calls it) fills them in and checks the rest.
type WriterConfig struct {
	// RecordConfig says how records are built: topic, worker id,
	// generation and the size limit. See its fields for defaults.
	RecordConfig
	// Backoff paces the retries of a failed produce: Initial, Multiplier,
	// MaxInterval and Jitter are used, MaxRetries is ignored (a dead letter
	// is retried until it is acknowledged or the context ends). The zero
	// Policy means retry.DefaultPolicy() (200 ms, ×2, 10 s cap, jitter 0.5).
	Backoff retry.Policy
	// Logger receives one WARN line per failed produce attempt. nil
	// discards them.
	Logger *slog.Logger
	// MaxAttempts is how many produce attempts one Write makes before it
	// gives up and returns the last produce error, so that the caller can
	// report a dead-letter topic that keeps refusing writes (the worker then
	// fails /readyz, logs an error and calls Write again). Default 5; -1
	// retries until ctx ends.
	MaxAttempts int
	// AttemptTimeout is how long one produce attempt (of Write, or the one
	// attempt of WriteBatch) waits for Kafka to acknowledge or refuse the
	// dead letter; then the attempt fails with ErrAttemptTimeout. Default
	// 10 s (DefaultAttemptTimeout); negative: no limit.
	//
	// It is what bounds a Write on retriable errors: kgo retries
	// NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT and unanswered requests
	// inside one produce without limit, so without it a Write can block
	// until ctx ends and the caller never learns that the dead-letter topic
	// is unavailable. With it, a Write that keeps failing returns within
	// MaxAttempts × AttemptTimeout plus the backoff waits between attempts:
	// about 55 s with the defaults (5 × 10 s + at most 4.5 s).
	//
	// Trap: an attempt that timed out may still be written (the broker
	// stored it but its answer was lost or late), and the next attempt then
	// writes the same dead letter again. See Write.
	AttemptTimeout time.Duration
	// TracerProvider, when set, receives a "send <topic>" span (kind
	// producer) per dead letter that has a Context, the child of the span
	// there; the dead letter's traceparent and tracestate headers are that
	// span's (the source's are kept as causet.dlq.original-traceparent and
	// -tracestate). Default nil: no spans, the source's headers as they are.
	TracerProvider trace.TracerProvider
}

// DefaultAttemptTimeout is the default WriterConfig.AttemptTimeout: as long
// as a broker waits for the in-sync replicas of a produce (kgo's default
// ProduceRequestTimeout), and long enough for kgo to ride out a leader
// election.
const DefaultAttemptTimeout = 10 * time.Second

// ErrAttemptTimeout is wrapped by the errors of Write and WriteBatch for a
// dead letter that Kafka neither acknowledged nor refused within
// WriterConfig.AttemptTimeout: a broker that does not answer, or retriable
// errors (NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT) that kgo kept
// retrying. It is not a context error: errors.Is(err,
// context.DeadlineExceeded) is false.
var ErrAttemptTimeout = errors.New("kafka did not acknowledge the dead letter in time")

// Writer publishes dead letters to the dead-letter topic and returns only
// once Kafka has acknowledged them (SPEC §5: the source offset is committed
// only after the dead letter is acknowledged). It is safe for concurrent
// use; each Write retries on its own.
type Writer struct {
	client         *kgo.Client
	cfg            RecordConfig
	backoff        retry.Policy // MaxRetries: WriterConfig.MaxAttempts − 1
	log            *slog.Logger
	attemptTimeout time.Duration // <= 0: none
	tr             *sendTracer   // nil: no spans

	mu    sync.Mutex
	folds map[string]*logfold.Line // the retry lines, by source topic and partition
}

// retryLineDue reports whether the retry line of a write of source's
// failing with text is written now, and the repeats left out since
// (logfold: once a minute while unchanged; pathological-stream trial: a
// dead-letter topic that refused every write gave 4 lines per partition
// every 15-20 s, for as long as it refused).
func (w *Writer) retryLineDue(src *kgo.Record, text string) (int, bool) {
	key := src.Topic + "/" + strconv.Itoa(int(src.Partition))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.folds == nil {
		w.folds = map[string]*logfold.Line{}
	}
	l := w.folds[key]
	if l == nil {
		l = &logfold.Line{}
		w.folds[key] = l
	}
	return l.Due(text, time.Now())
}

// NewWriter returns a Writer producing through client, which the caller
// owns and closes after the last Write.
//
// The client must be configured for durable, non-duplicated writes (STYLE
// rule 11): acks=all (kgo's default RequiredAcks(AllISRAcks())) and
// idempotent writes (kgo's default; no DisableIdempotentWrite), with no
// TransactionalID; Write sets each record's Topic, so the client must not
// use DefaultProduceTopicAlways with a different DefaultProduceTopic, and
// its ProducerBatchMaxBytes (default 1,000,012) and MaxBufferedBytes must
// not be below cfg.MaxBytes. NewWriter returns an error naming the first of
// these that the client breaks, or the first invalid field of cfg, or when
// client is nil.
//
// The dead-letter topic should exist (EnsureTopics) before the first Write:
// with a broker that auto-creates topics it would otherwise get the
// broker's default retention.
//
// Recommended: kgo.AllowIdempotentProduceCancellation, so that kgo drops a
// dead letter whose attempt timed out (or whose ctx ended) even while its
// request is in flight; without it kgo keeps such a record until the
// broker answers and may write it after the Write gave up. And
// kgo.ProducerLinger(0), or each write first waits out the linger (kgo's
// default 10 ms). Do not set kgo.RecordDeliveryTimeout: kgo measures it
// from the record's timestamp, which the attempts of one Write share, so
// attempts after the first would fail at once; AttemptTimeout bounds each
// attempt instead.
func NewWriter(client *kgo.Client, cfg WriterConfig) (*Writer, error) {
	if client == nil {
		return nil, errors.New("dead-letter writer: nil kafka client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dead-letter writer: %w", err)
	}
	if err := checkClient(client, cfg.RecordConfig); err != nil {
		return nil, fmt.Errorf("dead-letter writer: %w", err)
	}
	// Write's attempts are the policy's first try and its retries.
	bo := cfg.Backoff
	bo.MaxRetries = cfg.MaxAttempts - 1
	if cfg.MaxAttempts == -1 {
		bo.MaxRetries = math.MaxInt
	}
	return &Writer{client: client, cfg: cfg.RecordConfig, backoff: bo, log: cfg.Logger, attemptTimeout: cfg.AttemptTimeout,
		tr: newSendTracer(cfg.TracerProvider, cfg.Topic)}, nil
}

// Validate fills in the defaults of the zero fields (RecordConfig's with
// RecordConfig.WithDefaults) and returns an error naming the first field
// that is out of range: an invalid RecordConfig, an invalid Backoff, or
// MaxAttempts below -1.
func (c *WriterConfig) Validate() error {
	c.RecordConfig = c.RecordConfig.WithDefaults()
	if err := c.RecordConfig.Validate(); err != nil {
		return err
	}
	if c.Backoff == (retry.Policy{}) {
		c.Backoff = retry.DefaultPolicy()
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("backoff: %w", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = 5
	case c.MaxAttempts < -1:
		return fmt.Errorf("max attempts must be -1 (no limit) or >= 1, got %d", c.MaxAttempts)
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	return nil
}

// checkClient refuses a client whose producer settings could lose or
// misroute a dead letter.
func checkClient(cl *kgo.Client, rc RecordConfig) error {
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		return errors.New("kafka client must produce with acks=all (kgo.RequiredAcks(kgo.AllISRAcks()))")
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return errors.New("kafka client must produce idempotently (remove kgo.DisableIdempotentWrite)")
	}
	if _, set := optPresent(cl, kgo.TransactionalID); set {
		return errors.New("kafka client must not be transactional (kgo.TransactionalID)")
	}
	if always, _ := cl.OptValue(kgo.DefaultProduceTopicAlways).(bool); always {
		if t, _ := cl.OptValue(kgo.DefaultProduceTopic).(string); t != rc.Topic {
			return fmt.Errorf("kafka client produces every record to %q (kgo.DefaultProduceTopicAlways), not to dead-letter topic %q", t, rc.Topic)
		}
	}
	if fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		if limit := int(fn(rc.Topic)); limit < rc.MaxBytes {
			return fmt.Errorf("kafka client ProducerBatchMaxBytes %d for %q is below dead-letter max bytes %d", limit, rc.Topic, rc.MaxBytes)
		}
	}
	if limit, ok := cl.OptValue(kgo.MaxBufferedBytes).(int64); ok && limit > 0 && limit < int64(rc.MaxBytes) {
		return fmt.Errorf("kafka client MaxBufferedBytes %d is below dead-letter max bytes %d", limit, rc.MaxBytes)
	}
	return nil
}

// optPresent returns the value of a pointer-stored kgo option and whether
// it is set.
func optPresent(cl *kgo.Client, opt any) (any, bool) {
	vs := cl.OptValues(opt)
	if len(vs) < 2 {
		return nil, false
	}
	set, _ := vs[1].(bool)
	return vs[0], set
}

// Topic returns the dead-letter topic the Writer produces to.
func (w *Writer) Topic() string { return w.cfg.Topic }

// Write publishes the dead letter of dl, built by NewRecord with
// time.Now(), and waits for Kafka to acknowledge it. An attempt fails when
// Kafka refuses the record, or when AttemptTimeout (default 10 s) passes
// without an answer (ErrAttemptTimeout). A failed attempt is logged at WARN
// (keys topic, partition, offset, projection, tenant_schema of the source
// record, plus dlq_topic, attempt, wait and error; the same error for the
// same source partition once a minute, with repeats) and retried after a
// backoff wait: the same record (same FailedAt and timestamp) until Kafka
// acknowledges it, ctx is done, or MaxAttempts (default 5) attempts have
// failed; then it returns the last produce error, and the caller, which must
// not commit the source offset, calls Write again (a new record, the same
// content). So a Write that keeps failing returns within MaxAttempts ×
// AttemptTimeout plus the backoff waits (about 55 s with the defaults).
//
// It returns nil only once the broker has acknowledged the write. When ctx
// ends first, it returns at once an error that wraps ctx's error joined
// with the last produce error (errors.Is(err, context.Canceled) holds); the
// caller must then not commit the source offset, and the next owner of the
// partition dead-letters the record again. Errors from NewRecord (an
// invalid dl, or ErrTooLarge) are returned at once, without retrying.
//
// At least once, never lost: an attempt that timed out or was cancelled
// with its request in flight may have been stored by the broker, and the
// next attempt (or the next Write, or the next owner) then writes the dead
// letter again. The duplicates of one Write are byte-identical; those of
// two Writes differ only in failedAt and the record timestamp. All carry
// the same causet.dlq.original-topic, -partition, -offset and projection
// headers, which identify the pair; replaying both is harmless (the
// sequence guard makes the second a no-op).
func (w *Writer) Write(ctx context.Context, dl DeadLetter) (err error) {
	span := w.tr.start(&dl)
	var sent *kgo.Record
	defer func() { endSend(span, sent, err) }()
	rec, err := NewRecord(dl, w.cfg, time.Now())
	if err != nil {
		return err
	}
	src := dl.Source
	// last is the latest produce error that is not the end of ctx itself.
	var last error
	retries, err := w.backoff.Do(ctx, func(ctx context.Context) error {
		// kgo stamps the record it is given (partition, offset, context);
		// produce a fresh copy each time.
		r := &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Timestamp: rec.Timestamp}
		perr := w.produce(ctx, r)[0]
		if perr == nil {
			sent = r
		}
		if perr != nil && (ctx.Err() == nil || !errors.Is(perr, ctx.Err())) {
			last = perr
		}
		return perr
	}, func(perr error, n int, wait time.Duration) {
		repeats, due := w.retryLineDue(src, MaskLiterals(perr.Error())) // sizes in the text vary
		if !due {
			return
		}
		attrs := []slog.Attr{
			slog.String("topic", src.Topic),
			slog.Int("partition", int(src.Partition)),
			slog.Int64("offset", src.Offset),
			slog.String("projection", dl.Projection),
			slog.String("tenant_schema", dl.TenantSchema),
			slog.String("dlq_topic", w.cfg.Topic),
			slog.Int("attempt", n), // the attempt that failed
			slog.Duration("wait", wait),
			slog.Any("error", perr),
		}
		if repeats > 0 {
			attrs = append(attrs, slog.Int("repeats", repeats))
		}
		w.log.LogAttrs(ctx, slog.LevelWarn, "dead-letter write failed, retrying", attrs...)
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("dead letter for %s not written to %s: %w", sourceName(src), w.cfg.Topic, errors.Join(ctx.Err(), last))
	default:
		return fmt.Errorf("dead letter for %s not written to %s after %d attempts: %w", sourceName(src), w.cfg.Topic, retries+1, err)
	}
}

// WriteBatch publishes dead letters in one produce attempt, which keeps
// their order within a dead-letter partition, and returns one error per
// dead letter: nil once Kafka has acknowledged it. The attempt is bounded
// by AttemptTimeout like one attempt of Write. It does not retry: a dead
// letter with an error was not acknowledged (it may still have been
// written, as with Write) and the caller writes it again with Write. Use it
// for the dead letters of a batch that need no retry, so that they cost one
// round trip together rather than one each.
func (w *Writer) WriteBatch(ctx context.Context, dls []DeadLetter) []error {
	errs := make([]error, len(dls))
	now := time.Now()
	recs := make([]*kgo.Record, 0, len(dls))
	idx := make([]int, 0, len(dls))
	var spans []trace.Span // with tracing, by index of dls
	if w.tr != nil {
		spans = make([]trace.Span, len(dls))
	}
	for i, dl := range dls {
		if spans != nil {
			spans[i] = w.tr.start(&dl)
		}
		rec, err := NewRecord(dl, w.cfg, now)
		if err != nil {
			errs[i] = err
			if spans != nil {
				endSend(spans[i], nil, err)
			}
			continue
		}
		recs = append(recs, rec)
		idx = append(idx, i)
	}
	if len(recs) == 0 {
		return errs
	}
	for j, err := range w.produce(ctx, recs...) {
		i := idx[j]
		if err != nil {
			errs[i] = fmt.Errorf("dead letter for %s not written to %s: %w", sourceName(dls[i].Source), w.cfg.Topic, err)
		}
		if spans != nil {
			endSend(spans[i], recs[j], errs[i])
		}
	}
	return errs
}

// produce is one produce attempt: it hands recs to the client and waits
// until Kafka has acknowledged or refused each of them, ctx is done, or the
// attempt timeout has passed. It returns one error per record, in the order
// of recs (kgo answers in the order the brokers do): nil once acknowledged,
// the refusal, ctx's error, or ErrAttemptTimeout for a record not answered
// in time or failed by kgo with an earlier timed-out record of its
// partition. A record not answered in time may stay with the client (see
// NewWriter); its late answer goes to a buffered channel nobody reads.
func (w *Writer) produce(ctx context.Context, recs ...*kgo.Record) []error {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if w.attemptTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, w.attemptTimeout)
	}
	defer cancel()
	timedOut := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w (attempt timeout %s)", ErrAttemptTimeout, w.attemptTimeout)
	}
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(recs))
	for i, r := range recs {
		w.client.Produce(actx, r, func(_ *kgo.Record, err error) { results <- result{i, err} })
	}
	errs := make([]error, len(recs))
	answered := make([]bool, len(recs))
	take := func(res result) {
		// While ctx lasts, a context error can only come from an attempt
		// that timed out: this one, or an earlier one whose record was
		// ahead of this one in the same partition (kgo fails every record
		// queued behind a failed one, to keep a partition gapless).
		if ctx.Err() == nil && (errors.Is(res.err, context.DeadlineExceeded) || errors.Is(res.err, context.Canceled)) {
			res.err = timedOut()
		}
		errs[res.i], answered[res.i] = res.err, true
	}
	for left := len(recs); left > 0; left-- {
		select {
		case res := <-results:
			take(res)
		case <-actx.Done():
			for more := true; more; {
				select {
				case res := <-results:
					take(res)
				default:
					more = false
				}
			}
			for i := range errs {
				if !answered[i] {
					errs[i] = timedOut()
				}
			}
			return errs
		}
	}
	return errs
}
