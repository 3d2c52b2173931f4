package stagehand_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/staging"
)

// The domain of the end-to-end trace: an order placed once.
type telOrder struct {
	aggregate.Root
	Total int64
}

type telOrderPlaced struct{ Total int64 }

func (o *telOrder) Apply(e any) {
	if p, ok := e.(telOrderPlaced); ok {
		o.Total = p.Total
	}
}

// telPipeline is every component between repo.Save and a consumer's handler, each given the recorder's
// providers: repository → stager → outbox → relay → Watermill gochannel → inbox-wrapped handler.
type telPipeline struct {
	rec     *telemetrytest.Recorder
	store   *eventstore.PostgresStore
	ob      *outbox.Outbox
	repo    *aggregate.Repository[*telOrder]
	mapping *staging.Mapping
	handled chan trace.SpanContext // the span context the consumer's own span got
}

func newTelPipeline(t *testing.T, strategy staging.Strategy) *telPipeline {
	t.Helper()
	rec := telemetrytest.New(t)
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema, TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })

	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterAggregate(reg, "tel.order",
		func(id string) *telOrder { return &telOrder{Root: aggregate.NewRoot(id)} }))
	require.NoError(t, aggregate.RegisterEvent[telOrderPlaced](reg, "tel.order.placed"))
	m := staging.NewMapping(reg)
	require.NoError(t, staging.Map(m, "placed", func(src eventstore.Record, e telOrderPlaced) ([]staging.Message,
		error) {
		return []staging.Message{{Topic: "orders", Type: "orders.OrderPlaced", Payload: e}}, nil
	}))
	stager, err := staging.New(store, &staging.Config{Strategy: strategy, Outbox: ob, Mapping: m,
		TracerProvider: rec.TracerProvider})
	require.NoError(t, err)
	repo, err := aggregate.NewRepository[*telOrder](store, reg, &aggregate.RepositoryConfig{Stager: stager,
		TracerProvider: rec.TracerProvider, MeterProvider: rec.MeterProvider})
	require.NoError(t, err)

	relay, err := ob.NewRelay(&outbox.RelayConfig{PollingInterval: 50 * time.Millisecond,
		TracerProvider: rec.TracerProvider, MeterProvider: rec.MeterProvider})
	require.NoError(t, err)
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	relay.AddToRouter(router, broker, nil)
	inbox, err := ob.NewInbox(&outbox.InboxConfig{TracerProvider: rec.TracerProvider})
	require.NoError(t, err)
	p := &telPipeline{rec: rec, store: store, ob: ob, repo: repo, mapping: m, handled: make(chan trace.SpanContext, 1)}
	router.AddConsumerHandler("billing", "orders", broker, inbox.Handler("billing",
		func(ctx context.Context, _ pgx.Tx, _ *outbox.Publisher, _ *message.Message) error {
			_, span := rec.TracerProvider.Tracer("billing").Start(ctx, "billing.charge")
			span.End()
			p.handled <- span.SpanContext()
			return nil
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = router.Close()
		require.NoError(t, <-done)
		_ = relay.Close()
		_ = broker.Close()
	})
	select {
	case <-router.Running():
	case <-time.After(20 * time.Second):
		t.Fatal("the router did not start")
	}
	return p
}

// waitHandled waits for the consumer's handler and its inbox span, and returns the span context of the handler's
// own span.
func (p *telPipeline) waitHandled(t *testing.T) trace.SpanContext {
	t.Helper()
	var sc trace.SpanContext
	select {
	case sc = <-p.handled:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer's handler never ran")
	}
	// The inbox span ends after the handler returns and its transaction commits.
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(p.rec.Spans(telemetry.SpanInboxHandle)) > 0 },
		"the inbox span never ended")
	return sc
}

// one returns the only span named name.
func (p *telPipeline) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	spans := p.rec.Spans(name)
	require.Len(t, spans, 1, "spans named %s", name)
	return spans[0]
}

