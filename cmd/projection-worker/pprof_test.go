package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestPprof checks that --pprof serves Go's profiles on --http-addr, not
// /debug/pprof/cmdline (it would show --database-url's password), and that
// without it there are none.
func TestPprof(t *testing.T) {
	w := startBusyWorker(t, "--pprof")
	w.waitFor(t, "/healthz answers", 30*time.Second, func() bool { return strings.Contains(w.get(t, "/healthz"), "200 OK") })
	if got := w.get(t, "/debug/pprof/heap?debug=1"); !strings.HasPrefix(got, "200 OK") || !strings.Contains(got, "heap profile:") {
		t.Errorf("GET /debug/pprof/heap?debug=1 with --pprof = %.200q, want 200 and a heap profile", got)
	}
	if got := w.get(t, "/debug/pprof/goroutine?debug=1"); !strings.Contains(got, "goroutine profile:") {
		t.Errorf("GET /debug/pprof/goroutine?debug=1 with --pprof = %.200q, want a goroutine profile", got)
	}
	if got := w.get(t, "/debug/pprof/cmdline"); strings.HasPrefix(got, "200 OK") || strings.Contains(got, "postgres") {
		t.Errorf("GET /debug/pprof/cmdline = %.200q, want no command line (it holds --database-url)", got)
	}
	plain := startBusyWorker(t)
	plain.waitFor(t, "/healthz answers", 30*time.Second, func() bool { return strings.Contains(plain.get(t, "/healthz"), "200 OK") })
	if got := plain.get(t, "/debug/pprof/heap?debug=1"); !strings.HasPrefix(got, "404") {
		t.Errorf("GET /debug/pprof/heap without --pprof = %.200q, want 404", got)
	}
}

// TestPprofNeedsAnHTTPAddress: --pprof with an empty --http-addr is a usage error
// naming both flags (new-user trial: it started without the profiles).
func TestPprofNeedsAnHTTPAddress(t *testing.T) {
	clearSettingsEnv(t)
	var s settings
	if err := parseFlags(runFlags(&s, io.Discard), []string{"--pprof", "--http-addr", ""}); err != nil {
		t.Fatal(err)
	}
	if err := s.checkRun(); err == nil || !strings.Contains(err.Error(), "--pprof") || !strings.Contains(err.Error(), "--http-addr") {
		t.Errorf("--pprof --http-addr '': checkRun error %v, want one naming --pprof and --http-addr", err)
	}
}
