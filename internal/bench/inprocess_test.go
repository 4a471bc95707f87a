package bench

import (
	"github.com/causet/projection-worker/internal/otlptest"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"github.com/twmb/franz-go/plugin/kslog"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/projection"
	"github.com/causet/projection-worker/retry"
)

// BenchmarkWorkerInProcess runs the clean scenario of
// BenchmarkWorkerThroughput with the worker in this process, wired as
// `projection-worker run` wires it (pgxpool defaults, OpenTelemetry metrics
// with a Prometheus reader, kotel's metric hooks, no tracing, a dead-letter
// producer with acks=all and no linger), so that it can be profiled. The
// broker (kfake) runs in this process too and shows in profiles. The time
// reported runs from NewWorker until every pair is applied and Run, once
// cancelled, has committed and returned.
//
//	go test ./internal/bench -run '^$' -bench BenchmarkWorkerInProcess -benchtime 1x -cpuprofile cpu.out
//
// profiles the whole benchmark, producing included. Environment:
//   - BENCH_CPUPROFILE=file profiles only the worker's run (until every pair
//     is applied);
//   - BENCH_MEMPROFILE=file writes a heap profile at that point (kfake's log
//     is in it: use pprof -ignore kfake);
//   - BENCH_POISON=1 runs the poisoned scenario instead (derive dividing by
//     zero), BENCH_POISON=unmigrated the one with 1% of the events for a
//     tenant that is not migrated, BENCH_POISON=22003 or 23502 those that
//     PostgreSQL refuses (at their statements, which the worker's catalog
//     check sends them to instead of their COPY groups), BENCH_POISON=23514
//     the one a CHECK constraint refuses (a comparison, which the worker
//     evaluates from the catalog), BENCH_POISON=23514fn the one a CHECK
//     written with a function refuses inside COPY groups (the tenant schema gets
//     benchConstraints, as in BenchmarkWorkerThroughput, in every case);
//   - BENCH_MAX_POLL_RECORDS and BENCH_MAX_QUEUED_BYTES set those worker
//     Config fields (unset: the worker's defaults);
//   - BENCH_TRACE=ratio traces as `run` does with an OTLP endpoint, sampling
//     that ratio of the records (parent-based; 1 is every record), into an
//     in-process OTLP receiver; it prints the spans received and dropped
//     (BENCH_TRACE_EVERY_PAIR=1: a span for every pair, --trace-every-pair);
//   - BENCH_TIMELINE=1 prints the pairs done every 0.5 s (where a slowdown
//     happens: before or after a breaker opens);
//   - BENCH_DEBUG=1 logs the worker at DEBUG (every retry and dead letter).
func BenchmarkWorkerInProcess(b *testing.B) {
	n := benchEvents(b)
	e := newEnv(b, false)
	kind := noPoison
	switch os.Getenv("BENCH_POISON") {
	case "":
	case "unmigrated":
		kind = unmigratedPoison
	case "22003":
		kind = rangePoison
	case "23502":
		kind = nullPoison
	case "23514":
		kind = checkPoison
	case "23514fn":
		kind = checkFnPoison
	default:
		kind = derivePoison
	}
	s := e.newScenario("inproc", newDataset(n, kind))
	e.produce(s)
	defs, tps := e.projections(b)
	if err := projection.Migrate(e.ctx, e.pool, defs, s.tenant); err != nil {
		b.Fatal(err)
	}
	if err := benchConstraints(e.ctx, e.pool, s.tenant); err != nil {
		b.Fatal(err)
	}
	handlers := make([]projection.Handler, len(tps))
	for i, t := range tps {
		handlers[i] = t
	}
	e.createTopic(s.dlq)

	// Telemetry as cmd/projection-worker's telemetry.go builds it without OTLP.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		b.Fatal(err)
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	b.Cleanup(func() { _ = meters.Shutdown(context.Background()) })
	k := kotel.NewKotel(kotel.WithMeter(kotel.NewMeter(kotel.MeterProvider(meters))))
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: benchLogLevel()}))
	kopts := []kgo.Opt{kgo.SeedBrokers(e.brokers), kgo.DialTimeout(10 * time.Second),
		kgo.WithLogger(kslog.New(log.With("component", "kgo"))), kgo.WithHooks(k.Hooks()...)}
	var fetched fetchCounter

	cfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	tp, rcv, ended := benchTracing(b)
	if tp != nil {
		cfg.ConnConfig.Tracer = projection.NewDBTracer(tp)
		b.Cleanup(func() {
			_ = tp.Shutdown(context.Background())
			e.logf("tracing (BENCH_TRACE=%s): %d spans ended, %d received by the OTLP receiver, %d dropped",
				os.Getenv("BENCH_TRACE"), ended.Sampled(), rcv.SpanCount(), ended.Sampled()-int64(rcv.SpanCount()))
		})
	}
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	prod, err := kgo.NewClient(append(kopts, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(1<<20+64*1024))...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(prod.Close)
	writer, err := dlq.NewWriter(prod, dlq.WriterConfig{
		RecordConfig: dlq.RecordConfig{Topic: s.dlq, Worker: "bench", Generation: "bench/" + defs.IRVersion},
		Backoff:      retry.DefaultPolicy(),
		Logger:       log,
	})
	if err != nil {
		b.Fatal(err)
	}
	metrics, err := projection.NewMetrics(meters.Meter("github.com/causet/projection-worker"), projection.MetricsConfig{})
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	wcfg := projection.Config{Topic: s.topic, Group: s.group, Logger: log, Metrics: metrics,
		MaxPollRecords: envInt(b, "BENCH_MAX_POLL_RECORDS"), MaxQueuedBytes: envInt(b, "BENCH_MAX_QUEUED_BYTES")}
	if tp != nil {
		wcfg.TracerProvider = tp
		wcfg.TraceEveryPair = os.Getenv("BENCH_TRACE_EVERY_PAIR") != ""
	}
	w, err := projection.NewWorker(wcfg, handlers, pool, writer, append(kopts, kgo.WithHooks(&fetched))...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	defer func() { // on failure
		if !stopped {
			cancel()
			<-done
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	timeline := os.Getenv("BENCH_TIMELINE") != ""
	for ticks := 1; ; ticks++ {
		<-tick.C
		if timeline && ticks%5 == 0 {
			fmt.Fprintf(os.Stderr, "bench: t=%.1fs: %d pairs done\n", time.Since(start).Seconds(), pairsDoneIn(reg))
		}
		if pairsDoneIn(reg) >= int64(s.data.pairs) {
			break
		}
		if time.Since(start) > 5*time.Minute+time.Duration(n)*time.Millisecond {
			b.Fatalf("applied %d of %d pairs in %s", pairsDoneIn(reg), s.data.pairs, time.Since(start).Round(time.Second))
		}
	}
	pprof.StopCPUProfile()
	if path := os.Getenv("BENCH_MEMPROFILE"); path != "" {
		writeHeapProfile(b, path)
	}
	cancel() // Run commits what was applied at shutdown
	stopped = true
	if err := <-done; err != nil {
		b.Errorf("worker Run: %v", err)
	}
	el := time.Since(start)
	b.StopTimer()
	if got, err := e.committed(s.group, s.topic); err != nil || got != int64(n) {
		b.Fatalf("committed %d of %d events after shutdown (%v)", got, n, err)
	}
	if got := e.records(s.dlq); got != int64(s.data.poisoned) {
		b.Fatalf("dead-letter topic holds %d records, want %d", got, s.data.poisoned)
	}
	e.logf("in-process worker: %d events applied and committed in %s: %.0f events/s", n, el.Round(time.Millisecond), float64(n)/el.Seconds())
	e.logf("in-process worker fetched %d records in %d batches (%.2f× the events; %.1f MiB decompressed)",
		fetched.records.Load(), fetched.batches.Load(), float64(fetched.records.Load())/float64(n), mib(fetched.uncompressed.Load()))
	b.ReportMetric(float64(n)/el.Seconds(), "worker_events/s")
}

// benchTracing returns the tracer provider of BENCH_TRACE (nil when unset)
// and its OTLP receiver: the worker's telemetry.go setup (batch processor
// queue of 65536 spans, OTLP/HTTP protobuf, parent-based ratio sampler).
func benchTracing(b *testing.B) (*sdktrace.TracerProvider, *otlptest.Receiver, *otlptest.SpanCounter) {
	v := os.Getenv("BENCH_TRACE")
	if v == "" {
		return nil, nil, nil
	}
	ratio, err := strconv.ParseFloat(v, 64)
	if err != nil || ratio < 0 || ratio > 1 {
		b.Fatalf("BENCH_TRACE=%q: want a ratio in [0, 1]", v)
	}
	rcv := otlptest.NewReceiver(false)
	b.Cleanup(rcv.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(rcv.Endpoint()+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	limits := sdktrace.NewSpanLimits()
	limits.LinkCountLimit = 1000
	ended := &otlptest.SpanCounter{}
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithSpanLimits(limits), sdktrace.WithSpanProcessor(ended),
		sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(65536))), rcv, ended
}

// fetchCounter is a kgo hook that counts the records and bytes the worker's
// client reads from fetch responses, refetches included.
type fetchCounter struct{ records, batches, uncompressed atomic.Int64 }

func (c *fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	c.records.Add(int64(m.NumRecords))
	c.batches.Add(1)
	c.uncompressed.Add(int64(m.UncompressedBytes))
}

// pairsDoneIn returns the pairs the worker counted as applied, stale or
// dead-lettered in reg.
func pairsDoneIn(reg *prometheus.Registry) int64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "causet_projection_applied_total", "causet_projection_stale_total", "causet_projection_dead_lettered_total":
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return int64(sum)
}

// envInt returns the integer in environment variable name, 0 when unset.
func envInt(b *testing.B, name string) int {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("%s=%q: not an integer", name, v)
	}
	return n
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func benchLogLevel() slog.Level {
	if os.Getenv("BENCH_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
