package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// appendEvents appends one event per type to stream, in order.
func appendEvents(t *testing.T, store *eventstore.PostgresStore, tenant, streamType, stream string, types ...string) {
	t.Helper()
	evs := make([]eventstore.EventData, 0, len(types))
	for i, typ := range types {
		evs = append(evs, eventstore.EventData{Type: typ, Payload: fmt.Appendf(nil, `{"n": %d}`, i+1)})
	}
	_, err := store.Append(context.Background(), eventstore.AppendRequest{Tenant: tenant, StreamID: stream,
		StreamType: streamType, Expected: eventstore.AnyVersion, Events: evs})
	require.NoError(t, err)
}

// readModel is a projection handler writing one row per applied event (the primary key makes a double
// application fail); it rejects events of type "poison" while failing is set, and counts its resets.
type readModel struct {
	table   string
	failing atomic.Bool
	resets  atomic.Int32
}

func newReadModel(t *testing.T, e *env) *readModel {
	m := &readModel{table: pgtest.Q(e.schema, "applied")}
	pgtest.Exec(t, e.pool, "CREATE TABLE "+m.table+" (position bigint PRIMARY KEY)")
	return m
}

func (m *readModel) Handle(ctx context.Context, tx pgx.Tx, ev projection.Event) error {
	if ev.Type == "poison" && m.failing.Load() {
		return errors.New("cannot apply a poison event")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+m.table+" VALUES ($1)", ev.Position)
	return err
}

func (m *readModel) Reset(ctx context.Context, tx pgx.Tx) error {
	m.resets.Add(1)
	_, err := tx.Exec(ctx, "TRUNCATE "+m.table)
	return err
}

// runProjection runs the projection name over m until the returned stop is called (or the test ends).
func runProjection(t *testing.T, e *env, store eventstore.Store, m *readModel, name string,
	mode projection.FailureMode) (stop func()) {
	t.Helper()
	p, err := projection.New(e.pool, store, m, &projection.Config{Name: name, Schema: e.schema, OnFailure: mode,
		MaxAttempts: 1, RetryDelay: time.Millisecond, MaxRetryDelay: time.Millisecond,
		PollInterval: 50 * time.Millisecond, LeaseAcquireInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done)
	}
	t.Cleanup(stop)
	return stop
}

type projectionOut struct {
	Projection string `json:"projection"`
	State      string `json:"state"`
	Position   int64  `json:"position"`
	Head       int64  `json:"head"`
	Lag        int64  `json:"lag"`
	Parked     int    `json:"parked"`
	Rebuilding bool   `json:"rebuilding"`
}

// caughtUp reports whether the projection has recorded its checkpoint and has no lag; before its first run the
// status command does not know it yet.
func (e *env) caughtUp(name string) bool {
	e.t.Helper()
	if r := e.run("projection", "status", name); r.code != exitOK {
		return false
	}
	return e.projectionStatus(name).Lag == 0
}

func (e *env) projectionStatus(name string) projectionOut {
	e.t.Helper()
	var out struct {
		Projections []projectionOut `json:"projections"`
	}
	e.json(&out, "projection", "status", name)
	require.Len(e.t, out.Projections, 1)
	return out.Projections[0]
}

