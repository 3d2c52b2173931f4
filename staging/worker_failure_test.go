package staging

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// failingMapping maps OrderPlaced to one message, failing on totals of 13 while broken is set.
func failingMapping(e *env, broken *atomic.Bool) *Mapping {
	m := NewMapping(e.reg)
	_ = Map(m, "placed", func(src eventstore.Record, ev OrderPlaced) ([]Message, error) {
		if ev.Total == 13 && broken.Load() {
			return nil, errors.New("cannot map 13")
		}
		return []Message{{Topic: "orders", Type: "order.placed", Payload: ev}}, nil
	})
	return m
}

func (e *env) saveOrders(t *testing.T, totals ...int64) {
	t.Helper()
	r, _ := e.repo(e.store, &Config{Strategy: Deferred})
	for i, total := range totals {
		o := NewOrder(orderID(i))
		o.Place(total)
		require.NoError(t, r.Save(context.Background(), o))
	}
}

func workerStatus(t *testing.T, e *env, name string) WorkerStatus {
	t.Helper()
	sts, err := ListWorkerStatus(context.Background(), e.pool, e.store, e.schema)
	require.NoError(t, err)
	for _, s := range sts {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no status for %s in %v", name, sts)
	return WorkerStatus{}
}

// Under Stop (the default) a poison event stops the worker after MaxAttempts with a *WorkerError naming it, and
// the read-only ListWorkerStatus (no worker built) shows the failure.
func TestWorkerStopsOnAPoisonEventNamingIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var broken atomic.Bool
	broken.Store(true)
	e.saveOrders(t, 1, 13, 2)
	w, err := NewDeferredStager(e.store, e.outbox, failingMapping(e, &broken), &WorkerConfig{MaxAttempts: 2,
		RetryDelay: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = w.Run(ctx)
	require.ErrorIs(t, err, ErrWorkerStopped)
	var werr *WorkerError
	require.ErrorAs(t, err, &werr)
	require.Equal(t, orderID(1), werr.Record.StreamID)
	require.Equal(t, int64(1), werr.Record.Version)
	require.Equal(t, 2, werr.Attempts)
	require.ErrorContains(t, err, "cannot map 13")
	require.NotContains(t, err.Error(), "logfollow")
	st := workerStatus(t, e, "stager:default")
	require.Equal(t, WorkerFailed, st.State)
	require.Equal(t, "stager", st.Kind)
	require.Equal(t, werr.Record.Position, st.FailingPosition)
	require.Contains(t, st.LastError, "cannot map 13")
	require.Positive(t, st.Lag)
}

// Under Park a poison event is parked (listed with its error, counted in the status) and later events are staged;
// a replay requested from outside (as by the CLI) is carried out by the running worker once the cause is fixed,
// and a discard removes a parked event for good. An event whose row cannot be read is parked at once.
func TestWorkerParksAPoisonEventAndOthersFlow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var broken atomic.Bool
	broken.Store(true)
	e.saveOrders(t, 1, 13, 2, 3)
	_, err := e.pool.Exec(ctx, `UPDATE `+pgtest.Q(e.schema, "events")+` SET metadata = '[1]'
		WHERE stream_id = $1 AND version = 1`, orderID(3))
	require.NoError(t, err)
	w, err := NewDeferredStager(e.store, e.outbox, failingMapping(e, &broken), &WorkerConfig{OnFailure: Park,
		MaxAttempts: 2, RetryDelay: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	head, err := e.store.HeadPosition(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		sts, err := ListWorkerStatus(ctx, e.pool, nil, e.schema)
		require.NoError(t, err)
		return len(sts) == 1 && sts[0].Position >= head
	}, "the worker passes the poison events")
	require.Len(t, e.stagedIDs(), 2, "the two good orders are staged")
	parked, err := w.Parked(ctx)
	require.NoError(t, err)
	require.Len(t, parked, 2)
	require.Equal(t, orderID(1), parked[0].StreamID)
	require.Equal(t, 2, parked[0].Attempts)
	require.Contains(t, parked[0].LastError, "cannot map 13")
	require.Equal(t, orderID(3), parked[1].StreamID)
	require.Equal(t, 1, parked[1].Attempts, "an unreadable event is parked at once")
	require.Contains(t, parked[1].LastError, "cannot be read")
	st := workerStatus(t, e, w.Name())
	require.Equal(t, 2, st.Parked)
	require.Equal(t, WorkerRunning, st.State)

	broken.Store(false)
	n, err := RequestReplay(ctx, e.pool, e.schema, w.Name(), parked[0].ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		ps, err := ListParked(ctx, e.pool, e.schema, w.Name())
		require.NoError(t, err)
		return len(ps) == 1
	}, "the requested replay is carried out")
	require.Len(t, e.stagedIDs(), 3, "the replayed order is staged")
	require.NoError(t, DiscardParked(ctx, e.pool, e.schema, parked[1].ID))
	require.ErrorIs(t, DiscardParked(ctx, e.pool, e.schema, parked[1].ID), ErrParkedNotFound)
	require.ErrorIs(t, w.ReplayParked(ctx, parked[0].ID), ErrParkedNotFound)
	require.Zero(t, workerStatus(t, e, w.Name()).Parked)
}
