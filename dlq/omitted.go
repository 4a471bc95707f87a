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

// OmittedKey is the source record's key that NewRecord left out of a dead
// letter because it did not fit the dead-letter topic (header
// causet.dlq.original-key-omitted): where the record was read, the key's
// size and SHA-256.
type OmittedKey struct{ OmittedOriginal }

func (o *OmittedKey) String() string {
	return fmt.Sprintf("%s[%d]@%d (key of %d bytes)", o.Topic, o.Partition, o.Offset, o.Size)
}

// check returns an error unless r's key is the omitted one.
func (o *OmittedKey) check(r *kgo.Record) error {
	sum := sha256.Sum256(r.Key)
	if len(r.Key) != o.Size || hex.EncodeToString(sum[:]) != o.SHA256 {
		return fmt.Errorf("original %s: the record there has a key of %d bytes with another SHA-256: not the failed record", o, len(r.Key))
	}
	return nil
}

// OmittedHeaders are the source record's own headers that NewRecord left
// out of a dead letter because they did not fit the dead-letter topic
// (header causet.dlq.original-headers-omitted): where the record was read,
// and HeadersDigest's count, size and digest of them.
type OmittedHeaders struct {
	Topic     string
	Partition int32
	Offset    int64
	Count     int
	Size      int    // bytes of their keys and values
	SHA256    string // lowercase hex
}

func (o *OmittedHeaders) String() string {
	return fmt.Sprintf("%s[%d]@%d (%d headers, %d bytes)", o.Topic, o.Partition, o.Offset, o.Count, o.Size)
}

// parseOmittedHeaders reads a causet.dlq.original-headers-omitted value,
// "count=N size=B sha256=hex", into o's Count, Size and SHA256. It
// reports false when the value is not in that form.
func parseOmittedHeaders(v string, o *OmittedHeaders) bool {
	count, size := -1, -1
	for _, f := range strings.Fields(v) {
		k, val, _ := strings.Cut(f, "=")
		switch k {
		case "count", "size":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return false
			}
			if k == "count" {
				count = n
			} else {
				size = n
			}
		case "sha256":
			if b, err := hex.DecodeString(val); err != nil || len(b) != sha256.Size {
				return false
			}
			o.SHA256 = val
		}
	}
	o.Count, o.Size = count, size
	return count >= 0 && size >= 0 && o.SHA256 != ""
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

// originalReadTimeout bounds readOriginal's wait for the original record.
const originalReadTimeout = 30 * time.Second

// check returns an error unless r's value is the omitted one.
func (o *OmittedOriginal) check(r *kgo.Record) error {
	sum := sha256.Sum256(r.Value)
	if len(r.Value) != o.Size || !bytes.Equal([]byte(hex.EncodeToString(sum[:])), []byte(o.SHA256)) {
		return fmt.Errorf("original %s: the record there is %d bytes with another SHA-256: not the failed record", o, len(r.Value))
	}
	return nil
}

// check returns an error unless r's headers are the omitted ones.
func (o *OmittedHeaders) check(r *kgo.Record) error {
	if count, size, sum := HeadersDigest(r.Headers); count != o.Count || size != o.Size || sum != o.SHA256 {
		return fmt.Errorf("original %s: the record there has %d headers of %d bytes with another SHA-256: not the failed record", o, count, size)
	}
	return nil
}

// copiedHeaders returns the headers of hs that a dead letter copies.
func copiedHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(hs))
	for _, h := range hs {
		if copiedHeader(h) {
			out = append(out, h)
		}
	}
	return out
}

// originalPlace is where a left-out original was read: an
// *OmittedOriginal or *OmittedHeaders.
type originalPlace interface {
	place() (topic string, partition int32, offset int64)
	String() string
}

func (o *OmittedOriginal) place() (string, int32, int64) { return o.Topic, o.Partition, o.Offset }
func (o *OmittedHeaders) place() (string, int32, int64)  { return o.Topic, o.Partition, o.Offset }

// readOriginal reads the record at o's place with a client built from
// opts, fetching at least size bytes plus 1 MiB at once. It returns an
// error saying so when the topic no longer retains the record, when it is
// gone from the log (compaction), or when Kafka cannot be read within
// 30 s.
func readOriginal(ctx context.Context, opts []kgo.Opt, o originalPlace, size int) (*kgo.Record, error) {
	topic, partition, offset := o.place()
	ctx, cancel := context.WithTimeout(ctx, originalReadTimeout)
	defer cancel()
	// One client: it lists the start offset, and consumes from offset.
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(offset)}}),
		kgo.FetchMaxPartitionBytes(int32(min(size+(1<<20), 1<<30))))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	starts, err := kadm.NewClient(cl).ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("original %s: list start offsets: %w", o, err)
	}
	start, ok := starts.Lookup(topic, partition)
	switch {
	case !ok:
		return nil, fmt.Errorf("original %s: the topic has no such partition", o)
	case start.Err != nil:
		return nil, fmt.Errorf("original %s: list start offsets: %w", o, start.Err)
	case start.Offset > offset:
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
			if r.Offset < offset {
				continue
			}
			if r.Offset > offset {
				return nil, fmt.Errorf("original %s is no longer in the topic (compacted: the next record is at offset %d); the dead letter cannot be replayed", o, r.Offset)
			}
			return r, nil
		}
	}
}
