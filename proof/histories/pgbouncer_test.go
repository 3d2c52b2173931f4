package histories_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/proof/histories"
)

// pgBouncer starts PgBouncer in front of the test server in mode (transaction pooling when empty).
func pgBouncer(t *testing.T, mode string) *histories.PgBouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := histories.StartPgBouncer(ctx, pgtest.URL(t), histories.PgBouncerOptions{PoolMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if crashes := b.Crashes(); len(crashes) > 0 || t.Failed() {
			// PgBouncer 1.18 exits on a FATAL "server_proto: server in bad state: 11" when a server connection it
			// is cancelling receives an error (pg_terminate_backend); it was started again after each.
			t.Logf("pgbouncer exited on its own %d times (%v); its output:\n%s", len(crashes), crashes, b.Output())
		}
		_ = b.Stop()
	})
	return b
}

// withParams adds query parameters to a postgres:// URL.
func withParams(u string, params ...string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + strings.Join(params, "&")
}

// pooledPool opens a pool through PgBouncer with pgx's statement cache replaced by describe caching (what a pool
// behind PgBouncer before 1.21 needs: its named prepared statements do not survive a transaction).
func pooledPool(t *testing.T, u string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), withParams(u, "default_query_exec_mode=cache_describe"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPgBouncerStatementCacheFails shows why a pool behind PgBouncer in transaction pooling mode (1.18, Debian's)
// needs default_query_exec_mode=cache_describe or exec: with pgx's default statement cache, concurrent statements
// find their prepared statements on other server connections.
func TestPgBouncerStatementCacheFails(t *testing.T) {
	_, schema := pgtest.Migrated(t)
	b := pgBouncer(t, "")
	ctx := ctxT(t, time.Minute)
	run := func(params ...string) (failed int, first error) {
		pool, err := pgxpool.New(ctx, withParams(b.URL(), params...))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		errs := make(chan error, 40)
		for i := range 40 {
			go func() {
				_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: uuid.NewString(), StreamType: "x",
					Expected: eventstore.AnyVersion, Events: []eventstore.EventData{{EventID: uuid.New(),
						Type: "t", Payload: []byte(`{}`)}}})
				if err == nil && i%2 == 0 {
					_, err = store.ReadStream(ctx, "", "none", 1)
					if errors.Is(err, eventstore.ErrStreamNotFound) {
						err = nil
					}
				}
				errs <- err
			}()
		}
		for range 40 {
			if err := <-errs; err != nil {
				failed++
				if first == nil {
					first = err
				}
			}
		}
		return failed, first
	}
	if n, err := run("default_query_exec_mode=cache_describe"); n != 0 {
		t.Fatalf("with cache_describe, %d appends failed: %v", n, err)
	}
	if n, err := run("pool_max_conns=8"); n == 0 {
		t.Log("with the statement cache, no append failed this time (the pooler happened to keep each client " +
			"on one server connection)")
	} else {
		t.Logf("with the statement cache, %d of 40 failed, e.g. %v", n, err)
	}
}

