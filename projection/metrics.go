package projection

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/causet/projection-worker/retry"
)

// Metrics are the worker's OpenTelemetry instruments. The zero value records
// nothing. Build one with NewMetrics from a meter of the caller's
// MeterProvider (only cmd/ wires the SDK and exporters).
//
// Instruments (attributes in brackets):
//   - causet.projection.applied, {event} [projection, tenant_schema]: pairs applied
//   - causet.projection.stale, {event} [projection, tenant_schema]: stale no-ops
//   - causet.projection.swept, {row} [projection, tenant_schema]: rows the sweep
//     after commit deleted (sweep.go)
//   - causet.projection.failed, {attempt} [projection, tenant_schema, error_class]: failed attempts
//   - causet.projection.retried, {attempt} [projection, tenant_schema]: retries
//   - causet.projection.dead_lettered, {event} [projection, tenant_schema, error_class]
//   - causet.projection.apply.duration, s [projection, tenant_schema]: an attempt that
//     applied a pair, or a retry (a failed first attempt is not timed)
//   - causet.projection.batch.duration, s: one batch transaction
//   - causet.projection.batch.size, {pair}: (event, projection) pairs in one batch transaction
//   - causet.projection.consumer.lag, {record} [group, topic, partition]: high watermark − offset of
//     the next record to finish (so it grows while a partition is held)
//   - causet.projection.partitions.paused, {partition}: partitions waiting for the database
//   - causet.projection.partitions.stuck, {partition}: partitions held by a dead letter that
//     cannot be written
//   - causet.projection.pairs.retrying, {pair}: pairs waiting for a retry
//   - causet.projection.breakers.open, {fingerprint}: fingerprints whose breaker is open
//
// The tenant_schema attribute comes from the events, so its values are
// bounded: the first MetricsConfig.MaxTenantSchemas distinct tenant schemas
// recorded since the start keep their name, every later one is recorded as
// OtherTenantSchemas.
type Metrics struct {
	meter        metric.Meter
	tenants      *tenantBound // nil: tenant_schema as recorded (the zero Metrics)
	appliedC     metric.Int64Counter
	staleC       metric.Int64Counter
	failedC      metric.Int64Counter
	retriedC     metric.Int64Counter
	deadC        metric.Int64Counter
	unhandledC   metric.Int64Counter
	sweptC       metric.Int64Counter
	applyLatency metric.Float64Histogram
	pausedC      metric.Int64UpDownCounter
	stuckC       metric.Int64UpDownCounter
	batchLatency metric.Float64Histogram
	batchSize    metric.Int64Histogram
	retryingC    metric.Int64UpDownCounter
	breakersC    metric.Int64UpDownCounter
}

// DefaultMaxTenantSchemas is MetricsConfig.MaxTenantSchemas when it is 0.
const DefaultMaxTenantSchemas = 100

// OtherTenantSchemas is the tenant_schema attribute of the pairs of every
// tenant schema beyond MetricsConfig.MaxTenantSchemas. It is not a valid
// tenant schema name, so it cannot be mistaken for one.
const OtherTenantSchemas = "(other)"

// OtherProjections is the projection attribute of the dead letters of
// replayed records that name a projection the worker does not have (the
// causet.replay.projection header): the dead letter keeps the name. It is
// not a valid projection name.
const OtherProjections = "(other)"

// MetricsConfig bounds what the instruments record.
type MetricsConfig struct {
	// MaxTenantSchemas is how many distinct tenant_schema values the
	// instruments keep: the first ones recorded since the start; every later
	// tenant schema is recorded as OtherTenantSchemas, so that events for
	// many tenants cannot grow /metrics without bound (each tenant adds a
	// series per projection to every per-pair instrument, about 40 lines of
	// Prometheus text with the latency histogram). Default (0)
	// DefaultMaxTenantSchemas; negative: none, every pair is recorded as
	// OtherTenantSchemas (the label carries no tenant). The value "" (the
	// dead letters of records with no tenant schema the worker accepts) is
	// always kept and takes no tenant's place.
	MaxTenantSchemas int
}