// projection status shows what the running projection did; rebuild records a request visible in status and
// performed by the projection's process; --wait returns once the rebuild has caught up, with a progress bar only
// on a terminal.
func TestProjectionStatusAndRebuild(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	for i := range 4 {
		appendEvents(t, store, "", "bank.account", fmt.Sprintf("acc-%d", i), "account.opened", "account.deposited")
	}
	m := newReadModel(t, e)
	applied := func() int64 { return pgtest.Count(t, e.pool, "SELECT count(*) FROM "+m.table) }
	stop := runProjection(t, e, store, m, "balances", projection.Stop)
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.caughtUp("balances") },
		"projection caught up")
	require.Equal(t, projectionOut{Projection: "balances", State: "running", Position: 8, Head: 8},
		e.projectionStatus("balances"))
	require.Equal(t, int64(8), applied())
	human := e.ok("projection", "status")
	require.Regexp(t, `balances\s+running\s+8\s+8\s+0\s`, human)
	stop()
	require.Equal(t, "stopped", e.projectionStatus("balances").State)

	// A request while no process runs it: recorded, visible, performed when the projection starts.
	var req struct {
		Projection string `json:"projection"`
		Requested  bool   `json:"requested"`
		Completed  bool   `json:"completed"`
		Target     int64  `json:"target"`
	}
	e.json(&req, "projection", "rebuild", "balances")
	require.True(t, req.Requested)
	require.False(t, req.Completed)
	require.True(t, e.projectionStatus("balances").Rebuilding)
	require.Regexp(t, `balances\s+stopped\s.*requested`, e.ok("projection", "status"))
	require.Zero(t, m.resets.Load())

	runProjection(t, e, store, m, "balances", projection.Stop)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		st := e.projectionStatus("balances")
		return m.resets.Load() == 1 && !st.Rebuilding && st.Lag == 0
	}, "the started projection performs the requested rebuild")
	require.Equal(t, int64(8), applied())

	// --wait: returns when the rebuild has caught up with the head of the log at the time of the request.
	appendEvents(t, store, "", "bank.account", "acc-9", "account.opened")
	e.json(&req, "projection", "rebuild", "balances", "--wait", "--poll-interval", "20ms")
	require.True(t, req.Completed)
	require.Equal(t, int64(9), req.Target)
	require.Equal(t, int32(2), m.resets.Load(), "the rebuild was performed")
	require.Equal(t, int64(9), applied(), "every event applied once after the reset")

	tty := options{isTerminal: func(io.Writer) bool { return true }}
	r := invoke(context.Background(), tty, e.args("projection", "rebuild", "balances", "--wait",
		"--poll-interval", "20ms")...)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "100%", "a progress bar on a terminal")
	require.Contains(t, r.stdout, `Rebuild of projection "balances" done: caught up with position 9`)
	require.Equal(t, int32(3), m.resets.Load())
	human = e.ok("projection", "rebuild", "balances", "--wait", "--poll-interval", "20ms")
	require.NotContains(t, human, "%", "no progress bar without a terminal")
	require.Contains(t, human, "caught up with position 9")

	e.fails(exitFailure, `no projection named "nope"`, "projection", "rebuild", "nope")
	e.fails(exitFailure, `no projection named "nope"`, "projection", "status", "nope")
}

// Waiting for a rebuild that no process performs ends with the timeout (exit 1) or Ctrl-C (exit 130), and the
// request stays.
func TestProjectionRebuildWaitStops(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	appendEvents(t, store, "", "bank.account", "acc-1", "account.opened")
	m := newReadModel(t, e)
	stop := runProjection(t, e, store, m, "balances", projection.Stop)
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.caughtUp("balances") },
		"projection caught up")
	stop()

	r := e.run("projection", "rebuild", "balances", "--wait", "--timeout", "300ms", "--poll-interval", "20ms")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `warning: no process is running projection "balances"`)
	require.Contains(t, r.stderr, `gave up waiting for the rebuild of "balances" after 300ms`)

	// Interrupted while it waits: late enough that a loaded machine has connected and requested the rebuild (an
	// interruption before that is another message).
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	r = invoke(ctx, options{}, e.args("projection", "rebuild", "balances", "--wait", "--poll-interval", "20ms")...)
	require.Equal(t, exitInterrupted, r.code, r.stderr)
	require.Contains(t, r.stderr, "stagehand: interrupted: stopped waiting for the rebuild")
	require.Contains(t, r.stderr, "the reset has not happened yet")
	require.True(t, e.projectionStatus("balances").Rebuilding, "the request stands")
	require.Zero(t, m.resets.Load())
}

type parkedOut struct {
	ID              int64  `json:"id"`
	Projection      string `json:"projection"`
	Position        int64  `json:"position"`
	EventType       string `json:"event_type"`
	LastError       string `json:"last_error"`
	ReplayRequested bool   `json:"replay_requested"`
}

