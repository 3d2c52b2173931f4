package projection_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

func TestCatchUpLiveTailFiltersAndTypedDecoding(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 3, 4)
	// Events of another stream type are filtered out (they would not even decode).
	_, err := w.store.Append(context.Background(), eventstore.AppendRequest{StreamID: "x", StreamType: "other",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "unknown", Payload: []byte(`{}`)}}})
	require.NoError(t, err)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{StreamTypes: []string{"account"},
		BatchSize: 4})
	start(t, p)
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "catch-up")
	require.Equal(t, "__untenanted__ a0 owner-a0 10 5 5\n__untenanted__ a1 owner-a1 10 5 5\n"+
		"__untenanted__ a2 owner-a2 10 5 5\n", w.snapshot(t, "rm"))

	w.appendEvents(t, w.store, "a1", 5, Withdrawn{Amount: 7})
	pgtest.Eventually(t, 10*time.Second, func() bool { return w.applied(t, "rm") == 16 }, "live tail")
	require.Contains(t, w.snapshot(t, "rm"), "a1 owner-a1 3 6 6")
}

func TestRebuildProducesTheIncrementalReadModel(t *testing.T) {
	t.Parallel()
	w := setup(t)
	m := w.model("rm")
	p := w.newProjection(t, m.mux(), projection.Config{BatchSize: 7, PollInterval: 20 * time.Millisecond})
	start(t, p)
	// Built incrementally: events arrive in rounds while the projection runs.
	for round := range 5 {
		w.open(t, w.store, fmt.Sprintf("a%d", round))
		for i := range 4 {
			w.appendEvents(t, w.store, fmt.Sprintf("a%d", rand.IntN(round+1)), eventstore.AnyVersion,
				Deposited{Amount: int64(round*10 + i)})
		}
		pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "round %d", round)
	}
	incremental := w.snapshot(t, "rm")
	require.Contains(t, incremental, "a4 owner-a4")
	// Damage the read model: only a real rebuild (reset + replay) restores it.
	pgtest.Exec(t, w.pool, `UPDATE `+pgtest.Q(w.schema, "rm_accounts")+` SET balance = -1`)

	require.NoError(t, p.Rebuild(context.Background()))
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "rebuild")
	require.Equal(t, incremental, w.snapshot(t, "rm"), "the rebuilt read model equals the incremental one")
	w.requireOnce(t, "rm", w.logPositions(t))
}

// TestRequestRebuildFromAnotherProcess is the CLI's path: a request recorded in the database is performed by the
// process running the projection; a name that has no checkpoint is refused and records nothing.
func TestRequestRebuildFromAnotherProcess(t *testing.T) {
	t.Parallel()
	w := setup(t)
	m := w.model("rm")
	p := w.newProjection(t, m.mux(), projection.Config{PollInterval: 20 * time.Millisecond})
	start(t, p)
	w.seed(t, w.store, 3, 4)
	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, p), "catch-up: %+v", status(t, p))
	built := w.snapshot(t, "rm")
	pgtest.Exec(t, w.pool, `UPDATE `+pgtest.Q(w.schema, "rm_accounts")+` SET balance = -1`)

	err := projection.RequestRebuild(context.Background(), w.pool, w.schema, "acounts")
	require.ErrorIs(t, err, projection.ErrUnknownProjection)
	require.ErrorContains(t, err, `"acounts"`)
	require.Equal(t, int64(0), w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "checkpoints")+
		` WHERE reset_requested`), "an unknown name records no request")

	require.NoError(t, projection.RequestRebuild(context.Background(), w.pool, w.schema, "accounts"))
	pgtest.Eventually(t, 10*time.Second, func() bool { return w.snapshot(t, "rm") == built },
		"the running process rebuilds the damaged read model")
	w.requireOnce(t, "rm", w.logPositions(t))
}

