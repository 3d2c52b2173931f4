package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

const (
	acme   = "acme"
	globex = "globex"
)

// keyMsg is a message of tenant on partition key "acc-1" (stream IDs, the default keys, repeat across tenants).
func keyMsg(tenant, id string) outbox.Message {
	return outbox.Message{ID: id, Topic: "accounts", Tenant: tenant, PartitionKey: "acc-1", Payload: []byte(id)}
}

// rejectPrefix makes the broker reject the messages whose ID starts with prefix.
func rejectPrefix(prefix string) func(*message.Message) error {
	return func(m *message.Message) error {
		if strings.HasPrefix(m.UUID, prefix) {
			return errRejected
		}
		return nil
	}
}

// rawSeqs returns "tenant/id" -> (sequence number, parked) for every pending row.
func (e *env) rawSeqs() map[string][2]int64 {
	rows, err := e.pool.Query(context.Background(), `SELECT tenant_id || '/' || message_id, coalesce(seq, 0),
		(next_attempt_at = 'infinity')::int FROM `+pgtest.Q(e.schema, "outbox"))
	require.NoError(e.t, err)
	out := map[string][2]int64{}
	for rows.Next() {
		var k string
		var v [2]int64
		require.NoError(e.t, rows.Scan(&k, &v[0], &v[1]))
		out[k] = v
	}
	require.NoError(e.t, rows.Err())
	return out
}

// seqs returns "tenant/id" -> (place, parked) for every pending row: its place (1, 2, ...) in its key's order
// among the key's pending messages and dead letters (0 when it is not ordered). Sequence numbers themselves come
// from one sequence, so only their order means something.
func (e *env) seqs() map[string][2]int64 {
	rows, err := e.pool.Query(context.Background(), `SELECT tenant_id || '/' || message_id,
		CASE WHEN seq IS NOT NULL THEN rank() OVER (PARTITION BY tenant_id, partition_key, seq IS NULL ORDER BY seq)
		END, parked, pending
		FROM (SELECT tenant_id, message_id, partition_key, seq, (next_attempt_at = 'infinity')::int AS parked,
			     true AS pending FROM `+pgtest.Q(e.schema, "outbox")+`
		      UNION ALL
		      SELECT tenant_id, message_id, partition_key, seq, 0, false FROM `+
		pgtest.Q(e.schema, "outbox_dead_letters")+`) m`)
	require.NoError(e.t, err)
	out := map[string][2]int64{}
	for rows.Next() {
		var (
			k         string
			rank      *int64
			parked, s int64
			pending   bool
		)
		require.NoError(e.t, rows.Scan(&k, &rank, &parked, &pending))
		if rank != nil {
			s = *rank
		}
		if pending {
			out[k] = [2]int64{s, parked}
		}
	}
	require.NoError(e.t, rows.Err())
	return out
}

// Per-key order is per (tenant, key): one tenant's dead letter on a key holds only that tenant's later messages of
// the key; the other tenant's messages of the same key flow, in order, and its admin scope neither sees nor can touch
// the dead letter.
func TestTenantKeysOrderIndependently(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	n, err := e.ob.Stage(ctx, keyMsg(acme, "a-1"), keyMsg(globex, "g-1"), keyMsg(acme, "a-2"),
		keyMsg(globex, "g-2"))
	require.NoError(t, err)
	require.Equal(t, 4, n)
	// Each tenant numbers its own messages of the key, and only its own first message is due.
	require.Equal(t, map[string][2]int64{"acme/a-1": {1, 0}, "acme/a-2": {2, 1}, "globex/g-1": {1, 0},
		"globex/g-2": {2, 1}}, e.seqs())

	b := newBroker()
	b.setFail(rejectPrefix("a-1"))
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 2, Failed: 1, DeadLettered: 1}, res)
	require.Equal(t, []string{"g-1", "g-2"}, firstOrder(b.snapshot())["acc-1"])

	st, err := e.ob.Tenant(globex).Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Sent: 2}, st, "globex is not held by acme's dead letter")
	st, err = e.ob.Tenant(acme).Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Pending)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.DeadLettered)

	// globex's scope does not see acme's dead letter and cannot redrive or discard it.
	g := e.ob.Tenant(globex)
	dls, err := g.DeadLetters(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, dls)
	_, err = g.Redrive(ctx, "a-1")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = g.Discard(ctx, "a-1")
	require.ErrorIs(t, err, outbox.ErrNotFound)

	// A later globex message of the key is due at once: acme's dead letter holds acme's key only. globex's key has
	// emptied, so its numbering starts afresh.
	_, err = e.ob.Stage(ctx, keyMsg(globex, "g-3"))
	require.NoError(t, err)
	require.Equal(t, [2]int64{1, 0}, e.seqs()["globex/g-3"])
	_, err = e.ob.Stage(ctx, keyMsg(acme, "a-3"))
	require.NoError(t, err)
	require.Equal(t, [2]int64{3, 1}, e.seqs()["acme/a-3"], "parked behind acme's dead letter")

	// acme redrives its dead letter: its key is released, in order.
	b.setFail(nil)
	moved, err := e.ob.Tenant(acme).Redrive(ctx, "a-1")
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	res, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 4, res.Published)
	order := firstOrder(b.snapshot())["acc-1"]
	require.Equal(t, []string{"a-1", "a-2", "a-3"}, filterPrefix(order, "a-"))
	require.Equal(t, []string{"g-1", "g-2", "g-3"}, filterPrefix(order, "g-"))
}

