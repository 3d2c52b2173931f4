package projection_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// The tests in this file re-execute the test binary as child processes that run the projection, so they can be
// killed with SIGKILL like a crashed production process.

const helperEnv = "STAGEHAND_PROJECTION_HELPER"

// helperMain runs the "accounts" projection in a child process until SIGTERM. Settings come from the
// environment: HELPER_OWNER, HELPER_BATCH, HELPER_PAGES (PagesPerTx), HELPER_TTL and HELPER_RENEW (lease), HELPER_SLOW (a pause per event),
// HELPER_BLOCK_AT (after applying that position, print "BLOCKED" and wait inside the open transaction until the
// file HELPER_UNBLOCK exists, or forever).
func helperMain(string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(pgtest.EnvURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	schema := pgtest.HelperSchema()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	owner := os.Getenv("HELPER_OWNER")
	m := &model{schema: schema, prefix: "rm", by: owner, reg: registry()}
	blockAt, _ := strconv.ParseInt(os.Getenv("HELPER_BLOCK_AT"), 10, 64)
	slow, _ := time.ParseDuration(os.Getenv("HELPER_SLOW"))
	m.hook = func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		time.Sleep(slow)
		if e.Position != blockAt {
			return nil
		}
		fmt.Println("BLOCKED")
		for {
			if f := os.Getenv("HELPER_UNBLOCK"); f != "" {
				if _, err := os.Stat(f); err == nil {
					return nil // carry on as if nothing happened: a zombie
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	envInt := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	envDur := func(k string) time.Duration { d, _ := time.ParseDuration(os.Getenv(k)); return d }
	p, err := projection.New(pool, store, m.mux(), &projection.Config{Name: "accounts", Schema: schema,
		Owner: owner, BatchSize: envInt("HELPER_BATCH"), PagesPerTx: envInt("HELPER_PAGES"), LeaseTTL: envDur("HELPER_TTL"),
		LeaseRenewInterval: envDur("HELPER_RENEW"), LeaseAcquireInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type child struct {
	cmd    *exec.Cmd
	lines  chan string
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
}

func (c *child) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(b)
}

func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// spawn starts a child process running the projection with the given HELPER_* settings.
func spawn(t *testing.T, w world, env map[string]string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), pgtest.HelperEnv(t, w.schema)...), helperEnv+"=run")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	c := &child{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	cmd.Stderr = c
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("child %s stderr:\n%s", env["HELPER_OWNER"], c.log())
		}
	})
	return c
}

func (c *child) waitLine(t *testing.T, want string) {
	t.Helper()
	select {
	case line := <-c.lines:
		require.Equal(t, want, line)
	case <-c.done:
		t.Fatalf("child exited before printing %q:\n%s", want, c.log())
	case <-time.After(20 * time.Second):
		t.Fatalf("child did not print %q", want)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func TestCrashBetweenHandlerAndCommit(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 10, 29) // 300 events
	positions := w.logPositions(t)

	// The crash-free read model, built beside it.
	ref := w.model("ref")
	rp := w.newProjection(t, ref.mux(), projection.Config{Name: "reference"})
	stop := start(t, rp)
	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, rp), "reference")
	require.NoError(t, stop())

	// A child applies batches of 50 (one per transaction) and is killed inside the third, after the handler's
	// writes and before the commit.
	c := spawn(t, w, map[string]string{"HELPER_OWNER": "child", "HELPER_BATCH": "50", "HELPER_PAGES": "1",
		"HELPER_BLOCK_AT": "150", "HELPER_TTL": "500ms"})
	c.waitLine(t, "BLOCKED")
	require.Equal(t, int64(100), w.count(t, `SELECT position FROM `+pgtest.Q(w.schema, "checkpoints")+
		` WHERE name = 'accounts'`))
	c.kill()

	// More crashes at random moments, while a slow handler works through the log (several pages per
	// transaction).
	for i := range 3 {
		c := spawn(t, w, map[string]string{"HELPER_OWNER": fmt.Sprint("random", i), "HELPER_BATCH": "20",
			"HELPER_SLOW": "1ms", "HELPER_TTL": "300ms"})
		time.Sleep(time.Duration(400+rand.IntN(300)) * time.Millisecond)
		c.kill()
	}

	m := w.model("rm")
	p := w.newProjection(t, m.mux(), projection.Config{})
	start(t, p)
	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, p), "recovery after the crashes")
	require.Equal(t, w.snapshot(t, "ref"), w.snapshot(t, "rm"), "the read model equals the crash-free one")
	w.requireOnce(t, "rm", positions)
}

