package staging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// The crash tests re-execute the test binary as a child that saves orders (and, for Deferred, then runs the
// stager), and kill it with SIGKILL at a point of its work that the parent sees in the database: a statement of
// the child waiting for a row lock the parent holds, or sleeping in a trigger the parent installed. The parent then
// runs the reconciler or the stager and checks that every committed event's messages are staged exactly once, and
// none of an event that did not commit. No production code knows about the points.

const (
	envCrashStrategy = "STAGING_CRASH_STRATEGY"
	// childSaves is how many saves a Deferred child makes before its stager runs.
	childSaves = 8
	// maxChildSaves bounds the saves of the other children, which save until they are killed: under
	// EventuallyConsistent the parent's reconciler may stage a save's messages before the child does (the child
	// then inserts none of them), so on a loaded machine a fixed few saves could end before the child's own
	// inserts reach the crash point (a CI run: 8 saves, the child never stopped).
	maxChildSaves = 500
	// crashAfterRows is how many outbox rows a child inserts before it stops at a point in staging: three saves'
	// messages (each save raises two events that map to three messages).
	crashAfterRows = 9
)

// TestCrashChild is the child process; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	strategyText := os.Getenv(envCrashStrategy)
	if strategyText == "" {
		return // not a child: nothing to do (the parents are the tests below)
	}
	strategy, err := ParseStrategy(strategyText)
	require.NoError(t, err)
	// The child's sessions carry its schema as their application name, for the parent to find them.
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = pgtest.HelperSchema()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := setupOn(t, pool, pgtest.HelperSchema())
	ctx := context.Background()
	if strategy == Deferred {
		r, _ := e.repo(e.store, &Config{Strategy: Deferred})
		for i := range childSaves {
			_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(int64(i)); return nil })
			require.NoError(t, err)
		}
		w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 4, LeaseTTL: time.Second})
		require.NoError(t, err)
		_ = w.Run(ctx) // killed inside
		t.Fatal("the stager should have been killed")
	}
	r, _ := e.repo(e.store, &Config{Strategy: strategy, Outbox: e.outbox})
	for i := range maxChildSaves {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(int64(i)); return nil })
		require.NoError(t, err)
	}
	t.Fatal("the child should have been killed")
}

// crashPoint is where a child is killed: set up makes the child stop there (and returns what undoes it, if
// anything, once the child is dead), and the child is there when one of its sessions waits as waiting says
// (wait_event_type:wait_event).
type crashPoint struct {
	name    string
	waiting string
	setUp   func(t *testing.T, e *env) (undo func())
}

