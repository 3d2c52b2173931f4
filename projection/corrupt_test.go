package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// corrupt overwrites the metadata of a stored event with JSON that is not an object, as another tool could.
func (w world) corrupt(t *testing.T, stream string, version int64) {
	t.Helper()
	_, err := w.pool.Exec(context.Background(), `UPDATE `+pgtest.Q(w.schema, "events")+
		` SET metadata = '[1, 2]' WHERE stream_id = $1 AND version = $2`, stream, version)
	require.NoError(t, err)
}

// An event whose row cannot be read stops a Stop projection with a typed error naming its stream, version and
// position, shown in its status: it no longer stalls the projection forever with an empty last error.
func TestUnreadableEventStopsAStopProjectionNamingIt(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.open(t, w.store, "a")
	w.appendEvents(t, w.store, "a", 1, Deposited{Amount: 1}, Deposited{Amount: 2})
	w.corrupt(t, "a", 2)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{MaxAttempts: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.Run(ctx)
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorIs(t, err, eventstore.ErrCorruptRecord)
	var herr *projection.HandlerError
	require.ErrorAs(t, err, &herr)
	require.Equal(t, int64(2), herr.Record.Position)
	require.Equal(t, "a", herr.Record.StreamID)
	require.Equal(t, int64(2), herr.Record.Version)
	require.Equal(t, 1, herr.Attempts, "a row that cannot be read is not retried")
	st := status(t, p)
	require.Equal(t, projection.Failed, st.State)
	require.Equal(t, int64(1), st.Position)
	require.Equal(t, int64(2), st.FailingPosition)
	require.Contains(t, st.LastError, `stream "a" version 2`)
	require.Equal(t, []int64{1}, appliedPositions(t, w))
}

// A Park projection parks the unreadable event (listed with its error) and goes on with the others.
func TestUnreadableEventIsParkedAndOthersFlow(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.open(t, w.store, "a")
	w.appendEvents(t, w.store, "a", 1, Deposited{Amount: 1})
	w.open(t, w.store, "b")
	w.corrupt(t, "a", 2)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{OnFailure: projection.Park,
		PollInterval: 20 * time.Millisecond})
	start(t, p)
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "the others flow")
	require.Equal(t, []int64{1, 3}, appliedPositions(t, w))
	parked, err := p.Parked(context.Background())
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, int64(2), parked[0].Position)
	require.Equal(t, "a", parked[0].StreamID)
	require.Contains(t, parked[0].LastError, "cannot be read")
	require.Equal(t, 1, status(t, p).Parked)
}

// In partitioned mode only the partition that owns the unreadable event's stream parks it; the others pass it.
func TestUnreadableEventIsParkedOnceByItsPartition(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		w.open(t, w.store, id)
	}
	w.corrupt(t, "c", 1)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{OnFailure: projection.Park, Partitions: 2,
		PollInterval: 20 * time.Millisecond})
	start(t, p)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		st, err := p.Status(context.Background())
		require.NoError(t, err)
		return len(st) == 2 && caughtUp(t, w, p)() && len(appliedPositions(t, w)) == 3
	}, "every partition passes the event")
	parked, err := p.Parked(context.Background())
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "c", parked[0].StreamID)
	require.Equal(t, 1, parked[0].Attempts, "parked by one partition, once")
	require.Len(t, appliedPositions(t, w), 3)
}
