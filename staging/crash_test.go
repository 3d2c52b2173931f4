package staging

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// The crash tests re-execute the test binary as a child that saves orders and kills itself with SIGKILL at a named
// point of its N-th save (or of the Deferred stager's N-th batch). The parent then runs the reconciler or the
// stager and checks that every committed event's messages are staged exactly once, and none of an event that did
// not commit.

const (
	envCrashStrategy = "STAGING_CRASH_STRATEGY"
	envCrashPoint    = "STAGING_CRASH_POINT"
	crashOnSave      = 4 // the save (or the Deferred stager's batch) during which the child dies
	childSaves       = 8
)

func killSelf(point, at string, n *int) func(string) {
	return func(p string) {
		if p != point {
			return
		}
		*n++
		if *n == crashOnSave {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Minute) // never returns
		}
	}
}

// TestCrashChild is the child process; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	strategyText, point := os.Getenv(envCrashStrategy), os.Getenv(envCrashPoint)
	if strategyText == "" {
		return // not a child: nothing to do (the parents are the tests below)
	}
	strategy, err := ParseStrategy(strategyText)
	require.NoError(t, err)
	pool := pgtest.Pool(t)
	e := setupOn(t, pool, pgtest.HelperSchema())
	ctx := context.Background()
	var n int
	hook := killSelf(point, "", &n)
	if strategy == Deferred {
		r, _ := e.repo(e.store, &Config{Strategy: Deferred})
		for i := range childSaves {
			_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(int64(i)); return nil })
			require.NoError(t, err)
		}
		w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 4, LeaseTTL: time.Second})
		require.NoError(t, err)
		w.hook = hook
		_ = w.Run(ctx) // killed inside
		t.Fatal("the stager should have been killed")
	}
	r, _ := e.repo(e.store, &Config{Strategy: strategy, Outbox: e.outbox, hook: hook})
	for i := range childSaves {
		_, err := r.Create(ctx, orderID(i), func(o *Order) error { o.Place(int64(i)); return nil })
		require.NoError(t, err)
	}
	t.Fatal("the child should have been killed")
}

func runCrashChild(t *testing.T, e *env, strategy Strategy, point string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgtest.HelperEnv(t, e.schema)...)
	cmd.Env = append(cmd.Env, envCrashStrategy+"="+strategy.String(), envCrashPoint+"="+point)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output:\n%s", out)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child must die by SIGKILL at %s, got %v:\n%s", point, err, out)
}

var crashCases = []struct {
	strategy Strategy
	points   []string
}{
	// With the append and its staging statements queued and nothing sent yet; and after the commit, before the
	// save returns. (TestTransactionalCrashWithTheSaveInFlight kills a child while its batch runs.)
	{Transactional, []string{"staging", "staged"}},
	// After the append's commit and before staging; in the middle of staging; between staging and its commit.
	{EventuallyConsistent, []string{"appended", "staging", "staged"}},
	// The Deferred stager in the middle of staging a batch, and between staging and the checkpoint's commit.
	{Deferred, []string{"staging", "staged"}},
}

func TestCrashAtEveryPointStagesEachCommittedEventOnce(t *testing.T) {
	t.Parallel()
	for _, c := range crashCases {
		for _, point := range c.points {
			t.Run(c.strategy.String()+"/"+point, func(t *testing.T) {
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
				if c.strategy == Transactional {
					recs := readStream(t, e, orderID(crashOnSave-1))
					if point == "staging" {
						require.Empty(t, recs, "the save killed before sending anything committed nothing")
					} else {
						require.Len(t, recs, 2, "the save killed after its commit is stored whole")
					}
				}
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
		t.Run(c.strategy.String()+"/"+point, func(t *testing.T) {
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
			fmt.Fprintf(os.Stderr, "%s/%s: %d messages published once each\n", c.strategy, point, len(expected))
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
	victim := orderID(crashOnSave - 1)
	fn := pgtest.Q(e.schema, "sleep_at_commit")
	pgtest.Exec(t, e.pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$`)
	pgtest.Exec(t, e.pool, `CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON `+pgtest.Q(e.schema, "outbox")+`
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.partition_key = '`+victim+`')
		EXECUTE FUNCTION `+fn+`()`)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgtest.HelperEnv(t, e.schema)...)
	cmd.Env = append(cmd.Env, envCrashStrategy+"="+Transactional.String(), envCrashPoint+"=none")
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
