package aggregate_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// openAccount stores account id with n deposits of 1 (version n+1) through r.
func openAccount(t *testing.T, r *aggregate.Repository[*Account], id string, n int) {
	t.Helper()
	a := r.New(id)
	require.NoError(t, a.Open("ann"))
	for range n {
		require.NoError(t, a.Deposit(1))
	}
	require.NoError(t, r.Save(context.Background(), a))
}

// A SaveTx that crosses a snapshot boundary and is rolled back leaves no snapshot: Load returns the committed
// state, other readers never saw the open transaction's state, and the next Update succeeds.
func TestSnapshotOfARolledBackSaveTxIsNeverSeen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 10})
	openAccount(t, r, "a", 7) // version 8, no snapshot yet

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	a, err := r.LoadTx(ctx, tx, "a")
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, a.Deposit(100))
	}
	require.NoError(t, r.SaveTx(ctx, tx, a)) // version 13: crosses 10, snapshot taken on tx
	inside, err := r.LoadTx(ctx, tx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(507), inside.Balance, "the transaction sees its own save")

	outside, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(8), outside.Version(), "another reader sees only committed state while tx is open")
	require.Equal(t, int64(7), outside.Balance)
	require.NoError(t, tx.Rollback(ctx))

	_, err = store.LoadSnapshot(ctx, "", "a")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound, "the snapshot rolled back with its events")
	got, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(8), got.Version())
	require.Equal(t, int64(7), got.Balance)
	got, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(1) })
	require.NoError(t, err, "the next update does not conflict with a phantom version")
	require.Equal(t, int64(9), got.Version())
	require.Equal(t, int64(8), got.Balance)

	// A committed SaveTx keeps its snapshot, and the snapshot is used.
	tx, err = store.Begin(ctx)
	require.NoError(t, err)
	a, err = r.LoadTx(ctx, tx, "a")
	require.NoError(t, err)
	require.NoError(t, a.Deposit(2))
	require.NoError(t, r.SaveTx(ctx, tx, a)) // version 10
	require.NoError(t, tx.Commit(ctx))
	snap, err := store.LoadSnapshot(ctx, "", "a")
	require.NoError(t, err)
	require.Equal(t, int64(10), snap.Version)
	got, err = r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(10), got.Balance)
	require.Zero(t, got.applied, "loaded from the committed snapshot alone")
}

// A snapshot ahead of its stream, planted by SQL, is ignored: Load replays the stream and Update succeeds. So is a
// snapshot at an existing version that was taken before that version's event was recorded (another history).
func TestSnapshotThatDoesNotMatchItsStreamIsIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 10})
	openAccount(t, r, "ahead", 3)  // version 4
	openAccount(t, r, "before", 9) // version 10, snapshot at 10
	snapshots := pgtest.Q(schema, "snapshots")

	pgtest.Exec(t, pool, `INSERT INTO `+snapshots+` (tenant_id, stream_id, stream_type, version, schema_version,
		payload) VALUES ('__untenanted__', 'ahead', 'bank.account', 20, 1, '{"Owner":"eve","Balance":1000000}')`)
	pgtest.Exec(t, pool, `UPDATE `+snapshots+` SET payload = '{"Owner":"eve","Balance":1000000}',
		created_at = now() - interval '1 hour' WHERE stream_id = 'before'`)
	for id, want := range map[string][2]int64{"ahead": {4, 3}, "before": {10, 9}} {
		got, err := r.Load(ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, "ann", got.Owner, id)
		require.Equal(t, want[0], got.Version(), id)
		require.Equal(t, want[1], got.Balance, "%s: the planted snapshot is not trusted", id)
		require.Equal(t, int(want[0]), got.applied, "%s: the whole stream is replayed", id)
		got, err = r.Update(ctx, id, func(a *Account) error { return a.Deposit(1) })
		require.NoError(t, err, id)
		require.Equal(t, want[0]+1, got.Version(), id)
	}
}

// Both stores: a snapshot above the stream's version is ignored, and DropSnapshot removes an aggregate's snapshot.
func TestSnapshotAheadIgnoredAndDropSnapshot(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 5})
		openAccount(t, r, "a", 5) // version 6: snapshot at 6
		require.NoError(t, store.SaveSnapshot(ctx, eventstore.Snapshot{StreamID: "a", StreamType: "bank.account",
			Version: 9, SchemaVersion: 1, Payload: []byte(`{"Owner":"eve","Balance":99}`)}))
		got, err := r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, int64(5), got.Balance)
		require.Equal(t, 6, got.applied, "the snapshot ahead of the stream is ignored")

		require.NoError(t, r.DropSnapshot(ctx, "a"))
		_, err = store.LoadSnapshot(ctx, "", "a")
		require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)
		require.ErrorIs(t, r.DropSnapshot(ctx, "a"), eventstore.ErrSnapshotNotFound)
		got, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(5) }) // version 7
		require.NoError(t, err)
		require.Equal(t, int64(10), got.Balance)
		_, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(5) }) // 8
		require.NoError(t, err)
		_, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(5) }) // 9
		require.NoError(t, err)
		_, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(5) }) // 10: crosses 10
		require.NoError(t, err)
		snap, err := store.LoadSnapshot(ctx, "", "a")
		require.NoError(t, err)
		require.Equal(t, int64(10), snap.Version, "a fresh snapshot after the drop")
		got, err = r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, int64(25), got.Balance)
		require.Zero(t, got.applied)
	})
}

const envSnapshotCrash = "AGGREGATE_SNAPSHOT_CRASH"

// TestSnapshotCrashChild is the child of TestSnapshotOfASaveTxKilledBeforeCommitIsNeverSeen; it does nothing in a
// normal run. It saves across a snapshot boundary on a transaction and dies by SIGKILL before committing.
func TestSnapshotCrashChild(t *testing.T) {
	if os.Getenv(envSnapshotCrash) == "" {
		return
	}
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: pgtest.HelperSchema()})
	require.NoError(t, err)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 10})
	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	a, err := r.LoadTx(ctx, tx, "a")
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, a.Deposit(100))
	}
	require.NoError(t, r.SaveTx(ctx, tx, a))
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute) // never returns
}

func TestSnapshotOfASaveTxKilledBeforeCommitIsNeverSeen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r := repo(t, store, &aggregate.RepositoryConfig{SnapshotEvery: 10})
	openAccount(t, r, "a", 7) // version 8

	cmd := exec.Command(os.Args[0], "-test.run=^TestSnapshotCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgtest.HelperEnv(t, schema)...)
	cmd.Env = append(cmd.Env, envSnapshotCrash+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output:\n%s", out)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child must die by SIGKILL, got %v:\n%s", err, out)

	waitForBackendsToEnd(t, pool, schema)
	_, err = store.LoadSnapshot(ctx, "", "a")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound, "the killed transaction's snapshot never committed")
	got, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(8), got.Version())
	require.Equal(t, int64(7), got.Balance)
	got, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(1) })
	require.NoError(t, err)
	require.Equal(t, int64(9), got.Version())
}

// waitForBackendsToEnd waits until the server has noticed the killed child's connections (their open transaction
// is then rolled back), so the parent's reads do not race the server's clean-up.
func waitForBackendsToEnd(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()`, schema).Scan(&n)
		return err == nil && n == 0
	}, "the killed child's transaction still holds locks")
}
