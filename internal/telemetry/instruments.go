package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// More metric names (see the list beside MetricEventsAppended).
const (
	MetricInboxMessages = "stagehand.inbox.messages" // counter, messages an inbox-wrapped handler saw, by outcome
	MetricOutboxParked  = "stagehand.outbox.parked"  // gauge, messages parked behind their key, by AttrParkedBehind
)

// What a parked outbox message waits for (the AttrParkedBehind value of MetricOutboxParked).
const (
	ParkedBehindPending    = "pending"     // an earlier pending message of its key: it goes out in turn
	ParkedBehindDeadLetter = "dead_letter" // a dead letter holding its key: it waits for an operator
)

// More attribute keys (see the list beside AttrAggregateType).
const (
	AttrCheckpoint    = attribute.Key("stagehand.checkpoint")     // a log follower's checkpoint name
	AttrPositionFirst = attribute.Key("stagehand.position.first") // first log position of a batch
	AttrPositionLast  = attribute.Key("stagehand.position.last")  // last log position of a batch
	AttrAttempts      = attribute.Key("stagehand.attempts")       // attempts a unit of work took
	AttrParkedBehind  = attribute.Key("stagehand.parked.behind")  // what a parked outbox message waits for
)

// Outcomes of an inbox-wrapped handler run (the AttrOutcome value of SpanInboxHandle and MetricInboxMessages).
const (
	OutcomeHandled      = "handled"       // the handler ran and its transaction committed
	OutcomeDuplicate    = "duplicate"     // the message was handled before: skipped
	OutcomeFailed       = "failed"        // the handler failed; the message goes back to the broker
	OutcomeDeadLettered = "dead_lettered" // the handler failed for good; the message went to the dead letters
)

// Int64Counter returns the counter name of m. Instrument names are constants, so creation cannot fail in
// practice; if an SDK refuses one anyway, a no-op counter is returned rather than a nil one.
func Int64Counter(m metric.Meter, name, description, unit string) metric.Int64Counter {
	c, err := m.Int64Counter(name, metric.WithDescription(description), metric.WithUnit(unit))
	if err != nil || c == nil {
		c, _ = noop.Meter{}.Int64Counter(name)
	}
	return c
}

// RecordError records err on span and marks the span failed. A nil err does nothing.
func RecordError(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// HasTraceContext reports whether metadata carries a trace context header (traceparent).
func HasTraceContext(metadata map[string]string) bool {
	_, ok := metadata[traceparent]
	return ok
}

// CopyTraceContext copies the trace context headers of src into dst, unless dst has a traceparent of its own
// (an explicit header wins, and its tracestate is never mixed with another trace's). dst must not be nil.
func CopyTraceContext(dst, src map[string]string) {
	if HasTraceContext(dst) || !HasTraceContext(src) {
		return
	}
	for _, h := range Headers() {
		if v, ok := src[h]; ok {
			dst[h] = v
		}
	}
}

const traceparent = "traceparent"
