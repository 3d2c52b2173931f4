package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// After the start of a partitioned log is archived, a rebuild from the start is refused with ErrArchived (nothing
// recorded: the projection would skip the archived events), and a rebuild from the end of the archived range
// replays exactly the events after it.
func TestRebuildFromAPositionAfterArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 4,
		Headroom: 1})
	require.NoError(t, err)
	_, err = parts.Convert(ctx)
	require.NoError(t, err)
	w := worldOn(t, pool, schema)
	seen := pgtest.Q(schema, "seen")
	pgtest.Exec(t, pool, `CREATE TABLE `+seen+` (position bigint NOT NULL)`)
	p := w.newProjection(t, positionsSeen{seen}, projection.Config{PollInterval: 20 * time.Millisecond})
	start(t, p)
	w.seed(t, w.store, 3, 6) // positions 1..21: the first partition (1..10) is full
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "catch-up")

	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{AllowUncovered: true})
	require.NoError(t, err)

	err = p.Rebuild(ctx)
	var archived *eventstore.ArchivedError
	require.ErrorAs(t, err, &archived)
	require.Equal(t, int64(10), archived.ArchivedTo-1)
	require.ErrorIs(t, projection.RequestRebuildFrom(ctx, pool, schema, "accounts", 9), eventstore.ErrArchived)
	require.Zero(t, w.count(t, `SELECT count(*) FROM `+pgtest.Q(schema, "checkpoints")+` WHERE reset_requested`),
		"a refused rebuild records nothing")

	require.NoError(t, p.RebuildFrom(ctx, 10))
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return caughtUp(t, w, p)() && w.count(t, `SELECT count(*) FROM `+seen) == 11
	}, "rebuild from position 10: %+v", status(t, p))
	require.Equal(t, int64(11), w.count(t, `SELECT min(position) FROM `+seen))
	require.Equal(t, int64(11), w.count(t, `SELECT count(DISTINCT position) FROM `+seen), "each event once")
}

// positionsSeen is a read model that records the position of every event it handles.
type positionsSeen struct{ table string }

func (h positionsSeen) Handle(ctx context.Context, tx pgx.Tx, e projection.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+h.table+` VALUES ($1)`, e.Position)
	return err
}

func (h positionsSeen) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `TRUNCATE `+h.table)
	return err
}
