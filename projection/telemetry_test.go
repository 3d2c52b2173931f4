package projection_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// The lag gauges follow the checkpoint: a projection that never ran or is stopped behind N events shows lag N
// (and the age of the oldest event waiting), one that caught up shows 0; Close unregisters them. Every batch is
// a stagehand.projection.batch span linked to the traces of its events, with the handler's error recorded.
func TestProjectionLagGaugesAndBatchSpans(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rec := telemetrytest.New(t)
	ctx := context.Background()
	var failOnce atomic.Bool
	failOnce.Store(true)
	h := projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		if e.StreamID == "flaky" && failOnce.CompareAndSwap(true, false) {
			return errors.New("read model unavailable")
		}
		return nil
	})
	ahead := time.Hour // the clock the gauges measure time lag with runs an hour ahead
	p := w.newProjection(t, h, projection.Config{Name: "lagging", TracerProvider: rec.TracerProvider,
		MeterProvider: rec.MeterProvider, Clock: func() time.Time { return time.Now().Add(ahead) }})
	t.Cleanup(func() { _ = p.Close() })
	attrs := telemetry.AttrProjection.String("lagging")
	lag := func() int64 {
		n, ok := rec.Int64(t, telemetry.MetricProjectionLag, attrs)
		require.True(t, ok, "the lag gauge is observed")
		return n
	}

	w.open(t, w.store, "a")
	w.open(t, w.store, "b")
	require.Equal(t, int64(2), lag(), "never ran: the whole log is ahead")
	secs, ok := rec.Float64(t, telemetry.MetricProjectionLagTime, attrs)
	require.True(t, ok)
	require.GreaterOrEqual(t, secs, ahead.Seconds()-60)

	// One traced event, and one whose first attempt fails.
	traceCtx, span := rec.TracerProvider.Tracer("test").Start(ctx, "save")
	span.End()
	req := w.request(t, "traced", eventstore.NoStream, Opened{Owner: "t"})
	req.Events[0].Metadata = map[string]string{}
	telemetry.Inject(traceCtx, req.Events[0].Metadata)
	_, err := w.store.Append(ctx, req)
	require.NoError(t, err)
	w.open(t, w.store, "flaky")

	stop := start(t, p)
	pgtest.Eventually(t, 20*time.Second, func() bool { return lag() == 0 }, "the projection did not catch up")
	secs, _ = rec.Float64(t, telemetry.MetricProjectionLagTime, attrs)
	require.Zero(t, secs)
	require.NoError(t, stop())

	batches := rec.Spans(telemetry.SpanProjectionBatch)
	require.NotEmpty(t, batches)
	var linked, failed bool
	var events int64
	for _, b := range batches {
		require.Equal(t, "lagging", telemetrytest.Attr(b, telemetry.AttrProjection).AsString())
		require.LessOrEqual(t, telemetrytest.Attr(b, telemetry.AttrPositionFirst).AsInt64(),
			telemetrytest.Attr(b, telemetry.AttrPositionLast).AsInt64())
		for _, l := range b.Links {
			linked = linked || l.SpanContext.SpanID() == span.SpanContext().SpanID()
		}
		if b.Status.Code == codes.Error {
			failed = true
		} else {
			events += telemetrytest.Attr(b, telemetry.AttrEvents).AsInt64()
		}
	}
	require.True(t, linked, "a batch links to the trace of the save that recorded its event")
	require.True(t, failed, "the failed attempt is recorded")
	require.Equal(t, int64(4), events, "every event applied once in a batch that committed")

	// Stopped behind 3 events.
	for range 3 {
		w.appendEvents(t, w.store, "a", eventstore.AnyVersion, Deposited{Amount: 1})
	}
	require.Equal(t, int64(3), lag())
	start(t, p)
	pgtest.Eventually(t, 20*time.Second, func() bool { return lag() == 0 }, "the projection did not catch up")

	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close twice")
	_, ok = rec.Int64(t, telemetry.MetricProjectionLag, attrs)
	require.False(t, ok, "no lag observed after Close")
}

// In partitioned mode each checkpoint has its own gauge.
func TestProjectionLagPerPartition(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rec := telemetrytest.New(t)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{Name: "split", Partitions: 2,
		MeterProvider: rec.MeterProvider})
	t.Cleanup(func() { _ = p.Close() })
	w.seed(t, w.store, 4, 0)
	for _, cp := range []string{"split#0/2", "split#1/2"} {
		n, ok := rec.Int64(t, telemetry.MetricProjectionLag, telemetry.AttrCheckpoint.String(cp))
		require.True(t, ok, cp)
		require.Equal(t, int64(4), n, "%s: filtered positions count as lag, as in Status", cp)
	}
}
