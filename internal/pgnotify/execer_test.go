package pgnotify_test

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand/internal/pgnotify"
)

type countingExecer struct {
	inner pgnotify.Execer
	n     atomic.Int64
}

func (c *countingExecer) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.inner.Exec(ctx, sql, args...)
}

func (c *countingExecer) calls() int { return int(c.n.Load()) }