// NewMetrics creates the instruments on meter, bounded by cfg. It returns
// the first instrument-creation error.
func NewMetrics(meter metric.Meter, cfg MetricsConfig) (*Metrics, error) {
	limit := cfg.MaxTenantSchemas
	switch {
	case limit == 0:
		limit = DefaultMaxTenantSchemas
	case limit < 0:
		limit = 0
	}
	m := &Metrics{meter: meter, tenants: &tenantBound{limit: limit, kept: map[string]struct{}{}}}
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	m.appliedC = counter("causet.projection.applied", "{event}", "Events applied to a projection.")
	m.staleC = counter("causet.projection.stale", "{event}", "Stale events: the projection already held a newer sequence number (successful no-ops).")
	m.failedC = counter("causet.projection.failed", "{attempt}", "Failed attempts to apply an event to a projection.")
	m.retriedC = counter("causet.projection.retried", "{attempt}", "Retries of failed (event, projection) pairs.")
	m.unhandledC = counter("causet.projection.records.unhandled", "{record}", "Valid records whose event type no projection handles: committed without a write.")
	m.deadC = counter("causet.projection.dead_lettered", "{event}", "(event, projection) pairs written to the dead-letter topic.")
	m.sweptC = counter("causet.projection.swept", "{row}", "Rows the sweep after commit deleted: an older upsert running beside a newer delete of the key had brought them back beside its tombstone.")
	if err != nil {
		return nil, err
	}
	m.applyLatency, err = meter.Float64Histogram("causet.projection.apply.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to apply one event to one projection (one attempt)."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		return nil, err
	}
	m.batchLatency, err = meter.Float64Histogram("causet.projection.batch.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to apply one batch of statements in one transaction."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		return nil, err
	}
	m.batchSize, err = meter.Int64Histogram("causet.projection.batch.size", metric.WithUnit("{pair}"),
		metric.WithDescription("(Event, projection) pairs in one batch transaction."),
		metric.WithExplicitBucketBoundaries(1, 10, 50, 100, 250, 500, 1000, 2500))
	if err != nil {
		return nil, err
	}
	m.pausedC, err = meter.Int64UpDownCounter("causet.projection.partitions.paused", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions paused while waiting for the database."))
	if err != nil {
		return nil, err
	}
	m.stuckC, err = meter.Int64UpDownCounter("causet.projection.partitions.stuck", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions held by a dead letter that cannot be written (the dead-letter topic refuses it)."))
	if err != nil {
		return nil, err
	}
	m.retryingC, err = meter.Int64UpDownCounter("causet.projection.pairs.retrying", metric.WithUnit("{pair}"),
		metric.WithDescription("(event, projection) pairs waiting for a retry while their partitions go on."))
	if err != nil {
		return nil, err
	}
	m.breakersC, err = meter.Int64UpDownCounter("causet.projection.breakers.open", metric.WithUnit("{fingerprint}"),
		metric.WithDescription("Failure fingerprints whose breaker is open: their pairs are dead-lettered without retries."))
	if err != nil {
		return nil, err
	}
	// Export them at 0 from the start, so alerts can tell 0 from absent.
	for _, c := range []metric.Int64UpDownCounter{m.pausedC, m.stuckC, m.retryingC, m.breakersC} {
		c.Add(context.Background(), 0)
	}
	return m, nil
}

func pairAttrs(projection, tenant string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		attribute.String("projection", projection),
		attribute.String("tenant_schema", tenant),
	))
}

// tenantBound keeps the first limit tenant schemas it is asked about.
type tenantBound struct {
	limit int
	mu    sync.RWMutex
	kept  map[string]struct{}
}

