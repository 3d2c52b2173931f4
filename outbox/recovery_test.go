package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

const crashChildEnv = "STAGEHAND_OUTBOX_CRASH_CHILD"

// tableBroker is a "broker" another process can observe: every accepted publication is a row in broker_log. With
// blockAt > 0 the blockAt-th publication is recorded and then never returns, so it is never acknowledged.
type tableBroker struct {
	pool    *pgxpool.Pool
	schema  string
	blockAt int64
}

func (b *tableBroker) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		var n int64
		if err := b.pool.QueryRow(context.Background(), "INSERT INTO "+pgtest.Q(b.schema, "broker_log")+
			" (message_id, partition_key, pid) VALUES ($1, $2, $3) RETURNING n", m.UUID,
			m.Metadata.Get(outbox.HeaderPartitionKey), os.Getpid()).Scan(&n); err != nil {
			return err
		}
		if b.blockAt > 0 && n == b.blockAt {
			select {} // published, never acknowledged: the process is killed here
		}
	}
	return nil
}

func (b *tableBroker) Close() error { return nil }

// runCrashChild is the relay process the crash test kills. It runs from TestMain when crashChildEnv is set.
func runCrashChild() {
	ctx := context.Background()
	url, schema := os.Getenv(pgtest.EnvURL), pgtest.HelperSchema()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	r, err := ob.NewRelay(&outbox.RelayConfig{BatchSize: 100, PollingInterval: 50 * time.Millisecond,
		ClaimDuration: time.Second, ProcessorID: "doomed"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		os.Exit(2)
	}
	r.AddToRouter(router, &tableBroker{pool: pool, schema: schema, blockAt: 50}, nil)
	_ = router.Run(ctx)
	os.Exit(3)
}

// Contract 5 through a crash: a relay process killed with SIGKILL after publishing messages it had not marked
// loses nothing. Another relay delivers every message once the dead relay's leases lapse; the message that was
// published but not marked is published again (a duplicate, seen at the broker), and per-key order of first
// publications holds.
func TestRelayKilledMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	pgtest.Exec(t, e.pool, "CREATE TABLE "+pgtest.Q(e.schema, "broker_log")+
		" (n bigserial PRIMARY KEY, message_id text NOT NULL, partition_key text NOT NULL, pid int NOT NULL)")
	want := stageKeyed(t, e, "t", 300, 10)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), append(pgtest.HelperEnv(t, e.schema), crashChildEnv+"=1")...)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	require.NoError(t, child.Start())
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	var blocked string
	pgtest.Eventually(t, 30*time.Second, func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the relay process exited early: %v", err)
		default:
		}
		return e.pool.QueryRow(ctx, "SELECT message_id FROM "+pgtest.Q(e.schema, "broker_log")+" WHERE n = 50").
			Scan(&blocked) == nil
	}, "the relay process did not publish 50 messages")
	// The 50th publication never returned: it reached the broker but is still leased, unmarked, in the outbox.
	require.EqualValues(t, 1, e.count("outbox", "message_id = '"+blocked+"' AND lease_owner LIKE 'doomed/%'"))
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	require.Error(t, <-exited)

	r := e.relay(nil)
	runRouter(t, r, &tableBroker{pool: e.pool, schema: e.schema}, nil)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		return pgtest.Count(t, e.pool, "SELECT count(DISTINCT message_id) FROM "+pgtest.Q(e.schema, "broker_log")) == 300
	}, "messages were lost")
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.count("outbox") == 0 }, "rows left unmarked")
	require.GreaterOrEqual(t, e.count("broker_log", "message_id = '"+blocked+"'"), int64(2),
		"the published-but-unmarked message is published again")

	rows, err := e.pool.Query(ctx, "SELECT message_id, partition_key FROM "+pgtest.Q(e.schema, "broker_log")+" ORDER BY n")
	require.NoError(t, err)
	var log []published
	for rows.Next() {
		var p published
		require.NoError(t, rows.Scan(&p.id, &p.key))
		log = append(log, p)
	}
	require.NoError(t, rows.Err())
	got := firstOrder(log)
	for key, ids := range want {
		require.Equal(t, ids, got[key], "first publications of key %s out of order", key)
	}
}

