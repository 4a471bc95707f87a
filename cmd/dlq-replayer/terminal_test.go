package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/retry"
)

// addMany writes n dead letters as the worker does, in one produce: n/2
// of projection artist_followers and n/2 of artist_stats.
func (f *fixture) addMany(t *testing.T, n int) {
	t.Helper()
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		key := "user-" + strconv.Itoa(i)
		projection, err := "artist_followers", error(columnErr)
		if i%2 == 1 {
			projection, err = "artist_stats", retry.MarkPermanent(fmt.Errorf("derive score: division by zero"))
		}
		value := fmt.Appendf(nil, `{"eventType":"ARTIST_FOLLOWED","entityId":%q,"forkId":"production","tenantSchema":"acme_prod","irVersion":"v42","sequenceNumber":1,"ts":1719331200000,"payload":{"user_id":%q,"artist_id":"a-1"}}`, key, key)
		rec, nerr := dlq.NewRecord(dlq.DeadLetter{
			Source:     &kgo.Record{Topic: f.events, Partition: 2, Offset: int64(i), Key: []byte(key), Value: value},
			Projection: projection, TenantSchema: "acme_prod", ForkID: "production", EventType: "ARTIST_FOLLOWED",
			Class: retry.Classify(err), Err: err, Retries: 5,
		}, dlq.RecordConfig{Topic: f.dlqTopic}, t0.Add(time.Duration(i)*time.Second))
		if nerr != nil {
			t.Fatal(nerr)
		}
		recs = append(recs, rec)
	}
	if err := f.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// onTerminal runs the command with stdout and stderr on one pseudo-terminal
// of cols columns, as in an operator's shell, and returns its exit status
// and every byte it wrote there.
func onTerminal(t *testing.T, e env, cols uint16, args ...string) (int, []byte) {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("a pseudo-terminal is required when CI is set: %v", err)
		}
		t.Skipf("no pseudo-terminal (with CI=true this fails): %v", err)
	}
	defer ptmx.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	const end = "\x00end of output\x00"
	var out bytes.Buffer
	read := make(chan error, 1)
	go func() { // owned by onTerminal: ends at the end marker or a read error
		buf := make([]byte, 64<<10)
		for !bytes.Contains(out.Bytes(), []byte(end)) {
			n, err := ptmx.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				read <- err
				return
			}
		}
		read <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, tty, tty, e.lookup)
	fmt.Fprint(tty, end)
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("read the terminal: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the end marker did not come through the terminal within 30s")
	}
	tty.Close()
	b, _, _ := bytes.Cut(out.Bytes(), []byte(end))
	return code, b
}

// screen is what a terminal of a given width shows after the bytes were
// written to it: the lines, trailing blanks removed. It knows carriage
// return, line feed, backspace, automatic wrap at the last column and
// "erase in line" (CSI K, CSI 1 K, CSI 2 K); any other control sequence
// is reported, so that the test learns of output it cannot judge.
func screen(t *testing.T, b []byte, width int) []string {
	t.Helper()
	var rows [][]rune
	x, y, wrap := 0, 0, false
	row := func() []rune {
		for len(rows) <= y {
			rows = append(rows, []rune(strings.Repeat(" ", width)))
		}
		return rows[y]
	}
	for s := string(b); s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		s = s[n:]
		switch {
		case r == '\r':
			x, wrap = 0, false
		case r == '\n':
			y++
			wrap = false
		case r == '\b':
			x, wrap = max(0, x-1), false
		case r == 0x1b:
			m := regexp.MustCompile(`^\[([0-9;?]*)([@-~])`).FindStringSubmatch(s)
			if m == nil || m[2] != "K" {
				t.Errorf("the terminal got a control sequence this test does not know: %q", s[:min(len(s), 10)])
				if m != nil {
					s = s[len(m[0]):]
				}
				continue
			}
			s = s[len(m[0]):]
			line := row()
			from, to := x, width
			switch m[1] {
			case "1":
				from, to = 0, x+1
			case "2":
				from = 0
			}
			for i := from; i < min(to, width); i++ {
				line[i] = ' '
			}
		case r < ' ' || r == 0x7f:
			t.Errorf("the terminal got control character %q", r)
		default:
			if wrap {
				x, y, wrap = 0, y+1, false
			}
			row()[x] = r
			if x == width-1 {
				wrap = true
			} else {
				x++
			}
		}
	}
	lines := make([]string, len(rows))
	for i, r := range rows {
		lines[i] = strings.TrimRight(string(r), " ")
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

var percentRE = regexp.MustCompile(`(\d+)%`)

// barPercents returns the percentages the progress bar showed, in order.
func barPercents(out []byte) []int {
	var p []int
	for _, m := range percentRE.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(m[1]))
		p = append(p, n)
	}
	return p
}

