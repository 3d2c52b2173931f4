package stagehand_test

import (
	"context"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestContextMetadata(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Equal(t, stagehand.NoTenant, stagehand.TenantFrom(ctx))
	require.Equal(t, stagehand.NoTenant, stagehand.TenantFrom(stagehand.WithTenant(ctx, "  ")))
	ctx = stagehand.WithTenant(ctx, "acme")
	ctx = stagehand.WithCorrelationID(ctx, "c")
	ctx = stagehand.WithCausationID(ctx, "k")
	a := stagehand.WithMetadata(ctx, "x", "1")
	b := stagehand.WithMetadata(a, "y", "2")
	require.Equal(t, "acme", stagehand.TenantFrom(b))
	require.Equal(t, "c", stagehand.CorrelationIDFrom(b))
	require.Equal(t, "k", stagehand.CausationIDFrom(b))
	require.Equal(t, map[string]string{"x": "1"}, stagehand.MetadataFrom(a), "a derived context must not change its parent")
	require.Equal(t, map[string]string{"x": "1", "y": "2"}, stagehand.MetadataFrom(b))
	m := stagehand.MetadataFrom(b)
	m["z"] = "mutated"
	require.NotContains(t, stagehand.MetadataFrom(b), "z", "MetadataFrom returns a copy")
}

func TestMigrateAppliesEverythingOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchemaName(t)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema) })
	ctx := context.Background()
	cfg := &stagehand.MigrateConfig{Schema: schema}
	applied, err := stagehand.Migrate(ctx, pool, cfg)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	again, err := stagehand.Migrate(ctx, pool, cfg)
	require.NoError(t, err)
	require.Empty(t, again)
	list, err := stagehand.Migrations(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, list, len(applied))
	files, err := fs.Glob(stagehand.MigrationsFS(), "*.sql")
	require.NoError(t, err)
	require.Len(t, files, len(applied), "every embedded file is applied")

	// A zero Schema means DefaultSchema (not migrated here: the test server is shared); a blank one is refused.
	_, err = stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: " "})
	require.ErrorContains(t, err, "Schema")
}
