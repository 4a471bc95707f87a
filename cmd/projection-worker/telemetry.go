package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/logfold"
	"github.com/causet/projection-worker/projection"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"golang.org/x/net/http/httpguts"
)

// telemetry is the process's OpenTelemetry wiring: a Prometheus exporter for
// /metrics, and OTLP metric and trace exporters when
// OTEL_EXPORTER_OTLP_ENDPOINT (or the signal-specific variables) is set.
type telemetry struct {
	log      *slog.Logger
	stop     chan struct{} // closed by shutdown: ends watchDroppedSpans
	meters   *sdkmetric.MeterProvider
	sdkTrace *sdktrace.TracerProvider // nil without OTLP
	registry *prometheus.Registry
	kotel    *kotel.Kotel
}

// otlpSignal reports whether signal ("TRACES", "METRICS") is exported over
// OTLP: OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_<signal>_ENDPOINT
// is set. A traces endpoint alone does not export metrics (whose exporter
// would send them to its default, localhost:4318), nor the reverse.
func otlpSignal(signal string) bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// DefaultAttributeValueLengthLimit is the longest string attribute value a
// span keeps, in characters (longer ones are cut), unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
// says otherwise (the SDK's own default is no limit): a record's key is
// copied into its span, and the export queue counts spans, not bytes.
const DefaultAttributeValueLengthLimit = 1024

// DefaultSpanQueueSize is the default --trace-queue-size: spans waiting for
// export before the SDK drops new ones (the SDK's own default is 2048,
// which drops about half the spans at a few thousand records a second).
const DefaultSpanQueueSize = 65536

// telemetryConfig is what newTelemetry takes from the flags.
type telemetryConfig struct {
	group    string
	workerID string // service.instance.id
	// spanQueue bounds the spans waiting for export (OTEL_BSP_MAX_QUEUE_SIZE).
	spanQueue int
	// maxLinks bounds the links of one span: a batch transaction's span
	// links every record of the batch (--max-batch-records), a retry round
	// trip's every record of its pairs (--max-retrying; tracing trial: 23
	// links dropped with --max-batch-records 100).
	maxLinks int
	log      *slog.Logger
}

// newTelemetry builds the process's telemetry. Its resource is
// service.name "projection-worker", service.version and
// service.instance.id (the worker id), overridden by OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES; traces are sampled by OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (default parentbased_always_on). OpenTelemetry's
// own errors and logs (an exporter that cannot reach its endpoint) go to
// cfg.log.
func newTelemetry(ctx context.Context, cfg telemetryConfig) (*telemetry, error) {
	otel.SetErrorHandler(foldedErrorHandler(cfg.log, time.Now))
	otel.SetLogger(logr.FromSlogHandler(cfg.log.With("component", "opentelemetry").Handler()))
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			semconv.ServiceName("projection-worker"),
			semconv.ServiceVersion(buildVersion()),
			semconv.ServiceInstanceID(cfg.workerID),
		),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(exporter),
		// kotel declares its byte counters in "by", which is not UCUM and comes
		// out of the Prometheus exporter as a "_by" suffix; "By" is bytes.
		sdkmetric.WithView(sdkmetric.NewView(sdkmetric.Instrument{Unit: "by"}, sdkmetric.Stream{Unit: "By"})),
		// The SDK's self-observability counts every span into and out of
		// otel.sdk.span.live (two attribute sets resolved per span, ~4 % of
		// a record span's CPU by BenchmarkHotRecordSpan's profile): not kept.
		sdkmetric.WithView(sdkmetric.NewView(sdkmetric.Instrument{Name: "otel.sdk.span.live"}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}}))}
	t := &telemetry{registry: reg, log: cfg.log, stop: make(chan struct{})}
	if otlpSignal("METRICS") {
		mexp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)
	if otlpSignal("TRACES") {
		// The SDK counts the spans its batch processor drops when the queue
		// is full (otel.sdk.processor.span.processed, error.type
		// queue_full) and the exporter the spans it could not export
		// (otel.sdk.exporter.span.exported, error.type) with the global
		// meter provider as it was when they were made, when its
		// experimental observability is on: on unless
		// OTEL_GO_X_OBSERVABILITY says otherwise.
		if _, set := os.LookupEnv("OTEL_GO_X_OBSERVABILITY"); !set {
			_ = os.Setenv("OTEL_GO_X_OBSERVABILITY", "true")
		}
		otel.SetMeterProvider(t.meters)
		texp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		limits := sdktrace.NewSpanLimits() // OTEL_SPAN_*_LIMIT
		if os.Getenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" && os.Getenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" {
			limits.AttributeValueLengthLimit = DefaultAttributeValueLengthLimit
		}
		limits.LinkCountLimit = max(limits.LinkCountLimit, cfg.maxLinks)
		t.sdkTrace = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanLimits(limits),
			sdktrace.WithBatcher(texp, sdktrace.WithMaxQueueSize(cfg.spanQueue)))
		go t.watchDroppedSpans(droppedSpansCheck)
	}
	// kotel meters the Kafka clients; the worker starts its spans itself
	// (projection/tracing.go), with the current messaging conventions.
	t.kotel = kotel.NewKotel(kotel.WithMeter(kotel.NewMeter(kotel.MeterProvider(t.meters))))
	return t, nil
}

