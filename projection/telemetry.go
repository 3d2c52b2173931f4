package projection

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// maxBatchLinks caps the span links a batch span carries to the traces of the saves that recorded its events.
const maxBatchLinks = 32

// instruments are a projection's tracer and lag gauges.
type instruments struct {
	tracer trace.Tracer

	mu   sync.Mutex
	reg  metric.Registration // the lag gauges' callback; nil after Close
	lag  metric.Int64ObservableGauge
	time metric.Float64ObservableGauge
}

// instrument creates the projection's tracer and registers its lag gauges.
func (p *Projection) instrument() error {
	p.tel.tracer = telemetry.Tracer(p.cfg.TracerProvider)
	m := telemetry.Meter(p.cfg.MeterProvider)
	lag, err := m.Int64ObservableGauge(telemetry.MetricProjectionLag, metric.WithUnit("{event}"),
		metric.WithDescription("Log positions between a projection's checkpoint and the head of the log."))
	if err != nil {
		return fmt.Errorf("projection: %s gauge: %w", telemetry.MetricProjectionLag, err)
	}
	lagTime, err := m.Float64ObservableGauge(telemetry.MetricProjectionLagTime, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest event after a projection's checkpoint has been waiting."))
	if err != nil {
		return fmt.Errorf("projection: %s gauge: %w", telemetry.MetricProjectionLagTime, err)
	}
	reg, err := m.RegisterCallback(p.observeLag, lag, lagTime)
	if err != nil {
		return fmt.Errorf("projection: register lag gauges: %w", err)
	}
	p.tel.reg, p.tel.lag, p.tel.time = reg, lag, lagTime
	return nil
}

// observeLag reports the lag of every checkpoint of the projection (one per partition): one query for the
// checkpoints, one for the head of the log, and one more per checkpoint behind it, for its time lag. A checkpoint
// that does not exist yet (the projection never ran) is at position 0.
func (p *Projection) observeLag(ctx context.Context, o metric.Observer) error {
	positions, err := logfollow.Positions(ctx, p.pool, p.cfg.Schema, kind, p.cfg.Name)
	if err != nil {
		return fmt.Errorf("projection %s: lag: %w", p.cfg.Name, err)
	}
	head, err := p.store.HeadPosition(ctx)
	if err != nil {
		return fmt.Errorf("projection %s: lag: %w", p.cfg.Name, err)
	}
	now := p.cfg.Clock()
	waiting := map[int64]float64{} // time lag by position, so partitions at one position share a read
	for _, f := range p.followers {
		pos := positions[f.Name()]
		attrs := metric.WithAttributes(telemetry.AttrProjection.String(p.cfg.Name),
			telemetry.AttrCheckpoint.String(f.Name()))
		lag := max(head-pos, 0)
		o.ObserveInt64(p.tel.lag, lag, attrs)
		secs, seen := waiting[pos]
		if lag > 0 && !seen {
			page, err := p.store.ReadLog(ctx, eventstore.LogQuery{After: pos, Limit: 1})
			var rerr *eventstore.RecordError
			if errors.As(err, &rerr) { // unreadable, but its wait is known
				page, err = eventstore.LogPage{Records: []eventstore.Record{rerr.Record}}, nil
			}
			if err != nil {
				return fmt.Errorf("projection %s: time lag: %w", p.cfg.Name, err)
			}
			if len(page.Records) > 0 {
				secs = max(now.Sub(page.Records[0].RecordedAt).Seconds(), 0)
			}
			waiting[pos] = secs
		}
		o.ObserveFloat64(p.tel.time, secs, attrs)
	}
	return nil
}

// Close unregisters the projection's lag gauges from its meter provider. Call it when the projection is no longer
// needed (after Run has returned); it is safe to call more than once. It does not stop Run.
func (p *Projection) Close() error {
	p.tel.mu.Lock()
	defer p.tel.mu.Unlock()
	if p.tel.reg == nil {
		return nil
	}
	err := p.tel.reg.Unregister()
	p.tel.reg = nil
	if err != nil {
		return fmt.Errorf("projection %s: unregister lag gauges: %w", p.cfg.Name, err)
	}
	return nil
}

// startBatch starts the stagehand.projection.batch span of one batch of checkpoint, linked to the traces of the
// saves that recorded its events (up to maxBatchLinks).
func (p *Projection) startBatch(ctx context.Context, checkpoint string, recs []eventstore.Record) (
	context.Context, trace.Span) {
	attrs := []attribute.KeyValue{telemetry.AttrProjection.String(p.cfg.Name),
		telemetry.AttrCheckpoint.String(checkpoint), telemetry.AttrEvents.Int(len(recs))}
	if len(recs) > 0 {
		attrs = append(attrs, telemetry.AttrPositionFirst.Int64(recs[0].Position),
			telemetry.AttrPositionLast.Int64(recs[len(recs)-1].Position))
	}
	var links []trace.Link
	seen := map[trace.SpanID]bool{}
	for _, r := range recs {
		if len(links) == maxBatchLinks {
			break
		}
		if !telemetry.HasTraceContext(r.Metadata) {
			continue
		}
		sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), r.Metadata))
		if sc.IsValid() && !seen[sc.SpanID()] {
			seen[sc.SpanID()] = true
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return p.tel.tracer.Start(ctx, telemetry.SpanProjectionBatch, trace.WithAttributes(attrs...),
		trace.WithLinks(links...))
}
