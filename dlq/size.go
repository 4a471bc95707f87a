package dlq

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
)

// recordSize is the size kgo counts for rec alone in a record batch, which
// is what it compares with ProducerBatchMaxBytes and what the broker
// compares with max.message.bytes (within kgo's 4 extra bytes): the batch
// framing plus the record's length-prefixed encoding.
func recordSize(rec *kgo.Record) int {
	l := 1 + // attributes
		kbin.VarlongLen(0) + // timestamp delta
		kbin.VarintLen(0) + // offset delta
		kbin.VarintLen(int32(len(rec.Key))) + len(rec.Key) +
		kbin.VarintLen(int32(len(rec.Value))) + len(rec.Value) +
		kbin.VarintLen(int32(len(rec.Headers)))
	for _, h := range rec.Headers {
		l += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) +
			kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + kbin.VarintLen(int32(l)) + l
}

// cutter shortens one message field step by step: whole, then a prefix
// with a marker, then the marker alone, then "".
type cutter struct {
	full  string
	keep  int  // bytes of full kept while cut
	cut   bool // a prefix (possibly empty) and the marker
	empty bool
}

func (c *cutter) value() string {
	switch {
	case c.empty:
		return ""
	case c.cut:
		return truncate(c.full, c.keep)
	}
	return c.full
}

// shrink cuts at least excess more bytes, reporting false when the field
// is already "" and nothing more can be cut.
func (c *cutter) shrink(excess int) bool {
	switch {
	case c.empty || c.full == "":
		return false
	case c.cut && c.keep == 0:
		c.empty = true
	case c.cut:
		c.keep = max(0, c.keep-excess)
	default:
		c.cut = true
		c.keep = max(0, len(c.full)-excess)
	}
	return true
}

// truncatedFields is the causet.dlq.truncated value: the names of the
// fields cut so far, or "".
func truncatedFields(stack, errField *cutter) string {
	var names []string
	if stack.cut || stack.empty {
		names = append(names, "stackTrace")
	}
	if errField.cut || errField.empty {
		names = append(names, "error")
	}
	return strings.Join(names, ",")
}

// truncate returns s cut to at most keep bytes on a rune boundary,
// followed by "…[truncated N bytes]" with N the number of bytes cut.
func truncate(s string, keep int) string {
	keep = max(0, min(keep, len(s)))
	for keep > 0 && keep < len(s) && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + "…[truncated " + strconv.Itoa(len(s)-keep) + " bytes]"
}
