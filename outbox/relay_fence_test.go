package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// gate is a broker whose publishes wait until it is opened; entered receives every message that arrives.
type gate struct {
	*broker
	entered chan string
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{broker: newBroker(), entered: make(chan string, 100), open: make(chan struct{})}
}

func (g *gate) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		g.entered <- m.UUID
		<-g.open
	}
	return g.broker.Publish(topic, msgs...)
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (e *env) leaseToken(name string) int64 {
	return pgtest.Count(e.t, e.pool, `SELECT coalesce(max(token), 0) FROM `+pgtest.Q(e.schema, "leases")+
		` WHERE name = $1`, name)
}

// A leader whose lease was taken over while it was publishing: its late mark is rejected by the fence (even though
// its row lease has not lapsed) with a typed error, the message stays in the outbox, the demoted relay keeps
// contending, and the next leader takes the row over at once and publishes it.
func TestDemotedLeaderMarkIsRejectedAndTheNextLeaderDelivers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "m1", Topic: "orders", Payload: []byte("1")})
	require.NoError(t, err)

	markErrs := make(chan error, 10)
	leader := func(c *outbox.RelayConfig) {
		c.LeaderElection = "orders-relay"
		// Renewals every 10s: the relay does not notice the takeover by itself before its mark (a renewal that
		// noticed first would end the term and give the delivery up unmarked).
		c.LeaderTTL = 30 * time.Second
		c.ClaimDuration = time.Minute // the row lease would hold the message for a minute without the takeover
		c.Hooks.Marked = func(_ context.Context, _ int, _ time.Duration, err error) {
			if err != nil {
				markErrs <- err
			}
		}
	}
	g := newGate()
	defer g.release()
	a := e.relay(leader)
	runRouter(t, a, g, nil)
	select {
	case id := <-g.entered:
		require.Equal(t, "m1", id)
	case <-time.After(10 * time.Second):
		t.Fatal("the leader never delivered the message")
	}
	require.Equal(t, int64(1), e.leaseToken("orders-relay"))

	// The leader's lease lapses and another holder takes it: a higher fencing token.
	pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "leases")+` SET expires_at = now() WHERE name = $1`,
		"orders-relay")
	intruder, err := lease.New(e.pool, &lease.Config{Schema: e.schema, Owner: "intruder", TTL: time.Minute})
	require.NoError(t, err)
	held, ok, err := intruder.TryAcquire(ctx, "orders-relay")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(2), held.Token)

	// The broker accepts the demoted leader's publication; its mark must not go through.
	g.release()
	select {
	case err := <-markErrs:
		require.ErrorIs(t, err, outbox.ErrFenced)
		var fe *outbox.FencedError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "mark sent", fe.Op)
		require.Equal(t, int64(1), fe.Token)
		require.Equal(t, int64(2), fe.CurrentToken)
		require.Equal(t, "intruder", fe.CurrentOwner)
	case <-time.After(10 * time.Second):
		t.Fatal("the demoted leader's mark was not rejected")
	}
	require.Equal(t, int64(1), e.count("outbox", "message_id = 'm1'"), "the row is left for the new leader")
	require.Equal(t, int64(0), e.count("outbox_sent"))

	// A second relay joins; the intruder steps down. One of the two relays (the demoted one keeps contending)
	// leads with token 3 and publishes the message again at once, without waiting for the old row lease.
	b := setupOn(t, e.pool, e.schema, nil).relay(leader)
	runRouter(t, b, g, nil)
	require.NoError(t, intruder.Release(ctx, held))
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.count("outbox_sent", "message_id = 'm1'") == 1 },
		"the new leader did not deliver the message")
	require.Equal(t, int64(3), e.leaseToken("orders-relay"))
	require.Equal(t, int64(0), e.count("outbox"))
	require.Len(t, g.attemptsOf("m1"), 2, "published by the demoted leader and by the new one")
}

// The fence is the lease row's token, which no cleanup touches: after the outbox and its ledger were cleaned up,
// the next leader still gets a higher token, and a write with a stale token is still rejected.
func TestCleanupDoesNotResetTheFence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("orders", 3, nil)...)
	require.NoError(t, err)
	leader := func(c *outbox.RelayConfig) { c.LeaderElection = "orders-relay"; c.LeaderTTL = 2 * time.Second }
	b := newBroker()
	r := e.relay(leader)
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	require.Equal(t, int64(1), e.leaseToken("orders-relay"))

	deleted, err := e.ob.AllTenants().CleanupSent(ctx, -time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, int64(3), deleted)
	_, err = e.ob.AllTenants().CleanupInbox(ctx, -time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, int64(0), e.count("outbox")+e.count("outbox_sent"), "the outbox is empty")
	require.Equal(t, int64(1), e.leaseToken("orders-relay"), "cleanup left the fence alone")

	_, err = e.ob.Stage(ctx, outbox.Message{ID: "late", Topic: "orders"})
	require.NoError(t, err)
	res, err = setupOn(t, e.pool, e.schema, nil).relay(leader).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	require.Equal(t, int64(2), e.leaseToken("orders-relay"), "the token keeps increasing")
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	stale := lease.Lease{Name: "orders-relay", Owner: "anyone", Token: 1}
	require.ErrorIs(t, lease.CheckTx(ctx, tx, e.schema, stale), lease.ErrFenced)
}

