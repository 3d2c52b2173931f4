package stagehand_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// One configuration error type for every package: each constructor's refusal is a *stagehand.ConfigError naming
// its package and field, matching stagehand.ErrInvalidConfig and the package's own ErrInvalidConfig alike. Zero
// values mean the defaults and nil configs are accepted wherever no field is required.
func TestOneConfigErrorTypeEverywhere(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mem := eventstore.NewMemory(nil)
	reg := aggregate.NewRegistry(nil)
	type Happened struct{}
	require.NoError(t, aggregate.RegisterEvent[Happened](reg, "happened"))
	m := staging.NewMapping(reg)
	require.NoError(t, staging.Map(m, "happened", func(eventstore.Record, Happened) ([]staging.Message, error) {
		return nil, nil
	}))
	ob, err := outbox.New(pool, nil)
	require.NoError(t, err)

	check := func(err error, pkg, field string, sentinel error) {
		t.Helper()
		var ce *stagehand.ConfigError
		require.True(t, errors.As(err, &ce), "%v is not a *stagehand.ConfigError", err)
		require.Equal(t, pkg, ce.Package, err.Error())
		require.Equal(t, field, ce.Field, err.Error())
		require.ErrorIs(t, err, stagehand.ErrInvalidConfig)
		require.ErrorIs(t, err, sentinel)
		require.Contains(t, err.Error(), pkg+": invalid configuration: ")
		require.Contains(t, err.Error(), field)
	}
	_, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{MaxGapWait: -1})
	check(err, "eventstore", "MaxGapWait", eventstore.ErrInvalidConfig)
	_, err = outbox.New(pool, &outbox.Config{Schema: " "})
	check(err, "outbox", "Schema", outbox.ErrInvalidConfig)
	err = (&outbox.RelayConfig{BatchSize: -1}).Validate()
	check(err, "outbox", "BatchSize", outbox.ErrInvalidConfig)
	_, err = ob.NewInbox(&outbox.InboxConfig{TxOptions: pgx.TxOptions{IsoLevel: "read committed; DROP TABLE x"}})
	check(err, "outbox", "TxOptions.IsoLevel", outbox.ErrInvalidConfig)
	_, err = ob.NewInbox(&outbox.InboxConfig{TxOptions: pgx.TxOptions{AccessMode: "read write; DROP TABLE x"}})
	check(err, "outbox", "TxOptions.AccessMode", outbox.ErrInvalidConfig)
	_, err = ob.NewInbox(&outbox.InboxConfig{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	require.NoError(t, err)
	_, err = projection.New(pool, mem, projection.HandlerFunc(nil), &projection.Config{Name: "p", BatchSize: -1})
	check(err, "projection", "BatchSize", projection.ErrInvalidConfig)
	_, err = projection.New(pool, mem, projection.HandlerFunc(nil), nil)
	check(err, "projection", "Name", projection.ErrInvalidConfig)
	_, err = projection.NewSubscriber(pool, mem, nil)
	check(err, "projection", "ConsumerGroup", projection.ErrInvalidConfig)
	_, err = health.New(&health.Config{DegradedInactivity: -1})
	check(err, "health", "DegradedInactivity", health.ErrInvalidConfig)
	_, err = console.New(&console.Config{Pool: pool, PageSize: -1})
	check(err, "console", "PageSize", console.ErrInvalidConfig)
	_, err = console.New(nil)
	check(err, "console", "Pool", console.ErrInvalidConfig)
	_, err = staging.New(mem, &staging.Config{Strategy: 99, Mapping: m})
	check(err, "staging", "Strategy", staging.ErrInvalidConfig)
	_, err = staging.New(mem, nil)
	check(err, "staging", "Mapping", staging.ErrInvalidConfig)
	_, err = staging.NewDeferredStager(mem, ob, m, &staging.WorkerConfig{BatchSize: -1})
	check(err, "staging", "BatchSize", staging.ErrInvalidConfig)
	_, err = staging.NewDeferredStager(mem, ob, m, &staging.WorkerConfig{OnFailure: 7})
	check(err, "staging", "OnFailure", staging.ErrInvalidConfig)
	_, err = aggregate.NewRepository[*thing](mem, reg, &aggregate.RepositoryConfig{SnapshotEvery: -1})
	check(err, "aggregate", "SnapshotEvery", aggregate.ErrInvalidConfig)

	// Zero values are the defaults; nil is accepted where nothing is required.
	_, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{DisableNotify: true})
	require.NoError(t, err)
	_, err = eventstore.NewPostgres(pool, nil)
	require.NoError(t, err)
	_, err = health.New(nil)
	require.NoError(t, err)
	require.NoError(t, (*outbox.RelayConfig)(nil).Validate())
	_, err = ob.NewInbox(nil)
	require.NoError(t, err)
	_, err = staging.NewDeferredStager(mem, ob, m, nil)
	require.NoError(t, err)
}

type thing struct{ aggregate.Root }

func (*thing) Apply(any) {}
