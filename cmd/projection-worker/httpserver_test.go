package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestHTTPServerClosesIdleConnections: a kept-alive connection left idle
// after a request is closed by the server after httpIdleTimeout, and one
// whose request's headers never end after httpReadHeaderTimeout (security trial:
// 3 000 connections that each sent one GET /healthz were all open 32 s
// later).
func TestHTTPServerClosesIdleConnections(t *testing.T) {
	defer func(idle, header time.Duration) { httpIdleTimeout, httpReadHeaderTimeout = idle, header }(httpIdleTimeout, httpReadHeaderTimeout)
	httpIdleTimeout, httpReadHeaderTimeout = 300*time.Millisecond, 300*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	closedWithin := func(c net.Conn, limit time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		_ = c.SetReadDeadline(start.Add(limit))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("connection still open after %s: %v", limit, err)
		}
		return time.Since(start)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	t.Logf("idle connection closed after %s", closedWithin(c, 5*time.Second))

	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil { // headers never end
		t.Fatal(err)
	}
	t.Logf("slow request closed after %s", closedWithin(slow, 5*time.Second))
}
