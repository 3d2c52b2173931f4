package console_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// board is a projection handler that records each event it applies in a table (exactly once, in the projection's
// transaction), fails on events whose payload mentions "poison" while failing is set, and counts its resets.
type board struct {
	table   string
	failing atomic.Bool
	resets  atomic.Int64
}

func (b *board) Handle(ctx context.Context, tx pgx.Tx, e projection.Event) error {
	if b.failing.Load() && strings.Contains(string(e.Payload), "poison") {
		return errors.New("cannot apply a poisoned order")
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+b.table+` VALUES ($1)`, e.Position)
	return err
}

func (b *board) Reset(ctx context.Context, tx pgx.Tx) error {
	b.resets.Add(1)
	_, err := tx.Exec(ctx, `DELETE FROM `+b.table)
	return err
}

// runProjection runs a Park-mode projection named name over the world's store until the test ends.
func (w *world) runProjection(name string, h projection.Handler) {
	w.t.Helper()
	p, err := projection.New(w.pool, w.store, h, &projection.Config{Name: name, Schema: w.schema,
		OnFailure: projection.Park, MaxAttempts: 1, PollInterval: 20 * time.Millisecond, DisableListen: true,
		LeaseAcquireInterval: 50 * time.Millisecond})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		require.NoError(w.t, <-done)
	})
}

// A projection's page shows its state, position and parked events; a parked event is replayed through a
// confirmed, recorded action (the running projection applies it), and a rebuild requested from the console is
// followed until it has caught up with the head of the log at the request.
func TestProjectionParkedReplayAndRebuild(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
	})
	b := &board{table: qualified(w, "board")}
	pgtest.Exec(t, w.pool, `CREATE TABLE `+b.table+` (position bigint PRIMARY KEY)`)
	applied := func() int64 { return w.count(`SELECT count(*) FROM {s}.board`) }
	b.failing.Store(true)
	w.appendEvents("acme", "order-1", 3, func(i int) string {
		if i == 1 {
			return `{"note":"poison"}`
		}
		return `{"note":"fine"}`
	})
	w.runProjection("order-board", b)
	auth := []string{"Authorization", basic("ops", "pw")}
	pgtest.Eventually(t, 10*time.Second, func() bool {
		_, page := w.get("/projection?name=order-board", auth...)
		return strings.Contains(page, "cannot apply a poisoned order") && strings.Contains(page, "running")
	}, "the poisoned event is parked")
	list := w.page("/projections", auth...)
	require.Contains(t, list, "order-board")
	require.Contains(t, list, "cannot apply a poisoned order")

	// Replay the parked event: confirmed, recorded, applied by the running projection.
	b.failing.Store(false)
	page := w.page("/projection?name=order-board", auth...)
	form := hidden(t, page, "parked-actions")
	form.Set("action", "projection.replay")
	form["parked"] = parkedIDs(page)
	require.Len(t, form["parked"], 1)
	resp := w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirm := hidden(t, body(t, resp), "confirm-form")
	require.Equal(t, "1", confirm.Get("expected"))
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	pgtest.Eventually(t, 10*time.Second, func() bool { return applied() == 3 }, "the replay is applied")
	pgtest.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(w.page("/projection?name=order-board", auth...), "No parked event")
	}, "the replayed event leaves the parked list")

	// Rebuild: requested, then followed to the end.
	head, err := w.store.HeadPosition(context.Background())
	require.NoError(t, err)
	page = w.page("/projection?name=order-board", auth...)
	form = hidden(t, page, "rebuild-form")
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirmPage := body(t, resp)
	require.Contains(t, confirmPage, "Rebuild 1 projection")
	resp = w.post("/act", hidden(t, confirmPage, "confirm-form"), auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(w.page("/projection?name=order-board", auth...), "<strong>Done</strong>")
	}, "the rebuild is followed to its end")
	require.EqualValues(t, 1, b.resets.Load())
	require.EqualValues(t, 3, applied(), "the log was applied again from the start")
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.console_audit WHERE action = 'projection.rebuild'
		AND (details->>'head')::bigint = $1 AND affected = 1`, head))
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.console_audit WHERE action = 'projection.replay'
		AND affected = 1`))

	// An unknown projection is not found; a rebuild of it is refused before anything is recorded.
	code, _ := w.get("/projection?name=nope", auth...)
	require.Equal(t, http.StatusNotFound, code)
	form.Set("name", "nope")
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func parkedIDs(page string) []string {
	var out []string
	for _, part := range strings.Split(page, `name="parked" value="`)[1:] {
		out = append(out, part[:strings.Index(part, `"`)])
	}
	return out
}
