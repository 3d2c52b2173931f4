package staging

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// countingPublisher accepts every message, counting them.
type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}
func (p *countingPublisher) Close() error { return nil }

// statsServer starts a cluster of its own with pg_stat_statements loaded and planning tracked.
func statsServer(t *testing.T) string {
	t.Helper()
	srv, err := pgtest.Start(context.Background(), pgtest.Options{Settings: map[string]string{
		"shared_preload_libraries":          "'pg_stat_statements'",
		"pg_stat_statements.track_planning": "on",
		"pg_stat_statements.max":            "10000",
		// Only the relay's own maintenance: autovacuum and autoanalyze run on a timer (a minute), so how many of them
		// fall into the run would depend on how fast the machine is.
		"autovacuum": "off",
	}})
	if errors.Is(err, pgtest.ErrNoPostgres) && os.Getenv(pgtest.EnvURL) != "" {
		t.Skip("no local PostgreSQL binaries to start a server with pg_stat_statements loaded")
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	return srv.URL()
}

// singleMapping maps OrderPlaced to one message, so a save of one event stages one message (the common case),
// and OrderConfirmed to two, so a save of a placement stages three (several messages, two keys).
func singleMapping(reg *aggregate.Registry) *Mapping {
	m := NewMapping(reg)
	_ = Map(m, "placed", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.placed", Payload: e}}, nil
	})
	_ = Map(m, "confirmed", func(src eventstore.Record, e OrderConfirmed) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.confirmed", Payload: e},
			{Topic: "audit", Type: "order.confirmed", Payload: e, PartitionKey: "audit-" + src.StreamID}}, nil
	})
	return m
}

// Every hot statement keeps its plan: a few thousand saves (one event and one message, or a placement staging
// several messages over two keys) beside a relay that publishes them and vacuums the outbox table several times,
// with the statements of the staging, the relay (claim, mark, promotion, next due) and the append each planned on at
// most 1% of their calls, counted by pg_stat_statements after a warm-up. A plan made per call costs more than the
// statement it plans, and a vacuum (which invalidates every connection's plans on the table) must not turn into a
// storm of them.
func TestHotStatementsAreNotReplanned(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs thousands of saves")
	}
	url := statsServer(t)
	pool, schema := pgtest.MigratedOn(t, url)
	ctx := context.Background()
	pgtest.Exec(t, pool, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	// The maintenance cycles counted are the relay's own (its vacuums, below). Autovacuum and autoanalyze, which
	// also invalidate plans, run when the server's schedule says, more or less often with the machine's load: off
	// for these tables, so the count does not depend on how busy the machine is.
	for _, table := range []string{"events", "outbox", "outbox_sent", "outbox_dead_letters"} {
		pgtest.Exec(t, pool, `ALTER TABLE `+pgtest.Q(schema, table)+` SET (autovacuum_enabled = off)`)
	}
	e := setupOn(t, pool, schema)
	e.m = singleMapping(e.reg)
	r, st := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox})
	require.Equal(t, Transactional, st.Strategy())

	// A vacuum makes each connection that runs a statement plan it again: a statement of the relay, called once per
	// claim of about ten rows here, or once per mark of ten to twenty (a mark gathers the acknowledgements of the
	// deliveries under way), is planned by its two or three connections every vacuumAfterRows/10 or /20 calls. The
	// relay vacuums at its default, after 10,000 rows moved, and the run is sized for three vacuums.
	const clients, rounds, vacuumAfterRows = 2, 7500, 10_000

	// The relay runs on a pool of its own, as a relay process would.
	relayOutbox, err := outbox.New(pgtest.PoolFor(t, url), &outbox.Config{Schema: schema})
	require.NoError(t, err)
	relay, err := relayOutbox.NewRelay(&outbox.RelayConfig{PollingInterval: 100 * time.Millisecond,
		VacuumInterval: 200 * time.Millisecond, VacuumAfterRows: vacuumAfterRows})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	pub := &countingPublisher{}
	relay.AddToRouter(router, pub, nil)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- router.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	<-router.Running()

	save := func(rounds int) {
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := r.New(fmt.Sprintf("hot-%d-%d", c, time.Now().UnixNano()))
				for i := range rounds {
					if i%2 == 1 {
						o.Place(1) // two events, three messages over two keys
					} else {
						aggregate.Raise(o, OrderPlaced{Total: 1})
					}
					if err := r.Save(ctx, o); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	vacuums := func() int64 {
		return pgtest.Count(t, pool, `SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1
			AND relname = 'outbox'`, schema)
	}
	// Warm-up: every pooled connection prepares its statements and makes the custom plans PostgreSQL tries (five)
	// before it settles on a generic plan, so what is counted after it is the steady state.
	save(400)
	pgtest.Exec(t, pool, `SELECT pg_stat_statements_reset()`)
	before := vacuums()
	save(rounds)
	staged := pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "outbox")) +
		pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "outbox_sent"))
	pgtest.Eventually(t, 30*time.Second, func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "outbox")) == 0
	}, "the relay did not publish everything")
	cycles := vacuums() - before
	t.Logf("%d saves, %d messages, %d vacuums of the outbox", clients*rounds, staged, cycles)
	require.GreaterOrEqual(t, cycles, int64(3), "the relay vacuumed the outbox fewer than three times")
	require.Positive(t, staged)

	// Statements called at least 200 times: one re-plan after a vacuum, which every statement makes once per
	// connection, must not count as 1% by itself for a rarely used shape.
	rows, err := pool.Query(ctx, `SELECT query, calls, plans FROM pg_stat_statements
		WHERE query LIKE '%' || $1 || '%' AND calls >= 200 ORDER BY calls DESC`, `"`+schema+`"`)
	require.NoError(t, err)
	type stat struct {
		query        string
		calls, plans int64
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (stat, error) {
		var s stat
		return s, row.Scan(&s.query, &s.calls, &s.plans)
	})
	require.NoError(t, err)
	hot := map[string]bool{}
	for _, s := range stats {
		t.Logf("%-12s calls %6d plans %4d (%.2f%%) %.60s", hotName(s.query), s.calls, s.plans,
			100*float64(s.plans)/float64(s.calls), strings.Join(strings.Fields(s.query), " "))
	}
	for _, s := range stats {
		name := hotName(s.query)
		if name == "" {
			continue
		}
		hot[name] = true
		require.LessOrEqualf(t, float64(s.plans), 0.01*float64(s.calls),
			"%s was planned on %d of its %d calls:\n%s", name, s.plans, s.calls, s.query)
	}
	for _, name := range []string{"append", "stage", "claim", "mark"} {
		require.Truef(t, hot[name], "no %s statement among the statements counted", name)
	}
}

