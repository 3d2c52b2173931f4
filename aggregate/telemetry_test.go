package aggregate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
)

// A save is one stagehand.save span, a child of the caller's span, whose context is written into every saved
// event's metadata; appended events are counted, a failed save is recorded on its span and counts nothing.
func TestSaveIsTracedAndCounted(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	store := eventstore.NewMemory(nil)
	r := repo(t, store, &aggregate.RepositoryConfig{TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider})
	ctx, parent := rec.TracerProvider.Tracer("test").Start(stagehand.WithTenant(context.Background(), "acme"),
		"request")

	a := r.New("a-1")
	require.NoError(t, a.Open("ann"))
	require.NoError(t, a.Deposit(5))
	require.NoError(t, r.Save(ctx, a))
	require.NoError(t, r.Save(ctx, a), "a save without changes")

	saves := rec.Spans(telemetry.SpanSave)
	require.Len(t, saves, 1, "a save without changes is not traced")
	save := saves[0]
	require.Equal(t, parent.SpanContext().TraceID(), save.SpanContext.TraceID())
	require.Equal(t, parent.SpanContext().SpanID(), save.Parent.SpanID())
	require.Equal(t, "bank.account", telemetrytest.Attr(save, telemetry.AttrAggregateType).AsString())
	require.Equal(t, "a-1", telemetrytest.Attr(save, telemetry.AttrAggregateID).AsString())
	require.Equal(t, "acme", telemetrytest.Attr(save, telemetry.AttrTenant).AsString())
	require.Equal(t, int64(2), telemetrytest.Attr(save, telemetry.AttrEvents).AsInt64())
	require.Equal(t, codes.Unset, save.Status.Code)

	recs, err := store.ReadStream(ctx, "acme", "a-1", 0)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, e := range recs {
		got := trace.SpanContextFromContext(telemetry.Extract(context.Background(), e.Metadata))
		require.Equal(t, save.SpanContext.TraceID(), got.TraceID(), "the event carries the save's trace")
		require.Equal(t, save.SpanContext.SpanID(), got.SpanID(), "the save span is the parent of what follows")
	}
	n, ok := rec.Int64(t, telemetry.MetricEventsAppended, telemetry.AttrAggregateType.String("bank.account"))
	require.True(t, ok)
	require.Equal(t, int64(2), n)

	// A concurrent writer got there first: the save fails, its span says so, nothing is counted.
	stale, err := r.Load(ctx, "a-1")
	require.NoError(t, err)
	_, err = r.Update(ctx, "a-1", func(a *Account) error { return a.Deposit(1) })
	require.NoError(t, err)
	require.NoError(t, stale.Deposit(2))
	require.ErrorIs(t, r.Save(ctx, stale), eventstore.ErrConcurrencyConflict)
	saves = rec.Spans(telemetry.SpanSave)
	require.Len(t, saves, 3)
	update, failed := saves[1], saves[2]
	require.Equal(t, int64(1), telemetrytest.Attr(update, telemetry.AttrAttempts).AsInt64())
	require.Equal(t, int64(1), telemetrytest.Attr(update, telemetry.AttrEvents).AsInt64())
	require.Equal(t, codes.Error, failed.Status.Code)
	require.NotEmpty(t, failed.Events, "the error is recorded on the span")
	n, _ = rec.Int64(t, telemetry.MetricEventsAppended)
	require.Equal(t, int64(3), n, "two events saved, one updated, none of the failed save")
}

// Update traces its load-decide-save attempts as one span; a trace context set explicitly in the metadata wins
// over the save's.
func TestUpdateIsOneSpanAndExplicitTraceContextWins(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	store := eventstore.NewMemory(nil)
	r := repo(t, store, &aggregate.RepositoryConfig{TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider, UpdateRetries: 5})
	ctx := context.Background()
	_, err := r.Create(ctx, "b", func(a *Account) error { return a.Open("bob") })
	require.NoError(t, err)

	// The first attempt loses to a concurrent deposit made inside fn; the second lands.
	calls := 0
	_, err = r.Update(ctx, "b", func(a *Account) error {
		calls++
		if calls == 1 {
			_, err := r.Update(context.Background(), "b", func(a *Account) error { return a.Deposit(1) })
			require.NoError(t, err)
		}
		return a.Deposit(10)
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls)
	saves := rec.Spans(telemetry.SpanSave)
	require.Len(t, saves, 3, "create, the nested update, the retried update")
	retried := saves[2]
	require.Equal(t, int64(2), telemetrytest.Attr(retried, telemetry.AttrAttempts).AsInt64())
	require.Len(t, retried.Events, 1, "one retry event")

	explicit := "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	_, err = r.Update(stagehand.WithMetadata(ctx, "traceparent", explicit), "b",
		func(a *Account) error { return a.Deposit(3) })
	require.NoError(t, err)
	recs, err := store.ReadStream(ctx, "", "b", 0)
	require.NoError(t, err)
	require.Equal(t, explicit, recs[len(recs)-1].Metadata["traceparent"])
}

// Without providers the global ones are used; with no SDK installed they record nothing and add no headers.
func TestUntracedSaveAddsNoHeaders(t *testing.T) {
	t.Parallel()
	store := eventstore.NewMemory(nil)
	r := repo(t, store, nil)
	_, err := r.Create(context.Background(), "c", func(a *Account) error { return a.Open("cy") })
	require.NoError(t, err)
	recs, err := store.ReadStream(context.Background(), "", "c", 0)
	require.NoError(t, err)
	require.NotContains(t, recs[0].Metadata, "traceparent")
}