// tracerProvider is where the worker's and the dead-letter writer's spans
// go: nil (no spans) without an OTLP endpoint.
func (t *telemetry) tracerProvider() trace.TracerProvider {
	if t.sdkTrace == nil {
		return nil
	}
	return t.sdkTrace
}

// dbTracer returns pgx's tracer: nil without an OTLP endpoint, else
// projection.NewDBTracer's.
func (t *telemetry) dbTracer() pgx.QueryTracer {
	if t.sdkTrace == nil {
		return nil
	}
	return projection.NewDBTracer(t.sdkTrace)
}

// meter returns the meter for the project's instruments.
func (t *telemetry) meter() metric.Meter {
	return t.meters.Meter("github.com/causet/projection-worker")
}

// hooks returns the kgo hooks that trace records (W3C trace context in
// Kafka headers) and meter the client.
func (t *telemetry) hooks() kgo.Opt {
	return kgo.WithHooks(t.kotel.Hooks()...)
}

func (t *telemetry) metricsHandler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{})
}

// droppedSpansCheck is how often watchDroppedSpans looks at the SDK's
// count of dropped spans.
const droppedSpansCheck = 2 * time.Second

// watchDroppedSpans logs once, at WARN, that the span export queue dropped
// spans (the SDK counts them in otel_sdk_processor_span_processed_total with
// error_type="queue_full", which /metrics serves), with the fix; it looks
// every interval until shutdown.
func (t *telemetry) watchDroppedSpans(interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var saidFull, saidFailed bool
	for !saidFull || !saidFailed {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		full, failed := t.lostSpans()
		if full > 0 && !saidFull {
			saidFull = true
			t.log.Warn("spans dropped: the OTLP export queue was full; raise --trace-queue-size, sample fewer (OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG; a parentbased_ sampler keeps every record whose producer sampled its trace) or check the collector; otel_sdk_processor_span_processed_total{error_type=\"queue_full\"} counts them from now on",
				"dropped", full)
		}
		if failed > 0 && !saidFailed {
			saidFailed = true
			t.log.Warn("spans lost: an OTLP export failed (the collector could not be reached or refused the request; the ERROR lines msg=opentelemetry say why); otel_sdk_exporter_span_exported_total{error_type!=\"\"} counts them from now on",
				"lost", failed)
		}
	}
}

// lostSpans returns the SDK's counts of spans dropped on a full queue
// (full) and of spans an export failed to deliver (failed).
func (t *telemetry) lostSpans() (full, failed float64) {
	families, err := t.registry.Gather()
	if err != nil {
		return 0, 0
	}
	for _, f := range families {
		name := f.GetName()
		if name != "otel_sdk_processor_span_processed_total" && name != "otel_sdk_exporter_span_exported_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() != "error_type" || l.GetValue() == "":
				case name == "otel_sdk_processor_span_processed_total" && l.GetValue() == "queue_full":
					full += m.GetCounter().GetValue()
				case name == "otel_sdk_exporter_span_exported_total":
					failed += m.GetCounter().GetValue()
				}
			}
		}
	}
	return full, failed
}

