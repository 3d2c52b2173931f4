package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// The outbox's Tx methods and a Publisher bound to a transaction run on that transaction alone: nothing is
// acquired from the pool while it holds its connection (see pgtest.OneConnection).
func TestTxMethodsUseOnlyTheCallersConnection(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.GuardedMigrated(t, 3)
	e := setupOn(t, pool, schema, nil)
	ctx := pgtest.OneConnection(context.Background(), "outbox Tx methods")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := e.ob.StageTx(ctx, tx, outbox.Message{ID: "m-1", Topic: "t", Payload: []byte(`{}`), PartitionKey: "k"},
		outbox.Message{ID: "m-2", Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, tx, "w", 5))
	p, err := e.ob.AdvanceWatermarkTx(ctx, tx, "w", 7)
	require.NoError(t, err)
	require.Equal(t, int64(7), p)
	p, ok, err := e.ob.WatermarkTx(ctx, tx, "w")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(7), p)
	pub := e.ob.Publisher(ctx, tx)
	require.NoError(t, pub.Publish("t", message.NewMessage("m-3", []byte(`{}`))))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, int64(3), pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "outbox")))
}
