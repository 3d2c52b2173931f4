package pgnotify_test

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/pgnotify"
)

type countingExecer struct {
	inner pgnotify.Execer
	n     atomic.Int64
}

func (c *countingExecer) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.inner.SendBatch(ctx, b)
}

func (c *countingExecer) calls() int { return int(c.n.Load()) }