func (t *telemetry) shutdown(ctx context.Context) error {
	close(t.stop)
	var errs []error
	errs = append(errs, t.meters.Shutdown(ctx))
	if t.sdkTrace != nil {
		errs = append(errs, t.sdkTrace.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// traceContextHandler adds trace_id and span_id to a log record written
// with a context that holds a valid span, so that a log line leads to its
// trace.
type traceContextHandler struct{ slog.Handler }

func (h traceContextHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceContextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceContextHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceContextHandler) WithGroup(name string) slog.Handler {
	return traceContextHandler{h.Handler.WithGroup(name)}
}

// foldedErrorHandler logs OpenTelemetry's errors as ERROR lines
// `msg=opentelemetry`, an error that repeats when its text changes, else
// once a minute with repeats (logfold), as the Kafka client's lines are: a
// collector that cannot be reached made two ERROR lines every 5 s
// (tracing trial).
func foldedErrorHandler(log *slog.Logger, now func() time.Time) otel.ErrorHandler {
	var (
		mu   sync.Mutex
		fold logfold.Line
	)
	return otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		repeats, write := fold.Due(err.Error(), now())
		mu.Unlock()
		switch {
		case !write:
		case repeats > 0:
			log.Error("opentelemetry", "error", err, "repeats", repeats)
		default:
			log.Error("opentelemetry", "error", err)
		}
	})
}

// traceSamplers are the values of OTEL_TRACES_SAMPLER the Go SDK
// implements; the *traceidratio ones take OTEL_TRACES_SAMPLER_ARG, a ratio
// in [0, 1] (default 1).
var traceSamplers = map[string]bool{
	"always_on": false, "always_off": false, "traceidratio": true,
	"parentbased_always_on": false, "parentbased_always_off": false, "parentbased_traceidratio": true,
}

// checkOTelEnv checks the OpenTelemetry environment variables the SDK
// would otherwise only complain about at run time and ignore (tracing every
// span on an invalid sampler), as usage errors naming the variable:
// OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_RESOURCE_ATTRIBUTES
// (key=value pairs, comma-separated), the OTLP protocol (http/protobuf
// only) and the OTLP endpoints (http or https URLs with a host).
func checkOTelEnv() error {
	if v := os.Getenv("OTEL_TRACES_SAMPLER"); v != "" {
		takesArg, ok := traceSamplers[v]
		if !ok {
			names := slices.Sorted(maps.Keys(traceSamplers))
			return flagenv.Usagef("OTEL_TRACES_SAMPLER %q: not a sampler this worker knows (one of %s)", v, strings.Join(names, ", "))
		}
		if arg := os.Getenv("OTEL_TRACES_SAMPLER_ARG"); takesArg && arg != "" {
			if r, err := strconv.ParseFloat(arg, 64); err != nil || !(r >= 0 && r <= 1) { // NaN too
				return flagenv.Usagef("OTEL_TRACES_SAMPLER_ARG %q: want the ratio of traces sampled, a number from 0 to 1 (0.01 is 1 %%)", arg)
			}
		}
	}
	if v := os.Getenv("OTEL_RESOURCE_ATTRIBUTES"); v != "" {
		pairs := strings.Split(v, ",")
		for i, kv := range pairs {
			k, value, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				// Its place, not its text, which may hold a value.
				return flagenv.Usagef("OTEL_RESOURCE_ATTRIBUTES: pair %d of %d is not key=value (want comma-separated key=value pairs)", i+1, len(pairs))
			}
			// The SDK percent-decodes values, and keeps one it cannot
			// decode as it is, with an ERROR line that names no variable.
			if _, err := url.PathUnescape(strings.TrimSpace(value)); err != nil {
				return flagenv.Usagef("OTEL_RESOURCE_ATTRIBUTES: the value of %s has a %% not followed by two hexadecimal digits (values are percent-decoded: write %% as %%25)", strings.TrimSpace(k))
			}
		}
	}
	if err := checkOTLPHeaders(); err != nil {
		return err
	}
	if err := checkOTelSettings(); err != nil {
		return err
	}
	// The exporters are OTLP over HTTP (protobuf); the SDK's HTTP
	// exporters ignore the protocol variables, so a collector that only
	// speaks gRPC (:4317) would be tried over HTTP without a word.
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		if v := os.Getenv(k); v != "" && v != "http/protobuf" {
			return flagenv.Usagef("%s %q: this worker exports OTLP as protobuf over HTTP only (http/protobuf, to the collector's port 4318); unset it or set http/protobuf", k, v)
		}
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil {
			return flagenv.Usagef("%s: not a URL (not printed here: it may hold a password); want an http:// or https:// URL with a host, such as http://otel-collector:4318", k)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return flagenv.Usagef("%s %q: want an http:// or https:// URL with a host, such as http://otel-collector:4318", k, endpointText(u, ""))
		}
		// Fresh-user trials: accepted, and left out of the exports.
		if u.RawQuery != "" {
			return flagenv.Usagef("%s %q: the OTLP exporter drops a URL's query; send a token as a header instead (OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%%20<token>)", k, endpointText(u, ""))
		}
		if u.User != nil {
			return flagenv.Usagef("%s %q: the OTLP exporter sends no user or password from the URL; send them as a header instead (OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%%20<base64 of user:password>)", k, endpointText(u, ""))
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return flagenv.Usagef("%s %q: port %s is not a TCP port (1 to 65535)", k, endpointText(u, ""), p)
			}
		}
		// A signal's own endpoint is used as given, path and all (the
		// OTLP exporter specification); the paths are added to
		// OTEL_EXPORTER_OTLP_ENDPOINT only.
		if signal, ok := strings.CutPrefix(k, "OTEL_EXPORTER_OTLP_"); ok && signal != "ENDPOINT" && strings.Trim(u.Path, "/") == "" {
			path := "/v1/" + strings.ToLower(strings.TrimSuffix(signal, "_ENDPOINT"))
			return flagenv.Usagef("%s %q has no path: a signal's own endpoint is used as given (the OTLP specification), so its requests would go to /; add the collector's path, such as %s, or set OTEL_EXPORTER_OTLP_ENDPOINT instead, to which %s is added",
				k, endpointText(u, ""), endpointText(u, path), path)
		}
	}
	return nil
}