func (e *env) parked(args ...string) []parkedOut {
	e.t.Helper()
	var out struct {
		Parked []parkedOut `json:"parked"`
	}
	e.json(&out, append([]string{"projection", "parked", "list"}, args...)...)
	return out.Parked
}

type replayOut struct {
	Requested int64 `json:"requested"`
	Results   []struct {
		ID        int64  `json:"id"`
		Outcome   string `json:"outcome"`
		LastError string `json:"last_error"`
	} `json:"results"`
}

// Events a projection parked are listed; a replay is performed by the running projection (applied once, or
// parked again with the new error); discard deletes them.
func TestProjectionParkedListReplayDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	appendEvents(t, store, "", "bank.account", "acc-1", "account.opened", "poison", "account.deposited", "poison",
		"poison")
	m := newReadModel(t, e)
	m.failing.Store(true)
	runProjection(t, e, store, m, "balances", projection.Park)
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(e.parked()) == 3 }, "three events parked")
	pk := e.parked("balances")
	require.Equal(t, []int64{2, 4, 5}, []int64{pk[0].Position, pk[1].Position, pk[2].Position})
	for _, p := range pk {
		require.Equal(t, "balances", p.Projection)
		require.Equal(t, "poison", p.EventType)
		require.Contains(t, p.LastError, "cannot apply a poison event")
	}
	require.Empty(t, e.parked("other"))
	require.Equal(t, 3, e.projectionStatus("balances").Parked)
	human := e.ok("projection", "parked", "list")
	require.Regexp(t, fmt.Sprintf(`%d\s+balances\s+2\s+bank.account/acc-1@2\s+-\s+poison`, pk[0].ID), human)
	require.Contains(t, human, "3 parked event(s)")

	e.fails(exitFailure, "no parked event with ID 999999; nothing requested", "projection", "parked", "replay",
		fmt.Sprint(pk[0].ID), "999999")
	require.False(t, e.parked()[0].ReplayRequested, "a failed command requests nothing")

	// Still failing: the replay fails again, the event stays parked with the new error, exit 1.
	r := e.run("projection", "parked", "replay", fmt.Sprint(pk[0].ID), "--wait", "--json")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, "1 of 1 replayed event(s) failed again")
	var rep replayOut
	decodeOne(t, r.stdout, &rep)
	require.Equal(t, int64(1), rep.Requested)
	require.Equal(t, "failed", rep.Results[0].Outcome)
	require.Contains(t, rep.Results[0].LastError, "cannot apply a poison event")
	require.Len(t, e.parked(), 3)

	// Fixed: the replay applies it exactly once and it leaves the parked list.
	m.failing.Store(false)
	e.json(&rep, "projection", "parked", "replay", fmt.Sprint(pk[0].ID), "--wait")
	require.Equal(t, "replayed", rep.Results[0].Outcome)
	require.Equal(t, int64(1), pgtest.Count(t, e.pool, "SELECT count(*) FROM "+m.table+" WHERE position = 2"))
	require.Len(t, e.parked(), 2)

	// Discard: gone without being applied.
	require.Contains(t, e.ok("projection", "parked", "discard", fmt.Sprint(pk[1].ID)), "Discarded 1 parked event")
	require.Equal(t, []int64{pk[2].ID}, []int64{e.parked()[0].ID})
	require.Zero(t, pgtest.Count(t, e.pool, "SELECT count(*) FROM "+m.table+" WHERE position = 4"))
	e.fails(exitFailure, "no parked event with ID", "projection", "parked", "discard", fmt.Sprint(pk[1].ID))

	// Every parked event of a projection, without waiting: the running projection replays it.
	human = e.ok("projection", "parked", "replay", "--projection", "balances")
	require.Contains(t, human, "Requested replay of 1 parked event(s)")
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(e.parked()) == 0 }, "replayed")
	require.Equal(t, int64(4), pgtest.Count(t, e.pool, "SELECT count(*) FROM "+m.table))
}
