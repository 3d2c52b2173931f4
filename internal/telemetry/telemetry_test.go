package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
)

func TestInjectExtractRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	md := map[string]string{"other": "x"}
	telemetry.Inject(ctx, md)
	require.Contains(t, md, "traceparent")
	require.Equal(t, "x", md["other"])

	got := trace.SpanContextFromContext(telemetry.Extract(context.Background(), md))
	require.True(t, got.IsRemote())
	require.Equal(t, sc.TraceID(), got.TraceID())
	require.Equal(t, sc.SpanID(), got.SpanID())

	empty := map[string]string{}
	telemetry.Inject(context.Background(), empty)
	require.Empty(t, empty, "an untraced context adds no headers")
	require.False(t, trace.SpanContextFromContext(telemetry.Extract(context.Background(), nil)).IsValid())
	require.ElementsMatch(t, []string{"traceparent", "tracestate"}, telemetry.Headers())
}
