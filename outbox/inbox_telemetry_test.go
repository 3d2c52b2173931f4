package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Every inbox-wrapped run is a stagehand.inbox.handle span continuing the trace in the message's metadata, with
// its outcome; the handler's ctx carries the span, so its own spans and the messages it publishes join the trace.
func TestInboxHandleSpans(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	pool, schema := pgtest.Migrated(t)
	// The inbox takes the outbox's providers when its own configuration names none.
	e := setupOn(t, pool, schema, &outbox.Config{TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider})
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 2, RetryDelay: time.Millisecond})
	require.NoError(t, err)

	producer, pspan := rec.TracerProvider.Tracer("test").Start(context.Background(), "producer")
	pspan.End()
	traced := func(id string) *message.Message {
		msg := message.NewMessage(id, []byte("x"))
		telemetry.Inject(producer, msg.Metadata)
		msg.Metadata.Set(stagehand.HeaderMessageType, "test.Type")
		return msg
	}

	var handlerSpan trace.SpanContext
	ok := in.Handler("ok", func(ctx context.Context, _ pgx.Tx, out *outbox.Publisher, msg *message.Message) error {
		_, span := rec.TracerProvider.Tracer("test").Start(ctx, "handler")
		handlerSpan = span.SpanContext()
		span.End()
		return out.Publish("next", message.NewMessage("produced-by-"+msg.UUID, nil))
	})
	require.NoError(t, ok(traced("m1")))
	require.NoError(t, ok(traced("m1")), "a redelivery")
	failing := in.Handler("failing", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return errors.New("downstream rejected it")
	})
	m2 := traced("m2")
	requireRetried(t, failing(m2), m2)
	m2 = traced("m2")
	requireSettled(t, failing(m2), m2, "the second failure dead-letters")

	spans := rec.Spans(telemetry.SpanInboxHandle)
	require.Len(t, spans, 4)
	outcomes := []string{telemetry.OutcomeHandled, telemetry.OutcomeDuplicate, telemetry.OutcomeFailed,
		telemetry.OutcomeDeadLettered}
	for i, s := range spans {
		require.Equal(t, outcomes[i], telemetrytest.Attr(s, telemetry.AttrOutcome).AsString(), "span %d", i)
		require.Equal(t, pspan.SpanContext().TraceID(), s.SpanContext.TraceID(), "span %d", i)
		require.Equal(t, pspan.SpanContext().SpanID(), s.Parent.SpanID(), "the parent is in the metadata")
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		require.Equal(t, "test.Type", telemetrytest.Attr(s, telemetry.AttrMessageType).AsString())
	}
	require.Equal(t, "ok", telemetrytest.Attr(spans[0], telemetry.AttrHandler).AsString())
	require.Equal(t, "m1", telemetrytest.Attr(spans[0], telemetry.AttrMessageID).AsString())
	require.Equal(t, codes.Unset, spans[0].Status.Code)
	require.Equal(t, codes.Error, spans[2].Status.Code)
	require.Equal(t, codes.Error, spans[3].Status.Code)

	handler := rec.Spans("handler")
	require.Len(t, handler, 1, "the duplicate did not run the handler")
	require.Equal(t, spans[0].SpanContext.SpanID(), handler[0].Parent.SpanID(), "the handler's ctx holds the span")
	require.Equal(t, handlerSpan.TraceID(), spans[0].SpanContext.TraceID())
	require.Equal(t, spans[0].SpanContext.SpanID(), spanOf(e.stagedTraceparent("produced-by-m1")).SpanID(),
		"what the handler publishes continues the trace")

	for _, c := range []struct {
		handler, outcome string
		want             int64
	}{{"ok", telemetry.OutcomeHandled, 1}, {"ok", telemetry.OutcomeDuplicate, 1},
		{"failing", telemetry.OutcomeFailed, 1}, {"failing", telemetry.OutcomeDeadLettered, 1}} {
		n, _ := rec.Int64(t, telemetry.MetricInboxMessages, telemetry.AttrHandler.String(c.handler),
			telemetry.AttrOutcome.String(c.outcome))
		require.Equal(t, c.want, n, "%s %s", c.handler, c.outcome)
	}
}

// Through Inbox.Middleware the inner handler finds the inbox span in msg.Context().
func TestInboxMiddlewareSpan(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	pool, schema := pgtest.Migrated(t)
	e := setupOn(t, pool, schema, nil)
	in, err := e.ob.NewInbox(&outbox.InboxConfig{TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider})
	require.NoError(t, err)
	var inner trace.SpanContext
	h := in.Middleware("mw")(func(msg *message.Message) ([]*message.Message, error) {
		inner = trace.SpanContextFromContext(msg.Context())
		return nil, nil
	})
	_, err = h(message.NewMessage("m", nil))
	require.NoError(t, err)
	spans := rec.Spans(telemetry.SpanInboxHandle)
	require.Len(t, spans, 1)
	require.False(t, spans[0].Parent.IsValid(), "no trace context in the metadata: a new trace")
	require.Equal(t, spans[0].SpanContext.SpanID(), inner.SpanID())
	n, _ := rec.Int64(t, telemetry.MetricInboxMessages, telemetry.AttrOutcome.String(telemetry.OutcomeHandled))
	require.Equal(t, int64(1), n)
}
