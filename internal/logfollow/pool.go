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

// CheckPool refuses a pool on which that many log followers cannot make progress: when their event store reads
// through the same pool, each holds its batch's transaction while it waits for the read of its next page, so the
// pool must hold one transaction per follower and at least one read besides. It returns a *ConfigError (Field
// "pool") naming the numbers; stagehand.PoolSize gives the size at which nothing waits.
func CheckPool(pool *pgxpool.Pool, store eventstore.Store, followers int) error {
	if pool == nil || !sharesPool(pool, store) || followers < 1 {
		return nil
	}
	have := int(pool.Config().MaxConns)
	floor := followers + 1
	if have >= floor {
		return nil
	}
	what := "a log follower"
	if followers > 1 {
		what = fmt.Sprintf("%d log followers", followers)
	}
	return &ConfigError{Field: "pool", Reason: fmt.Sprintf("MaxConns %d is below the %d connections %s cannot "+
		"make progress without when the event store reads through the same pool: a batch transaction per "+
		"follower (%d), and 1 for the next page's read, which a batch waits for while it holds its transaction "+
		"(stagehand.PoolSize gives %d, at which nothing waits)", have, floor, what, followers,
		stagehand.PoolSize(stagehand.PoolUse{Followers: followers}))}
}

// poolShortfall describes what this follower holds at once when the pool is smaller than that (a risk of waits,
// not of a standstill), or returns "".
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
