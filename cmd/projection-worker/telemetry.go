package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// telemetry is the process's OpenTelemetry wiring: a Prometheus exporter for
// /metrics, and OTLP metric and trace exporters when
// OTEL_EXPORTER_OTLP_ENDPOINT (or the signal-specific variables) is set.
type telemetry struct {
	meters   *sdkmetric.MeterProvider
	sdkTrace *sdktrace.TracerProvider // nil without OTLP
	registry *prometheus.Registry
	// tracer starts a process span per record, continuing the W3C trace
	// context of its headers; nil (no spans) without an OTLP endpoint.
	tracer *kotel.Tracer
	kotel  *kotel.Kotel
}

func otlpConfigured() bool {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}

func newTelemetry(ctx context.Context, group string) (*telemetry, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName("projection-worker"),
		semconv.ServiceVersion(buildVersion()),
	))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(exporter)}
	t := &telemetry{registry: reg}
	if otlpConfigured() {
		mexp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
		texp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		t.sdkTrace = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(texp))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)
	kopts := []kotel.Opt{kotel.WithMeter(kotel.NewMeter(kotel.MeterProvider(t.meters)))}
	if t.sdkTrace != nil {
		// Spans only when they go somewhere: kotel's per-record hooks cost
		// about 15% of the worker's CPU in make bench.
		prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		t.tracer = kotel.NewTracer(kotel.TracerProvider(t.sdkTrace), kotel.TracerPropagator(prop), kotel.ConsumerGroup(group))
		kopts = append(kopts, kotel.WithTracer(t.tracer))
	}
	t.kotel = kotel.NewKotel(kopts...)
	return t, nil
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

func (t *telemetry) shutdown(ctx context.Context) error {
	var errs []error
	errs = append(errs, t.meters.Shutdown(ctx))
	if t.sdkTrace != nil {
		errs = append(errs, t.sdkTrace.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
