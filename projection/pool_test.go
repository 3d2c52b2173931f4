package projection_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// A projection whose followers could not make progress on the pool it is given (each holds its batch's
// transaction while it waits for its next page, read through the same pool) is refused at construction with a
// ConfigError naming the numbers; one that can, but with less than it holds at once, logs that once when it runs.
func TestProjectionRefusesAPoolItCannotProgressOn(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	w := worldOn(t, base, schema)
	small := func(n int32) (*pgxpool.Pool, *eventstore.PostgresStore) {
		cfg := base.Config()
		cfg.MaxConns, cfg.MinConns = n, 0
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		s, err := eventstore.NewPostgres(p, &eventstore.PostgresConfig{Schema: schema})
		require.NoError(t, err)
		t.Cleanup(s.Close)
		return p, s
	}
	m := &model{schema: schema, prefix: "rm", by: "p", reg: w.reg}

	pool, store := small(2)
	_, err := projection.New(pool, store, m.mux(), &projection.Config{Name: "accounts", Schema: schema,
		Partitions: 2})
	var ce *stagehand.ConfigError
	require.ErrorAs(t, err, &ce)
	require.True(t, errors.Is(err, stagehand.ErrInvalidConfig))
	require.Equal(t, "pool", ce.Field)
	require.Contains(t, err.Error(), "MaxConns 2 is below the 3 connections 2 log followers cannot make progress without")

	pool, store = small(1)
	_, err = projection.New(pool, store, m.mux(), &projection.Config{Name: "accounts", Schema: schema})
	require.ErrorAs(t, err, &ce)
	require.Contains(t, err.Error(), "MaxConns 1 is below the 2 connections a log follower cannot make progress without")

	var captured safeBuffer
	pool, store = small(2)
	p, err := projection.New(pool, store, m.mux(), &projection.Config{Name: "accounts", Schema: schema,
		Logger: captured.logger()})
	require.NoError(t, err, "two connections are enough to progress")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	require.NoError(t, p.Run(ctx))
	require.Contains(t, captured.String(), "pool MaxConns 2 is below the 3 connections this follower holds at once "+
		"(batch transaction 1, next page's read 1, lease renewal 1)")
}

// safeBuffer collects log lines from concurrent goroutines.
type safeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *safeBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
