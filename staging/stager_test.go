package staging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func TestAutoResolvesEachOutcome(t *testing.T) {
	t.Parallel()
	e := setup(t)

	st, err := New(e.store, &Config{Outbox: e.outbox, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, Transactional, st.Strategy(), "PostgreSQL store + outbox on its database")
	require.Equal(t, Auto, st.Requested())

	st, err = New(eventstore.NewMemory(nil), &Config{Outbox: e.outbox, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, EventuallyConsistent, st.Strategy(), "in-memory store + PostgreSQL outbox")

	var logs bytes.Buffer
	st, err = New(e.store, &Config{Mapping: e.m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.Equal(t, Deferred, st.Strategy(), "no outbox")
	require.Contains(t, logs.String(), "nothing is staged unless a DeferredStager runs")
	require.Contains(t, logs.String(), "strategy=deferred", "the resolved strategy is logged once")

	// An outbox on another database: the append cannot share its transaction.
	other := otherDatabase(t)
	ob2, err := outbox.New(other, &outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	st, err = New(e.store, &Config{Outbox: ob2, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, EventuallyConsistent, st.Strategy())
}

func TestExplicitTransactionalWithoutItsPartsFailsNamingThem(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := New(eventstore.NewMemory(nil), &Config{Strategy: Transactional, Outbox: e.outbox, Mapping: e.m})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "eventstore.TransactionalStore")
	require.ErrorContains(t, err, "*eventstore.MemoryStore")

	_, err = New(e.store, &Config{Strategy: Transactional, Mapping: e.m})
	require.ErrorContains(t, err, "an outbox (Config.Outbox is nil)")

	ob2, err := outbox.New(otherDatabase(t), &outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	_, err = New(e.store, &Config{Strategy: Transactional, Outbox: ob2, Mapping: e.m})
	require.ErrorContains(t, err, "different databases")

	_, err = New(e.store, &Config{Strategy: EventuallyConsistent, Mapping: e.m})
	require.ErrorContains(t, err, "Outbox is required by the EventuallyConsistent strategy")
	_, err = New(e.store, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(e.store, &Config{Strategy: Strategy(9), Mapping: e.m})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// otherDatabase returns a pool on a second database of the test server.
func otherDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	admin := pgtest.Pool(t)
	name := pgtest.NewSchemaName(t)
	pgtest.Exec(t, admin, "CREATE DATABASE "+name)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
	})
	return pool
}

func TestTransactionalStagesInTheAppendTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r, st := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox})
	require.Equal(t, Transactional, st.Strategy())
	for i := range 3 {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(10); return nil })
		require.NoError(t, err)
	}
	e.requireExactlyOnce(e.store)
	require.Len(t, e.stagedIDs(), 9, "3 orders x (2 placed messages + 1 confirmed message)")

	// A concurrency conflict stages nothing.
	stale, err := r.Load(ctx, orderID(0))
	require.NoError(t, err)
	_, err = r.Update(ctx, orderID(0), func(o *Order) error { o.Place(1); return nil })
	require.NoError(t, err)
	before := len(e.stagedIDs())
	stale.Place(99)
	err = r.Save(ctx, stale)
	require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict)
	require.Len(t, e.stagedIDs(), before, "a conflicting save stages nothing")
	e.requireExactlyOnce(e.store)
}

// A Transactional save builds its messages before the insert, so the staging statement reads each message's source
// position from its event: the last event's through the position sequence, the others by event ID. Concurrent saves
// interleave their positions, and every staged message must still carry its own event's position (the watermark
// rules of cleanup depend on it); a mapping sees the records as they will be stored, without position. On an events
// table partitioned by position too, where the lookup by event ID reads the store's event_ids table.
func TestTransactionalMessagesCarryTheirEventsPositions(t *testing.T) {
	t.Parallel()
	t.Run("unpartitioned", func(t *testing.T) {
		t.Parallel()
		transactionalMessagesCarryTheirEventsPositions(t, setup(t))
	})
	t.Run("partitioned", func(t *testing.T) {
		t.Parallel()
		transactionalMessagesCarryTheirEventsPositions(t, partitionedSetup(t))
	})
}

