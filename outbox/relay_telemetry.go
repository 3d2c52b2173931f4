package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// relayTelemetry is a relay's OpenTelemetry instrumentation (names in internal/telemetry):
//
//   - a stagehand.relay.claim span per claim that took rows: for each claimed message carrying trace context (a
//     traceparent in its metadata), a span in that message's trace covering the claim; one root span for the
//     claimed messages without trace context;
//   - a stagehand.relay.publish span per delivery, a child of the trace context in the message's metadata, whose
//     own context replaces it in the delivered Watermill message's metadata, so the consumer's span continues
//     the same trace;
//   - counters of messages published, delivery attempts rejected, and messages dead-lettered (by topic), a
//     histogram of claim durations, and gauges of the pending messages (due now, as Admin.Stats counts them), of
//     the age of the oldest, and of the parked messages by what they wait behind (an earlier pending message of
//     their key, or a dead letter holding it: Stats.WaitingBehindPending and Stats.HeldByDeadLetter), all from one
//     query per collection.
type relayTelemetry struct {
	r      *Relay
	tracer trace.Tracer

	publishedC, failedC, deadC metric.Int64Counter
	claimDuration              metric.Float64Histogram
	reg                        metric.Registration

	mu         sync.RWMutex
	topicAttrs map[string]metric.MeasurementOption // the topic attribute of each topic counted, built once
}

// maxTopicAttrs bounds topicAttrs: past it, a topic's attribute is built per measurement.
const maxTopicAttrs = 1024

func newRelayTelemetry(r *Relay) (*relayTelemetry, error) {
	tp, mp := r.s.TracerProvider, r.s.MeterProvider
	if tp == nil {
		tp = r.o.tp
	}
	if mp == nil {
		mp = r.o.mp
	}
	t := &relayTelemetry{r: r, tracer: telemetry.Tracer(tp), topicAttrs: map[string]metric.MeasurementOption{}}
	m := telemetry.Meter(mp)
	wrap := func(err error) error { return fmt.Errorf("outbox: relay metrics: %w", err) }
	var err error
	if t.publishedC, err = m.Int64Counter(telemetry.MetricMessagesPublished, metric.WithUnit("{message}"),
		metric.WithDescription("Messages the broker accepted from the outbox relay.")); err != nil {
		return nil, wrap(err)
	}
	if t.failedC, err = m.Int64Counter(telemetry.MetricMessagesFailed, metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery attempts the destination rejected (nacked or not acknowledged in time).")); err != nil {
		return nil, wrap(err)
	}
	if t.deadC, err = m.Int64Counter(telemetry.MetricMessagesDead, metric.WithUnit("{message}"),
		metric.WithDescription("Messages moved to the outbox dead letters.")); err != nil {
		return nil, wrap(err)
	}
	if t.claimDuration, err = m.Float64Histogram(telemetry.MetricRelayClaimDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of the relay's claims of due outbox rows.")); err != nil {
		return nil, wrap(err)
	}
	pending, err := m.Int64ObservableGauge(telemetry.MetricOutboxPending, metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the outbox that are due (not scheduled later), including those "+
			"backing off or waiting behind their key."))
	if err != nil {
		return nil, wrap(err)
	}
	oldest, err := m.Float64ObservableGauge(telemetry.MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest due message in the outbox (0 when none)."))
	if err != nil {
		return nil, wrap(err)
	}
	parked, err := m.Int64ObservableGauge(telemetry.MetricOutboxParked, metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the outbox parked behind an earlier message of their key, by what "+
			"they wait behind: an earlier pending message (pending) or a dead letter holding the key (dead_letter)."))
	if err != nil {
		return nil, wrap(err)
	}
	behindPending := metric.WithAttributes(telemetry.AttrParkedBehind.String(telemetry.ParkedBehindPending))
	behindDead := metric.WithAttributes(telemetry.AttrParkedBehind.String(telemetry.ParkedBehindDeadLetter))
	t.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		g, err := t.gauges(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(pending, g.pending)
		o.ObserveFloat64(oldest, g.oldest.Seconds())
		o.ObserveInt64(parked, g.waiting, behindPending)
		o.ObserveInt64(parked, g.held, behindDead)
		return nil
	}, pending, oldest, parked)
	if err != nil {
		return nil, wrap(err)
	}
	return t, nil
}

// gaugeValues are the figures of the relay's gauges at one collection.
type gaugeValues struct {
	pending, waiting, held int64
	oldest                 time.Duration
}

