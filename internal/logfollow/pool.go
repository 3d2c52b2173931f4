package logfollow

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

// sharesPool reports whether store reads through pool (a Postgres store built on it).
func sharesPool(pool *pgxpool.Pool, store eventstore.Store) bool {
	n, ok := store.(notifier)
	return ok && n.Pool() == pool
}

// poolShortfall describes what this follower holds at once when the pool is smaller than that, or returns "". It
// is a risk of waits, not of a standstill: a batch's transaction never waits for a second connection (it takes
// only a page already read, and commits otherwise), so a follower progresses on a pool of one connection.
func (f *Follower) poolShortfall() string {
	have := int(f.pool.Config().MaxConns)
	need := stagehand.PoolSize(stagehand.PoolUse{Followers: 1})
	parts := "batch transaction 1, next page's read 1, lease renewal 1"
	if !sharesPool(f.pool, f.store) {
		need-- // the reads go through the store's own pool
		parts = "batch transaction 1, lease renewal 1"
	}
	if have >= need {
		return ""
	}
	return fmt.Sprintf("pool MaxConns %d is below the %d connections this follower holds at once (%s)", have, need,
		parts)
}
