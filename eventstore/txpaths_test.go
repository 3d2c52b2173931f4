package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// onTx runs fn in a transaction of pool begun with a context marked by pgtest.OneConnection, and rolls it back:
// anything fn's calls acquire from pool while the transaction holds its connection fails the test.
func onTx(t *testing.T, pool *pgxpool.Pool, name string, fn func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	ctx := pgtest.OneConnection(ctxT(t), name)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fn(ctx, tx)
}

// newGuardedStore returns a store (that has read nothing yet) on a guarded pool of maxConns connections.
func newGuardedStore(t *testing.T, pool *pgxpool.Pool, schema string) *eventstore.PostgresStore {
	t.Helper()
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema,
		MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// Every Tx method of the PostgreSQL store runs on the caller's transaction alone, never on a second pool
// connection: reads of present, missing, ended and archived streams, snapshots, appends and their conflicts, on an
// unpartitioned and a partitioned table, by a store that knows nothing of the table's layout yet, one that knows
// it, and one whose knowledge is stale (the table converted and archived since). AppendWith and AppendQueued hold
// one connection at a time, conflicts included.
func TestTxMethodsUseOnlyTheCallersConnection(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.GuardedMigrated(t, 4)
			if partitioned {
				parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 100,
					Ahead: 3, Headroom: 1})
				require.NoError(t, err)
				_, err = parts.Convert(ctxT(t))
				require.NoError(t, err)
			}
			setup := newGuardedStore(t, pool, schema)
			appendOne(t, setup, "present", eventstore.NoStream, 3)
			for _, s := range []*eventstore.PostgresStore{newGuardedStore(t, pool, schema), setup} {
				exerciseTxMethods(t, pool, s)
			}
		})
	}
	t.Run("archived", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.GuardedMigrated(t, 4)
		stale := newGuardedStore(t, pool, schema)
		require.False(t, stale.Partitioned(ctxT(t)), "the store reads the table unpartitioned")
		parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 10,
			Ahead: 3, Headroom: 1})
		require.NoError(t, err)
		_, err = parts.Convert(ctxT(t))
		require.NoError(t, err)
		setup := newGuardedStore(t, pool, schema)
		appendOne(t, setup, "bare", eventstore.NoStream, 3) // positions 1..3
		appendOne(t, setup, "long", eventstore.NoStream, 7) // 4..10: the first partition is full
		appendOne(t, setup, "long", 7, 1)                   // 11
		_, err = parts.Archive(ctxT(t), eventstore.ArchiveRequest{AllowUncovered: true})
		require.NoError(t, err)
		for name, s := range map[string]*eventstore.PostgresStore{"fresh": newGuardedStore(t, pool, schema),
			"stale": stale, "known": setup} {
			onTx(t, pool, "read archived streams ("+name+")", func(ctx context.Context, tx pgx.Tx) {
				var archived *eventstore.ArchivedError
				_, err := s.ReadStreamTx(ctx, tx, "", "bare", 1)
				require.ErrorAs(t, err, &archived, "every event of bare is archived; its head says how many")
				require.Equal(t, int64(3), archived.ToVersion)
				_, err = s.ReadStreamTx(ctx, tx, "", "long", 1)
				require.ErrorAs(t, err, &archived)
				require.Equal(t, int64(7), archived.ToVersion)
				recs, err := s.ReadStreamTx(ctx, tx, "", "long", 8)
				require.NoError(t, err)
				require.Len(t, recs, 1)
				_, err = s.ReadStreamTx(ctx, tx, "", "never", 1)
				require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
			})
			require.True(t, s.Partitioned(ctxT(t)), "%s: the store knows the table is partitioned now", name)
		}
	})
}

// exerciseTxMethods calls every Tx method of s (and AppendWith and AppendQueued) on pool's guarded connections.
func exerciseTxMethods(t *testing.T, pool *pgxpool.Pool, s *eventstore.PostgresStore) {
	t.Helper()
	one := []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}
	onTx(t, pool, "ReadStreamTx", func(ctx context.Context, tx pgx.Tx) {
		recs, err := s.ReadStreamTx(ctx, tx, "", "present", 1)
		require.NoError(t, err)
		require.Len(t, recs, 3)
		recs, err = s.ReadStreamTx(ctx, tx, "", "present", 9)
		require.NoError(t, err)
		require.Empty(t, recs, "the stream ends before version 9")
		_, err = s.ReadStreamTx(ctx, tx, "", "missing", 1)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
		_, err = s.ReadStreamTx(ctx, tx, "tenant-a", "missing", 0)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
	})
	onTx(t, pool, "snapshots on tx", func(ctx context.Context, tx pgx.Tx) {
		_, err := s.LoadSnapshotTx(ctx, tx, "", "present")
		require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)
		require.NoError(t, s.SaveSnapshotTx(ctx, tx, eventstore.Snapshot{StreamID: "present", StreamType: "t",
			Version: 3, SchemaVersion: 1, Payload: []byte(`{}`)}))
		snap, err := s.LoadSnapshotTx(ctx, tx, "", "present")
		require.NoError(t, err)
		require.Equal(t, int64(3), snap.Version)
	})
	onTx(t, pool, "AppendTx", func(ctx context.Context, tx pgx.Tx) {
		for _, exp := range []eventstore.ExpectedVersion{eventstore.NoStream, eventstore.AnyVersion,
			eventstore.StreamExists, 2} {
			res, err := s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: fmt.Sprintf("new-%d", exp),
				StreamType: "t", Expected: exp, Events: one})
			if exp == eventstore.StreamExists || exp == 2 {
				var c *eventstore.ConflictError
				require.ErrorAs(t, err, &c, "expected %d on a missing stream", exp)
				require.Zero(t, c.Actual, "the version is read on the caller's transaction")
				continue
			}
			require.NoError(t, err)
			require.Equal(t, int64(1), res.Version)
		}
		_, err := s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: "present", StreamType: "t",
			Expected: 1, Events: one})
		var c *eventstore.ConflictError
		require.ErrorAs(t, err, &c)
		require.Equal(t, int64(3), c.Actual)
		res, err := s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: "present", StreamType: "t",
			Expected: 3, Events: one})
		require.NoError(t, err, "the transaction is still usable after the conflict")
		require.Equal(t, int64(4), res.Version)
		recs, err := s.ReadStreamTx(ctx, tx, "", "present", 4)
		require.NoError(t, err)
		require.Len(t, recs, 1, "the read sees the transaction's own append")
	})
	ctx := pgtest.OneConnection(ctxT(t), "AppendWith")
	_, err := s.AppendWith(ctx, eventstore.AppendRequest{StreamID: "present", StreamType: "t", Expected: 1,
		Events: one}, func(context.Context, pgx.Tx, eventstore.AppendResult) error { return nil })
	var c *eventstore.ConflictError
	require.ErrorAs(t, err, &c)
	require.Equal(t, int64(3), c.Actual, "read once the append's transaction has ended")
	_, err = s.AppendWith(ctx, eventstore.AppendRequest{StreamID: "with", StreamType: "t",
		Expected: eventstore.NoStream, Events: one}, func(context.Context, pgx.Tx, eventstore.AppendResult) error {
		return errors.New("stage failed")
	})
	require.ErrorContains(t, err, "stage failed")
	ctx = pgtest.OneConnection(ctxT(t), "AppendQueued")
	_, err = s.AppendQueued(ctx, eventstore.AppendRequest{StreamID: "present", StreamType: "t", Expected: 1,
		Events: one}, nil)
	require.ErrorAs(t, err, &c)
	require.Equal(t, int64(3), c.Actual, "read once the batch's connection is back")
}