// sleepIn makes the child's statements that insert into the schema's outbox sleep, per row (before the insert) or
// at their commit (a deferred trigger), from the child's crashAfterRows+1-th row on, so the child has committed
// some work before it stops. The parent's own statements (a reconciler's, say) go on.
func sleepIn(atCommit bool) func(t *testing.T, e *env) func() {
	return func(t *testing.T, e *env) func() {
		fn, rows := pgtest.Q(e.schema, "crash_sleep"), pgtest.Q(e.schema, "crash_rows")
		pgtest.Exec(t, e.pool, `CREATE SEQUENCE `+rows)
		pgtest.Exec(t, e.pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF current_setting('application_name') = '`+e.schema+`' THEN
					IF nextval('`+rows+`') > `+strconv.Itoa(crashAfterRows)+` THEN PERFORM pg_sleep(30); END IF;
				END IF;
				RETURN NEW;
			END $$`)
		trigger := `CREATE TRIGGER crash_sleep BEFORE INSERT ON ` + pgtest.Q(e.schema, "outbox") +
			` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`
		if atCommit {
			trigger = `CREATE CONSTRAINT TRIGGER crash_sleep AFTER INSERT ON ` + pgtest.Q(e.schema, "outbox") +
				` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`
		}
		pgtest.Exec(t, e.pool, trigger)
		return func() { pgtest.Exec(t, e.pool, `DROP TRIGGER crash_sleep ON `+pgtest.Q(e.schema, "outbox")) }
	}
}

// holdWatermark makes the save path of EventuallyConsistent wait right after its append committed: its staging
// transaction first locks the reconciler's watermark (FOR SHARE), which the parent holds FOR UPDATE.
func holdWatermark(t *testing.T, e *env) func() {
	ctx := context.Background()
	require.NoError(t, e.outbox.RegisterWatermarkTx(ctx, e.pool, "reconciler:default", 0))
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgtest.Q(e.schema, "outbox_watermarks")+
		` WHERE name = 'reconciler:default' FOR UPDATE`)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

var crashCases = []struct {
	strategy Strategy
	points   []crashPoint
}{
	// Inside the one round trip of a save: the server runs the batch's commit (TestTransactionalCrashWithTheSaveInFlight
	// also checks that the save is stored whole or not at all).
	{Transactional, []crashPoint{{"committing", "Timeout:PgSleep", sleepIn(true)}}},
	// After the append's commit, before staging; in the middle of staging; at staging's commit.
	{EventuallyConsistent, []crashPoint{{"appended", "Lock:transactionid", holdWatermark},
		{"staging", "Timeout:PgSleep", sleepIn(false)}, {"staged", "Timeout:PgSleep", sleepIn(true)}}},
	// The Deferred stager in the middle of staging a batch, and at the commit of the batch with its checkpoint.
	{Deferred, []crashPoint{{"staging", "Timeout:PgSleep", sleepIn(false)},
		{"staged", "Timeout:PgSleep", sleepIn(true)}}},
}

// runCrashChild runs a child until it reaches point, kills it there (SIGKILL), ends its server sessions and waits
// until they are gone; then the point is undone.
func runCrashChild(t *testing.T, e *env, strategy Strategy, point crashPoint) {
	t.Helper()
	ctx := context.Background()
	undo := point.setUp(t, e)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgtest.HelperEnv(t, e.schema)...)
	cmd.Env = append(cmd.Env, envCrashStrategy+"="+strategy.String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kind, event, _ := strings.Cut(point.waiting, ":")
	var pid int32
	pgtest.Eventually(t, 60*time.Second, func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the child ended (%v) before reaching %s:\n%s", err, point.name, out.String())
		default:
		}
		return e.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $3
			AND wait_event_type = $1 AND wait_event = $2 LIMIT 1`, kind, event, e.schema).Scan(&pid) == nil
	}, "the child never reached %s", point.name)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := <-exited
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output:\n%s", out.String())
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child must die by SIGKILL at %s, got %v:\n%s", point.name, err, out.String())
	// The killed child's sessions end when the server notices; a sleeping one would sleep on, holding its locks
	// (and a DROP TRIGGER of the undo would queue every other statement on the outbox behind them).
	pgtest.Exec(t, e.pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`,
		e.schema)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		return pgtest.Count(t, e.pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`,
			e.schema) == 0
	}, "the child's server processes did not end")
	if undo != nil {
		undo()
	}
}

func TestCrashAtEveryPointStagesEachCommittedEventOnce(t *testing.T) {
	t.Parallel()
	for _, c := range crashCases {
		for _, point := range c.points {
			t.Run(c.strategy.String()+"/"+point.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				runCrashChild(t, e, c.strategy, point)
				switch c.strategy {
				case EventuallyConsistent:
					w, err := NewReconciler(e.store, e.outbox, e.m, nil)
					require.NoError(t, err)
					runUntilCaughtUp(t, w, e.store)
				case Deferred:
					// The killed stager's lease must lapse (1s TTL) before the restarted one takes over.
					w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 4})
					require.NoError(t, err)
					runUntilCaughtUp(t, w, e.store)
				}
				e.requireExactlyOnce(e.store)
			})
		}
	}
}

func readStream(t *testing.T, e *env, id string) []string {
	t.Helper()
	recs, err := e.store.ReadStream(context.Background(), "", id, 0)
	if err != nil {
		return nil
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Type)
	}
	return out
}

// broker records every publication it receives.
type broker struct {
	mu    sync.Mutex
	seen  map[string]int
	total int
}

func (b *broker) Publish(_ string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		b.seen[m.UUID]++
		b.total++
	}
	return nil
}

func (b *broker) Close() error { return nil }

func (b *broker) counts() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.seen))
	for k, v := range b.seen {
		out[k] = v
	}
	return out
}

