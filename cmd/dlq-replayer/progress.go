package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows how far the scan of the dead-letter topic is: a progress
// bar when stderr is a terminal, else a log line at most every 5 s.
type progress struct {
	log   *slog.Logger
	w     io.Writer
	tty   bool
	what  string
	bar   *progressbar.ProgressBar
	last  time.Time
	total int64
}

func newProgress(stderr io.Writer, log *slog.Logger, cmd string) *progress {
	p := &progress{log: log, w: stderr, what: cmd}
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// update is the dlq.ScanConfig.Progress callback.
func (p *progress) update(scanned, total int64) {
	p.total = total
	if p.tty {
		if p.bar == nil {
			p.bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(p.w),
				progressbar.OptionSetDescription(p.what+": scanning dead letters"),
				progressbar.OptionShowCount(),
				progressbar.OptionShowIts(),
				progressbar.OptionSetItsString("dead letters"),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
		}
		_ = p.bar.Set64(scanned)
		return
	}
	if now := time.Now(); now.Sub(p.last) >= 5*time.Second || scanned == total {
		p.last = now
		pct := 100.0
		if total > 0 {
			pct = float64(scanned) * 100 / float64(total)
		}
		p.log.Info("progress", "scanned", scanned, "total", total, "percent", fmt.Sprintf("%.1f", pct))
	}
}

// println writes a data line without breaking the progress bar.
func (p *progress) println(w io.Writer, line string) {
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	fmt.Fprintln(w, line)
}

// done removes the progress bar.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
}