// The relay's listening connection killed with pg_terminate_backend: delivery resumes within two polling
// intervals, and wake-ups work again once the listener has reconnected.
func TestRelaySurvivesKilledListenConnection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	poll := 2 * time.Second
	b := newBroker()
	r := e.relay(func(c *outbox.RelayConfig) { c.PollingInterval = poll })
	runRouter(t, r, b, nil)

	channel := pgnotify.Channel(e.schema, "outbox") // a hash of the schema when the name would pass 63 bytes
	listening := "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'listen %" + channel + "%'"
	pgtest.Eventually(t, 5*time.Second, func() bool { return pgtest.Count(t, e.pool, listening) == 1 },
		"the relay is not listening")
	stageAndWait := func(id string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		_, err := e.ob.Stage(ctx, outbox.Message{ID: id, Topic: "t"})
		require.NoError(t, err)
		pgtest.Eventually(t, within, func() bool { return containsID(b.snapshot(), id) },
			"%s not delivered within %s", id, within)
		return time.Since(start)
	}
	require.Less(t, stageAndWait("before", poll), poll/2, "a wake-up should beat the poll")

	require.EqualValues(t, 1, pgtest.Count(t, e.pool, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "+
		"WHERE query ILIKE 'listen %"+channel+"%'"))
	stageAndWait("during", 2*poll)

	pgtest.Eventually(t, 5*time.Second, func() bool { return pgtest.Count(t, e.pool, listening) == 1 },
		"the listener did not reconnect")
	time.Sleep(100 * time.Millisecond) // let the reconnect signal's poll pass
	require.Less(t, stageAndWait("after", poll), poll/2, "wake-ups work again after the reconnect")
}

func containsID(log []published, id string) bool {
	for _, p := range log {
		if p.id == id {
			return true
		}
	}
	return false
}

// A database restart (every connection dropped) does not stop the relay: it goes on delivering once PostgreSQL
// is back, and its listener reconnects.
func TestRelayRecoversFromDatabaseRestart(t *testing.T) {
	t.Parallel()
	if os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("restarts a throwaway cluster of its own; DATABASE_URL points at a server this test must not restart")
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	pool := pgtest.PoolFor(t, srv.URL())
	_, err = stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: "restart"})
	require.NoError(t, err)
	e := setupOn(t, pool, "restart", nil)
	b := newBroker()
	r := e.relay(func(c *outbox.RelayConfig) { c.PollingInterval = 200 * time.Millisecond })
	runRouter(t, r, b, nil)

	_, err = e.ob.Stage(ctx, outbox.Message{ID: "before", Topic: "t"})
	require.NoError(t, err)
	pgtest.Eventually(t, 5*time.Second, func() bool { return b.distinct() == 1 }, "not delivered before restart")

	require.NoError(t, srv.Restart(ctx))
	pgtest.Eventually(t, 20*time.Second, func() bool {
		_, err := e.ob.Stage(ctx, outbox.Message{ID: "after", Topic: "t"})
		return err == nil
	}, "cannot stage after the restart")
	pgtest.Eventually(t, 20*time.Second, func() bool { return b.distinct() == 2 }, "not delivered after the restart")
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'listen %'") == 1
	}, "the listener did not reconnect")
}

// Contract 5 around re-staging: a message re-staged while a relay moves the same ID into the sent ledger is not
// staged again (the staging statement's snapshot predates the move; the recheck catches it).
func TestRestageRacingTheMoveToTheLedger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := outbox.Message{ID: "evt-1/0", Topic: "t", SourcePosition: 42}
	_, err := e.ob.Stage(ctx, m)
	require.NoError(t, err)

	// A relay's mark, held open: the row is deleted but the move has not committed.
	mover, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = mover.Rollback(ctx) }()
	_, err = mover.Exec(ctx, `WITH done AS (DELETE FROM `+pgtest.Q(e.schema, "outbox")+` WHERE message_id = $1 RETURNING *)
		INSERT INTO `+pgtest.Q(e.schema, "outbox_sent")+` (message_id, topic, tenant_id, message_type, source_position,
		    attempts, created_at, sent_at)
		SELECT message_id, topic, tenant_id, message_type, source_position, 1, created_at, now() FROM done`, m.ID)
	require.NoError(t, err)

	staged := make(chan int, 1)
	go func() {
		n, err := e.ob.Stage(ctx, m)
		if err != nil {
			n = -1
		}
		staged <- n
	}()
	select {
	case n := <-staged:
		t.Fatalf("the re-stage should wait for the move, returned %d", n)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, mover.Commit(ctx))
	require.Equal(t, 0, <-staged, "the re-staged message must not be inserted again")
	require.Zero(t, e.count("outbox"))
	require.EqualValues(t, 1, e.count("outbox_sent"))
}

