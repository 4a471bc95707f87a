package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/causet/projection-worker/dlq"
)

// The terminal output of the commands: list's table and JSON lines,
// summary's table and JSON lines, and retry's and skip's dry-run lines. The
// data they show (entries, groups, outcomes) comes from package dlq.

// outcomeLine describes an outcome on one line, as dry runs print it:
// "would replay P:O -> topic[p] (original partition) key=... projection=...
// tenant=... event=... replay-count=N: reason".
func outcomeLine(o dlq.Outcome) string {
	var b strings.Builder
	verb := string(o.Kind)
	switch {
	case o.Kind == dlq.OutcomeSkipped && o.Decided:
		verb = "already skipped" // the ledger's decision, not this run's
	case o.DryRun:
		switch o.Kind {
		case dlq.OutcomeReplayed:
			verb = "would replay"
		case dlq.OutcomeSkipped:
			verb = "would skip"
		}
	}
	fmt.Fprintf(&b, "%s %s", verb, o.Entry.Coordinates())
	if o.Partition >= 0 {
		src := "murmur2(key)"
		if o.FromHeader {
			src = "original partition"
		}
		fmt.Fprintf(&b, " -> %s[%d] (%s)", o.Topic, o.Partition, src)
	}
	fmt.Fprintf(&b, " key=%s projection=%q tenant=%q event=%q replay-count=%d",
		keyText(o.Entry.Key), o.Entry.Message.ProjectionName, o.Entry.TenantSchema, o.Entry.EventType, o.Entry.ReplayCount)
	if o.Reason != "" {
		fmt.Fprintf(&b, ": %s", escapeControls(o.Reason))
	}
	return b.String()
}