func TestTwoProcessesOnlyOneApplies(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 10, 9) // 100 events
	env := func(owner string) map[string]string {
		return map[string]string{"HELPER_OWNER": owner, "HELPER_BATCH": "10", "HELPER_TTL": "1s",
			"HELPER_RENEW": "200ms", "HELPER_SLOW": "1ms"}
	}
	children := map[string]*child{"A": spawn(t, w, env("A")), "B": spawn(t, w, env("B"))}
	pgtest.Eventually(t, 20*time.Second, func() bool { return w.applied(t, "rm") == 100 }, "first 100")
	byOwner := func() map[string]int64 {
		rows, err := w.pool.Query(context.Background(), `SELECT by, count(*) FROM `+
			pgtest.Q(w.schema, "rm_applied")+` GROUP BY by`)
		require.NoError(t, err)
		out := map[string]int64{}
		for rows.Next() {
			var by string
			var n int64
			require.NoError(t, rows.Scan(&by, &n))
			out[by] = n
		}
		return out
	}
	counts := byOwner()
	require.Len(t, counts, 1, "only one process applies events: %v", counts)
	var holder, standby string
	for owner := range counts {
		holder = owner
	}
	standby = map[string]string{"A": "B", "B": "A"}[holder]

	children[holder].kill() // SIGKILL: no release; the standby takes over once the lease expires
	for i := range 10 {
		w.appendEvents(t, w.store, fmt.Sprintf("a%d", i), eventstore.AnyVersion, Deposited{Amount: 100})
	}
	pgtest.Eventually(t, 20*time.Second, func() bool { return w.applied(t, "rm") == 110 }, "takeover")
	counts = byOwner()
	require.Equal(t, map[string]int64{holder: 100, standby: 10}, counts)
	w.requireOnce(t, "rm", w.logPositions(t))
}

func TestZombieProcessCannotCommitAfterATakeover(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 2, 9) // 20 events
	unblock := filepath.Join(t.TempDir(), "unblock")
	// The zombie commits 1..10, then stops inside the batch 11..20 with its writes made. Its renewal is slow
	// enough that only the fence can stop it.
	z := spawn(t, w, map[string]string{"HELPER_OWNER": "zombie", "HELPER_BATCH": "10", "HELPER_PAGES": "1",
		"HELPER_BLOCK_AT": "15",
		"HELPER_UNBLOCK":  unblock, "HELPER_TTL": "60s", "HELPER_RENEW": "30s"})
	z.waitLine(t, "BLOCKED")
	require.Equal(t, int64(10), w.applied(t, "rm"))

	// Its lease runs out (as if the process had frozen past its TTL) and this process takes over. The
	// successor's first batch waits on the row locks the zombie's open transaction holds.
	pgtest.Exec(t, w.pool, `UPDATE `+pgtest.Q(w.schema, "leases")+` SET expires_at = now()`)
	m := w.model("rm")
	m.by = "successor"
	p := w.newProjection(t, m.mux(), projection.Config{Owner: "successor"})
	start(t, p)
	pgtest.Eventually(t, 20*time.Second, func() bool { return status(t, p).Owner == "successor" }, "takeover")

	// The zombie wakes up and tries to commit its batch: fenced out, rolled back, and the successor goes on.
	require.NoError(t, os.WriteFile(unblock, nil, 0o600))
	pgtest.Eventually(t, 20*time.Second, func() bool { return strings.Contains(z.log(), "fenced out") },
		"the zombie's commit was not rejected by the fence")
	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, p), "successor caught up")
	w.requireOnce(t, "rm", w.logPositions(t))
	require.Equal(t, int64(10), w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "rm_applied")+
		` WHERE by = 'successor'`))
	require.Equal(t, int64(20), status(t, p).Position)
}

func TestRecoversFromADatabaseRestart(t *testing.T) {
	t.Parallel()
	srv, err := pgtest.Start(context.Background(), pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	pool, schema := pgtest.MigratedOn(t, srv.URL())
	w := worldOn(t, pool, schema)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{PollInterval: time.Hour,
		LeaseTTL: 2 * time.Second})
	start(t, p)
	w.seed(t, w.store, 2, 2)
	pgtest.Eventually(t, 10*time.Second, func() bool { return w.applied(t, "rm") == 6 }, "before the restart")

	require.NoError(t, srv.Restart(context.Background()))
	// With an hour-long poll, only a reconnected listener (or its catch-up read) can deliver in time.
	pgtest.Eventually(t, 10*time.Second, func() bool {
		_, err := w.store.Append(context.Background(), w.request(t, "a0", 3, Deposited{Amount: 5}))
		return err == nil
	}, "append after the restart")
	pgtest.Eventually(t, 15*time.Second, func() bool { return w.applied(t, "rm") == 7 }, "after the restart")
	w.requireOnce(t, "rm", w.logPositions(t))
}
