package aggregate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// After the oldest partition of a partitioned events table is archived, an aggregate whose snapshot was taken
// after its archived events loads from the snapshot and saves on; one that no snapshot covers fails to load with
// an error matching eventstore.ErrArchived that names it, never with a state rebuilt from part of its history.
func TestLoadAfterArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 3,
		Headroom: 1})
	require.NoError(t, err)
	_, err = parts.Convert(ctx)
	require.NoError(t, err)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 5})

	_, err = r.Create(ctx, "covered", func(a *Account) error { return a.Open("ann") }) // position 1
	require.NoError(t, err)
	for range 3 { // positions 2..4
		_, err = r.Update(ctx, "covered", func(a *Account) error { return a.Deposit(10) })
		require.NoError(t, err)
	}
	_, err = r.Create(ctx, "bare", func(a *Account) error { return a.Open("bob") }) // position 5
	require.NoError(t, err)
	for i := range 5 { // positions 6..10: the first partition is full
		_, err = r.Create(ctx, fmt.Sprintf("filler-%d", i), func(a *Account) error { return a.Open("x") })
		require.NoError(t, err)
	}
	// Version 5 of covered, at position 11, and its snapshot.
	_, err = r.Update(ctx, "covered", func(a *Account) error { return a.Deposit(10) })
	require.NoError(t, err)
	snap, err := store.LoadSnapshot(ctx, "", "covered")
	require.NoError(t, err)
	require.Equal(t, int64(5), snap.Version)

	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{})
	require.ErrorIs(t, err, eventstore.ErrArchiveRefused, "bare and the fillers have no snapshot")
	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{Disposition: eventstore.ArchiveDrop, AllowUncovered: true})
	require.NoError(t, err)

	a, err := r.Load(ctx, "covered")
	require.NoError(t, err)
	require.Equal(t, int64(40), a.Balance)
	require.Equal(t, int64(5), a.Version())
	require.Zero(t, a.applied, "loaded from the snapshot, nothing replayed")
	a, err = r.Update(ctx, "covered", func(a *Account) error { return a.Withdraw(15) })
	require.NoError(t, err)
	require.Equal(t, int64(25), a.Balance)

	_, err = r.Load(ctx, "bare")
	require.ErrorIs(t, err, eventstore.ErrArchived)
	require.ErrorContains(t, err, `stream "bare"`)
	_, err = r.Update(ctx, "bare", func(a *Account) error { return a.Deposit(1) })
	require.ErrorIs(t, err, eventstore.ErrArchived, "an update loads first")

	// Dropping the snapshot of a covered aggregate makes it one no snapshot covers.
	require.NoError(t, r.DropSnapshot(ctx, "covered"))
	_, err = r.Load(ctx, "covered")
	require.ErrorIs(t, err, eventstore.ErrArchived)
}