// gauges counts the due messages, the age of the oldest and the parked messages by what they wait behind, in one
// statement (a scan of the hot outbox table, which holds only messages still to publish; only parked rows probe
// the dead letters, through the key index).
func (t *relayTelemetry) gauges(ctx context.Context) (gaugeValues, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	o := t.r.o
	now := o.now()
	var g gaugeValues
	var oldest *time.Time
	err := o.pool.QueryRow(ctx, o.q.gauges, now).Scan(&g.pending, &oldest, &g.waiting, &g.held)
	if err != nil {
		return gaugeValues{}, fmt.Errorf("outbox: outbox gauges: %w", err)
	}
	if oldest != nil {
		g.oldest = max(now.Sub(*oldest), 0)
	}
	return g, nil
}

func (t *relayTelemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// claimed records a claim: its duration, and its spans when it took rows or failed.
func (t *relayTelemetry) claimed(ctx context.Context, start time.Time, took time.Duration, rows []*row, err error) {
	t.claimDuration.Record(ctx, took.Seconds())
	if len(rows) == 0 && err == nil {
		return // an empty poll: no span
	}
	end := start.Add(took)
	untraced := 0
	for _, rw := range rows {
		pctx := telemetry.Extract(ctx, rw.metadata)
		if !trace.SpanContextFromContext(pctx).IsValid() {
			untraced++
			continue
		}
		_, span := t.tracer.Start(pctx, telemetry.SpanRelayClaim, trace.WithTimestamp(start),
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(telemetry.AttrMessageID.String(rw.id), telemetry.AttrTopic.String(rw.topic),
				telemetry.AttrMessages.Int(len(rows))))
		span.End(trace.WithTimestamp(end))
	}
	if untraced == 0 && err == nil {
		return
	}
	_, span := t.tracer.Start(ctx, telemetry.SpanRelayClaim, trace.WithTimestamp(start), trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(telemetry.AttrMessages.Int(untraced)))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "claim failed")
	}
	span.End(trace.WithTimestamp(end))
}

// startPublish starts the publish span of a delivery, as a child of the trace context in the row's metadata. The
// returned context carries it; the delivery injects it into the message it hands over. The attributes go in at the
// start, so a sampler can decide on them.
func (t *relayTelemetry) startPublish(ctx context.Context, rw *row) (context.Context, trace.Span) {
	ctx = telemetry.Extract(ctx, rw.metadata)
	attrs := []attribute.KeyValue{telemetry.AttrMessageID.String(rw.id), telemetry.AttrTopic.String(rw.topic),
		telemetry.AttrTenant.String(rw.tenant)}
	if rw.msgType != "" {
		attrs = append(attrs, telemetry.AttrMessageType.String(rw.msgType))
	}
	return t.tracer.Start(ctx, telemetry.SpanRelayPublish, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...))
}

// published ends a delivery's span and counts a publication.
func (t *relayTelemetry) published(ctx context.Context, span trace.Span, rw *row, out outcome) {
	if span.IsRecording() { // the outcome is known only now; building it for a dropped span costs every delivery
		span.SetAttributes(telemetry.AttrOutcome.String(out.kind.String()))
	}
	switch out.kind {
	case Published:
		t.publishedC.Add(ctx, 1, t.topicAttr(rw.topic))
		t.r.beat.Add(1, time.Now())
	case Rejected, Unreachable:
		if out.err != nil {
			span.RecordError(out.err)
		}
		span.SetStatus(codes.Error, out.kind.String())
	}
	span.End()
}

// topicAttr is the measurement option of a topic's attribute, built once per topic (up to maxTopicAttrs).
func (t *relayTelemetry) topicAttr(topic string) metric.MeasurementOption {
	t.mu.RLock()
	opt, ok := t.topicAttrs[topic]
	t.mu.RUnlock()
	if ok {
		return opt
	}
	opt = metric.WithAttributeSet(attribute.NewSet(telemetry.AttrTopic.String(topic)))
	t.mu.Lock()
	if len(t.topicAttrs) < maxTopicAttrs {
		t.topicAttrs[topic] = opt
	}
	t.mu.Unlock()
	return opt
}

// failed counts a rejected attempt, and the dead-lettering it ended in.
func (t *relayTelemetry) failed(ctx context.Context, rw *row, dead bool) {
	attrs := t.topicAttr(rw.topic)
	t.failedC.Add(ctx, 1, attrs)
	if dead {
		t.deadC.Add(ctx, 1, attrs)
	}
}
