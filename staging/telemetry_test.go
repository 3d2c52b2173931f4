package staging

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

const (
	eventTraceparent = "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	eventTracestate  = "vendor=event"
)

// A message derived from an event carries the event's trace context; a traceparent the mapping sets wins, and the
// event's tracestate is then left out rather than mixed with another trace.
func TestMessagesCarryTheEventsTraceContext(t *testing.T) {
	t.Parallel()
	m := NewMapping(nil)
	require.NoError(t, m.MapRaw("plain", "e", func(src eventstore.Record) ([]Message, error) {
		return []Message{{Topic: "t", Headers: map[string]string{"x": "1"}}}, nil
	}))
	explicit := "00-ffeeddccbbaa99887766554433221100-aabbccddeeff0011-01"
	require.NoError(t, m.MapRaw("explicit", "e", func(src eventstore.Record) ([]Message, error) {
		return []Message{{Topic: "t", Headers: map[string]string{"traceparent": explicit}}}, nil
	}))
	rec := eventstore.Record{EventID: uuid.New(), StreamID: "s", StreamType: "st", Type: "e", Version: 1,
		Payload: json.RawMessage(`{}`), Metadata: map[string]string{"traceparent": eventTraceparent,
			"tracestate": eventTracestate}}
	msgs, err := m.messages(rec, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.Equal(t, eventTraceparent, msgs[0].Metadata["traceparent"])
	require.Equal(t, eventTracestate, msgs[0].Metadata["tracestate"])
	require.Equal(t, "1", msgs[0].Metadata["x"])
	require.Equal(t, explicit, msgs[1].Metadata["traceparent"], "the mapping's header wins")
	require.NotContains(t, msgs[1].Metadata, "tracestate", "no tracestate of another trace")

	rec.Metadata = nil
	msgs, err = m.messages(rec, nil)
	require.NoError(t, err)
	require.NotContains(t, msgs[0].Metadata, "traceparent", "an untraced event adds no header")
}

// traced returns a repository using strategy, with every component recording into rec.
func (e *env) traced(rec *telemetrytest.Recorder, strategy Strategy) (*aggregate.Repository[*Order], *outbox.Outbox) {
	e.t.Helper()
	ob, err := outbox.New(e.pool, &outbox.Config{Schema: e.schema, MeterProvider: rec.MeterProvider})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = ob.Close() })
	st, err := New(e.store, &Config{Strategy: strategy, Outbox: ob, Mapping: e.m,
		TracerProvider: rec.TracerProvider})
	require.NoError(e.t, err)
	r, err := aggregate.NewRepository[*Order](e.store, e.reg, &aggregate.RepositoryConfig{Stager: st,
		TracerProvider: rec.TracerProvider, MeterProvider: rec.MeterProvider})
	require.NoError(e.t, err)
	return r, ob
}

