package eventstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func one(stream string) eventstore.AppendRequest {
	return eventstore.AppendRequest{StreamID: stream, StreamType: "t", Expected: eventstore.AnyVersion,
		Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}}
}

// inFlight appends one event in a transaction it leaves open until the test ends (or commit is called).
func inFlight(t *testing.T, s *eventstore.PostgresStore, stream string) (commit func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = s.AppendTx(ctx, tx, one(stream))
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Commit(ctx)) }
}

// On a server in recovery (a hot standby does not show the primary's transactions in pg_locks, so a gap would be
// judged final while the primary may still commit it), ReadLog refuses with ErrInRecovery: at its first read, and
// at a gap if the server went into recovery later (a pool that reached a standby after a failover).
//
// The store asks the server through pg_is_in_recovery(); the test's pool resolves that name to a function of its
// own (a schema ahead of pg_catalog in its search_path) whose answer the test switches, so the store's own SQL runs
// as it would against a standby.
func TestReadLogRefusesAServerInRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema := pgtest.Migrated(t)
	standin := schema + "_standin"
	q := pgx.Identifier{standin}.Sanitize()
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+q+`;
		CREATE TABLE `+q+`.recovery (standby boolean NOT NULL);
		INSERT INTO `+q+`.recovery VALUES (true);
		CREATE FUNCTION `+q+`.pg_is_in_recovery() RETURNS boolean LANGUAGE sql STABLE
			AS 'SELECT standby FROM `+q+`.recovery'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+q+` CASCADE`) })
	standby := func(on bool) {
		_, err := admin.Exec(ctx, `UPDATE `+q+`.recovery SET standby = $1`, on)
		require.NoError(t, err)
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = standin + ", pg_catalog"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)

	_, err = s.Append(ctx, one("a"))
	require.NoError(t, err)
	_, err = s.ReadLog(ctx, eventstore.LogQuery{})
	require.ErrorIs(t, err, eventstore.ErrInRecovery)
	require.ErrorContains(t, err, "primary")

	standby(false)
	page, err := s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)

	inFlight(t, s, "b") // position 2, in flight
	_, err = s.Append(ctx, one("c"))
	require.NoError(t, err) // position 3, committed
	standby(true)
	_, err = s.ReadLog(ctx, eventstore.LogQuery{After: page.Last})
	require.ErrorIs(t, err, eventstore.ErrInRecovery, "a gap is never judged on a standby")
}

// The events table is looked up by name on every gap: after its schema is dropped and migrated again under a
// running store, an in-flight append still holds the reader back (a cached table OID pointed at the dropped
// table, so no lock holder was found and the in-flight position was skipped for good).
func TestReadLogFollowsARecreatedEventsTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	// A gap (an aborted append) makes the reader look its lock holders up before the schema goes.
	tx, err := s.Begin(ctx)
	require.NoError(t, err)
	_, err = s.AppendTx(ctx, tx, one("x"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = s.Append(ctx, one("y"))
	require.NoError(t, err)
	page, err := s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)

	_, err = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema, nil)
	require.NoError(t, err)

	commit := inFlight(t, s, "a") // position 1 of the new table, in flight
	_, err = s.Append(ctx, one("b"))
	require.NoError(t, err) // position 2, committed
	page, err = s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Records, "position 2 must not be handed out past in-flight position 1")
	require.Zero(t, page.Last)
	commit()
	page, err = s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 2)
}

// A transaction that holds the events table's lock but can never commit a position does not hold readers back:
// one that only took the lock (or whose INSERT failed and left nothing), idle in its transaction, and one whose
// failed INSERT drew a position and aborted it (waiting for its ROLLBACK). Before, each held every reader for
// MaxGapWait per read, for as long as it stayed open. A transaction that did write an event still holds them.
func TestGapWaitIgnoresHoldersThatCannotCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	events := pgtest.Q(schema, "events")
	open := func(sql string, wantErr bool) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, sql)
		require.Equal(t, wantErr, err != nil, "%s: %v", sql, err)
	}
	open(`LOCK TABLE `+events+` IN ROW EXCLUSIVE MODE`, false)
	// Draws position 1 (the column default) and fails on the NOT NULL tenant: the transaction is aborted.
	open(`INSERT INTO `+events+` (tenant_id, stream_id, stream_type, version, event_id, event_type, payload)
		VALUES (NULL, 's', 't', 1, gen_random_uuid(), 'e', '{}')`, true)
	_, err = s.Append(ctx, one("a")) // position 2
	require.NoError(t, err)

	start := time.Now()
	page, err := s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, int64(2), page.Records[0].Position)
	require.Less(t, time.Since(start), 2*time.Second, "no wait for holders that cannot commit")

	// A real in-flight append still holds the reader at its gap, for MaxGapWait per read.
	inFlight(t, s, "b") // position 3
	_, err = s.Append(ctx, one("c"))
	require.NoError(t, err) // position 4
	page, err = s.ReadLog(ctx, eventstore.LogQuery{After: 2})
	require.NoError(t, err)
	require.Empty(t, page.Records)
}

// A store that knew its events table partitioned reads the streams of a table migrated again, unpartitioned, under
// it (the read bounded by stream heads the new table does not keep finds nothing, and is made again unbounded),
// and records the new layout: on the caller's transaction alone.
func TestStreamReadFollowsARecreatedUnpartitionedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.GuardedMigrated(t, 4)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 100})
	require.NoError(t, err)
	_, err = parts.Convert(ctx)
	require.NoError(t, err)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	require.True(t, s.Partitioned(ctx))

	_, err = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema, nil)
	require.NoError(t, err)
	other, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(other.Close)
	_, err = other.Append(ctx, one("a"))
	require.NoError(t, err)

	tctx := pgtest.OneConnection(ctx, "read after the table was migrated again")
	tx, err := pool.Begin(tctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	recs, err := s.ReadStreamTx(tctx, tx, "", "a", 1)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.False(t, s.Partitioned(ctx), "the new layout is recorded")
}