// escapeControls writes the control characters of s as Go escapes (\n,
// \t, \x1b): a reason may quote the ledger's actor and reason, which
// skip's --actor and --reason take as given (new-user trial: a reason
// with a newline and an ANSI escape broke the line and coloured the
// terminal).
func escapeControls(s string) string {
	if !strings.ContainsFunc(s, isControlOrBidi) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControlOrBidi(r) {
			q := strconv.QuoteRune(r) // '\n'
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// isControlOrBidi reports whether r is a control character or a
// bidirectional formatting one (U+202E RIGHT-TO-LEFT OVERRIDE reverses how
// the rest of a terminal line shows; fresh-user trial: a record key's came
// through a table cell raw).
func isControlOrBidi(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }

// maxKeyText is the most of a record key an outcome line quotes.
const maxKeyText = 120

// keyText quotes key for an outcome line: whole up to maxKeyText bytes,
// else its first ones and its size (third new-user trial: a 3 MiB key,
// read again for a replay, made one 3 MB line).
func keyText(key []byte) string {
	if len(key) <= maxKeyText {
		return strconv.Quote(string(key))
	}
	k := key[:maxKeyText]
	for len(k) > 0 && !utf8.RuneStart(key[len(k)]) {
		k = k[:len(k)-1]
	}
	return strconv.Quote(string(k)) + fmt.Sprintf("…(%d bytes)", len(key))
}

// writeSummaryTable writes the groups of s as an aligned table: COUNT,
// REPLAYED and SKIPPED (by their newest ledger decision), the grouping key
// (never cut, unless it is an error text; by error, without a leading
// `projection "<p>": ` when the group has that one projection),
// PROJECTIONS (unless the key is the projection) and the first line of a
// SAMPLE ERROR (unless the key is the error; without that prefix too),
// cut with an ellipsis (an error key in its middle, keeping both ends) so
// that lines fit width columns; wide (width 0) adds FIRST FAILED and LAST
// FAILED (dlq.Group's; UTC, RFC 3339) and cuts only very long cells.
func writeSummaryTable(w io.Writer, s *dlq.Summary, width int, wide bool) error {
	key := strings.ToUpper(string(s.By()))
	t := newTable(width, col("COUNT"), col("REPLAYED"), col("SKIPPED"), wideCol("FIRST FAILED", wide), wideCol("LAST FAILED", wide),
		// The key is what the groups are told apart by: cut only when it is
		// an error text (a fingerprint, tenant schema or projection name is
		// at most 63 characters; second new-user trial: tenants of a long
		// common prefix looked alike).
		column{name: key, shrink: s.By() == dlq.GroupByError, cutMiddle: s.By() == dlq.GroupByError},
		// By projection, each group's projections are its key (new-user
		// trial: PROJECTION and PROJECTIONS side by side).
		column{name: "PROJECTIONS", shrink: true, hidden: s.By() == dlq.GroupByProjection},
		// By error, the key is the sample's first line (new-user trial: both
		// cut to ~23 characters side by side, rows could not be told apart).
		column{name: "SAMPLE ERROR", shrink: true, hidden: s.By() == dlq.GroupByError})
	type row struct {
		g           dlq.Group
		key, sample string
	}
	var rows []row
	for _, g := range s.Groups() {
		key, sample := g.Key, firstLine(g.SampleError)
		if len(g.Projections) == 1 { // PROJECTIONS (or the key) names it
			sample = errorCell(g.Projections[0], sample)
			if s.By() == dlq.GroupByError {
				key = errorCell(g.Projections[0], key)
			}
		}
		rows = append(rows, row{g, key, sample})
	}
	// Largest first, then by the key as shown (third new-user trial: by
	// error, ties came in the order of the keys' hidden projection
	// prefixes, and looked shuffled).
	slices.SortStableFunc(rows, func(a, b row) int {
		if c := cmp.Compare(b.g.Count, a.g.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	for _, r := range rows {
		g := r.g
		t.add(strconv.Itoa(g.Count), strconv.Itoa(g.Replayed), strconv.Itoa(g.Skipped), fmtMillis(g.FirstFailedAt), fmtMillis(g.LastFailedAt),
			cell(orDash(r.key), 160), cell(joinDash(g.Projections), 60), cell(r.sample, 160))
	}
	return t.write(w)
}

// writeSummaryJSON writes one JSON object per group per line, largest
// first: "by" and the fields of dlq.Group.
func writeSummaryJSON(w io.Writer, s *dlq.Summary) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, g := range s.Groups() {
		g.Projections = append(make([]string, 0, len(g.Projections)), g.Projections...)
		if err := enc.Encode(struct {
			By dlq.GroupBy `json:"by"`
			dlq.Group
		}{s.By(), g}); err != nil {
			return err
		}
	}
	return nil
}

// listWriter writes dead letters for list, as a table or as JSON lines.
type listWriter struct {
	json bool
	w    io.Writer
	t    *table
}

// newListWriter returns a writer of format "table" or "json" to w.
//
// Table columns: DLQ (partition:offset), FAILED AT (UTC), PROJECTION,
// TENANT, LEDGER (replayed, skipped or —) and the first line of the ERROR
// (without a leading `projection "<p>": ` naming the row's projection),
// the long ones cut with an ellipsis so that lines fit width columns; wide
// (width 0) adds EVENT TYPE, ENTITY (the record key), RETRIES (retryCount),
// REPLAYS (replay count) and FINGERPRINT, and cuts only cells beyond 160
// runes (the error's first line) or 60 (names).
// JSON: one object per line, the dead-letter message's fields plus
// dlqPartition, dlqOffset, key, forkId, eventType, fingerprint, errorClass,
// sqlstate, originalPartition (-1 when unknown), replayCount, ledgerStatus
// ("replayed", "skipped" or "") and ledger (the decision, or null), for jq.
func newListWriter(w io.Writer, format string, width int, wide bool) (*listWriter, error) {
	switch format {
	case "json":
		return &listWriter{json: true, w: w}, nil
	case "table", "":
		return &listWriter{w: w, t: newTable(width, col("DLQ"), col("FAILED AT"), shrinkCol("PROJECTION"), shrinkCol("TENANT"),
			wideCol("EVENT TYPE", wide), wideCol("ENTITY", wide), wideCol("RETRIES", wide), wideCol("REPLAYS", wide),
			col("LEDGER"), wideCol("FINGERPRINT", wide), shrinkCol("ERROR"))}, nil
	}
	return nil, fmt.Errorf("output format %q is not table or json", format)
}

// write writes one entry with its ledger decision (nil when it has none).
func (lw *listWriter) write(e *dlq.Entry, d *dlq.Decision) error {
	status := ""
	if d != nil {
		status = d.Action
	}
	if lw.json {
		var key, keyBase64 *string
		if e.Key != nil {
			k := string(e.Key)
			key = &k
			if !utf8.Valid(e.Key) {
				// JSON text would replace its bytes with U+FFFD (fresh-user
				// trial: a key ff fe 6b 65 79 read "\ufffd\ufffdkey").
				b := base64.StdEncoding.EncodeToString(e.Key)
				keyBase64 = &b
			}
		}
		// Message has its own MarshalJSON (which keeps originalEvent byte
		// for byte); the list fields are written first and the message's
		// fields spliced in after them.
		msg, err := e.Message.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encode dead letter %s: %w", e.Coordinates(), err)
		}
		if bytes.ContainsAny(msg, "\n\r") {
			// One line per dead letter: an original written over several
			// lines (or ending in a newline) is compacted here; its bytes
			// stay as they are in the dead letter and in a replay.
			var b bytes.Buffer
			if err := json.Compact(&b, msg); err != nil {
				return fmt.Errorf("encode dead letter %s: %w", e.Coordinates(), err)
			}
			msg = b.Bytes()
		}
		head, err := json.Marshal(struct {
			DLQPartition      int32         `json:"dlqPartition"`
			DLQOffset         int64         `json:"dlqOffset"`
			Key               *string       `json:"key"`
			KeyBase64         *string       `json:"keyBase64,omitempty"`
			ForkID            string        `json:"forkId"`
			EventType         string        `json:"eventType"`
			Fingerprint       string        `json:"fingerprint"`
			ErrorClass        string        `json:"errorClass"`
			SQLState          string        `json:"sqlstate"`
			OriginalPartition int32         `json:"originalPartition"`
			ReplayCount       int           `json:"replayCount"`
			LedgerStatus      string        `json:"ledgerStatus"`
			Ledger            *dlq.Decision `json:"ledger"`
		}{e.Partition, e.Offset, key, keyBase64, e.ForkID, e.EventType, e.Fingerprint, e.ErrorClass, e.SQLState,
			e.OriginalPartition, e.ReplayCount, status, d})
		if err != nil {
			return err
		}
		line := make([]byte, 0, len(head)+len(msg)+1)
		line = append(line, head[:len(head)-1]...)
		line = append(line, ',')
		line = append(line, msg[1:]...)
		line = append(line, '\n')
		_, err = lw.w.Write(line)
		return err
	}
	entity := "—"
	if e.Key != nil {
		entity = string(e.Key)
	}
	lw.t.add(e.Coordinates().String(), fmtMillis(e.Message.FailedAt), cell(orDash(e.Projection), 60), cell(orDash(e.TenantSchema), 63),
		cell(orDash(e.EventType), 60), cell(entity, 60), strconv.Itoa(e.Message.RetryCount), strconv.Itoa(e.ReplayCount), orDash(status),
		orDash(e.Fingerprint), cell(errorCell(e.Projection, e.Message.Error), 160))
	return nil
}

// errorCell is the first line of a dead letter's error for the list's
// ERROR column, without its leading `projection "<projection>": ` or
// `apply <event type> to <projection>: ` when it names the row's own
// projection, which has a column of its own (new-user trials: at 100
// columns the cell read `projection "artist_fo…` and nothing of the
// reason; two connection failures both read `apply ARTIST_FOLLOWED to
// artist_follo…`).
func errorCell(projection, msg string) string {
	line := firstLine(msg)
	if projection == "" {
		return line
	}
	if rest, ok := strings.CutPrefix(line, "projection "+strconv.Quote(projection)+": "); ok && rest != "" {
		return rest
	}
	if rest, ok := strings.CutPrefix(line, "apply "); ok {
		if _, rest, ok := strings.Cut(rest, " to "+projection+": "); ok && rest != "" {
			return rest
		}
	}
	return line
}

// flush writes out a table; JSON lines are written as they come.
func (lw *listWriter) flush() error {
	if lw.t != nil {
		return lw.t.write(lw.w)
	}
	return nil
}

// fmtMillis formats epoch ms as RFC 3339 in UTC, 0 as —.
func fmtMillis(ms int64) string {
	if ms == 0 {
		return "—"
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// joinDash joins projection names with commas. "" (a record that reached
// no projection) is — alone and "(none)" in a list, where — read as a
// projection of that name (new-user trial: "—,artist_followers").
func joinDash(names []string) string {
	if len(names) == 1 {
		return orDash(names[0])
	}
	out := make([]string, len(names))
	for i, n := range names {
		if out[i] = n; n == "" {
			out[i] = "(none)"
		}
	}
	return strings.Join(out, ",")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}

// tableWidth is the width the tables fit by default: 100 columns, or the
// terminal's width when out is a narrower terminal.
func tableWidth(out io.Writer) int {
	const width = 100
	if f, ok := out.(*os.File); ok {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 && w < width {
			return w
		}
	}
	return width
}

// column is a column of a table.
type column struct {
	name string
	// shrink: the column may be cut to make lines fit.
	shrink bool
	// hidden: the column is not shown (its cells are given all the same).
	hidden bool
	// cutMiddle: a cut keeps both ends of a cell, the ellipsis between
	// (error texts told apart by their ends).
	cutMiddle bool
}

func col(name string) column       { return column{name: name} }
func shrinkCol(name string) column { return column{name: name, shrink: true} }

// wideCol is a column shown only in wide tables.
func wideCol(name string, wide bool) column { return column{name: name, hidden: !wide} }

// table is a text table: columns separated by two spaces, each as wide as
// its widest cell, except that when lines would be wider than width (0:
// no limit) the shrinkable columns are narrowed, the widest first, never
// below their header, and their cells cut with an ellipsis. Rows are kept
// until write.
type table struct {
	width int
	cols  []column
	rows  [][]string
}

func newTable(width int, cols ...column) *table {
	return &table{width: width, cols: cols}
}

// add adds a row: one cell per column, hidden ones included. Cells must
// be free of tabs and control characters (cell).
func (t *table) add(cells ...string) {
	t.rows = append(t.rows, cells)
}

// write writes the header and the rows to w.
func (t *table) write(w io.Writer) error {
	var show []int
	for i, c := range t.cols {
		if !c.hidden {
			show = append(show, i)
		}
	}
	widths := make([]int, len(show))
	for j, i := range show {
		widths[j] = utf8.RuneCountInString(t.cols[i].name)
		for _, r := range t.rows {
			widths[j] = max(widths[j], utf8.RuneCountInString(r[i]))
		}
	}
	if t.width > 0 {
		excess := -t.width + 2*(len(show)-1)
		for _, n := range widths {
			excess += n
		}
		for ; excess > 0; excess-- {
			widest := -1
			for j, i := range show {
				if t.cols[i].shrink && widths[j] > utf8.RuneCountInString(t.cols[i].name) && (widest < 0 || widths[j] > widths[widest]) {
					widest = j
				}
			}
			if widest < 0 {
				break // nothing left to narrow
			}
			widths[widest]--
		}
	}
	bw := bufio.NewWriter(w)
	// The cut cells of the key columns (cutMiddle) that two different
	// cells were cut to: their rows look alike (operator trial: two error
	// texts that differed only in their middle).
	cutTo := map[string]string{}
	alike := false
	line := func(cells []string) {
		var b strings.Builder
		for j, i := range show {
			s := cells[i]
			if utf8.RuneCountInString(s) > widths[j] {
				if t.cols[i].cutMiddle {
					s = cellMiddle(s, widths[j])
					if full, seen := cutTo[s]; seen && full != cells[i] {
						alike = true
					}
					cutTo[s] = cells[i]
				} else {
					s = cell(s, widths[j])
				}
			}
			b.WriteString(s)
			if j < len(show)-1 {
				b.WriteString(strings.Repeat(" ", widths[j]-utf8.RuneCountInString(s)+2))
			}
		}
		bw.WriteString(strings.TrimRight(b.String(), " "))
		bw.WriteByte('\n')
	}
	header := make([]string, len(t.cols))
	for i, c := range t.cols {
		header[i] = c.name
	}
	line(header)
	for _, r := range t.rows {
		line(r)
	}
	if alike {
		bw.WriteString("(rows cut alike differ in the part cut out: --wide or --output json shows them whole)\n")
	}
	return bw.Flush()
}

// cell makes s fit a table cell: no tabs, control characters or
// bidirectional formatting ones (isControlOrBidi), at most n runes (an
// ellipsis marks a cut).
func cell(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if isControlOrBidi(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// cellMiddle is cell that, to cut s, keeps its first and last runes, about
// half of n each, with an ellipsis between.
func cellMiddle(s string, n int) string {
	s = cell(s, utf8.RuneCountInString(s)) // no control characters
	r := []rune(s)
	if len(r) <= n || n < 3 {
		return cell(s, n)
	}
	head := (n - 1) / 2
	return string(r[:head]) + "…" + string(r[len(r)-(n-1-head):])
}
