package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// redrawAfter is how soon a bar cleared for other output comes back while
// its percentage does not change.
const redrawAfter = 100 * time.Millisecond

// progress shows how far the scan of the dead-letter topic is: a progress
// bar on stderr when stderr is a terminal, else a log line at most every
// 5 s.
//
// The bar moves with the records read (dlq.ScanConfig.Progress reports each
// one): it is drawn again whenever the whole percentage changes. Everything
// else written to the terminal goes through writer, which clears the bar
// first, so no output is ever appended to a bar line; a cleared bar comes
// back at the next change of percentage, or after redrawAfter. done clears
// it for good. Its methods are safe for concurrent use (kgo logs from its
// own goroutines).
type progress struct {
	log  *slog.Logger // set by execute once the logger exists
	w    io.Writer    // stderr
	tty  bool
	what string

	mu      sync.Mutex
	bar     *progressbar.ProgressBar
	shown   bool      // the bar is on screen
	percent int       // the whole percentage last drawn
	drawn   time.Time // when the bar was last drawn
	logged  time.Time // when the last progress line was logged (no terminal)
}

func newProgress(stderr io.Writer, cmd string) *progress {
	return &progress{w: stderr, what: cmd, tty: isTerminal(stderr), percent: -1}
}

// isTerminal reports whether w is a terminal (not a pipe, a file or
// /dev/null).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// update is the dlq.ScanConfig.Progress callback: scanned of total records
// read.
func (p *progress) update(scanned, total int64) {
	if !p.tty {
		if now := time.Now(); (now.Sub(p.logged) >= 5*time.Second || scanned == total) && p.log != nil {
			p.logged = now
			pct := 100.0
			if total > 0 {
				pct = float64(scanned) * 100 / float64(total)
			}
			p.log.Info("progress", "scanned", scanned, "total", total, "percent", fmt.Sprintf("%.1f", pct))
		}
		return
	}
	if total <= 0 {
		return // nothing to read: no bar
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pct := int(scanned * 100 / total)
	switch {
	case p.bar == nil:
		p.bar = newBar(p.w, p.what+": reading", total)
	case pct == p.percent && (p.shown || time.Since(p.drawn) < redrawAfter):
		return
	}
	p.percent, p.drawn, p.shown = pct, time.Now(), true
	_ = p.bar.Set64(scanned)
}

// newBar returns a bar for total records on w whose line is never wider
// than the terminal: a line that wraps could not be cleared. From the
// widest to the narrowest terminal it shows "desc  45% |====    | (N/T)
// [elapsed:left]", then without the times, then without the count, then
// without the description.
func newBar(w io.Writer, desc string, total int64) *progressbar.ProgressBar {
	cols := 80
	if f, ok := w.(*os.File); ok {
		if c, _, err := term.GetSize(int(f.Fd())); err == nil && c > 0 {
			cols = c
		}
	}
	count := len(fmt.Sprintf(" (%d/%d)", total, total))
	const percent, frame, times = len(" 100% "), len("|| "), len(" [59m59s:59m59s]")
	// The room left for the bar itself, keeping the last column free.
	room := cols - 1 - utf8.RuneCountInString(desc) - percent - frame - count - times
	showTimes, showCount, showDesc := true, true, true
	if room < 10 {
		showTimes, room = false, room+times
	}
	if room < 10 {
		showCount, room = false, room+count
	}
	if room < 10 {
		showDesc, room = false, room+utf8.RuneCountInString(desc)
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetPredictTime(showTimes),
		progressbar.OptionSetWidth(max(1, min(room, 40))),
	}
	if showCount {
		opts = append(opts, progressbar.OptionShowCount())
	}
	if showDesc {
		opts = append(opts, progressbar.OptionSetDescription(desc))
	}
	return progressbar.NewOptions64(total, opts...)
}

// clearLocked removes the bar from the screen: back to the start of its
// line and erase the line (ECMA-48 EL), which also erases what a bar of a
// width the library did not record left there. p.mu is held.
func (p *progress) clearLocked() {
	if p.bar != nil && p.shown {
		_, _ = io.WriteString(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// writer returns w, or, when both w and stderr are terminals (the bar is
// on the same screen), a writer that clears the bar before each write.
func (p *progress) writer(w io.Writer) io.Writer {
	if !p.tty || !isTerminal(w) {
		return w
	}
	return clearingWriter{p: p, w: w}
}

type clearingWriter struct {
	p *progress
	w io.Writer
}

func (c clearingWriter) Write(b []byte) (int, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.clearLocked()
	return c.w.Write(b)
}

// done removes the progress bar for good.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	if p.bar != nil {
		_ = p.bar.Exit()
		p.bar = nil
	}
}