// TestPgBouncerRefusesListen checks a relay and a projection refuse, at their start, to listen for wake-ups
// through PgBouncer in transaction pooling mode (the notifications never arrive) with stagehand.ErrPooledConnection
// naming the setting that turns listening off; that with it turned off they run; and that in session pooling mode
// (where LISTEN works) nothing is refused.
func TestPgBouncerRefusesListen(t *testing.T) {
	direct, schema := pgtest.Migrated(t)
	tx := pgBouncer(t, "")
	ctx := ctxT(t, time.Minute)

	relaySubscribe := func(pool *pgxpool.Pool, disable bool) error {
		ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		relay, err := ob.NewRelay(&outbox.RelayConfig{DisableNotify: disable})
		if err != nil {
			t.Fatal(err)
		}
		defer relay.Close()
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err = relay.Subscribe(sctx, "t")
		return err
	}
	projectionRun := func(pool *pgxpool.Pool, disable bool) error {
		store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		p, err := projection.New(pool, store, projection.HandlerFunc(func(context.Context, pgx.Tx,
			projection.Event) error {
			return nil
		}), &projection.Config{Name: "pgbouncer-" + uuid.NewString()[:8], Schema: schema, DisableListen: disable})
		if err != nil {
			t.Fatal(err)
		}
		run := 2 * time.Second // with listening off, it runs until stopped
		if !disable {
			run = 3 * pgnotify.ProbeTimeout // long enough for the probe, on a loaded machine
		}
		rctx, cancel := context.WithTimeout(ctx, run)
		defer cancel()
		err = p.Run(rctx)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return nil // it ran until stopped
		}
		return err
	}

	pooled := pooledPool(t, tx.URL())
	err := relaySubscribe(pooled, false)
	if !errors.Is(err, stagehand.ErrPooledConnection) || !strings.Contains(err.Error(), "DisableNotify") {
		t.Fatalf("relay through transaction pooling: %v; want ErrPooledConnection naming DisableNotify", err)
	}
	t.Logf("relay refused: %v", err)
	if err := relaySubscribe(pooled, true); err != nil {
		t.Fatalf("relay through transaction pooling, DisableNotify: %v", err)
	}
	err = projectionRun(pooled, false)
	if !errors.Is(err, stagehand.ErrPooledConnection) || !strings.Contains(err.Error(), "DisableListen") {
		t.Fatalf("projection through transaction pooling: %v; want ErrPooledConnection naming DisableListen", err)
	}
	t.Logf("projection refused: %v", err)
	if err := projectionRun(pooled, true); err != nil {
		t.Fatalf("projection through transaction pooling, DisableListen: %v", err)
	}

	session := pooledPool(t, pgBouncer(t, "session").URL())
	if err := relaySubscribe(session, false); err != nil {
		t.Fatalf("relay through session pooling: %v", err)
	}
	if err := relaySubscribe(direct, false); err != nil {
		t.Fatalf("relay on a direct pool: %v", err)
	}
}

