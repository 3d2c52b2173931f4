package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// stagedTraceparent reads the traceparent stored with message id.
func (e *env) stagedTraceparent(id string) string {
	e.t.Helper()
	var tp string
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT coalesce(metadata->>'traceparent', '') FROM `+
		pgtest.Q(e.schema, "outbox")+` WHERE message_id = $1`, id).Scan(&tp))
	return tp
}

func spanOf(traceparent string) trace.SpanContext {
	return trace.SpanContextFromContext(telemetry.Extract(context.Background(),
		map[string]string{"traceparent": traceparent}))
}

// A staged message without a trace context takes the caller's; one with its own keeps it; the caller's metadata
// map is left alone. Inserted rows are counted once, duplicates not at all.
func TestStagingCarriesTheCallersTraceAndCountsRows(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	pool, schema := pgtest.Migrated(t)
	e := setupOn(t, pool, schema, &outbox.Config{MeterProvider: rec.MeterProvider})
	ctx, span := rec.TracerProvider.Tracer("test").Start(context.Background(), "business")
	defer span.End()

	own := "00-ffeeddccbbaa99887766554433221100-aabbccddeeff0011-01"
	callerMeta := map[string]string{"k": "v"}
	n, err := e.ob.Stage(ctx,
		outbox.Message{ID: "plain", Topic: "t", Metadata: callerMeta},
		outbox.Message{ID: "own", Topic: "t", Metadata: map[string]string{"traceparent": own}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, map[string]string{"k": "v"}, callerMeta, "the caller's map is not modified")
	got := spanOf(e.stagedTraceparent("plain"))
	require.Equal(t, span.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), got.SpanID())
	require.Equal(t, own, e.stagedTraceparent("own"), "a message's own trace context wins")

	n, err = e.ob.Stage(ctx, outbox.Message{ID: "plain", Topic: "t"}, outbox.Message{ID: "third", Topic: "t"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	staged, ok := rec.Int64(t, telemetry.MetricMessagesStaged)
	require.True(t, ok)
	require.Equal(t, int64(3), staged, "a known ID inserts nothing and counts nothing")

	// Through a Watermill Publisher: the message's own context wins over the publisher's.
	msgCtx, msgSpan := rec.TracerProvider.Tracer("test").Start(context.Background(), "producer")
	defer msgSpan.End()
	withCtx := message.NewMessage("wm-ctx", nil)
	withCtx.SetContext(msgCtx)
	require.NoError(t, e.ob.Publisher(ctx, pool).Publish("t", withCtx, message.NewMessage("wm-plain", nil)))
	require.Equal(t, msgSpan.SpanContext().SpanID(), spanOf(e.stagedTraceparent("wm-ctx")).SpanID())
	require.Equal(t, span.SpanContext().SpanID(), spanOf(e.stagedTraceparent("wm-plain")).SpanID())

	// Untraced: no header.
	_, err = e.ob.Stage(context.Background(), outbox.Message{ID: "untraced", Topic: "t"})
	require.NoError(t, err)
	require.Empty(t, e.stagedTraceparent("untraced"))
}
