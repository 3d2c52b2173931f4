package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Parked messages are reported by what they wait for: an earlier pending message of their key (they go out in
// turn), or a dead letter holding their key (they wait for an operator). Neither is confused with the other.
func TestStatsTellWaitingFromHeldByADeadLetter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	// A key whose first message is dead-lettered: the two after it are held by the dead letter.
	_, err := e.ob.Stage(ctx, msgs("poison", 3, func(int) string { return "poisoned" })...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(rejectPrefix("poison-00000"))
	rec := telemetrytest.New(t)
	res, err := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(0)
		c.MeterProvider = rec.MeterProvider
	}).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Failed: 1, DeadLettered: 1}, res)
	st, err := e.ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 2, OldestPendingAge: st.OldestPendingAge, Parked: 2, HeldByDeadLetter: 2,
		DeadLettered: 1}, st)

	// A second key with six pending messages: one ready, five waiting behind it, none held.
	_, err = e.ob.Stage(ctx, msgs("busy", 6, func(int) string { return "busy" })...)
	require.NoError(t, err)
	st, err = e.ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 8, st.Pending)
	require.EqualValues(t, 5, st.WaitingBehindPending, "busy's five wait behind its first message")
	require.EqualValues(t, 2, st.HeldByDeadLetter, "poisoned's two are still held by its dead letter")
	require.EqualValues(t, 7, st.Parked)
	require.EqualValues(t, 1, st.DeadLettered)

	// The relay's gauge reports the same two figures apart.
	parked := func(behind string) int64 {
		n, ok := rec.Int64(t, telemetry.MetricOutboxParked, telemetry.AttrParkedBehind.String(behind))
		require.True(t, ok, "no %s data point", behind)
		return n
	}
	require.EqualValues(t, 5, parked(telemetry.ParkedBehindPending))
	require.EqualValues(t, 2, parked(telemetry.ParkedBehindDeadLetter))
	pending, _ := rec.Int64(t, telemetry.MetricOutboxPending)
	require.EqualValues(t, 8, pending)

	// Discarding the dead letter frees its key: its next message is due, the last waits behind it.
	n, err := e.ob.AllTenants().Discard(ctx, "poison-00000")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = e.ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.HeldByDeadLetter)
	require.EqualValues(t, 6, st.WaitingBehindPending)
}