func TestConcurrentWritersCommittingAndAbortingOutOfOrder(t *testing.T) {
	t.Parallel()
	w := setup(t)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{BatchSize: 10})
	start(t, p)
	const writers, perWriter = 8, 25
	var wg sync.WaitGroup
	var committed atomic.Int64
	for g := range writers {
		wg.Go(func() {
			ctx := context.Background()
			id := fmt.Sprintf("w%d", g)
			version := int64(0)
			for i := range perWriter {
				tx, err := w.store.Begin(ctx)
				require.NoError(t, err)
				var events []any
				if version == 0 {
					events = append(events, Opened{Owner: id})
				}
				events = append(events, Deposited{Amount: int64(i + 1)})
				_, err = w.store.AppendTx(ctx, tx, w.request(t, id, eventstore.ExpectedVersion(version), events...))
				require.NoError(t, err)
				// Hold the transaction open for a while, so later positions commit first.
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				if rand.IntN(4) == 0 {
					require.NoError(t, tx.Rollback(ctx)) // a hole in the log, for good
					continue
				}
				require.NoError(t, tx.Commit(ctx))
				w.store.Notify()
				version += int64(len(events))
				committed.Add(int64(len(events)))
			}
		})
	}
	wg.Wait()
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, p), "catch-up")
	positions := w.logPositions(t)
	require.Len(t, positions, int(committed.Load()))
	w.requireOnce(t, "rm", positions)
}

// A partition that no process has run has no checkpoint; Status lists it anyway, as NotStarted at position 0, so
// its siblings at the head never make the projection look caught up (to a health check, the CLI's rebuild --wait
// or the console).
func TestStatusListsPartitionsThatNeverRan(t *testing.T) {
	t.Parallel()
	w := setup(t)
	// A handler that can apply an event again: the partition whose checkpoint goes reads the log from the start.
	noop := projection.HandlerFunc(func(context.Context, pgx.Tx, projection.Event) error { return nil })
	p := w.newProjection(t, noop, projection.Config{Partitions: 3, BatchSize: 16})
	stop := start(t, p)
	w.seed(t, w.store, 6, 2)
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, p), "catch-up")
	require.NoError(t, stop())
	pgtest.Exec(t, w.pool, `DELETE FROM `+pgtest.Q(w.schema, "checkpoints")+` WHERE name = 'accounts#1/3'`)

	st, err := p.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st, 3)
	for i, s := range st {
		require.Equal(t, fmt.Sprintf("accounts#%d/3", i), s.Checkpoint, "ordered by checkpoint")
		require.Equal(t, "accounts", s.Projection)
		require.Equal(t, i, s.Partition)
		require.Equal(t, 3, s.Partitions)
	}
	missing := st[1]
	require.Equal(t, projection.NotStarted, missing.State)
	require.Zero(t, missing.Position)
	require.Positive(t, missing.Head)
	require.Equal(t, missing.Head, missing.Lag)
	require.Zero(t, st[0].Lag)
	all, err := projection.ListStatus(context.Background(), w.pool, w.store, w.schema)
	require.NoError(t, err)
	require.Len(t, all, 3, "ListStatus lists it too")
	require.Equal(t, "accounts#1/3", all[1].Checkpoint)
	require.Equal(t, projection.NotStarted, all[1].State)
	require.False(t, caughtUp(t, w, p)())

	stop = start(t, p)
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, p), "the partition runs and catches up")
	require.NoError(t, stop())
	st, err = p.Status(context.Background())
	require.NoError(t, err)
	require.NotEqual(t, projection.NotStarted, st[1].State)
}