// With the relay draining and cleanup removing sent messages as fast as it can throughout, a crash at any point
// still yields exactly one publication per committed event's message: re-staging by the reconciler or the stager
// after cleanup publishes nothing again, because cleanup keeps what a worker could still re-stage.
func TestCrashWithRelayAndCleanupPublishesEachMessageOnce(t *testing.T) {
	t.Parallel()
	for _, c := range crashCases {
		point := c.points[len(c.points)/2]
		t.Run(c.strategy.String()+"/"+point.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := &broker{seen: map[string]int{}}
			relay, err := e.outbox.NewRelay(&outbox.RelayConfig{BatchSize: 10, PollingInterval: 20 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { _ = relay.Close() })
			var wg sync.WaitGroup
			background := func(fn func()) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						fn()
						time.Sleep(10 * time.Millisecond)
					}
				}()
			}
			background(func() {
				if _, err := relay.Drain(ctx, b); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("drain: %v", err)
				}
			})
			background(func() {
				if _, err := e.outbox.AllTenants().CleanupSent(ctx, 0, 100); err != nil &&
					!errors.Is(err, context.Canceled) {
					t.Errorf("cleanup: %v", err)
				}
			})

			// Under EventuallyConsistent the reconciler runs throughout, racing the save path's own staging.
			var reconciler *Worker
			if c.strategy == EventuallyConsistent {
				reconciler, err = NewReconciler(e.store, e.outbox, e.m, &WorkerConfig{PollInterval: 20 * time.Millisecond})
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := reconciler.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
						t.Errorf("reconciler: %v", err)
					}
				}()
				// Saves begin once the reconciler's watermark is registered: until then cleanup keeps no ledger
				// entry, and the reconciler, starting from the beginning of the log, would stage again a message
				// whose entry cleanup had just removed.
				pgtest.Eventually(t, 10*time.Second, func() bool {
					wms, err := e.outbox.Watermarks(context.Background())
					return err == nil && len(wms) > 0
				}, "the reconciler did not register its watermark")
			}
			runCrashChild(t, e, c.strategy, point)
			switch c.strategy {
			case EventuallyConsistent:
				head, err := e.store.HeadPosition(context.Background())
				require.NoError(t, err)
				pgtest.Eventually(t, 30*time.Second, func() bool {
					lag, err := reconciler.Lag(context.Background())
					return err == nil && lag.Position >= head
				}, "the reconciler did not catch up")
			case Deferred:
				w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 4})
				require.NoError(t, err)
				runUntilCaughtUp(t, w, e.store)
			}
			expected := e.expectedIDs(e.store)
			pgtest.Eventually(t, 30*time.Second, func() bool {
				got := b.counts()
				for id := range expected {
					if got[id] == 0 {
						return false
					}
				}
				return true
			}, "not every committed event's message reached the broker")
			time.Sleep(200 * time.Millisecond) // a late duplicate would arrive now
			cancel()
			wg.Wait()
			for id, n := range b.counts() {
				require.True(t, expected[id], "published a message of an event that never committed: %s", id)
				require.Equal(t, 1, n, "message %s published %d times", id, n)
			}
			require.Equal(t, len(expected), len(b.counts()))
			fmt.Fprintf(os.Stderr, "%s/%s: %d messages published once each\n", c.strategy, point.name, len(expected))
		})
	}
}

// A Transactional save is one batch: its append, its staging statements and its commit are on the wire together.
// A child is killed (SIGKILL) while the server runs that batch's commit (a deferred trigger on the outbox makes the
// commit of one save take a while): the server finishes or abandons the transaction whole, so the save is stored
// with every message of its events staged once, or not at all; either way nothing is half-written.
func TestTransactionalCrashWithTheSaveInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	victim := orderID(3) // the fourth save
	fn := pgtest.Q(e.schema, "sleep_at_commit")
	pgtest.Exec(t, e.pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$`)
	pgtest.Exec(t, e.pool, `CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON `+pgtest.Q(e.schema, "outbox")+`
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.partition_key = '`+victim+`')
		EXECUTE FUNCTION `+fn+`()`)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgtest.HelperEnv(t, e.schema)...)
	cmd.Env = append(cmd.Env, envCrashStrategy+"="+Transactional.String())
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The victim's commit is running when a backend sleeps in the trigger of this schema's outbox.
	var pid int32
	pgtest.Eventually(t, 30*time.Second, func() bool {
		err := e.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'
			AND backend_type = 'client backend' AND position($1 in query) > 0 LIMIT 1`, e.schema).Scan(&pid)
		return err == nil
	}, "the victim's commit never started")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := <-exited
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL, "the child must die by SIGKILL")
	pgtest.Eventually(t, 30*time.Second, func() bool {
		return pgtest.Count(t, e.pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
	}, "the victim's server process did not end")

	recs := readStream(t, e, victim)
	require.True(t, len(recs) == 0 || len(recs) == 2, "the save killed in flight is stored whole or not at all: %v",
		recs)
	t.Logf("the save killed in flight: %d events stored", len(recs))
	e.requireExactlyOnce(e.store)
}
