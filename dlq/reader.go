package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrTopicNotFound is returned (wrapped) by Scan when the dead-letter topic
// does not exist.
var ErrTopicNotFound = errors.New("topic does not exist")

// ErrStopScan may be returned by the function passed to Scan to stop reading
// early; Scan then returns the statistics so far and a nil error.
var ErrStopScan = errors.New("stop scan")

// ScanConfig configures Scan. Zero values take the documented defaults;
// Validate (Scan calls it) fills them in.
type ScanConfig struct {
	// Topic is the dead-letter topic. Default DefaultTopic.
	Topic string
	// Filters select the entries passed on; the zero value selects all.
	Filters Filters
	// Progress, when not nil, is called from Scan's goroutine once with
	// (0, total) before the first fetch, then after each record read, with
	// the offsets covered so far and the total to cover: the sum over
	// partitions of end offset − start offset listed at the start of Scan,
	// so scanned/total is the fraction of the records to read that were
	// read (offsets of control records and compacted-away records count as
	// read once passed). It must be cheap: it runs once per record.
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
	// Offsets is what the scan was to read: end minus start offset, all
	// partitions, as listed when it started (records, and the markers of
	// transactions if a writer used them); a scan that ran to the end has
	// read them all.
	Offsets int64
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
	progress := func(done, total int64) {
		st.Offsets = total
		if cfg.Progress != nil {
			cfg.Progress(done, total)
		}
	}
	parts, err := readToEnd(ctx, opts, cfg.Topic, log, progress, func(r *kgo.Record) error {
		st.Scanned++
		e, err := sel.entry(r)
		if err != nil {
			st.Undecodable++
			switch {
			case st.Undecodable <= maxUndecodableLogged:
				log.Warn("record is not a dead-letter message; ignored",
					"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			case st.Undecodable == maxUndecodableLogged+1:
				log.Warn("more records that are not dead-letter messages: counted at the end, not logged one by one", "topic", r.Topic)
			}
			return nil
		}
		if e == nil {
			return nil
		}
		st.Matched++
		if e.HeaderError != nil {
			log.Warn("dead letter with a malformed header, or headers the message contradicts: listed, never replayed", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", e.HeaderError)
		}
		return fn(e)
	})
	st.Partitions = parts
	st.Elapsed = time.Since(start)
	if st.Undecodable > maxUndecodableLogged {
		log.Warn("records that are not dead-letter messages were ignored", "topic", cfg.Topic,
			"ignored", st.Undecodable, "scanned", st.Scanned, "hint", "is the topic the dead-letter topic (--dlq-topic)?")
	}
	if errors.Is(err, ErrStopScan) {
		err = nil
	}
	return st, err
}

// maxUndecodableLogged is how many records that are not dead-letter
// messages Scan logs one by one; the rest are counted in a line at the
// end (a mistyped --dlq-topic naming a topic of events made a line per
// event).
const maxUndecodableLogged = 10

// scanIdle is how long readToEnd polls without records before it checks
// whether the records it waits for were deleted.
const scanIdle = 2 * time.Second

// readToEnd calls each for every record of topic from the start offsets to
// the end offsets listed when it starts, in offset order per partition, and
// returns the number of partitions that had records. Control records are
// fetched (so a transaction marker at the end of a partition is seen) but
// not passed on. Records deleted after the listing (retention,
// DeleteRecords) are skipped with a WARN line to log: after scanIdle
// without records it lists the start offsets again.
func readToEnd(ctx context.Context, opts []kgo.Opt, topic string, log *slog.Logger, progress func(scanned, total int64), each func(*kgo.Record) error) (int, error) {
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

	// One fetch of 16 MiB (the client's default is 50 MiB), as the
	// worker's: what a scan holds at once, decompressed, besides the
	// entries its command keeps. Before opts, which may lower it.
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.FetchMaxBytes(16 << 20)}, opts...),
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
	var done int64 // offsets covered, over all partitions
	advance := func(sp *span, next int64) {
		done += next - sp.next
		sp.next = next
		if progress != nil {
			progress(done, total)
		}
	}
	adm = kadm.NewClient(cl) // the first client is closed
	for remaining > 0 {
		pctx, cancel := context.WithTimeout(ctx, scanIdle)
		fetches := cl.PollFetches(pctx)
		idle := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return len(spans), err
		}
		if idle {
			// Nothing for a while: records deleted since the listing
			// (retention reaching them, DeleteRecords) are never delivered,
			// and the client resumes at the new start without a word, so
			// the offsets before it are skipped here, or the scan would
			// wait for them forever.
			starts, err := adm.ListStartOffsets(ctx, topic)
			if err != nil {
				return len(spans), fmt.Errorf("list offsets of %s: %w", topic, err)
			}
			for p, sp := range spans {
				s, ok := starts.Lookup(topic, p)
				if !ok || s.Err != nil || sp.next >= sp.end || s.Offset <= sp.next {
					continue
				}
				log.Warn("dead letters deleted while being read (retention or DeleteRecords): skipped",
					"topic", topic, "partition", p, "from", sp.next, "to", min(s.Offset, sp.end))
				advance(sp, min(s.Offset, sp.end))
				if sp.next >= sp.end {
					remaining--
					cl.PauseFetchPartitions(map[string][]int32{topic: {p}})
				}
			}
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			var loss *kgo.ErrDataLoss
			if errors.As(err, &loss) {
				return // informational: consuming continues at the new start
			}
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return // the idle poll's own deadline (below)
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
				if r.Attrs.IsControl() {
					advance(sp, r.Offset+1)
					continue
				}
				err := each(r)
				advance(sp, r.Offset+1)
				if err != nil {
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
	}
	return len(spans), nil
}
