package stagehand_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Every configured identifier (schema, projection, consumer group and worker names) is checked at construction:
// PostgreSQL keeps 63 bytes of a name, so two long schemas sharing their first 63 bytes silently became one; a name
// that is longer (in bytes), empty or holds a NUL fails naming the field.
func TestConfiguredIdentifiersAreValidated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := eventstore.NewMemory(nil)
	noop := projection.HandlerFunc(func(context.Context, pgx.Tx, projection.Event) error { return nil })
	long := strings.Repeat("s", 64)
	euro := strings.Repeat("€", 22) // 66 bytes, 22 characters
	for _, bad := range []string{long, euro, "a\x00b"} {
		_, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: bad})
		require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
		require.ErrorContains(t, err, "Schema")
		_, err = outbox.New(pool, &outbox.Config{Schema: bad})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorContains(t, err, "Schema")
		_, err = projection.New(pool, store, noop, &projection.Config{Name: "p", Schema: bad})
		require.ErrorIs(t, err, projection.ErrInvalidConfig)
		require.ErrorContains(t, err, "Schema")
		_, err = projection.New(pool, store, noop, &projection.Config{Name: bad})
		require.ErrorIs(t, err, projection.ErrInvalidConfig)
		require.ErrorContains(t, err, "Name")
		_, err = projection.NewSubscriber(pool, store, &projection.SubscriberConfig{ConsumerGroup: bad})
		require.ErrorIs(t, err, projection.ErrInvalidConfig)
		require.ErrorContains(t, err, "ConsumerGroup")
		_, err = stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: bad})
		require.Error(t, err)
		require.ErrorContains(t, err, "Schema")
	}
	// 63 bytes of multibyte characters is a valid name.
	_, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: strings.Repeat("€", 21)})
	require.NoError(t, err)

	ob, err := outbox.New(pool, nil)
	require.NoError(t, err)
	reg := aggregate.NewRegistry(nil)
	type Happened struct{}
	require.NoError(t, aggregate.RegisterEvent[Happened](reg, "happened"))
	m := staging.NewMapping(reg)
	require.NoError(t, staging.Map(m, "happened", func(eventstore.Record, Happened) ([]staging.Message, error) {
		return nil, nil
	}))
	_, err = staging.NewDeferredStager(store, ob, m, &staging.WorkerConfig{Name: long})
	require.ErrorIs(t, err, staging.ErrInvalidConfig)
	require.ErrorContains(t, err, "Name")
}