func TestPartitionedModeKeepsStreamOrderAndAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	w := setup(t)
	const parts = 4
	m := w.model("rm")
	var mu sync.Mutex
	worker := map[string]int{} // stream -> partition that applied it
	m.hook = func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		mu.Lock()
		defer mu.Unlock()
		part := projection.PartitionOf(e.Tenant, e.StreamID, parts)
		if prev, ok := worker[e.StreamID]; ok && prev != part {
			return fmt.Errorf("stream %s moved from partition %d to %d", e.StreamID, prev, part)
		}
		worker[e.StreamID] = part
		return nil
	}
	p := w.newProjection(t, m.mux(), projection.Config{Partitions: parts, BatchSize: 16})
	stop := start(t, p)
	w.seed(t, w.store, 12, 6)
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, p), "catch-up")
	require.NoError(t, stop())
	w.requireOnce(t, "rm", w.logPositions(t))
	st, err := p.Status(context.Background())
	require.NoError(t, err)
	require.Len(t, st, parts, "one checkpoint per partition")
	used := map[int]bool{}
	for i, s := range st {
		require.Equal(t, "accounts", s.Projection)
		require.Equal(t, fmt.Sprintf("accounts#%d/%d", i, parts), s.Checkpoint)
		require.Equal(t, i, s.Partition)
		require.Equal(t, parts, s.Partitions)
		used[i] = true
	}
	mu.Lock() // read under the lock, assert after it: a failed assertion must not leave the handlers blocked
	handled := len(worker)
	partsUsed := map[int]bool{}
	for _, part := range worker {
		partsUsed[part] = true
	}
	mu.Unlock()
	require.Equal(t, 12, handled)
	require.Greater(t, len(partsUsed), 1, "streams spread over several partitions")
	// Every account row checks its own version order; each has all 7 events.
	require.Equal(t, int64(12), w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "rm_accounts")+
		` WHERE events = 7 AND version = 7`))

	// A rebuild of a partitioned projection resets every partition once.
	stop = start(t, p)
	require.NoError(t, p.Rebuild(context.Background()))
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, p), "rebuild")
	require.NoError(t, stop())
	w.requireOnce(t, "rm", w.logPositions(t))
}

func TestParkModeParksTheFailingEventAndOthersFlow(t *testing.T) {
	t.Parallel()
	// A replay holds one connection at a time (it reads the event before its transaction begins).
	pool, schema := pgtest.GuardedMigrated(t, 10)
	w := worldOn(t, pool, schema)
	replayCtx := pgtest.OneConnection(context.Background(), "ReplayParked")
	m := w.model("rm")
	var broken atomic.Bool
	broken.Store(true)
	var attempts atomic.Int32
	m.fail = func(e projection.Event) error {
		if d, ok := e.Data.(Deposited); ok && d.Amount == 13 && broken.Load() {
			attempts.Add(1)
			return errors.New("cannot handle 13")
		}
		return nil
	}
	w.open(t, w.store, "a")
	w.appendEvents(t, w.store, "a", 1, Deposited{Amount: 13}, Deposited{Amount: 2})
	w.open(t, w.store, "b")
	p := w.newProjection(t, m.mux(), projection.Config{OnFailure: projection.Park, MaxAttempts: 3,
		PollInterval: 20 * time.Millisecond})
	start(t, p)
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "others flow")
	require.Equal(t, []int64{1, 4}, appliedPositions(t, w), "the parked event's stream stops at it (its "+
		"next event fails the version check and is parked too); other streams flow")

	parked, err := p.Parked(context.Background())
	require.NoError(t, err)
	require.Len(t, parked, 2)
	require.Equal(t, int64(2), parked[0].Position)
	require.Equal(t, 3, parked[0].Attempts)
	require.Contains(t, parked[0].LastError, "cannot handle 13")
	require.Equal(t, "account.deposited", parked[0].EventType)
	require.Equal(t, "a", parked[0].StreamID)
	st := status(t, p)
	require.Equal(t, 2, st.Parked)
	require.Equal(t, projection.Running, st.State)

	// Replay while still broken: fails, stays parked with one more attempt.
	require.ErrorContains(t, p.ReplayParked(replayCtx, parked[0].ID), "cannot handle 13")
	again, err := projection.ListParked(context.Background(), w.pool, w.schema, "accounts")
	require.NoError(t, err)
	require.Equal(t, 4, again[0].Attempts)

	// An operator's replay request (as from a CLI) is carried out by the running projection; still failing, it
	// records the error and clears the request.
	n, err := projection.RequestReplay(context.Background(), w.pool, w.schema, "accounts", parked[1].ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		ps, err := p.Parked(context.Background())
		require.NoError(t, err)
		return len(ps) == 2 && !ps[1].ReplayRequested && ps[1].Attempts == 4
	}, "requested replay attempted")

	// Fixed: replaying everything (in log order) applies each exactly once and empties the parked list.
	broken.Store(false)
	n, err = projection.RequestReplay(context.Background(), w.pool, w.schema, "accounts")
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		ps, err := p.Parked(context.Background())
		require.NoError(t, err)
		return len(ps) == 0
	}, "replayed")
	require.ErrorIs(t, p.ReplayParked(replayCtx, parked[1].ID), projection.ErrParkedNotFound)
	w.requireOnce(t, "rm", w.logPositions(t))
	require.Contains(t, w.snapshot(t, "rm"), "a owner-a 15 3 3")
	require.Zero(t, status(t, p).Parked)
}

