package health_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/outbox"
)

// The outbox component reports the messages waiting behind a pending message of their key apart from those held
// by a dead letter, counts neither as ready, and names the held ones beside the dead letters that hold them.
func TestOutboxDetailsTellParkedApart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "d1", Topic: "orders", PartitionKey: "poisoned"})
	require.NoError(t, err)
	r, err := e.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	res, err := r.Drain(ctx, rejecting{})
	require.NoError(t, err)
	require.Equal(t, 1, res.DeadLettered)
	_, err = e.ob.Stage(ctx,
		outbox.Message{ID: "h1", Topic: "orders", PartitionKey: "poisoned"},
		outbox.Message{ID: "h2", Topic: "orders", PartitionKey: "poisoned"},
		outbox.Message{ID: "w1", Topic: "orders", PartitionKey: "busy"},
		outbox.Message{ID: "w2", Topic: "orders", PartitionKey: "busy"},
		outbox.Message{ID: "w3", Topic: "orders", PartitionKey: "busy"})
	require.NoError(t, err)

	c := newChecker(t, health.Config{Outbox: e.ob.AllTenants()})
	rep := c.Check(ctx)
	d := component(t, rep, "outbox").Outbox
	require.EqualValues(t, 5, d.Pending)
	require.EqualValues(t, 2, d.WaitingBehindPending, "w2 and w3 wait behind w1")
	require.EqualValues(t, 2, d.HeldByDeadLetter, "h1 and h2 are held by d1")
	require.EqualValues(t, 4, d.Parked)
	require.EqualValues(t, 1, d.Ready, "only w1 is ready")
	require.Equal(t, health.Degraded, rep.Status)
	require.Equal(t, []string{"outbox: 1 dead letters wait to be redriven or discarded, holding 2 later messages " +
		"of their keys"}, rep.Reasons)

	b, err := json.Marshal(d)
	require.NoError(t, err)
	require.Contains(t, string(b), `"waiting_behind_pending":2,"held_by_dead_letter":2`)
}
