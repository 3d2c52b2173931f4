package aggregate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// Under SERIALIZABLE and REPEATABLE READ, a serialization failure of a racing save is a concurrency conflict, so
// Update retries it: every deposit of the racing writers is applied once.
func TestUpdateRetriesSerializationFailures(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, schema := pgtest.Migrated(t)
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
			require.NoError(t, err)
			t.Cleanup(store.Close)
			r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 1000, SnapshotEvery: 7})
			openAccount(t, r, "a", 0)

			const writers, deposits = 8, 10
			var wg sync.WaitGroup
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range deposits {
						if _, err := r.Update(ctx, "a", func(a *Account) error { return a.Deposit(1) }); err != nil {
							t.Errorf("update: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			got, err := r.Load(ctx, "a")
			require.NoError(t, err)
			require.Equal(t, int64(writers*deposits), got.Balance)
			require.Equal(t, int64(writers*deposits+1), got.Version())
		})
	}
}