// endpointText is endpoint u as an error shows it: without its user and
// password, its query (where a token may be) replaced and its fragment
// left out, its path path when not "".
// Fresh-user trial: a token in the query was printed, twice, and the path
// suggested after it.
func endpointText(u *url.URL, path string) string {
	c := *u
	if path != "" {
		c.Path, c.RawPath = path, ""
	}
	if c.RawQuery != "" {
		c.RawQuery = "xxxxx"
	}
	c.User = nil
	c.Fragment, c.RawFragment = "", ""
	return c.String()
}

// otelIntegers are the SDK's variables that take a whole number (of
// milliseconds for the timeouts, intervals and delays, of items for the
// limits, where below 0 is none, and sizes), which it logs an ERROR about and ignores when they
// are not one (tracing trial: OTEL_EXPORTER_OTLP_TIMEOUT=abc).
var otelIntegers = []string{
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
	"OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT",
	"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
	"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
	"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
}

// otelTime reports whether otelIntegers' variable k is a time in
// milliseconds (a timeout, interval or delay).
func otelTime(k string) bool {
	return strings.HasSuffix(k, "_TIMEOUT") || strings.HasSuffix(k, "_INTERVAL") || strings.HasSuffix(k, "_DELAY")
}

// checkOTelSettings checks the SDK's other variables that it would log
// about and ignore at run time: otelIntegers, the OTLP compression (gzip
// or none) and the OTLP certificate and key files (readable).
func checkOTelSettings() error {
	for _, k := range otelIntegers {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v) // as the SDK reads it: no spaces
		switch {
		case otelTime(k):
			// The SDK refuses 0 too (a non-positive duration, logged and
			// ignored: second fresh-user trial).
			if err != nil || n <= 0 {
				return flagenv.Usagef("%s %q: want a whole number of milliseconds above 0", k, v)
			}
		case strings.HasSuffix(k, "_LIMIT"): // below 0 is no limit, to the SDK
			if err != nil {
				return flagenv.Usagef("%s %q: want a whole number (below 0: no limit)", k, v)
			}
		case err != nil || n <= 0:
			return flagenv.Usagef("%s %q: want a whole number above 0", k, v)
		}
	}
	for _, signal := range []string{"", "TRACES_", "METRICS_"} {
		k := "OTEL_EXPORTER_OTLP_" + signal + "COMPRESSION"
		if v := os.Getenv(k); v != "" && v != "gzip" && v != "none" {
			return flagenv.Usagef("%s %q: want gzip or none (the compressions the exporter has)", k, v)
		}
		for _, file := range []string{"CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			k := "OTEL_EXPORTER_OTLP_" + signal + file
			if v := os.Getenv(k); v != "" {
				if _, err := os.ReadFile(v); err != nil {
					return flagenv.Usagef("%s: %v", k, err)
				}
			}
		}
	}
	return nil
}

// otlpHeaderVariables are the variables of the OTLP exporters' request
// headers: comma-separated name=value pairs, values percent-decoded.
var otlpHeaderVariables = []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"}

// checkOTLPHeaders checks otlpHeaderVariables as the SDK reads them, which
// logs a pair it cannot read, secret and all (Authorization: Bearer ...),
// and sends the requests without it (tracing trial). Its errors name the
// variable and the pair by its place, and a header's name only once it is
// one: never what may be a secret.
func checkOTLPHeaders() error {
	for _, k := range otlpHeaderVariables {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		pairs := strings.Split(v, ",")
		for i, h := range pairs {
			name, value, ok := strings.Cut(h, "=")
			name = strings.TrimSpace(name)
			switch {
			case !ok || !httpguts.ValidHeaderFieldName(name):
				return flagenv.Usagef("%s: header %d of %d is not name=value with an HTTP header name before the = (want comma-separated pairs, such as Authorization=Bearer%%20<token>; a colon in place of the = is a usual slip; the value is not printed here)", k, i+1, len(pairs))
			default:
				decoded, err := url.PathUnescape(value)
				if err != nil {
					return flagenv.Usagef("%s: the value of header %d of %d (%s) has a %% not followed by two hexadecimal digits (values are percent-decoded: write %% as %%25; the value is not printed here)", k, i+1, len(pairs), name)
				}
				// Second fresh-user trial: %0d%0a passed, and every
				// export then failed.
				if !httpguts.ValidHeaderFieldValue(strings.TrimSpace(decoded)) {
					return flagenv.Usagef("%s: the value of header %d of %d (%s), percent-decoded, holds a control character, which no HTTP header may (the value is not printed here)", k, i+1, len(pairs), name)
				}
			}
		}
	}
	return nil
}
