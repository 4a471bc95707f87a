package dlq

import (
	"bytes"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Filters select dead letters (SPEC §7). Every non-zero field must match
// (AND); the zero value selects everything. String fields compare exactly
// with the entry's context (causet.dlq.* headers, falling back to the
// message, see Entry); "" means no filter, so entries with an empty value
// (an input error has no projection) cannot be selected by that value.
type Filters struct {
	// ForkID selects dead letters of one fork (causet.dlq.fork-id).
	ForkID string
	// Projection selects one projection (causet.dlq.projection).
	Projection string
	// TenantSchema selects one tenant schema (causet.dlq.tenant-schema).
	TenantSchema string
	// EventType selects one event type (causet.dlq.event-type).
	EventType string
	// ErrorContains selects dead letters whose error message contains it,
	// ignoring case.
	ErrorContains string
	// Fingerprint selects one failure group (causet.dlq.fingerprint, 16 hex
	// digits, case ignored).
	Fingerprint string
	// Since and Until select dead letters by failedAt: Since ≤ failedAt <
	// Until; a zero time is no bound.
	Since, Until time.Time
}

// IsZero reports whether f selects everything.
func (f Filters) IsZero() bool { return f == Filters{} }

// Match reports whether e passes every filter.
func (f Filters) Match(e *Entry) bool {
	switch {
	case f.ForkID != "" && !labelMatches(e.ForkID, f.ForkID),
		f.Projection != "" && e.Projection != f.Projection,
		f.TenantSchema != "" && e.TenantSchema != f.TenantSchema,
		f.EventType != "" && !labelMatches(e.EventType, f.EventType),
		f.Fingerprint != "" && !strings.EqualFold(e.Fingerprint, f.Fingerprint),
		!f.Since.IsZero() && e.Message.FailedAt < f.Since.UnixMilli(),
		!f.Until.IsZero() && e.Message.FailedAt >= f.Until.UnixMilli():
		return false
	case f.ErrorContains != "":
		return strings.Contains(strings.ToLower(e.Message.Error), strings.ToLower(f.ErrorContains))
	}
	return true
}

// LogValue lists the filters that are set, for logs.
func (f Filters) LogValue() slog.Value {
	var as []slog.Attr
	add := func(k, v string) {
		if v != "" {
			as = append(as, slog.String(k, v))
		}
	}
	add("fork_id", f.ForkID)
	add("projection", f.Projection)
	add("tenant_schema", f.TenantSchema)
	add("event_type", f.EventType)
	add("error_contains", f.ErrorContains)
	add("fingerprint", f.Fingerprint)
	if !f.Since.IsZero() {
		as = append(as, slog.Time("since", f.Since))
	}
	if !f.Until.IsZero() {
		as = append(as, slog.Time("until", f.Until))
	}
	return slog.GroupValue(as...)
}

// durationDigits is what time.ParseDuration reads as a duration,
// whatever its size: numbers with units.
var durationDigits = regexp.MustCompile(`^(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+$`)

// ParseTimeBound parses a --since/--until value: an RFC 3339 time
// ("2024-06-25T12:00:00Z") or a positive Go duration ("24h", "90m")
// meaning that long before now. Its errors say which it is not; a
// duration beyond time.Duration's range (about 292 years) gets its own.
func ParseTimeBound(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil && strings.Contains(err.Error(), "invalid duration") && durationDigits.MatchString(s):
		// Read as a duration, too long for one (second new-user trial:
		// "not a positive duration" for 99999999999h).
		return time.Time{}, fmt.Errorf("%q is a duration longer than Go's limit of about 292 years: give an RFC 3339 time instead", s)
	case err != nil || d <= 0:
		// 0s would select nothing at all (--since) or everything before now.
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2024-06-25T12:00:00Z) nor a positive duration (24h)", s)
	}
	return now.Add(-d), nil
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

// headerReject reports whether a header that is present already fails a
// filter, so the value need not be decoded.
func (s *selector) headerReject(hv *headerValues) bool {
	f := &s.f
	return f.Projection != "" && hv.hasProjection && hv.projection != f.Projection ||
		f.TenantSchema != "" && hv.hasTenant && hv.tenant != f.TenantSchema ||
		f.ForkID != "" && hv.hasFork && !labelMatches(hv.fork, f.ForkID) ||
		f.EventType != "" && hv.hasEventType && !labelMatches(hv.eventType, f.EventType) ||
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

// labelMatches reports whether the forkId or eventType h of a dead letter
// is want: equal, or, when h is a header's text cut by CapLabel (its first
// bytes and "…[truncated N bytes]") and the dead letter carries no
// original event to read it whole from (newEntry), cut from it (replayer
// trial: --fork-id with a 320-byte forkId matched none of its dead
// letters, whose header held its first 226 bytes and the marker).
func labelMatches(h, want string) bool {
	if h == want {
		return true
	}
	kept, n, ok := cutLabel(h)
	return ok && len(want) == len(kept)+n && strings.HasPrefix(want, kept)
}

// cutLabel returns the bytes CapLabel kept of a label, and how many it
// cut, when h is its text for a label longer than maxLabelBytes.
func cutLabel(h string) (kept string, n int, ok bool) {
	const open, end = "…[truncated ", " bytes]"
	if len(h) > maxLabelBytes || !strings.HasSuffix(h, end) {
		return "", 0, false
	}
	i := strings.LastIndex(h, open)
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(h[i+len(open) : len(h)-len(end)])
	if err != nil || i < labelKeep-(utf8.UTFMax-1) || i > labelKeep || i+n <= maxLabelBytes {
		return "", 0, false
	}
	return h[:i], n, true
}
