package outbox

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// traceHeaders returns the trace context headers (traceparent, tracestate) of the span in ctx, or nil when ctx
// carries none: untraced applications stage no trace headers.
func traceHeaders(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil // the common untraced case allocates nothing
	}
	h := map[string]string{}
	telemetry.Inject(ctx, h)
	if len(h) == 0 {
		return nil
	}
	return h
}

// withTraceContext returns md with the headers of hdr added, unless md already carries a trace context (a
// message derived from an event carries the event's; one set explicitly wins). md itself is never modified.
func withTraceContext(md, hdr map[string]string) map[string]string {
	if len(hdr) == 0 || telemetry.HasTraceContext(md) {
		return md
	}
	out := make(map[string]string, len(md)+len(hdr))
	maps.Copy(out, md)
	maps.Copy(out, hdr)
	return out
}

// countStaged adds n rows inserted to the stagehand.messages.staged counter.
func (o *Outbox) countStaged(ctx context.Context, n int) {
	if n > 0 {
		o.staged.Add(ctx, int64(n))
	}
}
