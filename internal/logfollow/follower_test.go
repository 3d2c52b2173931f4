package logfollow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type fx struct {
	pool   *pgxpool.Pool
	schema string
	store  *eventstore.PostgresStore
}

// setup returns a migrated schema with a PostgreSQL store and an "applied" table for handlers to write to.
func setup(t *testing.T) fx {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema,
		MaxGapWait: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	pgtest.Exec(t, pool, `CREATE TABLE `+pgtest.Q(schema, "applied")+
		` (position bigint, stream text, version bigint, by text)`)
	return fx{pool, schema, store}
}

func (x fx) appendN(t *testing.T, store eventstore.Store, stream, typ string, n int) {
	t.Helper()
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: typ, Payload: []byte(`{}`)}
	}
	_, err := store.Append(context.Background(), eventstore.AppendRequest{StreamID: stream, StreamType: "s",
		Expected: eventstore.AnyVersion, Events: evs})
	require.NoError(t, err)
}

// record returns a handler that inserts one row per record into applied, in the follower's transaction.
func (x fx) record(by string) logfollow.Handler {
	return func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		for _, r := range recs {
			if _, err := tx.Exec(ctx, `INSERT INTO `+pgtest.Q(x.schema, "applied")+` VALUES ($1, $2, $3, $4)`,
				r.Position, r.StreamID, r.Version, by); err != nil {
				return err
			}
		}
		return nil
	}
}

func (x fx) applied(t *testing.T) int64 {
	return pgtest.Count(t, x.pool, `SELECT count(*) FROM `+pgtest.Q(x.schema, "applied"))
}

// requireOnce checks that every position of the log is applied exactly once.
func (x fx) requireOnce(t *testing.T, want int64) {
	t.Helper()
	require.Equal(t, want, x.applied(t))
	require.Equal(t, int64(0), pgtest.Count(t, x.pool, `SELECT count(*) FROM (SELECT position FROM `+
		pgtest.Q(x.schema, "applied")+` GROUP BY position HAVING count(*) > 1) d`), "an event was applied twice")
}

func (x fx) newFollower(t *testing.T, store eventstore.Store, h logfollow.Handler,
	cfg logfollow.Config) *logfollow.Follower {
	t.Helper()
	cfg.Schema = x.schema
	if cfg.Name == "" {
		cfg.Name = "f"
	}
	if cfg.LeaseTTL == 0 {
		// Long enough that no renewal is late on a loaded machine; takeovers in the tests follow a release.
		cfg.LeaseTTL, cfg.LeaseAcquireInterval = 5*time.Second, 20*time.Millisecond
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Millisecond
	}
	f, err := logfollow.New(x.pool, store, h, &cfg)
	require.NoError(t, err)
	return f
}

// start runs f until the test ends (or stop is called) and returns Run's result through stop.
func start(t *testing.T, f *logfollow.Follower) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func (x fx) checkpoint(t *testing.T, name string) logfollow.Checkpoint {
	t.Helper()
	all, err := logfollow.List(context.Background(), x.pool, x.schema, "")
	require.NoError(t, err)
	for _, c := range all {
		if c.Name == name {
			return c
		}
	}
	return logfollow.Checkpoint{} // not created yet
}

func TestFollowsTheLogAndResumesFromItsCheckpoint(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 25)
	var batches atomic.Int32
	h := x.record("one")
	counting := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		batches.Add(1)
		return h(ctx, tx, recs)
	}
	f := x.newFollower(t, x.store, counting, logfollow.Config{BatchSize: 10})
	stop := start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 25 }, "catch-up")
	require.GreaterOrEqual(t, batches.Load(), int32(3), "pages of BatchSize")
	require.NoError(t, stop())

	c := x.checkpoint(t, "f")
	require.Equal(t, int64(25), c.Position)
	require.Equal(t, logfollow.StateStopped, c.State)
	x.appendN(t, x.store, "a", "e", 5)
	stop = start(t, x.newFollower(t, x.store, x.record("two"), logfollow.Config{}))
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 30 }, "resume")
	require.NoError(t, stop())
	x.requireOnce(t, 30)
	require.Equal(t, int64(5), pgtest.Count(t, x.pool, `SELECT count(*) FROM `+pgtest.Q(x.schema, "applied")+
		` WHERE by = 'two'`), "the restarted follower began after its checkpoint")
}

func TestFollowsTheInMemoryStore(t *testing.T) {
	t.Parallel()
	x := setup(t)
	mem := eventstore.NewMemory(nil)
	x.appendN(t, mem, "a", "e", 3)
	f := x.newFollower(t, mem, x.record("m"), logfollow.Config{PollInterval: time.Hour})
	start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 3 }, "catch-up")
	x.appendN(t, mem, "a", "e", 2)
	f.Wake() // no notifications from the memory store: an in-process nudge instead of the hour-long poll
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 5 }, "wake")
}