// partitionedSetup is setup on a schema whose events table is partitioned by position (partitions of 20).
func partitionedSetup(t *testing.T) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 20, Ahead: 20,
		Headroom: 1})
	require.NoError(t, err)
	_, err = parts.Convert(context.Background())
	require.NoError(t, err)
	return setupOn(t, pool, schema)
}

func transactionalMessagesCarryTheirEventsPositions(t *testing.T, e *env) {
	ctx := context.Background()
	m := NewMapping(e.reg)
	var sawPosition atomic.Int64
	require.NoError(t, m.MapRaw("placed", "shop.order.placed", func(src eventstore.Record) ([]Message, error) {
		sawPosition.Add(src.Position)
		return []Message{{Topic: "orders", Type: "placed"}, {Topic: "billing", Type: "placed"}}, nil
	}))
	require.NoError(t, m.MapRaw("confirmed", "shop.order.confirmed", func(src eventstore.Record) ([]Message, error) {
		sawPosition.Add(src.Position)
		return []Message{{Topic: "orders", Type: "confirmed"}}, nil
	}))
	r, _ := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox, Mapping: m})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				_, err := r.Create(ctx, fmt.Sprintf("pos-%d-%d", w, i), func(o *Order) error {
					switch i % 3 {
					case 0:
						aggregate.Raise(o, OrderConfirmed{By: "x"}) // a single-event save
					case 1:
						// One message, caused by an event before the append's last one.
						aggregate.Raise(o, OrderConfirmed{By: "x"})
						aggregate.Raise(o, OrderNoted{Note: "mapped to nothing"})
					default:
						o.Place(1) // two events, three messages
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, sawPosition.Load(), "a Transactional mapping runs before the insert assigns positions")
	var total, wrong int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE o.source_position IS DISTINCT FROM
		(SELECT ev.position FROM `+pgtest.Q(e.schema, "events")+` ev WHERE ev.event_id = o.causation_id::uuid))
		FROM `+pgtest.Q(e.schema, "outbox")+` o`).Scan(&total, &wrong))
	require.Equal(t, int64(8*(4*1+3*1+3*3)), total)
	require.Zero(t, wrong, "messages whose source position is not their event's")
}

func TestTransactionalStagingErrorRollsBackTheAppend(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := NewMapping(e.reg)
	require.NoError(t, m.MapRaw("broken", "shop.order.confirmed", func(eventstore.Record) ([]Message, error) {
		return nil, errors.New("mapping failed")
	}))
	r, _ := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox, Mapping: m})
	_, err := r.Create(ctx, "o", func(o *Order) error { o.Place(1); return nil })
	require.ErrorContains(t, err, "mapping failed")
	_, err = e.store.ReadStream(ctx, "", "o", 0)
	require.ErrorIs(t, err, eventstore.ErrStreamNotFound, "events and messages commit together or not at all")
	require.Empty(t, e.stagedIDs())
}

func TestEventuallyConsistentStagesAfterTheAppend(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r, st := e.repo(e.store, &Config{Strategy: EventuallyConsistent, Outbox: e.outbox})
	require.Equal(t, EventuallyConsistent, st.Strategy())
	for i := range 3 {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(5); return nil })
		require.NoError(t, err)
	}
	e.requireExactlyOnce(e.store)

	// A staging failure after the append does not fail the save (the events are stored); the reconciler stages.
	var fail atomic.Bool
	fail.Store(true)
	m := NewMapping(e.reg)
	require.NoError(t, m.MapRaw("flaky", "shop.order.placed", func(src eventstore.Record) ([]Message, error) {
		if fail.Load() {
			return nil, errors.New("transient")
		}
		return []Message{{Topic: "flaky"}}, nil
	}))
	var logs bytes.Buffer
	r2, _ := e.repo(e.store, &Config{Strategy: EventuallyConsistent, Outbox: e.outbox, Mapping: m,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	_, err := r2.Create(ctx, "flaky-order", func(o *Order) error { o.Place(1); return nil })
	require.NoError(t, err)
	require.Contains(t, logs.String(), "the reconciler will stage it")
	id := MessageID("", "flaky-order", 1, "flaky", 0)
	require.Zero(t, e.stagedIDs()[id])

	fail.Store(false)
	rec, err := NewReconciler(e.store, e.outbox, m, &WorkerConfig{Name: "flaky"})
	require.NoError(t, err)
	runUntilCaughtUp(t, rec, e.store)
	require.Equal(t, 1, e.stagedIDs()[id], "the reconciler staged what the save could not")
}

// The save path of EventuallyConsistent leaves out the messages of events its reconciler has passed: the
// reconciler staged them, and cleanup may have forgotten their publication since.
func TestEventuallyConsistentLeavesOutWhatTheReconcilerPassed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r, _ := e.repo(e.store, &Config{Strategy: EventuallyConsistent, Outbox: e.outbox})
	keyed := func(id string) int64 {
		return pgtest.Count(t, e.pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "outbox")+
			` WHERE partition_key = '`+id+`'`)
	}
	_, err := r.Create(ctx, "before", func(o *Order) error { o.Place(1); return nil })
	require.NoError(t, err)
	require.Positive(t, keyed("before"), "no reconciler registered yet: nothing is left out")

	require.NoError(t, e.outbox.RegisterWatermarkTx(ctx, e.pool, "reconciler:default", 1<<50))
	_, err = r.Create(ctx, "passed", func(o *Order) error { o.Place(1); return nil })
	require.NoError(t, err, "the save succeeds: its events are stored")
	require.Zero(t, keyed("passed"), "the reconciler is past the event")
}

// The staging transaction of an EventuallyConsistent save commits without waiting for its WAL flush (the
// reconciler stages again what a server crash loses); a Transactional save's commit is durable.
func TestEventuallyConsistentStagingCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	base, schema := pgtest.Migrated(t)
	cfg := base.Config().Copy()
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on" // test clusters turn it off server-wide
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := setupOn(t, pool, schema)
	ctx := context.Background()
	seen, fn := pgtest.Q(schema, "commit_modes"), pgtest.Q(schema, "record_commit_mode")
	pgtest.Exec(t, pool, `CREATE TABLE `+seen+` (key text, mode text)`)
	pgtest.Exec(t, pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO `+seen+` VALUES (NEW.partition_key, current_setting('synchronous_commit'));
			RETURN NEW;
		END $$`)
	pgtest.Exec(t, pool, `CREATE TRIGGER record_commit_mode AFTER INSERT ON `+pgtest.Q(schema, "outbox")+
		` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	for strategy, want := range map[Strategy]string{EventuallyConsistent: "off", Transactional: "on"} {
		r, _ := e.repo(e.store, &Config{Strategy: strategy, Outbox: e.outbox})
		_, err := r.Create(ctx, strategy.String(), func(o *Order) error { o.Place(1); return nil })
		require.NoError(t, err)
		var mode string
		require.NoError(t, pool.QueryRow(ctx, `SELECT mode FROM `+seen+` WHERE key = $1`, strategy.String()).
			Scan(&mode))
		require.Equal(t, want, mode, strategy.String())
	}
}

func TestDeferredStagesNothingOnSave(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r, st := e.repo(e.store, &Config{Strategy: Deferred, Outbox: e.outbox})
	require.Equal(t, Deferred, st.Strategy())
	for i := range 4 {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(1); return nil })
		require.NoError(t, err)
	}
	require.Empty(t, e.stagedIDs())
	w, err := NewDeferredStager(e.store, e.outbox, e.m, nil)
	require.NoError(t, err)
	runUntilCaughtUp(t, w, e.store)
	e.requireExactlyOnce(e.store)
	lag, err := w.Lag(ctx)
	require.NoError(t, err)
	require.Zero(t, lag.Events)
}

func TestSaveTxStagesOnTheCallersTransactionOnlyWhenTransactional(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	r, _ := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox})
	tx, err := e.store.Begin(ctx)
	require.NoError(t, err)
	o := r.New("rolled")
	o.Place(1)
	require.NoError(t, r.SaveTx(ctx, tx, o))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, e.stagedIDs(), "rolled back with the caller's transaction")

	tx, err = e.store.Begin(ctx)
	require.NoError(t, err)
	o = r.New("kept")
	o.Place(1)
	require.NoError(t, r.SaveTx(ctx, tx, o))
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, e.stagedIDs(), 3)

	for _, s := range []Strategy{EventuallyConsistent, Deferred} {
		r, _ := e.repo(e.store, &Config{Strategy: s, Outbox: e.outbox})
		tx, err := e.store.Begin(ctx)
		require.NoError(t, err)
		o := r.New("tx-" + s.String())
		o.Place(1)
		require.NoError(t, r.SaveTx(ctx, tx, o))
		require.NoError(t, tx.Commit(ctx))
	}
	require.Len(t, e.stagedIDs(), 3, "eventually-consistent and deferred leave SaveTx staging to their workers")
	w, err := NewReconciler(e.store, e.outbox, e.m, nil)
	require.NoError(t, err)
	runUntilCaughtUp(t, w, e.store)
	e.requireExactlyOnce(e.store)
}

func TestWorkerConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := NewReconciler(nil, e.outbox, e.m, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewDeferredStager(e.store, nil, e.m, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewDeferredStager(e.store, e.outbox, NewMapping(e.reg), nil)
	require.ErrorContains(t, err, "maps no event type")
	_, err = NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestTwoDeferredStagersWithOneNameNeverBothStage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _ := e.repo(e.store, &Config{Strategy: Deferred})
	// Every staging transaction tries a lock of its own while it inserts into the outbox, and lingers: a try that
	// fails means another staging transaction is open at the same time, and is recorded (in a table the failing
	// transaction writes, so the record commits with it).
	overlaps, fn := pgtest.Q(e.schema, "overlaps"), pgtest.Q(e.schema, "one_stager")
	pgtest.Exec(t, e.pool, `CREATE TABLE `+overlaps+` (at timestamptz)`)
	pgtest.Exec(t, e.pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NOT pg_try_advisory_xact_lock(7357) THEN INSERT INTO `+overlaps+` VALUES (clock_timestamp()); END IF;
			PERFORM pg_sleep(0.005); -- widen the window two active stagers would need
			RETURN NEW;
		END $$`)
	pgtest.Exec(t, e.pool, `CREATE TRIGGER one_stager BEFORE INSERT ON `+pgtest.Q(e.schema, "outbox")+
		` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)

	workers := make([]*Worker, 2)
	done := make(chan error, 2)
	for i := range workers {
		w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 3, LeaseTTL: time.Second,
			PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		workers[i] = w
		go func() { done <- w.Run(ctx) }()
	}
	for i := range 30 {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(1); return nil })
		require.NoError(t, err)
	}
	head, err := e.store.HeadPosition(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		lag, err := workers[0].Lag(ctx)
		return err == nil && lag.Position >= head
	}, "the stagers did not catch up")
	cancel()
	for range workers {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			require.NoError(t, err)
		}
	}
	require.Zero(t, pgtest.Count(t, e.pool, `SELECT count(*) FROM `+overlaps),
		"two stagers with one name staged at the same time")
	e.requireExactlyOnce(e.store)
}

// The save path of EventuallyConsistent and the reconciler stage the same events at the same time: they must
// take their locks in one order (watermark, then partition keys), or PostgreSQL breaks a deadlock by failing one
// of them (the save's staging, a second later).
func TestEventuallyConsistentAndReconcilerNeverDeadlock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	r, _ := e.repo(e.store, &Config{Strategy: EventuallyConsistent, Outbox: e.outbox,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	rec, err := NewReconciler(e.store, e.outbox, e.m, &WorkerConfig{PollInterval: 2 * time.Millisecond, BatchSize: 5})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				id := fmt.Sprintf("o-%d-%d", w, i%6) // several saves per aggregate: shared partition keys
				if _, err := r.Update(ctx, id, func(o *Order) error { o.Place(1); return nil }); err != nil {
					if _, err := r.Create(ctx, id, func(o *Order) error { o.Place(1); return nil }); err != nil &&
						!errors.Is(err, eventstore.ErrConcurrencyConflict) {
						t.Errorf("save: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	head, err := e.store.HeadPosition(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		lag, err := rec.Lag(ctx)
		return err == nil && lag.Position >= head
	}, "the reconciler did not catch up")
	cancel()
	require.NoError(t, ignoreCanceled(<-done))
	require.NotContains(t, logs.String(), "staging after the append failed", "the save path's staging failed")
	e.requireExactlyOnce(e.store)
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
