package dlq

import (
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ReplayPartitioner chooses the events-topic partition a replayed event is
// written to (SPEC §2): the partition the event was first read from (header
// causet.dlq.original-partition) whatever partitioner its producer used
// (kcat and librdkafka hash keys with CRC32, Java and franz-go with murmur2),
// so the entity keeps its order with its newer events; only when that header
// is missing, unreadable or names a partition the topic no longer has does
// it hash the key as Kafka's Java client does (murmur2, high bit masked, mod
// the partition count). A record without a key and without the header goes
// to a partition picked by kgo's sticky partitioner.
//
// The producer that writes the records must use kgo.ManualPartitioner, since
// the partition is set on the record. A ReplayPartitioner is safe for
// concurrent use.
type ReplayPartitioner struct {
	partitions int32

	mu     sync.Mutex
	hasher kgo.TopicPartitioner // murmur2 on the key; sticky for nil keys
}

// NewReplayPartitioner returns a partitioner for an events topic that has
// partitions partitions (its current count, which must be ≥ 1).
func NewReplayPartitioner(partitions int32) *ReplayPartitioner {
	return &ReplayPartitioner{
		partitions: partitions,
		hasher:     kgo.StickyKeyPartitioner(nil).ForTopic(""),
	}
}

// Partitions returns the partition count the partitioner was built for.
func (p *ReplayPartitioner) Partitions() int32 { return p.partitions }

// Partition returns the partition for a replayed event. originalPartition
// is the value of the causet.dlq.original-partition header, or -1 when the
// header is absent; key is the record key. fromHeader reports whether the
// original partition was used (false: the key was hashed).
func (p *ReplayPartitioner) Partition(originalPartition int32, key []byte) (partition int32, fromHeader bool) {
	if originalPartition >= 0 && originalPartition < p.partitions {
		return originalPartition, true
	}
	return p.Hash(key), false
}

// Hash returns the partition Kafka's default partitioner (murmur2 of the key,
// as in the Java client and kgo.StickyKeyPartitioner(nil)) picks for key.
func (p *ReplayPartitioner) Hash(key []byte) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int32(p.hasher.Partition(&kgo.Record{Key: key}, int(p.partitions)))
}

// parseOriginalPartition reads the causet.dlq.original-partition header
// value: a decimal int32 ≥ 0, else -1.
func parseOriginalPartition(v []byte) int32 {
	n, err := strconv.ParseInt(string(v), 10, 32)
	if err != nil || n < 0 {
		return -1
	}
	return int32(n)
}
