package eventstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/eventstore/eventstoretest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newPostgres(t *testing.T) *eventstore.PostgresStore {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	eventstoretest.Run(t, func(t *testing.T) eventstore.Store { return newPostgres(t) })
}

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	eventstoretest.Run(t, func(t *testing.T) eventstore.Store { return eventstore.NewMemory(nil) })
}

func TestPostgresConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	_, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: " "})
	require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
	require.ErrorContains(t, err, "Schema")
	_, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: "x", MaxGapWait: -1})
	require.ErrorContains(t, err, "MaxGapWait")
	_, err = eventstore.NewPostgres(nil, nil)
	require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
}