// TestTerminalShowsAMovingBarThenATableThatFits runs list, summary and a
// dry run on a pseudo-terminal 120 columns wide over 5 000 dead letters
// (issue 12): the bar shows percentages between 0 and 100 while the dead
// letters are read; it is cleared, so that no bar text is left on screen
// and the table starts at the top left, its header at column 0; the
// default table is at most 100 columns wide; and no JSON log line lands on
// the terminal.
func TestTerminalShowsAMovingBarThenATableThatFits(t *testing.T) {
	f := newFixture(t, kafkatest.New(t))
	// The ledger topic exists, as the worker makes it at start: the screen
	// holds the table alone, without the warning of a missing ledger.
	f.b.CreateTopic(t, f.ledger, 1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")})
	const n = 5000
	f.addMany(t, n)
	const cols = 120
	barText := regexp.MustCompile(`reading|\d+%|dead letters/`)

	checkBar := func(t *testing.T, out []byte) {
		t.Helper()
		ps := barPercents(out)
		var between int
		for _, p := range ps {
			if p > 0 && p < 100 {
				between++
			}
		}
		if between < 10 {
			t.Errorf("the bar showed %d percentages between 0 and 100 (all: %v), want it to move with the records read", between, ps)
		}
	}
	checkScreen := func(t *testing.T, lines []string, header string, rows int) {
		t.Helper()
		if len(lines) != rows+1 {
			t.Fatalf("the screen has %d lines, want the %d of the table; first lines:\n%s", len(lines), rows+1, strings.Join(lines[:min(len(lines), 5)], "\n"))
		}
		if !strings.HasPrefix(lines[0], header) {
			t.Errorf("the first line of the screen is %q, want the table header %q at column 0", lines[0], header)
		}
		for i, l := range lines {
			if barText.MatchString(l) {
				t.Errorf("line %d still shows the progress bar: %q", i, l)
			}
			if w := utf8.RuneCountInString(l); w > 100 {
				t.Errorf("line %d is %d columns wide, want <= 100: %q", i, w, l)
			}
			if strings.HasPrefix(l, "{") {
				t.Errorf("line %d is a JSON log line: %q", i, l)
			}
		}
	}

	t.Run("list", func(t *testing.T) {
		code, out := onTerminal(t, f.env, cols, "list", "--all")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkBar(t, out)
		lines := screen(t, out, cols)
		checkScreen(t, lines, "DLQ ", n)
		if !strings.HasSuffix(lines[1], "…") {
			t.Errorf("the long error is not cut with an ellipsis: %q", lines[1])
		}
	})
	t.Run("list --limit", func(t *testing.T) {
		// The scan stops early: the bar never reaches 100 % and must be
		// cleared all the same before the table.
		code, out := onTerminal(t, f.env, cols, "list", "--all", "--limit", "3")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		// The table, then a line that says it was cut (new-user trial:
		// the cut list looked whole).
		lines := screen(t, out, cols)
		if last := lines[len(lines)-1]; last != "the first 3 listed (--limit 3): more may match; summary counts them all" {
			t.Errorf("last line %q, want it to say the list was cut at --limit 3", last)
		}
		checkScreen(t, lines[:len(lines)-1], "DLQ ", 3)
	})
	t.Run("summary", func(t *testing.T) {
		code, out := onTerminal(t, f.env, cols, "summary", "--all")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkBar(t, out)
		checkScreen(t, screen(t, out, cols), "COUNT  REPLAYED  SKIPPED  FINGERPRINT ", 2)
	})
	t.Run("narrow terminal", func(t *testing.T) {
		code, out := onTerminal(t, f.env, 80, "summary", "--all")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkBar(t, out)
		lines := screen(t, out, 80)
		checkScreen(t, lines, "COUNT  REPLAYED  SKIPPED  FINGERPRINT ", 2)
		for i, l := range lines {
			if w := utf8.RuneCountInString(l); w > 80 {
				t.Errorf("line %d is %d columns wide on an 80-column terminal, want the table to fit: %q", i, w, l)
			}
		}
	})
	t.Run("very narrow terminal", func(t *testing.T) {
		// The bar drops its times, count and description to stay on one
		// line: a line that wraps could not be cleared.
		code, out := onTerminal(t, f.env, 30, "summary", "--all")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkBar(t, out)
		for i, l := range screen(t, out, 30) {
			if barText.MatchString(l) || strings.Contains(l, "█") {
				t.Errorf("line %d still shows the progress bar: %q", i, l)
			}
		}
	})
	t.Run("dry run", func(t *testing.T) {
		code, out := onTerminal(t, f.env, cols, "retry", "--all", "--dry-run")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkBar(t, out)
		lines := screen(t, out, cols)
		var would int
		for i, l := range lines {
			if barText.MatchString(l) {
				t.Errorf("line %d still shows the progress bar: %q", i, l)
			}
			if strings.HasPrefix(l, "would replay ") {
				would++
			}
		}
		want := fmt.Sprintf("matched=%d would-replay=%d skipped=0 already-replayed=0 already-skipped=0 refused=0 failed=0 (dry run: nothing sent or recorded)", n, n)
		last := lines[len(lines)-1]
		if len(want) > cols { // the terminal wraps it, at a space the screen trims
			last = strings.Join(strings.Fields(lines[len(lines)-2]+" "+last), " ")
		}
		if would != n || last != want {
			t.Errorf("%d lines start with \"would replay\" at column 0, want %d; last line %q", would, n, last)
		}
	})
}

// TestLogsFollowTheTerminal: without --log-format and --log-level, a
// terminal gets text logs of warnings and errors only, anything else JSON
// from info up; the flags win either way.
func TestLogsFollowTheTerminal(t *testing.T) {
	tests := []struct {
		name          string
		level, format string
		tty           bool
		want          string // what log.Info("listed") then log.Warn("odd") write
	}{
		{"terminal", "", "", true, "level=WARN msg=odd\n"},
		{"not a terminal", "", "", false, `{"level":"INFO","msg":"listed"}` + "\n" + `{"level":"WARN","msg":"odd"}` + "\n"},
		{"terminal, asked for json", "", "json", true, `{"level":"WARN","msg":"odd"}` + "\n"},
		{"terminal, asked for info", "info", "", true, "level=INFO msg=listed\nlevel=WARN msg=odd\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := settings{logLevel: tt.level, logFormat: tt.format}
			var b strings.Builder
			log, _, err := s.logger(&b, tt.tty)
			if err != nil {
				t.Fatal(err)
			}
			log = slog.New(dropTime{log.Handler()})
			log.Info("listed")
			log.Warn("odd")
			if b.String() != tt.want {
				t.Errorf("logs %q, want %q", b.String(), tt.want)
			}
		})
	}
}

// dropTime removes the time from records, for comparable output.
type dropTime struct{ slog.Handler }

func (d dropTime) Handle(ctx context.Context, r slog.Record) error {
	r.Time = time.Time{}
	return d.Handler.Handle(ctx, r)
}
