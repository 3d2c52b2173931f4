package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// metricsOf collects once and returns every metric by name.
func metricsOf(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func sumOf(t *testing.T, data metricdata.Aggregation) int64 {
	t.Helper()
	s, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "%T is not an int64 sum", data)
	var n int64
	for _, dp := range s.DataPoints {
		n += dp.Value
	}
	return n
}

// The relay's spans join the trace staged in the message's metadata, the published message carries the publish
// span's context, and the metrics read back what happened.
func TestRelayTelemetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })

	// The trace context a traced Save puts in the metadata of the messages it stages.
	sctx, save := tp.Tracer("test").Start(ctx, "save")
	traced := map[string]string{}
	telemetry.Inject(sctx, traced)
	save.End()
	saveSC := save.SpanContext()

	_, err := e.ob.Stage(ctx,
		outbox.Message{ID: "traced", Topic: "orders", Metadata: traced},
		outbox.Message{ID: "plain", Topic: "orders"},
		outbox.Message{ID: "poison", Topic: "orders"},
		outbox.Message{ID: "later", Topic: "orders", ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "outbox")+
		` SET created_at = now() - interval '1 hour' WHERE message_id = 'plain'`)

	r := e.relay(func(c *outbox.RelayConfig) {
		c.TracerProvider, c.MeterProvider = tp, mp
		c.MaxRetryCount = outbox.Retries(1)
		c.RetryDelay, c.MaxRetryDelay = 10*time.Millisecond, 10*time.Millisecond
	})

	// Before delivery: three messages due (the scheduled one is not), the oldest an hour old.
	m := metricsOf(t, reader)
	pending := m[telemetry.MetricOutboxPending].(metricdata.Gauge[int64])
	require.Len(t, pending.DataPoints, 1)
	require.Equal(t, int64(3), pending.DataPoints[0].Value)
	age := m[telemetry.MetricOutboxOldestAge].(metricdata.Gauge[float64])
	require.InDelta(t, 3600, age.DataPoints[0].Value, 60)

	b := newBroker()
	b.setFail(func(msg *message.Message) error {
		if msg.UUID == "poison" {
			return fmt.Errorf("schema registry says no: %w", errRejected)
		}
		return nil
	})
	pgtest.Eventually(t, 10*time.Second, func() bool {
		_, err := r.Drain(ctx, b)
		require.NoError(t, err)
		return e.count("outbox_dead_letters") == 1
	}, "the poison message was not dead-lettered")

	// Spans: the traced message's claim and publish spans are children of the save span, in its trace.
	var claim, publish []sdktrace.ReadOnlySpan
	for _, s := range spans.GetSpans().Snapshots() {
		if s.SpanContext().TraceID() != saveSC.TraceID() {
			continue
		}
		switch s.Name() {
		case telemetry.SpanRelayClaim:
			claim = append(claim, s)
		case telemetry.SpanRelayPublish:
			publish = append(publish, s)
		}
	}
	require.Len(t, claim, 1)
	require.Len(t, publish, 1)
	require.Equal(t, saveSC.SpanID(), claim[0].Parent().SpanID())
	require.Equal(t, saveSC.SpanID(), publish[0].Parent().SpanID())
	require.Equal(t, trace.SpanKindProducer, publish[0].SpanKind())

	// The published message carries the publish span's context, so the consumer's span continues this trace.
	var meta map[string]string
	for _, p := range b.snapshot() {
		if p.id == "traced" {
			meta = p.meta
		}
	}
	require.NotNil(t, meta)
	got := trace.SpanContextFromContext(telemetry.Extract(ctx, meta))
	require.Equal(t, saveSC.TraceID(), got.TraceID())
	require.Equal(t, publish[0].SpanContext().SpanID(), got.SpanID())

	// Untraced messages get publish spans of their own traces.
	var plainPublishes int
	for _, s := range spans.GetSpans().Snapshots() {
		if s.Name() == telemetry.SpanRelayPublish && s.SpanContext().TraceID() != saveSC.TraceID() {
			plainPublishes++
		}
	}
	require.Equal(t, 3, plainPublishes, "plain once, poison twice")

	// Metrics.
	m = metricsOf(t, reader)
	require.Equal(t, int64(2), sumOf(t, m[telemetry.MetricMessagesPublished]))
	require.Equal(t, int64(2), sumOf(t, m[telemetry.MetricMessagesFailed]), "poison rejected twice")
	require.Equal(t, int64(1), sumOf(t, m[telemetry.MetricMessagesDead]))
	hist := m[telemetry.MetricRelayClaimDuration].(metricdata.Histogram[float64])
	require.Len(t, hist.DataPoints, 1)
	require.GreaterOrEqual(t, hist.DataPoints[0].Count, uint64(2))
	require.Positive(t, hist.DataPoints[0].Sum)
	pending = m[telemetry.MetricOutboxPending].(metricdata.Gauge[int64])
	require.Equal(t, int64(0), pending.DataPoints[0].Value, "only the scheduled message is left")
	age = m[telemetry.MetricOutboxOldestAge].(metricdata.Gauge[float64])
	require.Zero(t, age.DataPoints[0].Value)

	// Without providers of its own, a relay uses its Outbox's.
	reader2 := sdkmetric.NewManualReader()
	mp2 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader2))
	t.Cleanup(func() { _ = mp2.Shutdown(ctx) })
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "one-more", Topic: "orders"})
	require.NoError(t, err)
	setupOn(t, e.pool, e.schema, &outbox.Config{MeterProvider: mp2}).relay(nil)
	pending = metricsOf(t, reader2)[telemetry.MetricOutboxPending].(metricdata.Gauge[int64])
	require.Equal(t, int64(1), pending.DataPoints[0].Value)
}

// attrSampler records the attributes a sampler is given for each publish span, and samples nothing.
type attrSampler struct {
	mu   sync.Mutex
	seen []map[string]string
}

func (s *attrSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Name == telemetry.SpanRelayPublish {
		m := map[string]string{}
		for _, kv := range p.Attributes {
			m[string(kv.Key)] = kv.Value.AsString()
		}
		s.mu.Lock()
		s.seen = append(s.seen, m)
		s.mu.Unlock()
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop}
}

func (s *attrSampler) Description() string { return "attrSampler" }

// A sampler deciding on a publish span sees its message's attributes: they go in when the span starts, not only
// on spans that record.
func TestPublishSpanAttributesReachTheSampler(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	sampler := &attrSampler{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "sampled-1", Topic: "sampled", Type: "test.Sampled",
		Payload: []byte("{}")})
	require.NoError(t, err)
	r := e.relay(func(c *outbox.RelayConfig) { c.TracerProvider = tp })
	res, err := r.Drain(ctx, newBroker())
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	sampler.mu.Lock()
	defer sampler.mu.Unlock()
	require.Len(t, sampler.seen, 1)
	require.Equal(t, "sampled-1", sampler.seen[0][string(telemetry.AttrMessageID)])
	require.Equal(t, "sampled", sampler.seen[0][string(telemetry.AttrTopic)])
	require.Equal(t, "test.Sampled", sampler.seen[0][string(telemetry.AttrMessageType)])
}
