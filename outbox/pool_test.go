package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// poolOf returns a pool on the same database as pool with maxConns connections, closed when the test ends.
func poolOf(t *testing.T, pool *pgxpool.Pool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// A relay whose pool is smaller than what a subscription holds at once (stagehand.PoolSize) says so once, with
// the numbers, and still delivers: none of its statements holds a connection while it waits for another, so even
// one connection makes progress. A pool large enough logs nothing.
func TestRelayWarnsOnceAboutASmallPool(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	var captured logs
	e := setupOn(t, poolOf(t, base, 1), schema, &outbox.Config{Logger: captured.logger()})
	_, err := e.ob.Stage(context.Background(), msgs("t", 5, nil)...)
	require.NoError(t, err)
	r := e.relay(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.Subscribe(ctx, "t")
	require.NoError(t, err)
	for range 5 {
		select {
		case m := <-ch:
			m.Ack()
		case <-time.After(20 * time.Second):
			t.Fatal("a relay on a one-connection pool did not deliver")
		}
	}
	_, err = r.Subscribe(ctx, "t")
	require.NoError(t, err)
	warned := captured.lines(false, "level=WARN", "pool is smaller")
	require.Len(t, warned, 1, "logged once:\n%s", captured.all())
	require.Contains(t, warned[0], "pool MaxConns 1 is below the 3 connections this relay subscription holds at "+
		"once (claim 1 and mark 1 per partition × 1, upkeep 1)")
	require.Equal(t, 3, stagehand.PoolSize(stagehand.PoolUse{RelaySubscriptions: 1}))

	var quiet logs
	big := setupOn(t, poolOf(t, base, 3), schema, &outbox.Config{Logger: quiet.logger()})
	r2, err := big.ob.NewRelay(&outbox.RelayConfig{PollingInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r2.Close() })
	_, err = r2.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.Empty(t, quiet.lines(false, "pool is smaller"), "3 connections hold an unpartitioned relay")
}
