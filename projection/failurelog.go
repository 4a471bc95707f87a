package projection

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// DefaultFailureLogInterval is the default Config.FailureLogInterval.
const DefaultFailureLogInterval = time.Minute

// failureLog writes the worker's per-pair failure lines (a pair that
// failed and waits for a retry, a pair dead-lettered) without one line per
// pair: within an interval, the first line of each message and failure
// fingerprint is written in full, with its fingerprint; the repeats are
// counted and, when the interval ends, written as one line per message and
// fingerprint, "<message> (repeated)" with their count, the interval and
// the last pair's partition, offset and error. 100 000 dead letters of one cause
// then write a few lines a minute, not 100 000.
type failureLog struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	seen map[failureKey]*failureRepeats
}

type failureKey struct{ msg, fingerprint string }

// failureRepeats is one message and fingerprint within the current
// interval.
type failureRepeats struct {
	level slog.Level
	since time.Time // when its line was written in full
	n     int       // repeats since, not yet written
	last  []any     // the attributes of the last repeat
	// lastSpan is the span context of the last repeat's record, which
	// its "(repeated)" line carries (trace_id, span_id) with its partition
	// and offset; not the context the line happens to be written in.
	lastSpan trace.SpanContext
}

func newFailureLog(log *slog.Logger, interval time.Duration) *failureLog {
	return &failureLog{log: log, interval: interval, now: time.Now, seen: make(map[failureKey]*failureRepeats)}
}

// write writes msg at level with attrs (key-value pairs, as slog takes
// them) and fingerprint, unless a line of the same msg and fingerprint was
// written within the interval, in which case it is counted for flush.
func (l *failureLog) write(ctx context.Context, level slog.Level, msg, fingerprint string, attrs ...any) {
	if !l.log.Enabled(ctx, level) {
		return
	}
	k := failureKey{msg, fingerprint}
	l.mu.Lock()
	r := l.seen[k]
	if r != nil && l.now().Sub(r.since) < l.interval {
		r.n++
		r.last, r.lastSpan = attrs, trace.SpanContextFromContext(ctx)
		l.mu.Unlock()
		return
	}
	l.seen[k] = &failureRepeats{level: level, since: l.now()}
	l.mu.Unlock()
	if r != nil && r.n > 0 {
		l.writeRepeats(ctx, k, r)
	}
	l.log.Log(ctx, level, msg, append(attrs, "fingerprint", fingerprint)...)
}

// flush writes the repeats counted in the intervals that have ended and
// forgets those intervals; all of them when final is set (shutdown).
func (l *failureLog) flush(ctx context.Context, final bool) {
	type due struct {
		k failureKey
		r *failureRepeats
	}
	var out []due
	l.mu.Lock()
	now := l.now()
	for k, r := range l.seen {
		if final || now.Sub(r.since) >= l.interval {
			delete(l.seen, k)
			if r.n > 0 {
				out = append(out, due{k, r})
			}
		}
	}
	l.mu.Unlock()
	for _, d := range out {
		l.writeRepeats(ctx, d.k, d.r)
	}
}

func (l *failureLog) writeRepeats(ctx context.Context, k failureKey, r *failureRepeats) {
	attrs := []any{"fingerprint", k.fingerprint, "count", r.n, "since", r.since}
	for i := 0; i+1 < len(r.last); i += 2 {
		switch r.last[i] {
		case "projection", "tenant_schema", "error_class", "partition", "offset", "error":
			attrs = append(attrs, "last_"+r.last[i].(string), r.last[i+1])
		}
	}
	// The last repeat's record's span context, in place of ctx's (the
	// record being written when the interval ended; tracing trial: the
	// repeated line carried the next record's trace id).
	l.log.Log(trace.ContextWithSpanContext(ctx, r.lastSpan), r.level, k.msg+" (repeated)", attrs...)
}

// run flushes the failure log every tenth of the interval (at least 1 ms)
// until ctx is done, then writes what is left: a fingerprint's repeats are
// written at most a tenth of the interval after its interval ends
// (new-user trial: flushed once an interval, a repeat came up to two
// intervals after its fingerprint's first line).
func (l *failureLog) run(ctx context.Context) {
	t := time.NewTicker(max(l.interval/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.flush(context.WithoutCancel(ctx), true)
			return
		case <-t.C:
			l.flush(ctx, false)
		}
	}
}
