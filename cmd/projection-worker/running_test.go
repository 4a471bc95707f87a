package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// running is `projection-worker run` started in-process by a test, with
// text logs and its HTTP endpoints on a free local address.
type running struct {
	addr           string
	stdout, stderr syncBuffer
	done           chan int // receives the exit status
	stop           context.CancelFunc
}

// startRun starts `projection-worker run` with args; the test's end stops
// it.
func startRun(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	r := &running{addr: closedAddr(t), done: make(chan int, 1), stop: stop}
	args = append([]string{"run", "--http-addr", r.addr, "--log-format", "text"}, args...)
	go func() { r.done <- run(ctx, args, &r.stdout, &r.stderr) }()
	t.Cleanup(stop)
	return r
}

// waitFor polls cond until it holds, failing t when limit passes first or
// the worker exits.
func (r *running) waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s\nstderr:\n%s", limit, what, r.stderr.String())
		}
		select {
		case code := <-r.done:
			t.Fatalf("the worker exited with %d before %s\nstderr:\n%s", code, what, r.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exit waits at most limit for the worker to exit and returns its status.
func (r *running) exit(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case code := <-r.done:
		return code
	case <-time.After(limit):
		t.Fatalf("the worker did not exit within %s\nstderr:\n%s", limit, r.stderr.String())
		return -1
	}
}

// shutdown cancels the worker as SIGTERM does and checks that it exits 0.
func (r *running) shutdown(t *testing.T) {
	t.Helper()
	r.stop()
	if code := r.exit(t, 40*time.Second); code != 0 {
		t.Errorf("the worker exited %d after cancel, want 0\nstderr:\n%s", code, r.stderr.String())
	}
}

// get returns "<status> <body>" of GET path on the worker's HTTP address,
// or the request's error.
func (r *running) get(t *testing.T, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b)
}

// logged reports whether the worker's log holds s.
func (r *running) logged(s string) bool { return strings.Contains(r.stderr.String(), s) }