// keeps reports whether tenant keeps its own tenant_schema value: it is one
// of the first limit tenant schemas asked about.
func (b *tenantBound) keeps(tenant string) bool {
	b.mu.RLock()
	_, ok := b.kept[tenant]
	full := len(b.kept) >= b.limit
	b.mu.RUnlock()
	if ok || full {
		return ok
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.kept[tenant]; ok {
		return true
	}
	if len(b.kept) >= b.limit {
		return false
	}
	b.kept[tenant] = struct{}{}
	return true
}

// bounded returns attrs (made by pairAttrs) with its tenant_schema replaced
// by OtherTenantSchemas when that tenant schema is beyond the bound.
func (m *Metrics) bounded(attrs metric.MeasurementOption) metric.MeasurementOption {
	if m.tenants == nil {
		return attrs
	}
	set := metric.NewAddConfig([]metric.AddOption{attrs}).Attributes()
	tenant, ok := set.Value("tenant_schema")
	if !ok || tenant.AsString() == "" || m.tenants.keeps(tenant.AsString()) {
		return attrs // "": a record with no tenant schema the worker accepts, one label that takes no tenant's
	}
	projection, _ := set.Value("projection")
	return pairAttrs(projection.AsString(), OtherTenantSchemas)
}

func (m *Metrics) applied(ctx context.Context, attrs metric.MeasurementOption, out Outcome) {
	if m.appliedC == nil {
		return
	}
	attrs = m.bounded(attrs)
	if out == Stale {
		m.staleC.Add(ctx, 1, attrs)
		return
	}
	m.appliedC.Add(ctx, 1, attrs)
}

// appliedN counts applied pairs and stale ones of one projection and
// tenant schema at once, as that many calls of applied would.
func (m *Metrics) appliedN(ctx context.Context, attrs metric.MeasurementOption, applied, stale int64) {
	if m.appliedC == nil {
		return
	}
	attrs = m.bounded(attrs)
	if stale > 0 {
		m.staleC.Add(ctx, stale, attrs)
	}
	if applied > 0 {
		m.appliedC.Add(ctx, applied, attrs)
	}
}

func (m *Metrics) failed(ctx context.Context, attrs metric.MeasurementOption, class retry.Class) {
	if m.failedC != nil {
		m.failedC.Add(ctx, 1, m.bounded(attrs), metric.WithAttributes(attribute.String("error_class", class.String())))
	}
}

func (m *Metrics) retried(ctx context.Context, attrs metric.MeasurementOption) {
	if m.retriedC != nil {
		m.retriedC.Add(ctx, 1, m.bounded(attrs))
	}
}

// unhandled counts a valid record whose event type no projection
// handles.
func (m *Metrics) unhandled(ctx context.Context) {
	if m.unhandledC != nil {
		m.unhandledC.Add(ctx, 1)
	}
}

// swept counts n rows the sweep after commit deleted.
func (m *Metrics) swept(ctx context.Context, attrs metric.MeasurementOption, n int64) {
	if m.sweptC != nil {
		m.sweptC.Add(ctx, n, m.bounded(attrs))
	}
}

func (m *Metrics) deadLettered(ctx context.Context, attrs metric.MeasurementOption, class retry.Class) {
	if m.deadC != nil {
		m.deadC.Add(ctx, 1, m.bounded(attrs), metric.WithAttributes(attribute.String("error_class", class.String())))
	}
}

func (m *Metrics) observeApply(ctx context.Context, attrs metric.MeasurementOption, d time.Duration) {
	if m.applyLatency != nil {
		m.applyLatency.Record(ctx, d.Seconds(), m.bounded(attrs))
	}
}

// observeApplyN records d as the apply latency of n pairs, as n calls of
// observeApply would.
func (m *Metrics) observeApplyN(ctx context.Context, attrs metric.MeasurementOption, d time.Duration, n int) {
	if m.applyLatency == nil {
		return
	}
	// One options slice for the n calls: passing attrs alone would make
	// one per call (the variadic slice escapes).
	opts, v := []metric.RecordOption{m.bounded(attrs)}, d.Seconds()
	for range n {
		m.applyLatency.Record(ctx, v, opts...)
	}
}

// observeBatch records one batch transaction of n pairs that took d:
// committed, or rolled back (an error: the batch is applied again in parts
// or as statements).
func (m *Metrics) observeBatch(ctx context.Context, n int, d time.Duration, committed bool) {
	if m.batchLatency != nil {
		o := batchCommitted
		if !committed {
			o = batchRolledBack
		}
		m.batchLatency.Record(ctx, d.Seconds(), o)
		m.batchSize.Record(ctx, int64(n), o)
	}
}

var (
	batchCommitted  = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "committed")))
	batchRolledBack = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "rolled_back")))
)

func (m *Metrics) addStuck(ctx context.Context, n int64) {
	if m.stuckC != nil {
		m.stuckC.Add(ctx, n)
	}
}

func (m *Metrics) addRetrying(ctx context.Context, n int64) {
	if m.retryingC != nil {
		m.retryingC.Add(ctx, n)
	}
}

func (m *Metrics) addBreakersOpen(ctx context.Context, n int64) {
	if m.breakersC != nil {
		m.breakersC.Add(ctx, n)
	}
}

func (m *Metrics) addPaused(ctx context.Context, n int64) {
	if m.pausedC != nil {
		m.pausedC.Add(ctx, n)
	}
}

// observeWorker registers the consumer-lag gauge for w's partitions.
func (m *Metrics) observeWorker(w *Worker) error {
	if m.meter == nil {
		return nil
	}
	_, err := m.meter.Int64ObservableGauge("causet.projection.consumer.lag",
		metric.WithUnit("{record}"),
		metric.WithDescription("Records between a partition's high watermark and the next offset to process."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			for p, pc := range w.partitions {
				pc.mu.Lock()
				from := pc.next
				if from < 0 {
					from = pc.lagFrom // no record taken yet
				}
				lag := pc.highWatermark - from
				known := from >= 0
				pc.mu.Unlock()
				if known {
					o.Observe(lag, metric.WithAttributes(attribute.String("group", w.cfg.Group),
						attribute.String("topic", w.cfg.Topic), attribute.Int("partition", int(p))))
				}
			}
			return nil
		}))
	return err
}