// hotName names the hot statement q is, or "".
func hotName(q string) string {
	switch {
	case strings.Contains(q, `INSERT INTO`) && strings.Contains(q, `"outbox" (message_id`):
		return "stage" // before the append: the staging statement reads positions from the events table
	case strings.Contains(q, `INSERT INTO`) && strings.Contains(q, `"events"`):
		return "append"
	case strings.Contains(q, `UPDATE`) && strings.Contains(q, `SET lease_owner = $`) && strings.Contains(q, `heads AS`):
		return "claim"
	case strings.Contains(q, `INSERT INTO`) && strings.Contains(q, `"outbox_sent"`):
		return "mark"
	case strings.Contains(q, `next_attempt_at = $3`):
		return "promote"
	case strings.Contains(q, `min(next_attempt_at)`):
		return "next due"
	}
	return ""
}

// A save locks few enough relations to stay within PostgreSQL's 16 fast-path lock slots per backend: beyond them,
// every lock goes through the shared lock manager (a LockManager LWLock partition), which serializes concurrent
// saves. Measured on both paths, in the steady state of a connection that has planned their statements (planning
// locks every index of a table it reads, once per connection and after each invalidation): the transactional twin
// (SaveTx), whose transaction is open to look at, and Save, whose one round trip (the append, the staging and the
// commit in one batch) is looked at from inside, by a deferred trigger on the outbox that records the session's
// locks at the commit.
//
// On an events table partitioned by position too: the save locks the parent and the one partition its row goes to
// (not every partition: the stream's version is read from its head in event_streams, not from the partitions'
// indexes), and the trigger's two tables.
//
// Not parallel, with nothing beside it: a strong lock any session holds (the DDL of another test's setup, a trigger
// created, an events table converted) sends every weak lock on relations that hash to the same one of the server's
// 1,024 slots through the shared lock manager, whichever schema they are in.
func TestSaveStaysWithinFastPathLocks(t *testing.T) {
	t.Run("unpartitioned", func(t *testing.T) {
		saveStaysWithinFastPathLocks(t, setup(t))
	})
	t.Run("partitioned", func(t *testing.T) {
		saveStaysWithinFastPathLocks(t, partitionedSetup(t))
	})
}

