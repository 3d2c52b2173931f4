package staging

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// startStage starts the stagehand.stage span of one save's staging, a child of the save span in ctx.
func startStage(ctx context.Context, tracer trace.Tracer, strategy Strategy, req eventstore.AppendRequest) (
	context.Context, trace.Span) {
	return tracer.Start(ctx, telemetry.SpanStage, trace.WithAttributes(
		telemetry.AttrStrategy.String(strategy.String()),
		telemetry.AttrAggregateType.String(req.StreamType),
		telemetry.AttrAggregateID.String(req.StreamID),
		telemetry.AttrTenant.String(stagehand.NormalizeTenant(req.Tenant)),
		telemetry.AttrEvents.Int(len(req.Events))))
}

// endStage ends a stage span with the number of messages derived and the error, if any.
func endStage(span trace.Span, messages int, err error) {
	span.SetAttributes(telemetry.AttrMessages.Int(messages))
	telemetry.RecordError(span, err)
	span.End()
}

// tagSave names the staging strategy on the caller's span (the repository's stagehand.save span).
func (s *Stager) tagSave(ctx context.Context) {
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrStrategy.String(s.strategy.String()))
}

// stageGroup is the stage span of the events of one save (one trace context) within a worker's batch.
type stageGroup struct {
	ctx              context.Context
	span             trace.Span
	events, messages int
}

// workerStages are the stage spans of a worker's batch: one per distinct trace context found in the events'
// metadata (the events of one save share it), so each continues the trace of the save that recorded its events.
// Events without a trace context share one span of their own, a new trace.
type workerStages struct {
	groups []*stageGroup
	byKey  map[string]*stageGroup
}

func (w *Worker) startStages(ctx context.Context, recs []eventstore.Record) *workerStages {
	ws := &workerStages{byKey: map[string]*stageGroup{}}
	for _, rec := range recs {
		key := rec.Metadata["traceparent"]
		g := ws.byKey[key]
		if g == nil {
			g = &stageGroup{}
			parent := telemetry.Extract(ctx, rec.Metadata)
			attrs := []attribute.KeyValue{telemetry.AttrStrategy.String(w.strategy.String()),
				telemetry.AttrCheckpoint.String(w.name), telemetry.AttrAggregateType.String(rec.StreamType),
				telemetry.AttrAggregateID.String(rec.StreamID),
				telemetry.AttrTenant.String(stagehand.NormalizeTenant(rec.Tenant))}
			g.ctx, g.span = w.tracer.Start(parent, telemetry.SpanStage, trace.WithAttributes(attrs...))
			ws.byKey[key] = g
			ws.groups = append(ws.groups, g)
		}
		g.events++
	}
	return ws
}

// counted adds n messages derived from rec to its group.
func (ws *workerStages) counted(rec eventstore.Record, n int) {
	if g := ws.byKey[rec.Metadata["traceparent"]]; g != nil {
		g.messages += n
	}
}

// untraced is the context of the span of events without a trace context (messages derived from them carry
// it), or fallback when every event had one.
func (ws *workerStages) untraced(fallback context.Context) context.Context {
	if g := ws.byKey[""]; g != nil {
		return g.ctx
	}
	return fallback
}

func (ws *workerStages) end(err error) {
	for _, g := range ws.groups {
		g.span.SetAttributes(telemetry.AttrEvents.Int(g.events))
		endStage(g.span, g.messages, err)
	}
}