// TestPgBouncerLostCommitInFlightIsNeverAFailure cuts the connection of an AppendWith through PgBouncer while its
// COMMIT runs on the server (a deferred trigger makes the commit take a second), so the commit completes after the
// client lost it. The store resolves a lost commit by waiting for the transaction's server process to end, but
// through a pooler the process ID the connection was started with is PgBouncer's own: it must not take that
// process's absence for the end of the transaction and report a failure for an append that then commits.
func TestPgBouncerLostCommitInFlightIsNeverAFailure(t *testing.T) {
	admin, schema := pgtest.Migrated(t)
	events := pgtest.Q(schema, "events")
	pgtest.Exec(t, admin, `CREATE FUNCTION `+pgtest.Q(schema, "slow_commit")+`() RETURNS trigger LANGUAGE plpgsql
		AS $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$`)
	pgtest.Exec(t, admin, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON `+events+`
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.stream_id LIKE 'slow-%')
		EXECUTE FUNCTION `+pgtest.Q(schema, "slow_commit")+`()`)
	b := pgBouncer(t, "")
	addr, err := histories.ServerAddr(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := histories.NewProxy(addr, histories.ProxyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	through, err := histories.Through(b.URL(), proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.NewPostgres(pooledPool(t, through), &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	ctx := ctxT(t, time.Minute)
	for i := range 3 {
		stream := "slow-" + uuid.NewString()
		req := eventstore.AppendRequest{StreamID: stream, StreamType: "x", Expected: eventstore.NoStream,
			Events: []eventstore.EventData{{EventID: uuid.New(), Type: "t", Payload: []byte(`{}`)}}}
		go func() {
			// Cut once the COMMIT sleeps in the trigger, on the server.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				var n int
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
					AND query ILIKE 'commit%'`).Scan(&n); err == nil && n > 0 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			proxy.CutAll()
		}()
		_, err := store.AppendWith(ctx, req, nil)
		pgtest.Eventually(t, 10*time.Second, func() bool {
			return pgtest.Count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`) == 0
		}, "the commit is still sleeping")
		stored := pgtest.Count(t, admin, `SELECT count(*) FROM `+events+` WHERE stream_id = $1`, stream)
		t.Logf("attempt %d: append error %v; %d events stored", i, err, stored)
		if err != nil && !errors.Is(err, eventstore.ErrCommitUnknown) && stored > 0 {
			t.Fatalf("the append was reported failed (%v) and its events are stored", err)
		}
		if err == nil && stored == 0 {
			t.Fatal("the append was reported committed and nothing is stored")
		}
	}
}

// TestStreamsThroughPgBouncerUnderNetworkFaults is TestStreamsUnderNetworkFaults with PgBouncer in transaction
// pooling mode between the fault proxy and PostgreSQL (pools with default_query_exec_mode=cache_describe).
func TestStreamsThroughPgBouncerUnderNetworkFaults(t *testing.T) {
	pgtest.CheckLeaks(t)
	admin, schema := pgtest.Migrated(t)
	b := pgBouncer(t, "")
	seed := runSeed(t)
	cfg := histories.StreamRunConfig{Seed: seed, Schema: schema, Admin: admin, Duration: 4 * time.Second,
		DatabaseURL: withParams(b.URL(), "default_query_exec_mode=cache_describe"), Logger: verboseLogger()}
	if os.Getenv(envSize) == "full" {
		cfg.Clients, cfg.Streams, cfg.Duration = 10, 5, 3*time.Minute
	}
	checkStreamRun(t, cfg)
}

// TestPipelineThroughPgBouncerUnderNetworkFaults is TestPipelineUnderNetworkFaults with PgBouncer in transaction
// pooling mode between the fault proxy and PostgreSQL: the relay and the projection poll (PollOnly), since they
// would refuse to listen through it.
//
// PgBouncer 1.18 exits when the nemesis terminates a server connection it is cancelling (a PgBouncer bug); the
// harness starts it again, as a service manager would, and the run goes on (proof/histories/README.md).
func TestPipelineThroughPgBouncerUnderNetworkFaults(t *testing.T) {
	pgtest.CheckLeaks(t)
	admin, schema := pgtest.Migrated(t)
	b := pgBouncer(t, "")
	seed := runSeed(t)
	cfg := histories.PipelineRunConfig{Seed: seed, Schema: schema, Admin: admin, Duration: 4 * time.Second,
		DatabaseURL: withParams(b.URL(), "default_query_exec_mode=cache_describe"), PollOnly: true,
		Logger: verboseLogger()}
	if os.Getenv(envSize) == "full" {
		cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 6, 24, 4, 3*time.Minute
		cfg.SaveEvery = fullSaveEvery
	}
	checkPipelineRun(t, cfg)
}

// TestPipelineThroughPgBouncerWithWorkerKills is TestPipelineThroughPgBouncerUnderNetworkFaults with the relay and
// the handlers in a worker process, reaching PgBouncer through the fault proxy too, that the nemesis kills with
// SIGKILL mid-work and replaces (as in TestCrashesUnderNetworkFaults): PgBouncer, not the server, sees the killed
// worker's connections end, and must roll back and release the server connections they held mid-transaction.
func TestPipelineThroughPgBouncerWithWorkerKills(t *testing.T) {
	pgtest.CheckLeaks(t)
	admin, schema := pgtest.Migrated(t)
	b := pgBouncer(t, "")
	seed := runSeed(t)
	// Two producers: every message goes through the one worker process.
	cfg := histories.PipelineRunConfig{Seed: seed, Schema: schema, Admin: admin, Producers: 2, Keys: 4,
		Duration: 4 * time.Second, DatabaseURL: withParams(b.URL(), "default_query_exec_mode=cache_describe"),
		PollOnly: true, WorkerCommand: []string{os.Args[0], "-test.run=^$"}, Logger: verboseLogger()}
	if os.Getenv(envSize) == "full" {
		cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 3, 12, 4, 3*time.Minute
		cfg.DrainTimeout, cfg.SaveEvery = 4*time.Minute, 40*time.Millisecond
	}
	run := checkPipelineRun(t, cfg)
	checkWorkerKills(t, seed, run)
}
