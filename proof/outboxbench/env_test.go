package outboxbench_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// env is one outbox on a migrated schema, closed when the benchmark ends.
type env struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	ob     *outbox.Outbox
}

func setupOn(t testing.TB, pool *pgxpool.Pool, schema string, cfg *outbox.Config) *env {
	t.Helper()
	var c outbox.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	ob, err := outbox.New(pool, &c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	return &env{t: t, pool: pool, schema: schema, ob: ob}
}

// count is the number of rows in one of the outbox's tables, optionally filtered.
func (e *env) count(table string, where ...string) int64 {
	q := "SELECT count(*) FROM " + pgtest.Q(e.schema, table)
	if len(where) > 0 {
		q += " WHERE " + where[0]
	}
	return pgtest.Count(e.t, e.pool, q)
}

// runRouter runs r in a Watermill router publishing to pub, stopped when the benchmark ends.
func runRouter(t testing.TB, r *outbox.Relay, pub message.Publisher, cfg *outbox.RouterConfig) *message.Router {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	r.AddToRouter(router, pub, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = router.Close()
		<-done
	})
	return router
}