func TestFiltersAndSelectStillAdvanceTheCheckpoint(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "keep", 3)
	x.appendN(t, x.store, "b", "drop", 3)
	x.appendN(t, x.store, "c", "keep", 3)
	f := x.newFollower(t, x.store, x.record("f"), logfollow.Config{EventTypes: []string{"keep"},
		Select: func(r eventstore.Record) bool { return r.StreamID != "c" }})
	stop := start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 9 },
		"the checkpoint passes filtered-out events")
	require.NoError(t, stop())
	require.Equal(t, int64(3), x.applied(t))
	require.Equal(t, "events:keep;select", x.checkpoint(t, "f").Filter)
}

func TestLiveTailThroughNotifyAndRecoveryFromDroppedConnections(t *testing.T) {
	t.Parallel()
	x := setup(t)
	// The follower and its store get their own pool, tagged so the test can kill exactly their connections.
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = x.schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: x.schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	c := logfollow.Config{Name: "f", Schema: x.schema, PollInterval: time.Hour, ReconnectDelay: 50 * time.Millisecond,
		LeaseTTL: 10 * time.Second}
	f, err := logfollow.New(pool, store, x.record("f"), &c)
	require.NoError(t, err)
	start(t, f)
	// With an hour-long poll, only a notification can deliver within the deadline.
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Held }, "lease")
	x.appendN(t, store, "a", "e", 1)
	pgtest.Eventually(t, 5*time.Second, func() bool { return x.applied(t) == 1 }, "notify wake-up")

	for round := 2; round <= 3; round++ {
		killed := pgtest.Count(t, x.pool, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM
			pg_stat_activity WHERE application_name = $1) k`, x.schema)
		require.Positive(t, killed)
		// The listener reconnects, and reads once when it does; the pool replaces its connections.
		x.appendN(t, x.store, "a", "e", 1)
		x.store.Notify()
		pgtest.Eventually(t, 5*time.Second, func() bool { return x.applied(t) == int64(round) },
			"delivery after the connections were killed (round %d)", round)
	}
	x.requireOnce(t, 3)
}

func TestHandlerErrorRollsBackAndRetriesOnlyTheFailingEvent(t *testing.T) {
	t.Parallel()
	// One page per transaction, and several pages per transaction (catching up with pages of 3).
	for _, batch := range []int{1000, 3} {
		t.Run(fmt.Sprint("batch-", batch), func(t *testing.T) {
			t.Parallel()
			testHandlerErrorRollsBack(t, batch)
		})
	}
}

func testHandlerErrorRollsBack(t *testing.T, batch int) {
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 10)
	var calls sync.Map // position -> attempts
	h := x.record("f")
	flaky := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		if err := h(ctx, tx, recs); err != nil {
			return err
		}
		for _, r := range recs {
			n, _ := calls.LoadOrStore(r.Position, new(atomic.Int32))
			if r.Position == 6 && n.(*atomic.Int32).Add(1) <= 2 {
				return errors.New("transient")
			}
		}
		return nil
	}
	stop := start(t, x.newFollower(t, x.store, flaky, logfollow.Config{MaxAttempts: 3, BatchSize: batch}))
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 10 }, "catch-up")
	require.NoError(t, stop())
	x.requireOnce(t, 10)
	c := x.checkpoint(t, "f")
	require.Equal(t, "transient", c.LastError)
	require.Zero(t, c.FailingPosition, "recovered: nothing is failing any more")
}

func TestExhaustedEventStopsTheFollowerWithoutSkippingIt(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 5)
	h := x.record("f")
	failing := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		for _, r := range recs {
			if r.Position == 4 {
				return errors.New("poison")
			}
		}
		return h(ctx, tx, recs)
	}
	f := x.newFollower(t, x.store, failing, logfollow.Config{MaxAttempts: 3})
	err := f.Run(context.Background())
	var herr *logfollow.HandlerError
	require.ErrorAs(t, err, &herr)
	require.ErrorIs(t, err, logfollow.ErrHandler)
	require.Equal(t, int64(4), herr.Record.Position)
	require.Equal(t, 3, herr.Attempts)
	require.ErrorContains(t, err, "poison")

	c := x.checkpoint(t, "f")
	require.Equal(t, logfollow.StateFailed, c.State)
	require.Equal(t, int64(3), c.Position, "the checkpoint stops before the failing event")
	require.Equal(t, int64(4), c.FailingPosition)
	require.Equal(t, 3, c.Attempts)
	require.False(t, c.Held, "the lease is released when the follower stops")
	x.requireOnce(t, 3)
}

func TestPermanentErrorsAreGivenUpOnAtOnceAndOnExhaustedMovesOn(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 5)
	var attempts atomic.Int32
	h := x.record("f")
	failing := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		for _, r := range recs {
			if r.Position == 2 {
				if len(recs) == 1 { // a failed batch is first replayed one record at a time
					attempts.Add(1)
				}
				return stagehand.Permanent(errors.New("undecodable"))
			}
		}
		return h(ctx, tx, recs)
	}
	pgtest.Exec(t, x.pool, `CREATE TABLE `+pgtest.Q(x.schema, "given_up")+` (position bigint, err text)`)
	cfg := logfollow.Config{MaxAttempts: 10, OnExhausted: func(ctx context.Context, tx pgx.Tx,
		failure *logfollow.HandlerError) error {
		if failure.Attempts != 1 {
			return fmt.Errorf("attempts = %d, want 1", failure.Attempts)
		}
		_, e := tx.Exec(ctx, `INSERT INTO `+pgtest.Q(x.schema, "given_up")+` VALUES ($1, $2)`,
			failure.Record.Position, failure.Err.Error())
		return e
	}}
	stop := start(t, x.newFollower(t, x.store, failing, cfg))
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 5 }, "catch-up")
	require.NoError(t, stop())
	require.Equal(t, int32(1), attempts.Load(), "a permanent error is not retried")
	require.Equal(t, int64(1), pgtest.Count(t, x.pool, `SELECT count(*) FROM `+pgtest.Q(x.schema, "given_up")+
		` WHERE position = 2 AND err = 'undecodable'`))
	x.requireOnce(t, 4)
}

func TestZombieCheckpointWriteIsRejected(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 3)
	var stole atomic.Bool
	h := x.record("f")
	zombie := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		if err := h(ctx, tx, recs); err != nil {
			return err
		}
		if stole.CompareAndSwap(false, true) {
			// While this batch is in flight the lease changes hands (as when this process froze past its TTL and
			// another took over). The renewer has not noticed yet: only the fence can stop this commit.
			pgtest.Exec(t, x.pool, `UPDATE `+pgtest.Q(x.schema, "leases")+` SET owner = 'successor',
				token = token + 1, expires_at = now() + interval '300 milliseconds'`)
		}
		return nil
	}
	f := x.newFollower(t, x.store, zombie, logfollow.Config{LeaseTTL: 10 * time.Second,
		LeaseRenewInterval: 5 * time.Second, LeaseAcquireInterval: 20 * time.Millisecond})
	stop := start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 3 }, "catch-up")
	require.NoError(t, stop())
	// The zombie's batch was rolled back; the follower re-acquired the lease (token 3) and applied it once.
	x.requireOnce(t, 3)
	require.Equal(t, int64(3), x.checkpoint(t, "f").Token)
}

func TestOnlyOneFollowerOfANameApplies(t *testing.T) {
	t.Parallel()
	x := setup(t)
	a := x.newFollower(t, x.store, x.record("a"), logfollow.Config{Owner: "a", PollInterval: 20 * time.Millisecond})
	b := x.newFollower(t, x.store, x.record("b"), logfollow.Config{Owner: "b", PollInterval: 20 * time.Millisecond})
	stops := map[string]func() error{"a": start(t, a), "b": start(t, b)}
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Held }, "a holder")
	for i := range 10 {
		x.appendN(t, x.store, fmt.Sprint(i), "e", 2)
	}
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 20 }, "first holder")
	first := x.checkpoint(t, "f").Owner
	require.Equal(t, int64(20), pgtest.Count(t, x.pool, `SELECT count(*) FROM `+pgtest.Q(x.schema, "applied")+
		` WHERE by = $1`, first), "only the lease holder applies")

	require.NoError(t, stops[first]()) // the holder stops: the standby takes over
	for i := range 5 {
		x.appendN(t, x.store, fmt.Sprint(i), "e", 2)
	}
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 30 }, "takeover")
	second := x.checkpoint(t, "f").Owner
	require.NotEqual(t, first, second)
	x.requireOnce(t, 30)
}

func TestResetReplaysFromTheStart(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 4)
	var resets atomic.Int32
	cfg := logfollow.Config{PollInterval: 20 * time.Millisecond, OnReset: func(ctx context.Context, tx pgx.Tx) error {
		resets.Add(1)
		_, err := tx.Exec(ctx, `DELETE FROM `+pgtest.Q(x.schema, "applied"))
		return err
	}}
	start(t, x.newFollower(t, x.store, x.record("f"), cfg))
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 4 }, "catch-up")
	n, err := logfollow.RequestReset(context.Background(), x.pool, x.schema, "f", 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	pgtest.Eventually(t, 10*time.Second, func() bool { return resets.Load() == 1 }, "reset performed")
	pgtest.Eventually(t, 10*time.Second, func() bool {
		c := x.checkpoint(t, "f")
		return c.Position == 4 && !c.ResetRequested
	}, "replayed")
	x.requireOnce(t, 4)
}

func TestLag(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 5)
	f := x.newFollower(t, x.store, x.record("f"), logfollow.Config{})
	lag, err := f.Lag(context.Background())
	require.NoError(t, err)
	require.Equal(t, logfollow.Lag{Position: 0, Head: 5, Events: 5, Time: lag.Time}, lag)
	require.Positive(t, lag.Time)
	stop := start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 5 }, "catch-up")
	require.NoError(t, stop())
	lag, err = f.Lag(context.Background())
	require.NoError(t, err)
	require.Equal(t, logfollow.Lag{Position: 5, Head: 5}, lag)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	x := setup(t)
	h := x.record("f")
	for field, cfg := range map[string]*logfollow.Config{
		"Name":          nil,
		"BatchSize":     {Name: "f", BatchSize: 10001},
		"PollInterval":  {Name: "f", PollInterval: time.Microsecond},
		"MaxAttempts":   {Name: "f", MaxAttempts: -1},
		"MaxRetryDelay": {Name: "f", RetryDelay: time.Second, MaxRetryDelay: time.Millisecond},
		"LeaseTTL":      {Name: "f", LeaseTTL: time.Millisecond},
		"PagesPerTx":    {Name: "f", PagesPerTx: 101},
	} {
		_, err := logfollow.New(x.pool, x.store, h, cfg)
		require.ErrorIs(t, err, logfollow.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field)
	}
	_, err := logfollow.New(x.pool, nil, h, &logfollow.Config{Name: "f"})
	require.ErrorContains(t, err, "store")
}

// TestRunLeavesNoGoroutines is not parallel: the leak check sees every goroutine of the process, and sequential
// tests run while the parallel ones wait.
func TestRunLeavesNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 5)
	var failed atomic.Bool
	h := x.record("f")
	flaky := func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("once")
		}
		return h(ctx, tx, recs)
	}
	a := x.newFollower(t, x.store, flaky, logfollow.Config{Owner: "a", ReconnectDelay: 10 * time.Millisecond})
	b := x.newFollower(t, x.store, flaky, logfollow.Config{Owner: "b", ReconnectDelay: 10 * time.Millisecond})
	stopA, stopB := start(t, a), start(t, b)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 5 }, "catch-up")
	x.appendN(t, x.store, "a", "e", 1)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 6 }, "live")
	require.NoError(t, stopA())
	require.NoError(t, stopB())
	// Run returns a HandlerError too without leaving anything behind.
	c := x.newFollower(t, x.store, func(context.Context, pgx.Tx, []eventstore.Record) error {
		return stagehand.Permanent(errors.New("no"))
	}, logfollow.Config{Name: "g"})
	require.ErrorIs(t, c.Run(context.Background()), logfollow.ErrHandler)
}

// heldRead is a store whose log reads after position after wait until release is closed.
type heldRead struct {
	eventstore.Store
	after   int64
	release chan struct{}
}

func (h *heldRead) ReadLog(ctx context.Context, q eventstore.LogQuery) (eventstore.LogPage, error) {
	if q.After == h.after {
		select {
		case <-h.release:
		case <-ctx.Done():
			return eventstore.LogPage{}, ctx.Err()
		}
	}
	return h.Store.ReadLog(ctx, q)
}

// A follower catching up never waits, with its transaction open, for the page it reads ahead: that read takes
// another connection, which a pool full of transactions waiting for this one's locks would never give it. The page
// in hand commits alone, and the next one is taken once it has been read.
func TestCommitDoesNotWaitForThePageReadAhead(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 25)
	held := &heldRead{Store: x.store, after: 10, release: make(chan struct{})}
	f := x.newFollower(t, held, x.record("one"), logfollow.Config{BatchSize: 10, PagesPerTx: 10,
		PollInterval: 20 * time.Millisecond})
	start(t, f)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 10 },
		"the first page commits while the next one is still being read")
	close(held.release)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.checkpoint(t, "f").Position == 25 }, "catch-up")
	x.requireOnce(t, 25)
}
