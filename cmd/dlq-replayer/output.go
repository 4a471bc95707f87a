package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

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
	if o.DryRun {
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
	fmt.Fprintf(&b, " key=%q projection=%q tenant=%q event=%q replay-count=%d",
		o.Entry.Key, o.Entry.Message.ProjectionName, o.Entry.TenantSchema, o.Entry.EventType, o.Entry.ReplayCount)
	if o.Reason != "" {
		fmt.Fprintf(&b, ": %s", o.Reason)
	}
	return b.String()
}

// writeSummaryTable writes the groups of s as an aligned table: COUNT,
// FIRST FAILED, LAST FAILED (UTC, RFC 3339), the grouping key, PROJECTIONS
// and the first line of a SAMPLE ERROR.
func writeSummaryTable(w io.Writer, s *dlq.Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "COUNT\tFIRST FAILED\tLAST FAILED\t%s\tPROJECTIONS\tSAMPLE ERROR\n", strings.ToUpper(string(s.By())))
	for _, g := range s.Groups() {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", g.Count, fmtMillis(g.FirstFailedAt), fmtMillis(g.LastFailedAt),
			cell(orDash(g.Key), 80), cell(joinDash(g.Projections), 60), cell(firstLine(g.SampleError), 160))
	}
	return tw.Flush()
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
	tw   *tabwriter.Writer
}

// newListWriter returns a writer of format "table" or "json" to w.
//
// Table columns: DLQ (partition:offset), FAILED AT (UTC), PROJECTION,
// TENANT, EVENT TYPE, ENTITY (the record key), RETRIES (retryCount),
// REPLAYS (replay count), LEDGER (replayed, skipped or —) and the first line
// of the ERROR. JSON: one object per line, the dead-letter message's fields
// plus dlqPartition, dlqOffset, key, forkId, eventType, fingerprint,
// errorClass, sqlstate, originalPartition (-1 when unknown), replayCount,
// ledgerStatus ("replayed", "skipped" or "") and ledger (the decision, or
// null), for jq.
func newListWriter(w io.Writer, format string) (*listWriter, error) {
	switch format {
	case "json":
		return &listWriter{json: true, w: w}, nil
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DLQ\tFAILED AT\tPROJECTION\tTENANT\tEVENT TYPE\tENTITY\tRETRIES\tREPLAYS\tLEDGER\tERROR")
		return &listWriter{tw: tw}, nil
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
		var key *string
		if e.Key != nil {
			k := string(e.Key)
			key = &k
		}
		// Message has its own MarshalJSON (which keeps originalEvent byte
		// for byte); the list fields are written first and the message's
		// fields spliced in after them.
		msg, err := e.Message.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encode dead letter %s: %w", e.Coordinates(), err)
		}
		head, err := json.Marshal(struct {
			DLQPartition      int32         `json:"dlqPartition"`
			DLQOffset         int64         `json:"dlqOffset"`
			Key               *string       `json:"key"`
			ForkID            string        `json:"forkId"`
			EventType         string        `json:"eventType"`
			Fingerprint       string        `json:"fingerprint"`
			ErrorClass        string        `json:"errorClass"`
			SQLState          string        `json:"sqlstate"`
			OriginalPartition int32         `json:"originalPartition"`
			ReplayCount       int           `json:"replayCount"`
			LedgerStatus      string        `json:"ledgerStatus"`
			Ledger            *dlq.Decision `json:"ledger"`
		}{e.Partition, e.Offset, key, e.ForkID, e.EventType, e.Fingerprint, e.ErrorClass, e.SQLState,
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
	_, err := fmt.Fprintf(lw.tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n",
		e.Coordinates(), fmtMillis(e.Message.FailedAt), cell(orDash(e.Projection), 60), cell(orDash(e.TenantSchema), 63),
		cell(orDash(e.EventType), 60), cell(entity, 60), e.Message.RetryCount, e.ReplayCount, orDash(status),
		cell(firstLine(e.Message.Error), 160))
	return err
}

// flush writes out a table; JSON lines are written as they come.
func (lw *listWriter) flush() error {
	if lw.tw != nil {
		return lw.tw.Flush()
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

// joinDash joins names with commas, "" written as —.
func joinDash(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = orDash(n)
	}
	return strings.Join(out, ",")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}

// cell makes s fit a table cell: no tabs or control characters, at most n
// runes (an ellipsis marks a cut).
func cell(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
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