func appliedPositions(t *testing.T, w world) []int64 {
	rows, err := w.pool.Query(context.Background(), `SELECT position FROM `+pgtest.Q(w.schema, "rm_applied")+
		` ORDER BY position`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return out
}

func TestStopModeStopsWithTheError(t *testing.T) {
	t.Parallel()
	w := setup(t)
	m := w.model("rm")
	m.fail = func(e projection.Event) error {
		if e.Version == 3 {
			return errors.New("boom")
		}
		return nil
	}
	w.seed(t, w.store, 1, 4)
	p := w.newProjection(t, m.mux(), projection.Config{MaxAttempts: 2})
	err := p.Run(context.Background())
	require.ErrorIs(t, err, projection.ErrHandler)
	var herr *projection.HandlerError
	require.ErrorAs(t, err, &herr)
	require.Equal(t, int64(3), herr.Record.Position)
	require.Equal(t, 2, herr.Attempts)
	require.ErrorContains(t, err, "boom")
	require.Equal(t, "accounts", herr.Name)
	require.True(t, strings.HasPrefix(err.Error(), "projection accounts stopped: event "), err.Error())
	require.NotContains(t, err.Error(), "logfollow", "no internal package name reaches the user")
	st := status(t, p)
	require.Equal(t, projection.Failed, st.State)
	require.Equal(t, int64(2), st.Position)
	require.Equal(t, int64(3), st.FailingPosition)
	require.Contains(t, st.LastError, "boom")
	require.Equal(t, []int64{1, 2}, appliedPositions(t, w))
}

func TestUndecodableEventIsNotSkipped(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.open(t, w.store, "a")
	_, err := w.store.Append(context.Background(), eventstore.AppendRequest{StreamID: "a", StreamType: "account",
		Expected: 1, Events: []eventstore.EventData{{Type: "account.deposited", Payload: []byte(`{"Amount":"x"}`)}}})
	require.NoError(t, err)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{MaxAttempts: 5})
	err = p.Run(context.Background())
	var herr *projection.HandlerError
	require.ErrorAs(t, err, &herr)
	require.Equal(t, 1, herr.Attempts, "a decoding error is not retried")
	require.Equal(t, int64(2), herr.Record.Position)
	require.ErrorContains(t, err, "cannot decode")
}