func saveStaysWithinFastPathLocks(t *testing.T, e *env) {
	ctx := context.Background()
	cfg := e.pool.Config().Copy()
	cfg.MaxConns = 1 // one connection: its plans are the ones warmed up
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	one := setupOn(t, pool, e.schema)
	one.m = singleMapping(one.reg)
	r, _ := one.repo(one.store, &Config{Strategy: Transactional, Outbox: one.outbox})
	// The locks Save holds at its commit, recorded by a deferred trigger (a row per staged message).
	seen, fn := pgtest.Q(e.schema, "save_locks"), pgtest.Q(e.schema, "save_locks_record")
	pgtest.Exec(t, e.pool, `CREATE TABLE `+seen+` (at bigint GENERATED ALWAYS AS IDENTITY, relations bigint,
		slow bigint)`)
	pgtest.Exec(t, e.pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO `+seen+` (relations, slow) SELECT count(DISTINCT relation), count(*) FILTER (WHERE NOT fastpath)
				FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'
					AND relation NOT IN ('pg_locks'::regclass, '`+seen+`'::regclass);
			RETURN NULL;
		END $$`)
	for _, events := range []int{1, 2} {
		o := r.New(fmt.Sprintf("locks-%d", events))
		aggregate.Raise(o, OrderPlaced{Total: 1})
		require.NoError(t, r.Save(ctx, o)) // the outbox has a pending row and the key a message: probes hit
		// save saves through Save (with the trigger in place) and returns what the row it recorded last says.
		save := func() (relations, slow int64) {
			if events == 1 {
				aggregate.Raise(o, OrderPlaced{Total: 1})
			} else {
				o.Place(1)
			}
			require.NoError(t, r.Save(ctx, o))
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT relations, slow FROM `+seen+` ORDER BY at DESC LIMIT 1`).
				Scan(&relations, &slow))
			return relations, slow
		}
		// saveTx saves on a transaction of the pool's one connection, counts the relations it locked, and rolls
		// back (also when the test fails: the pool could not close while the transaction holds the connection).
		saveTx := func() (relations, slow int64) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			if events == 1 {
				aggregate.Raise(o, OrderPlaced{Total: 1})
			} else {
				o.Place(1)
			}
			require.NoError(t, r.SaveTx(ctx, tx, o))
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(DISTINCT relation),
				count(*) FILTER (WHERE NOT fastpath) FROM pg_locks
				WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation <> 'pg_locks'::regclass`).
				Scan(&relations, &slow))
			require.NoError(t, tx.Rollback(ctx))
			loaded, err := r.Load(ctx, o.ID()) // the rolled-back save left o ahead of its stream
			require.NoError(t, err)
			*o = *loaded
			return relations, slow
		}
		for range 6 { // past PostgreSQL's custom plans
			saveTx()
		}
		// A save that plans (the first on a connection, or the first after a vacuum or an analyze of a table it
		// writes invalidated its plans) locks every index of the tables it reads while planning; the steady state
		// is a save that runs cached plans. Autovacuum may invalidate them at any moment, so a few tries are allowed
		// for one save of the steady state.
		var relations, slow int64
		for try := range 5 {
			if relations, slow = saveTx(); slow <= max(0, relations+1-16) {
				break
			}
			t.Logf("try %d: %d locks outside the fast path (the save planned)", try+1, slow)
		}
		t.Logf("SaveTx of %d event(s): %d relations locked, %d locks outside the fast path", events, relations, slow)
		// The count's own query locks pg_locks: a save of 16 relations fits the 16 slots, and the query's lock is
		// the one that overflows them, in whichever slot's place.
		require.LessOrEqual(t, slow, max(0, relations+1-16),
			"a SaveTx of %d event(s) took %d relation locks, %d outside the fast path", events, relations, slow)
		require.LessOrEqual(t, relations, int64(16))

		// Save, with the trigger in place (its creation invalidates the outbox's plans: the saves after it plan
		// again, and then run cached plans).
		pgtest.Exec(t, e.pool, `CREATE CONSTRAINT TRIGGER save_locks AFTER INSERT ON `+pgtest.Q(e.schema, "outbox")+
			` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
		for range 6 {
			save()
		}
		for try := range 5 {
			if relations, slow = save(); slow <= max(0, relations+2-16) {
				break
			}
			t.Logf("try %d: %d locks outside the fast path (the save planned)", try+1, slow)
		}
		pgtest.Exec(t, e.pool, `DROP TRIGGER save_locks ON `+pgtest.Q(e.schema, "outbox"))
		t.Logf("Save of %d event(s): %d relations locked, %d locks outside the fast path", events, relations, slow)
		// The trigger's statement locks its table and pg_locks: a save of 16 relations fits the 16 slots, and
		// those two locks are the ones that overflow them, in whichever slots' place.
		require.LessOrEqual(t, slow, max(0, relations+2-16),
			"a Save of %d event(s) took %d relation locks, %d outside the fast path", events, relations, slow)
		require.LessOrEqual(t, relations, int64(16))
	}
}
