package aggregate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// An archived aggregate loads from the archive (snapshot or not) and its saves fail with the typed archive error,
// through Save, Update (which does not retry it) and SaveTx; a deleted one fails to load (ErrNotFound and
// eventstore.ErrStreamDeleted) and to save.
func TestArchivedAndDeletedAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 2, UpdateRetries: 3})
	for _, id := range []string{"old", "gone"} {
		_, err = r.Create(ctx, id, func(a *Account) error { return a.Open("ann") })
		require.NoError(t, err)
		for range 2 {
			_, err = r.Update(ctx, id, func(a *Account) error { return a.Deposit(10) })
			require.NoError(t, err)
		}
	}
	stale, err := r.Load(ctx, "old")
	require.NoError(t, err)

	_, err = store.ArchiveStream(ctx, eventstore.LifecycleRequest{StreamID: "old"})
	require.NoError(t, err)
	a, err := r.Load(ctx, "old")
	require.NoError(t, err, "an archived aggregate loads")
	require.Equal(t, int64(20), a.Balance)
	require.Equal(t, int64(3), a.Version())
	require.NoError(t, r.DropSnapshot(ctx, "old"))
	a, err = r.Load(ctx, "old")
	require.NoError(t, err, "and replays from the archive without its snapshot")
	require.Equal(t, int64(20), a.Balance)

	require.NoError(t, a.Deposit(5))
	err = r.Save(ctx, a)
	var ae *eventstore.StreamArchivedError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "old", ae.StreamID)
	require.NotErrorIs(t, err, eventstore.ErrConcurrencyConflict)
	require.NoError(t, stale.Deposit(1))
	require.ErrorIs(t, r.Save(ctx, stale), eventstore.ErrStreamArchived, "a stale copy too")
	calls := 0
	_, err = r.Update(ctx, "old", func(a *Account) error { calls++; return a.Deposit(1) })
	require.ErrorIs(t, err, eventstore.ErrStreamArchived)
	require.Equal(t, 1, calls, "Update does not retry an archived stream")
	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, r.SaveTx(ctx, tx, a), eventstore.ErrStreamArchived, "SaveTx leaves the transaction usable")
	require.NoError(t, tx.Commit(ctx))
	_, err = r.Create(ctx, "old", func(a *Account) error { return a.Open("x") })
	require.ErrorIs(t, err, eventstore.ErrStreamArchived, "its ID is not free")

	_, err = store.DeleteStream(ctx, eventstore.LifecycleRequest{StreamID: "gone", Reason: "erasure"})
	require.NoError(t, err)
	_, err = r.Load(ctx, "gone")
	require.ErrorIs(t, err, aggregate.ErrNotFound)
	require.ErrorIs(t, err, eventstore.ErrStreamDeleted)
	_, err = r.Create(ctx, "gone", func(a *Account) error { return a.Open("x") })
	require.ErrorIs(t, err, eventstore.ErrStreamDeleted, "a deleted stream's ID is not reused")
	_, err = r.Upsert(ctx, "gone", func(a *Account) error { return a.Open("x") })
	require.ErrorIs(t, err, eventstore.ErrStreamDeleted)
}
