package migrate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestAllNumberedAndUnique(t *testing.T) {
	t.Parallel()
	all, err := migrate.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i-1].Version, all[i].Version)
	}
}

func TestUpTwiceAppliesOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchemaName(t)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema) })
	ctx := context.Background()

	first, err := migrate.Up(ctx, pool, schema, nil)
	require.NoError(t, err)
	all, _ := migrate.All()
	require.Len(t, first, len(all))

	second, err := migrate.Up(ctx, pool, schema, nil)
	require.NoError(t, err)
	require.Empty(t, second)

	list, err := migrate.List(ctx, pool, schema)
	require.NoError(t, err)
	for _, s := range list {
		require.True(t, s.Applied(), "migration %d not recorded", s.Version)
	}
}

func TestUpConcurrentIsSafe(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchemaName(t)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema) })

	const n = 4
	var wg sync.WaitGroup
	applied := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done, err := migrate.Up(context.Background(), pool, schema, nil)
			applied[i], errs[i] = len(done), err
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		require.NoError(t, errs[i])
		total += applied[i]
	}
	all, _ := migrate.All()
	require.Equal(t, len(all), total, "each migration must be applied exactly once across concurrent callers")
	require.Equal(t, int64(len(all)), pgtest.Count(t, pool,
		"SELECT count(*) FROM "+pgtest.Q(schema, migrate.HistoryTable)))
}

func TestHostileSchemaNameIsQuoted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	// A canary table that an injected statement would drop.
	canary := pgtest.NewSchemaName(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA "+pgx.Identifier{canary}.Sanitize())
	t.Cleanup(func() { pgtest.DropSchema(t, pool, canary) })
	pgtest.Exec(t, pool, "CREATE TABLE "+pgtest.Q(canary, "keep")+" (id int)")

	hostile := `x";DROP TABLE ` + canary + `.keep;--` // within the 63 bytes PostgreSQL keeps
	t.Cleanup(func() { pgtest.DropSchema(t, pool, hostile) })
	_, err := migrate.Up(ctx, pool, hostile, nil)
	require.NoError(t, err)

	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgtest.Q(canary, "keep")).Scan(&exists))
	require.True(t, exists, "the hostile schema name was executed as SQL")
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgtest.Q(hostile, "events")).Scan(&exists))
	require.True(t, exists, "tables must be created inside the literally named schema")
}

func TestEmptySchemaRejected(t *testing.T) {
	t.Parallel()
	_, err := migrate.Up(context.Background(), nil, " ", nil)
	require.ErrorIs(t, err, migrate.ErrInvalidSchema)
}