// requireOneTrace checks the spans from the save to the consumer's own span form one trace, parent to child.
func (p *telPipeline) requireOneTrace(t *testing.T, consumer trace.SpanContext) {
	t.Helper()
	save, stage, handle := p.one(t, telemetry.SpanSave), p.one(t, telemetry.SpanStage),
		p.one(t, telemetry.SpanInboxHandle)
	traceID := save.SpanContext.TraceID()
	require.False(t, save.Parent.IsValid(), "the save starts the trace")
	require.Equal(t, traceID, stage.SpanContext.TraceID(), "stage")
	require.Equal(t, save.SpanContext.SpanID(), stage.Parent.SpanID(), "the save is the stage's parent")
	require.Equal(t, traceID, handle.SpanContext.TraceID(), "inbox handle")
	require.Equal(t, telemetry.OutcomeHandled, telemetrytest.Attr(handle, telemetry.AttrOutcome).AsString())
	require.Equal(t, traceID, consumer.TraceID(), "the handler's own span")
	handler := p.one(t, "billing.charge")
	require.Equal(t, handle.SpanContext.SpanID(), handler.Parent.SpanID(), "the handler's ctx holds the inbox span")

	// The relay's publish span sits between the stage and the consumer: the inbox continues from it.
	publish := p.one(t, telemetry.SpanRelayPublish)
	require.Equal(t, traceID, publish.SpanContext.TraceID(), "relay publish")
	require.Equal(t, publish.SpanContext.SpanID(), handle.Parent.SpanID(), "the relay's publish is the inbox's parent")
}

// One trace runs from repo.Save to the consumer's handler: the save, the staging in its transaction, the relay's
// publish and the inbox, each the child of the one before; events appended and messages staged are counted.
func TestOneTraceFromSaveToTheConsumer(t *testing.T) {
	pgtest.CheckLeaks(t) // not parallel: the leak check sees every goroutine
	t.Run("transactional", func(t *testing.T) {
		p := newTelPipeline(t, staging.Transactional)
		_, err := p.repo.Create(context.Background(), "o-1", func(o *telOrder) error {
			aggregate.Raise(o, telOrderPlaced{Total: 42})
			return nil
		})
		require.NoError(t, err)
		p.requireOneTrace(t, p.waitHandled(t))
		n, _ := p.rec.Int64(t, telemetry.MetricEventsAppended, telemetry.AttrAggregateType.String("tel.order"))
		require.Equal(t, int64(1), n)
		n, _ = p.rec.Int64(t, telemetry.MetricMessagesStaged)
		require.Equal(t, int64(1), n)
	})

	// Under Deferred the save stages nothing; the Deferred stager reads the event from the log later and
	// continues the save's trace from the event's metadata, through to the consumer.
	t.Run("deferred", func(t *testing.T) {
		p := newTelPipeline(t, staging.Deferred)
		_, err := p.repo.Create(context.Background(), "o-2", func(o *telOrder) error {
			aggregate.Raise(o, telOrderPlaced{Total: 7})
			return nil
		})
		require.NoError(t, err)
		require.Empty(t, p.rec.Spans(telemetry.SpanStage), "nothing staged on save")

		w, err := staging.NewDeferredStager(p.store, p.ob, p.mapping, &staging.WorkerConfig{
			PollInterval: 20 * time.Millisecond, TracerProvider: p.rec.TracerProvider})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		consumer := p.waitHandled(t)
		cancel()
		require.NoError(t, <-done)

		stage := p.one(t, telemetry.SpanStage)
		require.True(t, stage.Parent.IsRemote(), "the stage span's parent comes from the event's metadata")
		require.Equal(t, "deferred", telemetrytest.Attr(stage, telemetry.AttrStrategy).AsString())
		p.requireOneTrace(t, consumer)
		n, _ := p.rec.Int64(t, telemetry.MetricMessagesStaged)
		require.Equal(t, int64(1), n)
	})
}
