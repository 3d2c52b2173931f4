package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDrainBeats: a drain is a process operators must see like a subscription. It beats while it runs, with what
// it published, and records that it stopped when it returns.
func TestDrainBeats(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("orders", 30, nil)...)
	require.NoError(t, err)
	res, err := e.relay(nil).Drain(ctx, newBroker())
	require.NoError(t, err)
	require.Equal(t, 30, res.Published)
	require.EqualValues(t, 1, e.count("heartbeats", "kind = 'relay' AND activity = 30 AND stopped_at IS NOT NULL"),
		"one relay beat with the drain's 30 publications, stopped")
}
