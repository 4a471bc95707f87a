package dlq

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// OmittedOriginal is an original record value that NewRecord left out of a
// dead letter because it did not fit the dead-letter topic (header
// causet.dlq.original-omitted): where it was read, its size and digest.
type OmittedOriginal struct {
	Topic     string
	Partition int32
	Offset    int64
	Size      int    // bytes
	SHA256    string // lowercase hex
}

func (o *OmittedOriginal) String() string {
	return fmt.Sprintf("%s[%d]@%d (%d bytes)", o.Topic, o.Partition, o.Offset, o.Size)
}

// parseOmitted reads a causet.dlq.original-omitted value, "size=N
// sha256=hex", into o's Size and SHA256. It reports false when the value
// is not in that form.
func parseOmitted(v string, o *OmittedOriginal) bool {
	for _, f := range strings.Fields(v) {
		k, val, _ := strings.Cut(f, "=")
		switch k {
		case "size":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return false
			}
			o.Size = n
		case "sha256":
			if b, err := hex.DecodeString(val); err != nil || len(b) != sha256.Size {
				return false
			}
			o.SHA256 = val
		}
	}
	return o.SHA256 != ""
}

// originalReadTimeout bounds ReadOmitted's wait for the original record.
const originalReadTimeout = 30 * time.Second

// ReadOmitted reads the omitted original value o from its topic with a
// client built from opts and checks its size and SHA-256. It returns an
// error saying so when the topic no longer retains the record (its log
// start offset is past o.Offset: retention or deleted records), when the
// record is gone from the log (compaction), when the bytes read differ,
// or when Kafka cannot be read within 30 s.
func ReadOmitted(ctx context.Context, opts []kgo.Opt, o *OmittedOriginal) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, originalReadTimeout)
	defer cancel()
	// One client: it lists the start offset, and consumes from o.Offset.
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: {o.Partition: kgo.NewOffset().At(o.Offset)}}),
		kgo.FetchMaxPartitionBytes(int32(min(o.Size+(1<<20), 1<<30))))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	starts, err := kadm.NewClient(cl).ListStartOffsets(ctx, o.Topic)
	if err != nil {
		return nil, fmt.Errorf("original %s: list start offsets: %w", o, err)
	}
	start, ok := starts.Lookup(o.Topic, o.Partition)
	switch {
	case !ok:
		return nil, fmt.Errorf("original %s: the topic has no such partition", o)
	case start.Err != nil:
		return nil, fmt.Errorf("original %s: list start offsets: %w", o, start.Err)
	case start.Offset > o.Offset:
		return nil, fmt.Errorf("original %s is no longer in the topic: its log starts at offset %d (retention or deleted records); the dead letter cannot be replayed", o, start.Offset)
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("original %s: not read within %s: %w", o, originalReadTimeout, err)
		}
		for _, fe := range fs.Errors() {
			return nil, fmt.Errorf("original %s: fetch: %w", o, fe.Err)
		}
		for _, r := range fs.Records() {
			if r.Offset < o.Offset {
				continue
			}
			if r.Offset > o.Offset {
				return nil, fmt.Errorf("original %s is no longer in the topic (compacted: the next record is at offset %d); the dead letter cannot be replayed", o, r.Offset)
			}
			sum := sha256.Sum256(r.Value)
			if len(r.Value) != o.Size || !bytes.Equal([]byte(hex.EncodeToString(sum[:])), []byte(o.SHA256)) {
				return nil, fmt.Errorf("original %s: the record there is %d bytes with another SHA-256: not the failed record", o, len(r.Value))
			}
			return r.Value, nil
		}
	}
}
