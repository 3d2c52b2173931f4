package staging

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// Every goroutine a staging worker starts (its log follower, its listener, the replay loop of parked events) and
// every one a save starts (the coalesced wake-up notifications) ends with its owner: a Deferred stager and a
// reconciler run, catch up and stop, a Deferred save and an EventuallyConsistent save return, and nothing is left
// running. Not parallel: the leak check sees the whole process.
func TestWorkersLeaveNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	e := setup(t)
	ctx := context.Background()
	for _, s := range []Strategy{Deferred, EventuallyConsistent} {
		r, _ := e.repo(e.store, &Config{Strategy: s, Outbox: e.outbox})
		for i := range 3 {
			_, err := r.Create(ctx, orderID(int(s)*10+i), func(o *Order) error { o.Place(1); return nil })
			require.NoError(t, err)
		}
	}
	stager, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runUntilCaughtUp(t, stager, e.store)
	reconciler, err := NewReconciler(e.store, e.outbox, e.m, &WorkerConfig{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runUntilCaughtUp(t, reconciler, e.store)
	e.requireExactlyOnce(e.store)
}