// Leader election on a database that cannot fence (here: migrations not applied, so there is no leases table)
// refuses to start, naming the reason, instead of draining unfenced.
func TestLeaderElectionWithoutAFenceRefusesToStart(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	e := setupOn(t, pool, schema, nil)
	r := e.relay(func(c *outbox.RelayConfig) { c.LeaderElection = "orders-relay" })
	_, err := r.Subscribe(context.Background(), "orders")
	require.ErrorIs(t, err, outbox.ErrCannotFence)
	var ce *outbox.CannotFenceError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "leases")
	require.Equal(t, "orders-relay", ce.Lease)
	_, err = r.Drain(context.Background(), newBroker())
	require.ErrorIs(t, err, outbox.ErrCannotFence)

	// Without leader election the same relay settings start (and fail later on the missing outbox, as before).
	_, err = e.relay(nil).Drain(context.Background(), newBroker())
	require.False(t, errors.Is(err, outbox.ErrCannotFence))
}

// A drain under leader election leaves the outbox to a relay that leads it.
func TestDrainLeavesTheOutboxToTheLeader(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("orders", 2, nil)...)
	require.NoError(t, err)
	other, err := lease.New(e.pool, &lease.Config{Schema: e.schema, Owner: "other", TTL: time.Minute})
	require.NoError(t, err)
	_, ok, err := other.TryAcquire(ctx, "orders-relay")
	require.NoError(t, err)
	require.True(t, ok)
	res, err := e.relay(func(c *outbox.RelayConfig) { c.LeaderElection = "orders-relay" }).Drain(ctx, newBroker())
	require.ErrorIs(t, err, outbox.ErrNotLeader)
	require.Zero(t, res.Published)
	require.Equal(t, int64(2), e.count("outbox"))
}

// The single-writer opt-out runs unfenced and says so once.
func TestSingleWriterLogsOneWarning(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var buf syncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := e.relay(func(c *outbox.RelayConfig) { c.SingleWriter = true; c.Logger = logger })
	_, err := e.ob.Stage(context.Background(), msgs("orders", 2, nil)...)
	require.NoError(t, err)
	res, err := r.Drain(context.Background(), newBroker())
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "level=WARN"), out)
	require.Contains(t, out, "unfenced (SingleWriter)")
	require.Contains(t, out, "only relay")
}

func TestLeaderAndPartitionSettingsAreValidated(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]*outbox.RelayConfig{
		"SingleWriter":   {LeaderElection: "relay", SingleWriter: true},
		"LeaderTTL":      {LeaderTTL: time.Second},
		"LeaderElection": {LeaderElection: "  "},
		"Partitions":     {Partitions: 1000},
		"PartitionBy":    {PartitionBy: outbox.PartitionBy(7)},
	} {
		err := cfg.Validate()
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, field)
		var ce *outbox.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, field, ce.Field)
	}
	require.NoError(t, (&outbox.RelayConfig{LeaderElection: "relay", LeaderTTL: time.Second, Partitions: 8,
		PartitionBy: outbox.PartitionByTenant}).Validate())
	var short outbox.RelayConfig
	short.LeaderElection, short.LeaderTTL = "relay", time.Millisecond
	require.Error(t, short.Validate())
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A demoted leader's backoff (after a nack) and dead-letter move are fenced like its marks: rejected, logged with
// the typed error, and the row is left as it was for the new leader (no attempt counted, nothing dead-lettered).
func TestDemotedLeaderBackoffAndDeadLetterMoveAreRejected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		op      string
		retries int
	}{{"backoff", 5}, {"dead-letter move", 0}} {
		t.Run(tc.op, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			_, err := e.ob.Stage(ctx, outbox.Message{ID: "m1", Topic: "orders"})
			require.NoError(t, err)
			var buf syncBuffer
			r := e.relay(func(c *outbox.RelayConfig) {
				c.LeaderElection, c.LeaderTTL = "orders-relay", 30*time.Second
				c.MaxRetryCount = outbox.Retries(tc.retries)
				c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			})
			ch, err := r.Subscribe(ctx, "orders")
			require.NoError(t, err)
			var msg *message.Message
			select {
			case msg = <-ch:
			case <-time.After(10 * time.Second):
				t.Fatal("the leader delivered nothing")
			}
			pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "leases")+
				` SET owner = 'intruder', token = token + 1 WHERE name = 'orders-relay'`)
			outbox.RecordError(msg, errRejected)
			msg.Nack()
			pgtest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(buf.String(), "demoted") },
				"the rejected write was not logged")
			require.Contains(t, buf.String(), tc.op+" rejected")
			require.Equal(t, int64(1), e.count("outbox", "message_id = 'm1' AND attempts = 0 AND last_error IS NULL"))
			require.Equal(t, int64(0), e.count("outbox_dead_letters"))
		})
	}
}
