package health_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// A projection whose checkpoint stopped moving 20 minutes ago, with events waiting since, is reported Unhealthy by
// a checker built now, on its first check: the stall clock starts from the database's times, not from when the
// checker first looked (a restarted console or probe does not hide it).
func TestStallSeenByAFreshCheckerFromTheDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	store, err := eventstore.NewPostgres(e.pool, &eventstore.PostgresConfig{Schema: e.schema, DisableNotify: true})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	req := eventstore.AppendRequest{StreamID: "order-1", StreamType: "order", Expected: eventstore.AnyVersion}
	for range 3 {
		req.Events = append(req.Events, eventstore.EventData{Type: "order.placed", Payload: []byte(`{}`)})
	}
	_, err = store.Append(ctx, req)
	require.NoError(t, err)
	q := func(table string) string { return pgtest.Q(e.schema, table) }
	pgtest.Exec(t, e.pool, `UPDATE `+q("events")+` SET recorded_at = now() - interval '25 minutes'`)
	// A projection that handled the first event, then stopped moving 20 minutes ago (its process still holds
	// the state "running": it hangs).
	pgtest.Exec(t, e.pool, `INSERT INTO `+q("checkpoints")+` (name, kind, reset_group, position, state,
		last_event_at, created_at, updated_at) VALUES ('board', 'projection', 'board', 1, 'running',
		now() - interval '25 minutes', now() - interval '1 hour', now() - interval '20 minutes')`)
	// The outbox: ready messages, the latest publication 20 minutes ago.
	e.stage(t, "m", 3)
	pgtest.Exec(t, e.pool, `UPDATE `+q("outbox")+` SET created_at = now() - interval '22 minutes'`)
	pgtest.Exec(t, e.pool, `INSERT INTO `+q("outbox_sent")+` (message_id, topic, tenant_id, message_type,
		attempts, created_at, sent_at) VALUES ('old', 'orders', '__untenanted__', '', 1,
		now() - interval '21 minutes', now() - interval '20 minutes')`)

	c := newChecker(t, health.Config{Outbox: e.ob.AllTenants(),
		Projections: func(ctx context.Context) ([]projection.Status, error) {
			return projection.ListStatus(ctx, e.pool, store, e.schema)
		}})
	r := c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status, "%v", r.Reasons)
	board := component(t, r, "projection:board")
	require.Equal(t, health.Unhealthy, board.Status, "%v", board.Reasons)
	require.InDelta(t, (20 * time.Minute).Seconds(), time.Duration(board.Follower.Inactive).Seconds(), 30)
	require.Contains(t, board.Reasons[0], "has not moved for 20m")
	ob := component(t, r, "outbox")
	require.Equal(t, health.Unhealthy, ob.Status, "%v", ob.Reasons)
	require.InDelta(t, (20 * time.Minute).Seconds(), time.Duration(ob.Outbox.Inactive).Seconds(), 30)

	// Recent progress is no stall: a checkpoint that moved a second ago, a publication a second ago.
	pgtest.Exec(t, e.pool, `UPDATE `+q("checkpoints")+` SET updated_at = now() - interval '1 second'`)
	pgtest.Exec(t, e.pool, `UPDATE `+q("outbox_sent")+` SET sent_at = now() - interval '1 second'`)
	r = newChecker(t, health.Config{Outbox: e.ob.AllTenants(),
		Projections: func(ctx context.Context) ([]projection.Status, error) {
			return projection.ListStatus(ctx, e.pool, store, e.schema)
		}}).Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
}

// The inbox is part of the verdict: a handler's dead letters make it Degraded, messages a handler keeps failing on
// Degraded, and a handler stuck on a message (by the database's first-failure time) or failing on too many
// Unhealthy; the thresholds are configurable.
func TestInboxFailuresInTheVerdict(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	q := func(table string) string { return pgtest.Q(e.schema, table) }
	check := func(cfg health.Config) health.Component {
		t.Helper()
		cfg.Inbox = e.ob.AllTenants()
		return component(t, newChecker(t, cfg).Check(ctx), "inbox")
	}
	in := check(health.Config{})
	require.Equal(t, health.Healthy, in.Status)
	require.Empty(t, in.Inbox.Handlers)

	pgtest.Exec(t, e.pool, `INSERT INTO `+q("inbox_dead_letters")+` (message_id, handler, tenant_id,
		message_type, topic, payload, metadata, attempts, last_error, dead_at) VALUES ('d-1', 'billing',
		'acme', 'Invoice', 'billing', '\x7b7d', '{}', 5, 'ledger is down', now())`)
	in = check(health.Config{})
	require.Equal(t, health.Degraded, in.Status, "%v", in.Reasons)
	require.Contains(t, in.Reasons[0], `handler "billing" has 1 dead letters`)
	require.EqualValues(t, 1, in.Inbox.DeadLettered)
	require.Equal(t, health.Healthy, check(health.Config{InboxDeadLetters: -1}).Status, "a negative threshold")

	pgtest.Exec(t, e.pool, `INSERT INTO `+q("inbox_attempts")+` (message_id, handler, tenant_id, attempts,
		last_error, first_failed_at, last_failed_at) VALUES ('f-1', 'shipping', 'acme', 2, 'carrier timeout',
		now() - interval '30 seconds', now())`)
	in = check(health.Config{InboxDeadLetters: -1})
	require.Equal(t, health.Degraded, in.Status, "%v", in.Reasons)
	require.Contains(t, in.Reasons[0], `handler "shipping" is failing on 1 messages (up to 2 attempts): carrier timeout`)
	require.Equal(t, health.Healthy, check(health.Config{InboxDeadLetters: -1, InboxFailing: 2}).Status)
	require.Equal(t, health.Unhealthy, check(health.Config{InboxDeadLetters: -1, InboxFailing: 1,
		UnhealthyInboxFailing: 1}).Status)

	// Stuck on it for ten minutes, by the database's first failure: Unhealthy on a fresh checker's first check.
	pgtest.Exec(t, e.pool, `UPDATE `+q("inbox_attempts")+` SET first_failed_at = now() - interval '10 minutes'`)
	in = check(health.Config{InboxDeadLetters: -1, InboxFailing: 5})
	require.Equal(t, health.Unhealthy, in.Status, "%v", in.Reasons)
	require.Contains(t, in.Reasons[0], `handler "shipping" has been failing on a message for 10m`)
	require.Len(t, in.Inbox.Handlers, 2)
	require.Equal(t, "shipping", in.Inbox.Handlers[1].Handler)
	require.InDelta(t, 600, time.Duration(in.Inbox.Handlers[1].FailingFor).Seconds(), 30)

	// A tenant's scope sees its tenant's failures only.
	tc := newChecker(t, health.Config{Inbox: e.ob.Tenant("globex")})
	require.Equal(t, health.Healthy, component(t, tc.Check(ctx), "inbox").Status)
}