func filterPrefix(ids []string, prefix string) []string {
	var out []string
	for _, id := range ids {
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	return out
}

// Discarding one tenant's dead letter releases that tenant's key and leaves the other tenant's dead letter on the
// same key holding its own.
func TestTenantKeysDiscardReleasesOnlyItsTenant(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, keyMsg(acme, "x-a1"), keyMsg(acme, "a-2"), keyMsg(globex, "x-g1"),
		keyMsg(globex, "g-2"))
	require.NoError(t, err)
	b := newBroker()
	b.setFail(rejectPrefix("x-"))
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Failed: 2, DeadLettered: 2}, res)

	n, err := e.ob.Tenant(acme).Discard(ctx, "x-a1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, map[string][2]int64{"acme/a-2": {1, 0}, "globex/g-2": {2, 1}}, e.seqs())

	res, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 1}, res)
	st, err := e.ob.Tenant(globex).Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked, "globex's key is still held by its own dead letter")
	require.EqualValues(t, 1, st.HeldByDeadLetter)
}

// The sweep promotes the first parked message of every (tenant, key) whose promotion was missed, including two
// tenants' messages of the same key.
func TestTenantKeysSweepPromotesEveryTenant(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, keyMsg(acme, "a-1"), keyMsg(acme, "a-2"), keyMsg(globex, "g-1"),
		keyMsg(globex, "g-2"))
	require.NoError(t, err)
	// The heads go as though published by a relay that died before promoting their keys' next messages.
	pgtest.Exec(t, e.pool, `DELETE FROM `+pgtest.Q(e.schema, "outbox")+` WHERE message_id IN ('a-1', 'g-1')`)
	require.Equal(t, map[string][2]int64{"acme/a-2": {1, 1}, "globex/g-2": {1, 1}}, e.seqs())

	b := newBroker()
	runRouter(t, e.relay(nil), b, nil) // a subscription sweeps when it starts
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 2 }, "both tenants' keys promoted")
}

// Migration 025 keeps the rows staged before it valid: counters and parked messages of a key shared by two tenants
// go on in order after it.
func TestTenantKeysMigrationKeepsRows(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	all, err := migrate.All()
	require.NoError(t, err)
	apply := func(keep func(v int) bool) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
				return err
			}
			for _, m := range all {
				if keep(m.Version) {
					if _, err := tx.Exec(ctx, m.SQL); err != nil {
						return err
					}
				}
			}
			return nil
		}))
	}
	apply(func(v int) bool { return v < 25 })
	// Before 025: one counter per key, whichever tenant staged; acme's head is pending, globex's next message
	// parked behind it (the old shared order), acme's own follower parked too.
	ob := pgtest.Q(schema, "outbox")
	pgtest.Exec(t, pool, `INSERT INTO `+pgtest.Q(schema, "outbox_keys")+` VALUES ('acc-1', 3)`)
	for _, r := range []struct {
		tenant, id string
		seq        int
		parked     bool
	}{{acme, "a-1", 1, false}, {globex, "g-1", 2, true}, {acme, "a-2", 3, true}} {
		next := "now()"
		if r.parked {
			next = "'infinity'"
		}
		pgtest.Exec(t, pool, `INSERT INTO `+ob+` (message_id, topic, payload, tenant_id, partition_key, seq,
			next_attempt_at, created_at)
			VALUES ($1::text, 'accounts', convert_to($1::text, 'UTF8'), $2, 'acc-1', $3, `+next+`, now())`,
			r.id, r.tenant, r.seq)
	}
	apply(func(v int) bool { return v >= 25 })
	e := setupOn(t, pool, schema, nil)
	require.Equal(t, map[string][2]int64{"acme/a-1": {1, 0}, "globex/g-1": {2, 0}, "acme/a-2": {3, 1}}, e.rawSeqs(),
		"globex's message no longer waits for acme's")

	_, err = e.ob.Stage(ctx, keyMsg(acme, "a-3"), keyMsg(globex, "g-2"), keyMsg(initech, "i-1"))
	require.NoError(t, err)
	seqs := e.seqs()
	require.Equal(t, [2]int64{3, 1}, seqs["acme/a-3"], "after acme's existing messages")
	require.Equal(t, [2]int64{2, 1}, seqs["globex/g-2"], "after globex's existing message")
	require.Equal(t, [2]int64{1, 0}, seqs["initech/i-1"], "a tenant new to the key is due at once")

	b := newBroker()
	res, err := e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 6, res.Published)
	order := firstOrder(b.snapshot())["acc-1"]
	require.Equal(t, []string{"a-1", "a-2", "a-3"}, filterPrefix(order, "a-"))
	require.Equal(t, []string{"g-1", "g-2"}, filterPrefix(order, "g-"))
}

const initech = "initech"
