package aggregate

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// instruments are a repository's tracer and counters.
type instruments struct {
	tracer   trace.Tracer
	appended metric.Int64Counter
	typeAttr attribute.KeyValue
	addOpts  []metric.AddOption // the attributes every measurement of the repository carries, built once
}

// spanKind is built once: options are interfaces, and building one per save would allocate.
var spanKind = trace.WithSpanKind(trace.SpanKindInternal)

func newInstruments(tp trace.TracerProvider, mp metric.MeterProvider, aggregateType string) instruments {
	typeAttr := telemetry.AttrAggregateType.String(aggregateType)
	return instruments{
		tracer: telemetry.Tracer(tp),
		appended: telemetry.Int64Counter(telemetry.Meter(mp), telemetry.MetricEventsAppended,
			"Events appended to the event store by aggregate repositories.", "{event}"),
		typeAttr: typeAttr,
		addOpts:  []metric.AddOption{metric.WithAttributes(typeAttr)},
	}
}

// startSave starts the stagehand.save span of one save of aggregate id. The returned context carries it: the
// stager's spans are its children, and its span context is written into the metadata of the events saved.
func (in *instruments) startSave(ctx context.Context, id string) (context.Context, trace.Span) {
	return in.tracer.Start(ctx, telemetry.SpanSave, spanKind, trace.WithAttributes(in.typeAttr,
		telemetry.AttrAggregateID.String(id), telemetry.AttrTenant.String(stagehand.TenantFrom(ctx))))
}

// appendedEvents counts n events appended.
func (in *instruments) appendedEvents(ctx context.Context, n int) {
	if n > 0 {
		in.appended.Add(ctx, int64(n), in.addOpts...)
	}
}

// endSave ends span with the outcome of the save.
func endSave(span trace.Span, events int, err error) {
	if span.IsRecording() {
		span.SetAttributes(telemetry.AttrEvents.Int(events))
	}
	telemetry.RecordError(span, err)
	span.End()
}
