package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// The outbox empties and refills all day; a vacuum that truncated its empty tail would take an ACCESS EXCLUSIVE
// lock and hold every staging transaction behind it. The table keeps its pages whatever vacuums it.
func TestVacuumNeverTruncatesTheOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("t", 2000, nil)...)
	require.NoError(t, err)
	table := pgtest.Q(e.schema, "outbox")
	size := func() int64 {
		return pgtest.Count(t, e.pool, `SELECT pg_relation_size('`+table+`')`)
	}
	before := size()
	require.Positive(t, before)
	pgtest.Exec(t, e.pool, `DELETE FROM `+table)
	_, err = e.pool.Exec(ctx, `VACUUM `+table) // as autovacuum would, with the table's own settings
	require.NoError(t, err)
	require.Equal(t, before, size(), "vacuum truncated the outbox")
}