// outboxTraceparents returns the traceparent of every staged message.
func (e *env) outboxTraceparents() []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT coalesce(metadata->>'traceparent', '') FROM `+
		pgtest.Q(e.schema, "outbox"))
	require.NoError(e.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var tp string
		require.NoError(e.t, rows.Scan(&tp))
		out = append(out, tp)
	}
	require.NoError(e.t, rows.Err())
	return out
}

// Under Transactional and EventuallyConsistent the stage span is a child of the save span, which names the
// strategy; the staged messages carry the save's trace context and are counted once.
func TestStagingOnSaveIsAChildOfTheSave(t *testing.T) {
	t.Parallel()
	for _, strategy := range []Strategy{Transactional, EventuallyConsistent} {
		t.Run(strategy.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			rec := telemetrytest.New(t)
			r, _ := e.traced(rec, strategy)
			_, err := r.Create(context.Background(), "o-1", func(o *Order) error { o.Place(5); return nil })
			require.NoError(t, err)

			saves, stages := rec.Spans(telemetry.SpanSave), rec.Spans(telemetry.SpanStage)
			require.Len(t, saves, 1)
			require.Len(t, stages, 1)
			save, stage := saves[0], stages[0]
			require.Equal(t, strategy.String(), telemetrytest.Attr(save, telemetry.AttrStrategy).AsString())
			require.Equal(t, save.SpanContext.TraceID(), stage.SpanContext.TraceID())
			require.Equal(t, save.SpanContext.SpanID(), stage.Parent.SpanID())
			require.Equal(t, int64(2), telemetrytest.Attr(stage, telemetry.AttrEvents).AsInt64())
			require.Equal(t, int64(3), telemetrytest.Attr(stage, telemetry.AttrMessages).AsInt64())

			tps := e.outboxTraceparents()
			require.Len(t, tps, 3)
			for _, tp := range tps {
				sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(),
					map[string]string{"traceparent": tp}))
				require.Equal(t, save.SpanContext.TraceID(), sc.TraceID())
				require.Equal(t, save.SpanContext.SpanID(), sc.SpanID(), "the event's traceparent: the save span")
			}
			n, _ := rec.Int64(t, telemetry.MetricMessagesStaged)
			require.Equal(t, int64(3), n)
			n, _ = rec.Int64(t, telemetry.MetricEventsAppended)
			require.Equal(t, int64(2), n)
		})
	}
}

// Under Deferred the save stages nothing; the Deferred stager, reading the events later, continues each save's
// trace with a stage span whose parent is the save span (one per save, even when one batch holds several).
func TestDeferredStagerContinuesTheSavesTrace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := telemetrytest.New(t)
	r, ob := e.traced(rec, Deferred)
	ctx := context.Background()
	for _, id := range []string{"d-1", "d-2"} {
		_, err := r.Create(ctx, id, func(o *Order) error { o.Place(1); return nil })
		require.NoError(t, err)
	}
	saves := rec.Spans(telemetry.SpanSave)
	require.Len(t, saves, 2)
	require.Equal(t, "deferred", telemetrytest.Attr(saves[0], telemetry.AttrStrategy).AsString())
	require.Empty(t, rec.Spans(telemetry.SpanStage), "a deferred save stages nothing")

	w, err := NewDeferredStager(e.store, ob, e.m, &WorkerConfig{TracerProvider: rec.TracerProvider})
	require.NoError(t, err)
	runUntilCaughtUp(t, w, e.store)

	stages := rec.Spans(telemetry.SpanStage)
	require.Len(t, stages, 2, "one stage span per save")
	for i, stage := range stages {
		require.Equal(t, saves[i].SpanContext.TraceID(), stage.SpanContext.TraceID())
		require.Equal(t, saves[i].SpanContext.SpanID(), stage.Parent.SpanID())
		require.True(t, stage.Parent.IsRemote(), "the parent comes from the event's metadata")
		require.Equal(t, "deferred", telemetrytest.Attr(stage, telemetry.AttrStrategy).AsString())
		require.Equal(t, w.Name(), telemetrytest.Attr(stage, telemetry.AttrCheckpoint).AsString())
		require.Equal(t, int64(2), telemetrytest.Attr(stage, telemetry.AttrEvents).AsInt64())
		require.Equal(t, int64(3), telemetrytest.Attr(stage, telemetry.AttrMessages).AsInt64())
	}
	n, _ := rec.Int64(t, telemetry.MetricMessagesStaged)
	require.Equal(t, int64(6), n)
	e.requireExactlyOnce(e.store)
}

// In SaveTx, Transactional stages on the caller's transaction inside the save span; EventuallyConsistent leaves
// staging to the Reconciler, whose stage span continues the save's trace and names its strategy.
func TestSaveTxStagingSpans(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := telemetrytest.New(t)
	ctx := context.Background()
	for _, c := range []struct {
		strategy Strategy
		id       string
	}{{Transactional, "tx-1"}, {EventuallyConsistent, "ec-1"}} {
		r, _ := e.traced(rec, c.strategy)
		tx, err := e.store.Begin(ctx)
		require.NoError(t, err)
		o := r.New(c.id)
		o.Place(1)
		require.NoError(t, r.SaveTx(ctx, tx, o))
		require.NoError(t, tx.Commit(ctx))
	}
	saves, stages := rec.Spans(telemetry.SpanSave), rec.Spans(telemetry.SpanStage)
	require.Len(t, saves, 2)
	require.Len(t, stages, 1, "only Transactional stages in SaveTx")
	require.Equal(t, saves[0].SpanContext.SpanID(), stages[0].Parent.SpanID())
	require.Equal(t, "transactional", telemetrytest.Attr(stages[0], telemetry.AttrStrategy).AsString())

	rec.Reset()
	w, err := NewReconciler(e.store, e.outbox, e.m, &WorkerConfig{TracerProvider: rec.TracerProvider})
	require.NoError(t, err)
	runUntilCaughtUp(t, w, e.store)
	stages = rec.Spans(telemetry.SpanStage)
	require.Len(t, stages, 2, "one per save in the log: the reconciler passes the staged one again")
	byTrace := map[trace.TraceID]string{}
	for _, s := range stages {
		byTrace[s.SpanContext.TraceID()] = telemetrytest.Attr(s, telemetry.AttrStrategy).AsString()
		require.True(t, s.Parent.IsRemote())
	}
	for _, save := range saves {
		require.Equal(t, "eventually-consistent", byTrace[save.SpanContext.TraceID()],
			"the reconciler continues the trace of save %s",
			telemetrytest.Attr(save, telemetry.AttrAggregateID).AsString())
	}
	e.requireExactlyOnce(e.store)
}

// Events saved without a trace (no SDK, or before tracing was on) share one stage span per batch, a new trace, and
// their messages carry it so the relay and the consumer still see one trace per batch.
func TestDeferredStagerTracesUntracedEvents(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := telemetrytest.New(t)
	r, _ := e.repo(e.store, &Config{Strategy: Deferred}) // global providers: untraced saves
	for _, id := range []string{"u-1", "u-2"} {
		_, err := r.Create(context.Background(), id, func(o *Order) error { o.Place(1); return nil })
		require.NoError(t, err)
	}
	w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{TracerProvider: rec.TracerProvider})
	require.NoError(t, err)
	runUntilCaughtUp(t, w, e.store)
	stages := rec.Spans(telemetry.SpanStage)
	require.NotEmpty(t, stages)
	var events int64
	ids := map[trace.SpanID]bool{}
	for _, s := range stages {
		require.False(t, s.Parent.IsValid(), "a new trace")
		events += telemetrytest.Attr(s, telemetry.AttrEvents).AsInt64()
		ids[s.SpanContext.SpanID()] = true
	}
	require.Equal(t, int64(4), events)
	tps := e.outboxTraceparents()
	require.Len(t, tps, 6)
	for _, tp := range tps {
		sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(),
			map[string]string{"traceparent": tp}))
		require.True(t, ids[sc.SpanID()], "the message carries its batch's stage span")
	}
}
