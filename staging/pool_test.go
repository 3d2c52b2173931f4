package staging

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// A Deferred stager reading an event store through its one-connection pool could never commit a batch it waits a
// page for: it is refused at construction, naming the worker and the numbers.
func TestWorkerRefusesAPoolItCannotProgressOn(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	cfg := base.Config()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := setupOn(t, pool, schema)
	_, err = NewDeferredStager(e.store, e.outbox, e.m, nil)
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.True(t, errors.Is(err, ErrInvalidConfig))
	require.Equal(t, "stager:default", ce.Component)
	require.Equal(t, "pool", ce.Field)
	require.Contains(t, err.Error(), "MaxConns 1 is below the 2 connections a log follower cannot make progress")

	big := setup(t) // the test pool: enough
	_, err = NewDeferredStager(big.store, big.outbox, big.m, nil)
	require.NoError(t, err)
}