func TestStatusReportsLag(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 2, 2) // positions 1..6
	var release atomic.Bool
	m := w.model("rm")
	m.fail = func(e projection.Event) error {
		if e.Position > 4 && !release.Load() {
			return errors.New("not yet")
		}
		return nil
	}
	p := w.newProjection(t, m.mux(), projection.Config{MaxAttempts: 1000, RetryDelay: 5 * time.Millisecond,
		MaxRetryDelay: 5 * time.Millisecond})
	all, err := projection.ListStatus(context.Background(), w.pool, w.store, w.schema)
	require.NoError(t, err)
	require.Empty(t, all, "a projection that never ran has no status yet")

	start(t, p)
	pgtest.Eventually(t, 10*time.Second, func() bool { return status(t, p).Position == 4 }, "stuck at 4")
	time.Sleep(50 * time.Millisecond)
	// The failure on position 5 is recorded once the handler's attempt has failed, which a loaded machine may
	// delay past the checkpoint's move to 4.
	var s projection.Status
	pgtest.Eventually(t, 10*time.Second, func() bool {
		all, err = projection.ListStatus(context.Background(), w.pool, w.store, w.schema)
		require.NoError(t, err)
		require.Len(t, all, 1)
		s = all[0]
		return s.FailingPosition != 0
	}, "the failure on position 5 recorded")
	require.Equal(t, "accounts", s.Projection)
	require.Equal(t, projection.Running, s.State)
	require.Equal(t, int64(4), s.Position)
	require.Equal(t, int64(6), s.Head)
	require.Equal(t, int64(2), s.Lag)
	require.Greater(t, s.TimeLag, 40*time.Millisecond, "position 5 has been waiting")
	require.Less(t, s.TimeLag, time.Minute)
	require.Equal(t, int64(5), s.FailingPosition)
	require.Contains(t, s.LastError, "not yet")
	require.NotEmpty(t, s.Owner)

	release.Store(true)
	pgtest.Eventually(t, 10*time.Second, func() bool { return status(t, p).Lag == 0 }, "caught up")
	s = status(t, p)
	require.Equal(t, int64(6), s.Position)
	require.Zero(t, s.TimeLag)
	require.Zero(t, s.FailingPosition)
}

// TestLiveLatencyWithNotify is not parallel: it measures latency, which the other tests' load (on two cores,
// with the race detector) would distort; sequential tests run while the parallel ones wait. Other packages'
// tests may still run beside it, so it takes the best of three measurements: with notifications broken, every
// measurement would be near the 1s poll (p50 about 500ms).
func TestLiveLatencyWithNotify(t *testing.T) {
	w := setup(t)
	const n = 100
	var mu sync.Mutex
	handled := map[int64]time.Time{}
	m := w.model("rm")
	m.hook = func(_ context.Context, _ pgx.Tx, e projection.Event) error {
		mu.Lock()
		handled[e.Position] = time.Now()
		mu.Unlock()
		return nil
	}
	p := w.newProjection(t, m.mux(), projection.Config{PollInterval: time.Second})
	start(t, p)
	pgtest.Eventually(t, 10*time.Second, func() bool { return status(t, p).Owner != "" }, "running")
	// Without notifications the latency is the 1 s poll's: half a second at the median. With them it is
	// milliseconds, and stays well under that on a loaded machine, where the tail (not the median) grows.
	var best time.Duration
	for attempt := range 3 {
		committed := map[int64]time.Time{}
		id := fmt.Sprint("a", attempt)
		w.open(t, w.store, id)
		for i := range n {
			res, err := w.store.Append(context.Background(), w.request(t, id, eventstore.ExpectedVersion(i+1),
				Deposited{Amount: 1}))
			require.NoError(t, err)
			committed[res.Records[0].Position] = time.Now()
			time.Sleep(time.Duration(2+rand.IntN(8)) * time.Millisecond)
		}
		want := int64((attempt + 1) * (n + 1))
		pgtest.Eventually(t, 10*time.Second, func() bool { return w.applied(t, "rm") == want }, "all handled")
		var lat []time.Duration
		mu.Lock()
		for pos, c := range committed {
			lat = append(lat, handled[pos].Sub(c))
		}
		mu.Unlock()
		slices.Sort(lat)
		p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
		t.Logf("append commit -> handler latency over %d events: p50 %s, p99 %s, max %s", n, p50, p99,
			lat[len(lat)-1])
		if attempt == 0 || p50 < best {
			best = p50
		}
		if best < 50*time.Millisecond {
			break
		}
	}
	require.Less(t, best, 250*time.Millisecond, "live latency p50 with a 1s poll: notifications must work")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	w := setup(t)
	h := w.model("rm").mux()
	for field, cfg := range map[string]*projection.Config{
		"Name":          nil,
		"Partitions":    {Name: "p", Partitions: 1000},
		"OnFailure":     {Name: "p", OnFailure: 7},
		"BatchSize":     {Name: "p", BatchSize: -1},
		"MaxRetryDelay": {Name: "p", RetryDelay: time.Second, MaxRetryDelay: time.Millisecond},
		"LeaseTTL":      {Name: "p", LeaseTTL: time.Nanosecond},
	} {
		_, err := projection.New(w.pool, w.store, h, cfg)
		require.ErrorIs(t, err, projection.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field)
	}
	_, err := projection.New(w.pool, w.store, h, &projection.Config{Name: "a#b"})
	require.ErrorContains(t, err, "Name")
	_, err = projection.New(w.pool, w.store, nil, &projection.Config{Name: "p"})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
}

