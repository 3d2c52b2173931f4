package aggregate_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
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

// commitUnknownStore fails every append with an ambiguous commit, counting the appends.
type commitUnknownStore struct {
	eventstore.Store
	appends atomic.Int32
}

func (s *commitUnknownStore) Append(_ context.Context, req eventstore.AppendRequest) (eventstore.AppendResult, error) {
	s.appends.Add(1)
	return eventstore.AppendResult{}, &eventstore.CommitUnknownError{StreamID: req.StreamID, Expected: req.Expected,
		Err: errors.New("conn closed")}
}

// Update never retries an append whose commit outcome is unknown: it may have been stored.
func TestUpdateDoesNotRetryAnUnknownCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	openAccount(t, repo(t, mem, nil), "a", 1)
	store := &commitUnknownStore{Store: mem}
	r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 5})
	_, err := r.Update(ctx, "a", func(a *Account) error { return a.Deposit(1) })
	require.ErrorIs(t, err, eventstore.ErrCommitUnknown)
	var cu *eventstore.CommitUnknownError
	require.ErrorAs(t, err, &cu)
	require.Equal(t, "a", cu.StreamID)
	require.Equal(t, int32(1), store.appends.Load(), "appended once, never retried")
}