// Statistics count what they say, per scope; cleanup removes old sent-ledger entries in batches, never at or
// above the lowest watermark, and never pending or dead-lettered messages.
func TestStatisticsAndCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	acme := stagehand.WithTenant(ctx, "acme")
	now := time.Now()
	_, err := e.ob.Stage(acme,
		outbox.Message{ID: "sent-10", Topic: "t", SourcePosition: 10},
		outbox.Message{ID: "sent-20", Topic: "t", SourcePosition: 20},
		outbox.Message{ID: "sent-30", Topic: "t", SourcePosition: 30},
		outbox.Message{ID: "sent-none", Topic: "t"},
		outbox.Message{ID: "poison", Topic: "t", PartitionKey: "k"},
	)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if m.UUID == "poison" {
			return errRejected
		}
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) })
	_, err = r.Drain(ctx, b)
	require.NoError(t, err)

	_, err = e.ob.Stage(acme, outbox.Message{ID: "held", Topic: "t", PartitionKey: "k"}, // behind the dead letter
		outbox.Message{ID: "later", Topic: "t", ScheduledAt: now.Add(time.Hour)},
		outbox.Message{ID: "flaky", Topic: "flaky"})
	require.NoError(t, err)
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "waiting", Topic: "t"}) // no tenant
	require.NoError(t, err)
	b.setFail(func(*message.Message) error { return errRejected })
	r2 := e.relay(func(c *outbox.RelayConfig) { c.RetryDelay, c.MaxRetryDelay = time.Hour, time.Hour })
	ch, err := r2.Subscribe(ctx, "flaky")
	require.NoError(t, err)
	(<-ch).Nack()
	pgtest.Eventually(t, 5*time.Second, func() bool { return e.count("outbox", "attempts = 1") == 1 }, "no nack")

	st, err := e.ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Pending, "held, flaky and waiting are due; later is scheduled")
	require.EqualValues(t, 1, st.Scheduled)
	require.EqualValues(t, 1, st.BackingOff)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.HeldByDeadLetter)
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 4, st.Sent)
	require.Greater(t, st.OldestPendingAge, time.Duration(0))
	acmeStats, err := e.ob.Tenant("acme").Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, acmeStats.Pending, "the untenanted message is not acme's")
	none, err := e.ob.Tenant("").Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, outbox.Stats{Pending: 1}, trim(none))
	other, err := e.ob.Tenant("other").Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, outbox.Stats{}, trim(other))
	_, err = e.ob.Tenant("other").DeadLetter(ctx, "poison")
	require.ErrorIs(t, err, outbox.ErrNotFound, "another tenant's dead letter is invisible")
	n, err := e.ob.Tenant("other").Redrive(ctx, "poison")
	require.ErrorIs(t, err, outbox.ErrNotFound, "the ID is reported as unknown to that tenant")
	require.Zero(t, n, "nor can it be redriven from another tenant")

	// Watermark rule: with the lowest watermark at 20, entries at or above 20 stay whatever their age.
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, e.pool, "reconciler", 20))
	_, err = e.ob.AdvanceWatermark(ctx, "deferred-stager", 35)
	require.NoError(t, err)
	pos, err := e.ob.AdvanceWatermark(ctx, "deferred-stager", 25)
	require.NoError(t, err)
	require.EqualValues(t, 35, pos, "a watermark never moves back")
	deleted, err := e.ob.AllTenants().CleanupSent(ctx, time.Hour, 1)
	require.NoError(t, err)
	require.Zero(t, deleted, "nothing is older than an hour")
	deleted, err = e.ob.Tenant("other").CleanupSent(ctx, 0, 1)
	require.NoError(t, err)
	require.Zero(t, deleted, "nothing belongs to that tenant")
	deleted, err = e.ob.AllTenants().CleanupSent(ctx, 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, deleted, "sent-10 (below 20) and sent-none (no position), one per batch")
	require.EqualValues(t, 2, e.count("outbox_sent"))
	n, err = e.ob.Stage(acme, outbox.Message{ID: "sent-20", Topic: "t", SourcePosition: 20})
	require.NoError(t, err)
	require.Zero(t, n, "an ID at the watermark stays known: re-staging it publishes nothing")

	_, err = e.ob.AdvanceWatermark(ctx, "reconciler", 31)
	require.NoError(t, err)
	deleted, err = e.ob.AllTenants().CleanupSent(ctx, 0, 100)
	require.NoError(t, err)
	require.EqualValues(t, 2, deleted)
	wms, err := e.ob.Watermarks(ctx)
	require.NoError(t, err)
	require.Len(t, wms, 2)
	require.NoError(t, e.ob.RemoveWatermark(ctx, "reconciler"))
	require.NoError(t, e.ob.RemoveWatermark(ctx, "deferred-stager"))

	require.EqualValues(t, 4, e.count("outbox"), "cleanup never touches pending messages")
	require.EqualValues(t, 1, e.count("outbox_dead_letters"))
}

// trim drops the age, for comparisons.
func trim(s outbox.Stats) outbox.Stats {
	s.OldestPendingAge = 0
	return s
}
