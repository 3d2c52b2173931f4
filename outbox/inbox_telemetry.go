package outbox

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// inboxInstruments are an inbox's tracer and counter.
type inboxInstruments struct {
	tracer   trace.Tracer
	messages metric.Int64Counter
}

func newInboxInstruments(tp trace.TracerProvider, mp metric.MeterProvider) inboxInstruments {
	return inboxInstruments{
		tracer: telemetry.Tracer(tp),
		messages: telemetry.Int64Counter(telemetry.Meter(mp), telemetry.MetricInboxMessages,
			"Messages an inbox-wrapped handler received, by handler and outcome.", "{message}"),
	}
}

// startHandle starts the stagehand.inbox.handle span of one handler run. Its parent is the trace context in the
// message's metadata (the relay's, or the producer's), else the span in ctx.
func (in *inboxInstruments) startHandle(ctx context.Context, name, tenant, msgType string, msg *message.Message) (
	context.Context, trace.Span) {
	attrs := []attribute.KeyValue{telemetry.AttrHandler.String(name), telemetry.AttrMessageID.String(msg.UUID),
		telemetry.AttrMessageType.String(msgType), telemetry.AttrTenant.String(tenant)}
	if topic := message.SubscribeTopicFromCtx(msg.Context()); topic != "" {
		attrs = append(attrs, telemetry.AttrTopic.String(topic))
	}
	return in.tracer.Start(telemetry.Extract(ctx, msg.Metadata), telemetry.SpanInboxHandle,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endHandle ends a handler run's span with its outcome (and the handler's error when it failed) and counts it.
func (in *inboxInstruments) endHandle(ctx context.Context, span trace.Span, name, outcome string, cause error) {
	span.SetAttributes(telemetry.AttrOutcome.String(outcome))
	if outcome == telemetry.OutcomeFailed || outcome == telemetry.OutcomeDeadLettered {
		telemetry.RecordError(span, cause)
	}
	span.End()
	in.messages.Add(ctx, 1, metric.WithAttributes(telemetry.AttrHandler.String(name),
		telemetry.AttrOutcome.String(outcome)))
}
