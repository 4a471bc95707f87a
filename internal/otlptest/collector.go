package otlptest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// CollectorEnv is the environment variable that names an OpenTelemetry
// Collector binary (the one scripts/otelcol.sh builds, `make test-otel`) for
// Start to put in front of its receiver.
const CollectorEnv = "OTELCOL_BIN"

// collectorStartTimeout bounds the wait for a collector's OTLP/HTTP port.
const collectorStartTimeout = 60 * time.Second

// collectorStopTimeout bounds the wait for a collector to exit after
// SIGTERM, before it is killed.
const collectorStopTimeout = 15 * time.Second

// Start returns a receiver that keeps what it receives, closed when t
// ends. When the environment variable OTELCOL_BIN (CollectorEnv) names a
// collector binary, the receiver sits behind that collector
// (NewCollectorReceiver) and Endpoint is the collector's; the collector's
// log is logged when t fails. Start fails t when the collector does not
// start.
func Start(t testing.TB) *Receiver {
	t.Helper()
	bin := os.Getenv(CollectorEnv)
	if bin == "" {
		r := NewReceiver(true)
		t.Cleanup(r.Close)
		return r
	}
	r, err := NewCollectorReceiver(bin, true)
	if err != nil {
		t.Fatalf("%s=%s: %v", CollectorEnv, bin, err)
	}
	t.Cleanup(func() {
		r.Close()
		if t.Failed() {
			t.Logf("collector %s, its output:\n%s", bin, r.CollectorLog())
		}
	})
	return r
}

// NewCollectorReceiver starts a receiver (NewReceiver(keep)) and, in front
// of it, the OpenTelemetry Collector binary bin, with an OTLP/HTTP receiver
// on a free loopback port (Endpoint) and traces and metrics pipelines whose
// otlp_http exporter forwards to the receiver, gzip-compressed, with no
// sending queue and no retries: an export to the collector returns once the
// receiver has what the collector decoded and re-encoded, and fails when
// the forwarding fails. The binary needs the otlp receiver, the otlphttp
// exporter and the file and env config providers
// (scripts/otelcol-builder.yaml). Close stops the collector (SIGTERM, then
// SIGKILL after 15 s) and the receiver.
//
// It returns an error, with the collector's output, when the collector
// exits or does not listen within 60 s (three tries, each on a new port).
func NewCollectorReceiver(bin string, keep bool) (*Receiver, error) {
	r := NewReceiver(keep)
	var errs []error
	for range 3 {
		col, err := startCollector(bin, r.srv.URL)
		if err == nil {
			r.col = col
			return r, nil
		}
		errs = append(errs, err)
	}
	r.Close()
	return nil, errors.Join(errs...)
}

// CollectorLog returns what the collector in front of r wrote (its log) so
// far, "" without one.
func (r *Receiver) CollectorLog() string {
	if r.col == nil {
		return ""
	}
	return r.col.output()
}

// collector is a running collector process.
type collector struct {
	endpoint string // http://127.0.0.1:port of its OTLP/HTTP receiver
	cmd      *exec.Cmd
	// dir holds its configuration and its output (log), removed by stop.
	dir string
	// exited is closed once the process has exited and waitErr is set; the
	// goroutine of startCollector that waits on the process closes it.
	exited  chan struct{}
	waitErr error
	once    sync.Once
	// stopped is closed by stop once finalLog holds the output.
	stopped  chan struct{}
	finalLog string
}

// output returns what the collector wrote to stdout and stderr so far.
func (c *collector) output() string {
	select {
	case <-c.stopped:
		return c.finalLog
	default:
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "output.log"))
	if err != nil {
		return fmt.Sprintf("(its output: %v)", err)
	}
	return string(b)
}

// collectorConfig is the collector's configuration: %s are the OTLP/HTTP
// receiver's host:port and the forwarding exporter's base URL. The
// collector's own metrics are off (they would listen on :8888 in each
// collector).
const collectorConfig = `receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
exporters:
  otlp_http:
    endpoint: %s
    compression: gzip
    sending_queue:
      enabled: false
    retry_on_failure:
      enabled: false
service:
  telemetry:
    logs:
      level: info
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlp_http]
    metrics:
      receivers: [otlp]
      exporters: [otlp_http]
`

func startCollector(bin, forwardTo string) (*collector, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "otelcol-test-")
	if err != nil {
		return nil, fmt.Errorf("collector config folder: %w", err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, collectorConfig, addr, forwardTo), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("collector config: %w", err)
	}
	out, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("collector output: %w", err)
	}
	defer out.Close() // the process has its own descriptor
	c := &collector{endpoint: "http://" + addr, dir: dir, exited: make(chan struct{}), stopped: make(chan struct{})}
	c.cmd = exec.Command(bin, "--config", "file:"+cfg)
	c.cmd.Stdout = out
	c.cmd.Stderr = out
	// The collector would read the OTEL_* variables that tests set for the
	// worker (OTEL_EXPORTER_OTLP_ENDPOINT pointing at itself).
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	setPdeathsig(c.cmd)
	if err := c.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start collector: %w", err)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	deadline := time.Now().Add(collectorStartTimeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return c, nil
		}
		select {
		case <-c.exited:
			c.stop()
			return nil, fmt.Errorf("collector exited before listening on %s (%v); its output:\n%s", addr, c.waitErr, c.output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("collector not listening on %s after %s; its output:\n%s", addr, collectorStartTimeout, c.output())
		}
	}
}

// stop ends the process, SIGTERM first, keeps its output and removes its
// folder.
func (c *collector) stop() {
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(os.Interrupt)
		select {
		case <-c.exited:
		case <-time.After(collectorStopTimeout):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		c.finalLog = c.output()
		close(c.stopped)
		_ = os.RemoveAll(c.dir)
	})
}

// freeLoopbackAddr returns 127.0.0.1:port for a port that was free a moment
// ago (another process can take it before the collector does: the caller
// tries again).
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}
