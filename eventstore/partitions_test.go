package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/eventstore/eventstoretest"
	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// smallPartitions are partitions of 10 positions, so the suites' appends cross many partition boundaries, 60
// of them ahead (the suites draw a few hundred positions, failed appends included).
func smallPartitions(schema string) *eventstore.PartitionConfig {
	return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 60, Headroom: 1}
}

// newPartitioned returns a store on a new schema whose events table was converted to partitions (empty).
func newPartitioned(t *testing.T, cfg func(schema string) *eventstore.PartitionConfig) (*eventstore.PostgresStore,
	*eventstore.Partitions) {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, cfg(schema))
	require.NoError(t, err)
	_, err = parts.Convert(context.Background())
	require.NoError(t, err)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, parts
}

// The whole conformance suite on a partitioned events table: concurrency control through the stream heads,
// event-ID uniqueness through event_ids, the gap-safe log through the partitioned parent's lock.
func TestPartitionedConformance(t *testing.T) {
	t.Parallel()
	eventstoretest.Run(t, func(t *testing.T) eventstore.Store {
		s, _ := newPartitioned(t, smallPartitions)
		return s
	})
}

func TestPartitionConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for field, cfg := range map[string]*eventstore.PartitionConfig{
		"Schema":      {Schema: " "},
		"Size":        {Size: -1},
		"Ahead":       {Ahead: -1},
		"Headroom":    {Headroom: -5},
		"LockTimeout": {LockTimeout: -time.Second},
	} {
		_, err := eventstore.NewPartitions(pool, cfg)
		var ce *stagehand.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
	}
	_, err := eventstore.NewPartitions(nil, nil)
	require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
}

var _ = errors.New
var _ = fmt.Sprint
var _ sync.Mutex
var _ pgx.Tx
var _ *pgxpool.Pool
