package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// capture is a broker that keeps every published message.
type capture struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	return nil
}

func (c *capture) Close() error { return nil }

func (c *capture) take() []*message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.msgs
	c.msgs = nil
	return out
}

// redriveEnv has two inbox handlers on one topic: "ledger" (adds the payload's row to a table, failing while
// failing is set) and "audit" (counts its runs).
type redriveEnv struct {
	*env
	failing     atomic.Bool
	ledger      message.NoPublishHandlerFunc
	audit       message.NoPublishHandlerFunc
	auditRuns   atomic.Int32
	ledgerTable string
}

func setupRedrive(t *testing.T) *redriveEnv {
	t.Helper()
	e := &redriveEnv{env: setup(t)}
	e.ledgerTable = pgtest.Q(e.schema, "ledger")
	pgtest.Exec(t, e.pool, "CREATE TABLE "+e.ledgerTable+" (message_id text PRIMARY KEY, entry text NOT NULL)")
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	e.ledger = in.Handler("ledger", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		if e.failing.Load() {
			return errors.New("ledger unavailable")
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+e.ledgerTable+" VALUES ($1, $2)", msg.UUID, string(msg.Payload))
		return err
	})
	e.audit = in.Handler("audit", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		e.auditRuns.Add(1)
		return nil
	})
	return e
}

// deliver hands msg to both handlers, as a subscription of each would.
func (e *redriveEnv) deliver(t *testing.T, msg *message.Message) {
	t.Helper()
	require.NoError(t, e.ledger(msg.Copy()))
	require.NoError(t, e.audit(msg.Copy()))
}

func (e *redriveEnv) incoming(id string) *message.Message {
	m := message.NewMessage(id, []byte("entry-"+id))
	m.Metadata.Set(stagehand.HeaderTenantID, "acme")
	m.Metadata.Set(stagehand.HeaderMessageType, "bank.Credit")
	return m
}

func (e *redriveEnv) entries(t *testing.T) int64 {
	return pgtest.Count(t, e.pool, "SELECT count(*) FROM "+e.ledgerTable)
}

// An inbox dead letter redriven through the API is published again by the relay; its next delivery runs the
// dead-lettered handler once, under the original message ID, while the other handler on the topic skips the copy;
// further deliveries and a second redrive change nothing.
func TestInboxRedriveRunsTheHandlerOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRedrive(t)
	e.failing.Store(true)
	e.deliver(t, e.incoming("m-1")) // ledger fails: MaxAttempts 1 dead-letters it; audit handles it
	require.Equal(t, int32(1), e.auditRuns.Load())
	admin := e.ob.Tenant("acme")
	dl, err := admin.InboxDeadLetter(ctx, "ledger", "m-1")
	require.NoError(t, err)
	require.Equal(t, "ledger unavailable", dl.LastError)
	e.deliver(t, e.incoming("m-1")) // a redelivery of a dead-lettered message is skipped
	require.Zero(t, e.entries(t))

	e.failing.Store(false)
	n, err := e.ob.Tenant("other").RedriveInbox(ctx, "m-1")
	require.ErrorIs(t, err, outbox.ErrNotFound, "another tenant's scope does not reach it")
	require.Zero(t, n)
	var unknown *outbox.UnknownIDsError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []string{"m-1"}, unknown.IDs)
	n, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{Handler: "ledger", ID: "m-1",
		RedriveTopic: "credits"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = admin.InboxDeadLetter(ctx, "ledger", "m-1")
	require.ErrorIs(t, err, outbox.ErrNotFound, "the dead letter is gone")

	b := &capture{}
	_, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	copies := b.take()
	require.Len(t, copies, 1, "the redrive staged one copy")
	c := copies[0]
	require.NotEqual(t, "m-1", c.UUID)
	require.Equal(t, "m-1", c.Metadata.Get(outbox.HeaderInboxRedriveOf))
	require.Equal(t, "ledger", c.Metadata.Get(outbox.HeaderInboxRedriveHandler))
	require.Equal(t, "acme", c.Metadata.Get(stagehand.HeaderTenantID))

	e.deliver(t, c)
	require.Equal(t, int64(1), e.entries(t), "the handler ran again")
	require.Equal(t, int64(1), pgtest.Count(t, e.pool, "SELECT count(*) FROM "+e.ledgerTable+
		" WHERE message_id = 'm-1' AND entry = 'entry-m-1'"), "under the original ID, with the original payload")
	require.Equal(t, int32(1), e.auditRuns.Load(), "the other handler skipped the copy")
	e.deliver(t, c)
	e.deliver(t, e.incoming("m-1"))
	require.Equal(t, int64(1), e.entries(t), "effects applied once")

	_, err = admin.RedriveInbox(ctx, "m-1")
	require.ErrorIs(t, err, outbox.ErrNotFound, "a second redrive of a handled message does nothing")
	_, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Empty(t, b.take(), "nothing staged by the second redrive")
	st, err := admin.InboxStats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.DeadLettered)
	require.Zero(t, st.Failing)
}

// Redrive by filter (handler, message IDs) and all: each selects exactly its dead letters, in the scope.
func TestInboxRedriveByFilterAndAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRedrive(t)
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	fail := func(name string) message.NoPublishHandlerFunc {
		return in.Handler(name, func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
			return errors.New("no")
		})
	}
	for _, id := range []string{"a", "b", "c"} {
		require.NoError(t, fail("x")(e.incoming(id)))
		require.NoError(t, fail("y")(e.incoming(id)))
	}
	admin := e.ob.AllTenants()
	n, err := admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{Handler: "x", IDs: []string{"a",
		"b", "zzz"}, RedriveTopic: "t"})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{Handler: "y", RedriveTopic: "t"})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	left, err := admin.InboxDeadLetters(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, "x", left[0].Handler)
	require.Equal(t, "c", left[0].MessageID)
	_, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{})
	require.ErrorContains(t, err, "has no topic recorded", "no topic: nothing redriven")
	n, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{RedriveTopic: "t"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Zero(t, n)
	b := &capture{}
	_, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Len(t, b.take(), 6, "one copy per redriven dead letter")
}