// TestRunLeavesNoGoroutines is not parallel: the leak check sees every goroutine of the process, and sequential
// tests run while the parallel ones wait.
func TestRunLeavesNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	w := setup(t)
	w.seed(t, w.store, 4, 2)
	p := w.newProjection(t, w.model("rm").mux(), projection.Config{Partitions: 2})
	stop := start(t, p)
	pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "catch-up")
	require.NoError(t, stop())

	// The Watermill subscriber too, closed in the middle of a delivery.
	seen, stopRouter := routed(t, w, "g", "*", 0)
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(seen()) >= 3 }, "delivery")
	stopRouter()
}

// The partitions of a partitioned projection are spread over the processes running it: a process that joins gets
// its share handed over by the others, the partitions of a process that stops are taken over, and every event is
// applied once, in stream order, throughout.
func TestPartitionsSpreadOverProcesses(t *testing.T) {
	t.Parallel()
	w := setup(t)
	const parts = 4
	m := w.model("rm")
	cfg := func(owner string) projection.Config {
		return projection.Config{Partitions: parts, BatchSize: 16, Owner: owner, LeaseTTL: time.Second,
			LeaseAcquireInterval: 100 * time.Millisecond}
	}
	one := w.newProjection(t, m.mux(), cfg("one"))
	two := w.newProjection(t, m.mux(), cfg("two"))
	held := func() map[string]int64 {
		rows, err := w.pool.Query(context.Background(), `SELECT owner, count(*) FROM `+pgtest.Q(w.schema, "leases")+
			` WHERE name ~ '^logfollow:accounts#[0-9]+/' AND expires_at > now() GROUP BY owner`)
		require.NoError(t, err)
		out := map[string]int64{}
		for rows.Next() {
			var owner string
			var n int64
			require.NoError(t, rows.Scan(&owner, &n))
			out[owner] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	deposit := func(amount int64) {
		for i := range 12 {
			w.appendEvents(t, w.store, fmt.Sprintf("a%d", i), eventstore.AnyVersion, Deposited{Amount: amount})
		}
	}
	stopOne := start(t, one)
	w.seed(t, w.store, 12, 2)
	pgtest.Eventually(t, 15*time.Second, func() bool { return held()["one"] == parts }, "one leads every partition")

	stopTwo := start(t, two)
	pgtest.Eventually(t, 15*time.Second, func() bool {
		h := held()
		return h["one"] == parts/2 && h["two"] == parts/2
	}, "a process that joins gets its share")
	deposit(100)
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, one), "both processes apply the log")

	require.NoError(t, stopTwo()) // releases its partitions
	pgtest.Eventually(t, 15*time.Second, func() bool { return held()["one"] == parts },
		"the partitions of a process that stops are taken over")
	deposit(200)
	pgtest.Eventually(t, 15*time.Second, caughtUp(t, w, one), "the survivor applies the log")
	require.NoError(t, stopOne())
	w.requireOnce(t, "rm", w.logPositions(t))
	require.Equal(t, int64(12), w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "rm_accounts")+
		` WHERE events = 5 AND version = 5`), "every account has its five events, in order")
}
