package projection_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// A projection on a pool smaller than what its followers hold at once still makes progress (a batch's transaction
// never waits for a second connection): two partitions on one connection apply every event, and each follower
// logs the shortfall once.
func TestProjectionProgressesOnAOneConnectionPool(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	w := worldOn(t, base, schema)
	w.seed(t, w.store, 20, 10)
	cfg := base.Config()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)

	var captured safeBuffer
	m := &model{schema: schema, prefix: "rm", by: "p", reg: w.reg}
	p, err := projection.New(pool, store, m.mux(), &projection.Config{Name: "accounts", Schema: schema,
		Partitions: 2, Logger: captured.logger()})
	require.NoError(t, err, "a small pool is a risk of waits, not a configuration that cannot work")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	want := w.count(t, `SELECT count(*) FROM `+pgtest.Q(schema, "events"))
	require.Eventually(t, func() bool { return w.applied(t, "rm") == want }, 30*time.Second, 20*time.Millisecond,
		"every event applied on one connection")
	cancel()
	require.NoError(t, <-done)
	warned := strings.Count(captured.String(), "pool MaxConns 1 is below the 3 connections this follower holds at "+
		"once (batch transaction 1, next page's read 1, lease renewal 1)")
	require.True(t, warned >= 1 && warned <= 2, "one warning per follower, got %d:\n%s", warned, captured.String())
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
