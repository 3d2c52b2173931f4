// Package telemetry holds stagehand's OpenTelemetry conventions in one place: the instrumentation scope, span and
// metric names, attribute keys, and the propagation of trace context through event and message metadata, so one
// trace runs from repo.Save through the outbox relay and the broker to the consumer's handler.
//
// Packages take a trace.TracerProvider and a metric.MeterProvider in their configuration; nil means the global
// providers (otel.GetTracerProvider, otel.GetMeterProvider), which do nothing until the application installs an
// SDK. No exporter is ever forced on users.
package telemetry

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every tracer and meter stagehand creates.
const ScopeName = "github.com/stagehand-es/stagehand"

// Span names.
const (
	SpanSave            = "stagehand.save"             // aggregate.Repository Save/SaveTx: append and staging
	SpanStage           = "stagehand.stage"            // staging the messages of a save
	SpanRelayClaim      = "stagehand.relay.claim"      // one claim of due outbox rows
	SpanRelayPublish    = "stagehand.relay.publish"    // one message handed to the broker
	SpanInboxHandle     = "stagehand.inbox.handle"     // an inbox-wrapped handler run
	SpanProjectionBatch = "stagehand.projection.batch" // one batch of a projection (or a log follower)
)

// Metric names. Counters are monotonic sums; gauges are observed on collection.
const (
	MetricEventsAppended     = "stagehand.events.appended"           // counter, events
	MetricMessagesStaged     = "stagehand.messages.staged"           // counter, messages
	MetricMessagesPublished  = "stagehand.messages.published"        // counter, messages
	MetricMessagesFailed     = "stagehand.messages.failed"           // counter, delivery attempts rejected
	MetricMessagesDead       = "stagehand.messages.dead_lettered"    // counter, messages
	MetricOutboxPending      = "stagehand.outbox.pending"            // gauge, messages
	MetricOutboxOldestAge    = "stagehand.outbox.oldest_pending_age" // gauge, seconds
	MetricRelayClaimDuration = "stagehand.relay.claim.duration"      // histogram, seconds
	MetricProjectionLag      = "stagehand.projection.lag"            // gauge, events
	MetricProjectionLagTime  = "stagehand.projection.lag_time"       // gauge, seconds
	MetricMaintenanceRemoved = "stagehand.maintenance.removed"       // counter, rows
	MetricMaintenancePasses  = "stagehand.maintenance.passes"        // counter, passes
)

// Attribute keys.
const (
	AttrAggregateType = attribute.Key("stagehand.aggregate.type")
	AttrAggregateID   = attribute.Key("stagehand.aggregate.id")
	AttrTenant        = attribute.Key("stagehand.tenant")
	AttrEvents        = attribute.Key("stagehand.events")
	AttrMessages      = attribute.Key("stagehand.messages")
	AttrMessageID     = attribute.Key("messaging.message.id")
	AttrMessageType   = attribute.Key("stagehand.message.type")
	AttrTopic         = attribute.Key("messaging.destination.name")
	AttrHandler       = attribute.Key("stagehand.handler")
	AttrProjection    = attribute.Key("stagehand.projection")
	AttrStrategy      = attribute.Key("stagehand.staging.strategy")
	AttrOutcome       = attribute.Key("stagehand.outcome")
	AttrTable         = attribute.Key("stagehand.table")
)

// Tracer returns the stagehand tracer of tp, or of the global provider when tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// Meter returns the stagehand meter of mp, or of the global provider when mp is nil.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName)
}

// propagator is W3C Trace Context: the headers travel in event and message metadata whatever propagator the
// application installs globally, so a trace never breaks between two stagehand components.
var propagator = propagation.TraceContext{}

// Headers are the metadata keys that carry trace context.
func Headers() []string { return propagator.Fields() }

// Inject writes the span context of ctx into metadata (traceparent, tracestate). It does nothing when ctx carries
// no valid span context, so untraced applications add no headers.
func Inject(ctx context.Context, metadata map[string]string) {
	if metadata == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(metadata))
}

// Extract returns ctx with the remote span context found in metadata, if any.
func Extract(ctx context.Context, metadata map[string]string) context.Context {
	if len(metadata) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(metadata))
}
