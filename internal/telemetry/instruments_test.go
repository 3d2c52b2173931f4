package telemetry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
)

func TestCopyTraceContext(t *testing.T) {
	src := map[string]string{"traceparent": "00-01-02-01", "tracestate": "a=b", "other": "x"}
	dst := map[string]string{"k": "v"}
	telemetry.CopyTraceContext(dst, src)
	require.Equal(t, map[string]string{"k": "v", "traceparent": "00-01-02-01", "tracestate": "a=b"}, dst,
		"only the trace headers are copied")

	own := map[string]string{"traceparent": "mine"}
	telemetry.CopyTraceContext(own, src)
	require.Equal(t, map[string]string{"traceparent": "mine"}, own, "an explicit traceparent wins, alone")

	empty := map[string]string{}
	telemetry.CopyTraceContext(empty, map[string]string{"tracestate": "orphan"})
	require.Empty(t, empty, "a tracestate without its traceparent means nothing")
	require.False(t, telemetry.HasTraceContext(nil))
}

func TestInstrumentHelpers(t *testing.T) {
	rec := telemetrytest.New(t)
	c := telemetry.Int64Counter(telemetry.Meter(rec.MeterProvider), "test.counter", "a counter", "{thing}")
	c.Add(context.Background(), 2)
	n, ok := rec.Int64(t, "test.counter")
	require.True(t, ok)
	require.Equal(t, int64(2), n)

	_, span := telemetry.Tracer(rec.TracerProvider).Start(context.Background(), "ok")
	telemetry.RecordError(span, nil)
	span.End()
	_, span = telemetry.Tracer(rec.TracerProvider).Start(context.Background(), "failed")
	telemetry.RecordError(span, errors.New("boom"))
	span.End()
	require.Equal(t, codes.Unset, rec.Spans("ok")[0].Status.Code)
	failed := rec.Spans("failed")[0]
	require.Equal(t, codes.Error, failed.Status.Code)
	require.Equal(t, "boom", failed.Status.Description)
	require.Len(t, failed.Events, 1, "the error is recorded as an event")
	require.Equal(t, telemetry.ScopeName, failed.InstrumentationScope.Name)
}