// With a pool of one connection, reads of a missing stream inside a transaction answer at once: nothing waits
// for a second connection (which would wait until the context's deadline).
func TestMissingStreamOnAOneConnectionPool(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t)
	pool := pgtest.GuardedPool(t, 1)
	for round := range 3 { // the first read of the layout, then known
		s := newGuardedStore(t, pool, schema)
		for range round {
			s.Partitioned(ctxT(t))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := s.ReadStreamTx(ctx, tx, "", "nobody", 1)
			return err
		})
		cancel()
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
		require.Less(t, time.Since(start), 2*time.Second)
	}
}

// Transactions holding every connection of the pool read missing streams (and append) at the same time, on a store
// that has read nothing of the table yet: none waits for another, nor for a connection.
func TestConcurrentTxReadsOfMissingStreamsOnAFullPool(t *testing.T) {
	t.Parallel()
	const n = 8
	_, schema := pgtest.Migrated(t)
	pool := pgtest.GuardedPool(t, n)
	for round := range 3 {
		s := newGuardedStore(t, pool, schema)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		txs := make([]pgx.Tx, n)
		for i := range txs {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			txs[i] = tx
			// Deferred to the test's end: every connection goes back to the pool, even after a failure.
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		}
		errs := make(chan error, n)
		start := make(chan struct{})
		for i, tx := range txs {
			go func() {
				<-start
				_, err := s.ReadStreamTx(ctx, tx, "", fmt.Sprintf("missing-%d-%d", round, i), 1)
				if !errors.Is(err, eventstore.ErrStreamNotFound) {
					errs <- fmt.Errorf("read %d: %w", i, err)
					return
				}
				_, err = s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: fmt.Sprintf("s-%d-%d", round, i),
					StreamType: "t", Expected: eventstore.NoStream,
					Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
				if err == nil {
					err = tx.Commit(ctx)
				}
				errs <- err
			}()
		}
		close(start)
		for range n {
			select {
			case err := <-errs:
				require.NoError(t, err)
			case <-time.After(15 * time.Second):
				t.Fatalf("round %d: the transactions' reads hung", round)
			}
		}
		cancel()
	}
}

// A read of the layout that fails inside the caller's transaction (here: the transaction was aborted by the
// caller's own failed statement) returns its error and leaves nothing cached: the next call reads the layout
// afresh. Through the pool, a failed read still keeps what was known (unpartitioned at first) for 10 s.
func TestFailedLayoutReadInATransactionIsNotCached(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.GuardedMigrated(t, 4)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 100, Ahead: 2,
		Headroom: 1})
	require.NoError(t, err)
	_, err = parts.Convert(ctxT(t))
	require.NoError(t, err)
	s := newGuardedStore(t, pool, schema)
	onTx(t, pool, "aborted transaction", func(ctx context.Context, tx pgx.Tx) {
		_, err := tx.Exec(ctx, `SELECT 1/0`)
		require.Error(t, err)
		_, err = s.ReadStreamTx(ctx, tx, "", "any", 1)
		require.ErrorContains(t, err, "read the layout")
	})
	require.True(t, s.Partitioned(ctxT(t)), "the failed read cached no guess")

	// An events table without its archives table (not migrated): through the pool the store goes on with what it
	// knew, and the statement that follows reports the database's error.
	pgtest.Exec(t, pool, `DROP TABLE `+pgtest.Q(schema, "event_archives"))
	fresh := newGuardedStore(t, pool, schema)
	require.False(t, fresh.Partitioned(ctxT(t)), "unpartitioned at first")
	onTx(t, pool, "unmigrated schema", func(ctx context.Context, tx pgx.Tx) {
		_, err := newGuardedStore(t, pool, schema).ReadStreamTx(ctx, tx, "", "any", 1)
		require.ErrorContains(t, err, "did you run stagehand.Migrate")
	})
}
