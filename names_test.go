package stagehand_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
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
		require.ErrorIs(t, err, stagehand.ErrInvalidConfig)
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

// Every exported entry point that takes a schema (or a follower's name) refuses the values the constructors refuse
// with the same error: a *stagehand.ConfigError naming the argument, matching ErrInvalidConfig, never a PostgreSQL
// error about a name it cut or a NUL byte it cannot hold.
func TestEveryEntryPointRefusesAnInvalidSchemaAlike(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, good := pgtest.Migrated(t)
	store := eventstore.NewMemory(nil)
	long := strings.Repeat("s", 64)
	type call struct {
		name string
		run  func(schema string) error
	}
	schemaCalls := []call{
		{"stagehand.Migrate", func(s string) error {
			_, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: s})
			return err
		}},
		{"stagehand.Migrations", func(s string) error { _, err := stagehand.Migrations(ctx, pool, s); return err }},
		{"eventstore.NewPostgres", func(s string) error {
			_, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: s})
			return err
		}},
		{"eventstore.CheckLogFrom", func(s string) error { return eventstore.CheckLogFrom(ctx, pool, s, 0) }},
		{"outbox.New", func(s string) error { _, err := outbox.New(pool, &outbox.Config{Schema: s}); return err }},
		{"projection.ListStatus", func(s string) error {
			_, err := projection.ListStatus(ctx, pool, store, s)
			return err
		}},
		{"projection.RequestRebuild", func(s string) error { return projection.RequestRebuild(ctx, pool, s, "p") }},
		{"projection.ListParked", func(s string) error { _, err := projection.ListParked(ctx, pool, s, ""); return err }},
		{"projection.ListParkedPage", func(s string) error {
			_, err := projection.ListParkedPage(ctx, pool, s, projection.ParkedQuery{})
			return err
		}},
		{"projection.DiscardParked", func(s string) error { return projection.DiscardParked(ctx, pool, s, 1) }},
		{"projection.RequestReplay", func(s string) error {
			_, err := projection.RequestReplay(ctx, pool, s, "p")
			return err
		}},
		{"staging.ListWorkerStatus", func(s string) error {
			_, err := staging.ListWorkerStatus(ctx, pool, store, s)
			return err
		}},
		{"staging.ListParked", func(s string) error { _, err := staging.ListParked(ctx, pool, s, ""); return err }},
		{"staging.ListParkedPage", func(s string) error {
			_, err := staging.ListParkedPage(ctx, pool, s, staging.ParkedQuery{})
			return err
		}},
		{"staging.DiscardParked", func(s string) error { return staging.DiscardParked(ctx, pool, s, 1) }},
		{"staging.RequestReplay", func(s string) error {
			_, err := staging.RequestReplay(ctx, pool, s, "stager:w")
			return err
		}},
	}
	for _, c := range schemaCalls {
		for _, bad := range []string{long, strings.Repeat("€", 22), "a\x00b", " "} {
			err := c.run(bad)
			var ce *stagehand.ConfigError
			require.ErrorIs(t, err, stagehand.ErrInvalidConfig, "%s(%q)", c.name, bad)
			require.ErrorAs(t, err, &ce, "%s(%q)", c.name, bad)
			require.Equal(t, "schema", strings.ToLower(ce.Field), "%s(%q): %v", c.name, bad, err)
		}
		// A valid, migrated schema is not refused as a configuration error (whatever else the call says).
		require.NotErrorIs(t, c.run(good), stagehand.ErrInvalidConfig, c.name)
	}

	nameCalls := []call{
		{"projection.RequestRebuild", func(n string) error { return projection.RequestRebuild(ctx, pool, good, n) }},
		{"projection.ListParked", func(n string) error { _, err := projection.ListParked(ctx, pool, good, n); return err }},
		{"projection.RequestReplay", func(n string) error {
			_, err := projection.RequestReplay(ctx, pool, good, n)
			return err
		}},
		{"staging.ListParked", func(n string) error { _, err := staging.ListParked(ctx, pool, good, n); return err }},
		{"staging.RequestReplay", func(n string) error {
			_, err := staging.RequestReplay(ctx, pool, good, n)
			return err
		}},
	}
	for _, c := range nameCalls {
		for _, bad := range []string{"a\x00b", "bad\xff", "tab\tname"} {
			err := c.run(bad)
			require.ErrorIs(t, err, stagehand.ErrInvalidConfig, "%s(%q)", c.name, bad)
		}
	}
}

// A tenant no entry point accepts matches stagehand.ErrInvalidTenant wherever it is given: at a constructor (which
// also returns its *ConfigError naming the field) as in a read, a filter, a staged message or an operator's scope.
func TestARefusedTenantMatchesErrInvalidTenantEverywhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	store := eventstore.NewMemory(nil)
	noop := projection.HandlerFunc(func(context.Context, pgx.Tx, projection.Event) error { return nil })
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	for _, bad := range []string{"a\x00b", "tab\tin", strings.Repeat("t", stagehand.MaxTenantLen+1)} {
		constructors := map[string]error{}
		_, constructors["projection.New"] = projection.New(pool, store, noop,
			&projection.Config{Name: "p", Schema: schema, Tenants: []string{bad}})
		_, constructors["console.New"] = console.New(&console.Config{Pool: pool, Schema: schema, Tenant: &bad})
		for name, err := range constructors {
			require.ErrorIs(t, err, stagehand.ErrInvalidConfig, name)
			require.ErrorIs(t, err, stagehand.ErrInvalidTenant, name)
			var te *stagehand.TenantError
			require.ErrorAs(t, err, &te, name)
		}
		others := map[string]error{}
		_, others["eventstore.ReadLog"] = store.ReadLog(ctx, eventstore.LogQuery{Tenants: []string{bad}})
		_, others["projection.ParseTopic"] = projection.ParseTopic(projection.Topic(projection.Filter{
			Tenants: []string{bad}}))
		_, others["projection.ListParkedPage"] = projection.ListParkedPage(ctx, pool, schema,
			projection.ParkedQuery{Tenants: []string{bad}})
		_, others["staging.ListParkedPage"] = staging.ListParkedPage(ctx, pool, schema,
			staging.ParkedQuery{Tenants: []string{bad}})
		_, others["outbox.Stage"] = ob.Stage(ctx, outbox.Message{ID: "m", Topic: "t", Tenant: bad, Payload: []byte("x")})
		_, others["outbox.Tenant"] = ob.Tenant(bad).Stats(ctx)
		for name, err := range others {
			require.ErrorIs(t, err, stagehand.ErrInvalidTenant, name)
		}
	}
}
