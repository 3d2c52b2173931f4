package staging

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// A Deferred stager whose event store reads through its one-connection pool still stages every event's messages:
// a batch's transaction never waits for a second connection.
func TestWorkerProgressesOnAOneConnectionPool(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	cfg := base.Config()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := setupOn(t, pool, schema)
	ctx := context.Background()
	r, _ := e.repo(e.store, &Config{Strategy: Deferred})
	for i := range 30 {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(int64(i)); return nil })
		require.NoError(t, err)
	}
	w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 4})
	require.NoError(t, err, "a small pool is a risk of waits, not a configuration that cannot work")
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	want := len(e.expectedIDs(e.store))
	require.Eventually(t, func() bool { return len(e.stagedIDs()) == want }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	e.requireExactlyOnce(e.store)
}
