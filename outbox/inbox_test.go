package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// inboxEnv has a table the handler changes and an inbox.
type inboxEnv struct {
	*env
	inbox *outbox.Inbox
	calls atomic.Int64
}

func setupInbox(t *testing.T, cfg *outbox.InboxConfig, clock func() time.Time) *inboxEnv {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock})
	pgtest.Exec(t, pool, "CREATE TABLE "+pgtest.Q(schema, "payments")+" (order_id text PRIMARY KEY, amount int NOT NULL)")
	if cfg == nil {
		cfg = &outbox.InboxConfig{}
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Millisecond // the tests call handlers directly: no real backoff to wait
	}
	in, err := e.ob.NewInbox(cfg)
	require.NoError(t, err)
	return &inboxEnv{env: e, inbox: in}
}

// payHandler records a payment and publishes PaymentTaken, both in the inbox transaction.
func (e *inboxEnv) payHandler(hold time.Duration) outbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher, msg *message.Message) error {
		e.calls.Add(1)
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgtest.Q(e.schema, "payments")+" VALUES ($1, 10) "+
			"ON CONFLICT (order_id) DO UPDATE SET amount = payments.amount + 10", string(msg.Payload)); err != nil {
			return err
		}
		time.Sleep(hold)
		produced := message.NewMessage("payment-for-"+msg.UUID, msg.Payload)
		produced.Metadata.Set(stagehand.HeaderMessageType, "payments.PaymentTaken")
		return out.Publish("payments", produced)
	}
}

// Contract 7: the same message delivered three times concurrently, then three times sequentially, changes the
// handler's table once and stages the message it produced once, with causation = the incoming message and the
// correlation carried over.
func TestInboxHandlesAMessageOnce(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	h := e.inbox.Handler("payments", e.payHandler(200*time.Millisecond))
	incoming := func() *message.Message {
		m := message.NewMessage("order-placed-1", []byte("order-1"))
		m.Metadata.Set(stagehand.HeaderCorrelationID, "checkout-77")
		m.Metadata.Set(stagehand.HeaderTenantID, "acme")
		return m
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- h(incoming())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for range 3 {
		require.NoError(t, h(incoming()))
	}
	var amount int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT amount FROM "+pgtest.Q(e.schema, "payments")).
		Scan(&amount))
	require.Equal(t, 10, amount, "the handler's effect applied once")
	require.EqualValues(t, 1, e.count("outbox"), "the produced message staged once")
	var causation, correlation, tenant string
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT causation_id, correlation_id, tenant_id FROM "+
		pgtest.Q(e.schema, "outbox")).Scan(&causation, &correlation, &tenant))
	require.Equal(t, "order-placed-1", causation)
	require.Equal(t, "checkout-77", correlation)
	require.Equal(t, "acme", tenant)
	// A second handler name is a second consumer: it handles the message too.
	require.NoError(t, e.inbox.Handler("audit", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return nil
	})(incoming()))
	require.EqualValues(t, 2, e.count("inbox"))
}

// The same, through a Watermill router consuming a broker that redelivers.
func TestInboxBehindARouter(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddConsumerHandler("payments", "orders", broker, e.inbox.Handler("payments", e.payHandler(0)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = router.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()
	for range 3 {
		require.NoError(t, broker.Publish("orders", message.NewMessage("m1", []byte("order-9"))))
	}
	pgtest.Eventually(t, 5*time.Second, func() bool { return e.calls.Load() >= 1 && e.count("inbox") == 1 },
		"not handled")
	time.Sleep(200 * time.Millisecond)
	require.EqualValues(t, 1, e.calls.Load(), "duplicates never reach the handler")
	require.EqualValues(t, 1, e.count("outbox"))
}

// A failed handler rolls back everything it did, so the message is retried; the failure is counted.
func TestInboxRollsBackAFailedHandler(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	fail := true
	pay := e.payHandler(0)
	h := e.inbox.Handler("payments", func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message) error {
		if err := pay(ctx, tx, out, msg); err != nil {
			return err
		}
		if fail {
			return errors.New("ledger service timed out")
		}
		return nil
	})
	msg := message.NewMessage("m1", []byte("order-1"))
	requireRetried(t, h(msg), msg)
	require.Zero(t, e.count("payments"))
	require.Zero(t, e.count("outbox"))
	require.Zero(t, e.count("inbox"))
	require.EqualValues(t, 1, e.count("inbox_attempts", "attempts = 1 AND last_error = 'ledger service timed out'"))
	st, err := e.ob.AllTenants().InboxStats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Failing)

	fail = false
	msg = message.NewMessage("m1", []byte("order-1"))
	requireSettled(t, h(msg), msg)
	require.EqualValues(t, 1, e.count("payments"))
	require.EqualValues(t, 1, e.count("outbox"))
	require.Zero(t, e.count("inbox_attempts"), "a success forgets the failures")
}

// Contract 8 on the consumer side: a message that keeps failing, cannot be decoded or has an unknown type ends in
// the inbox dead letters with its error and is acknowledged, so it stops blocking the subscription; redeliveries
// are then skipped.
func TestInboxDeadLettersWhatCannotBeHandled(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, &outbox.InboxConfig{MaxAttempts: 3}, nil)
	ctx := context.Background()

	var calls atomic.Int64
	always := e.inbox.Handler("flaky", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		calls.Add(1)
		return errors.New("downstream rejected it")
	})
	deliver := func() (*message.Message, error) {
		msg := message.NewMessage("m1", []byte("x"))
		return msg, always(msg)
	}
	msg, err := deliver()
	requireRetried(t, err, msg)
	msg, err = deliver()
	requireRetried(t, err, msg)
	msg, err = deliver()
	requireSettled(t, err, msg, "the third failure dead-letters and acknowledges")
	msg, err = deliver()
	requireSettled(t, err, msg, "a redelivery is skipped")
	require.EqualValues(t, 3, calls.Load())

	type OrderPlaced struct {
		OrderID string `json:"order_id"`
		Amount  int    `json:"amount"`
	}
	hs := outbox.NewHandlers(nil, false)
	var got []OrderPlaced
	outbox.Handle(hs, "orders.OrderPlaced", func(_ context.Context, _ pgx.Tx, _ *outbox.Publisher,
		_ *message.Message, v OrderPlaced) error {
		got = append(got, v)
		return nil
	})
	typed := e.inbox.Handler("typed", hs.Func())
	ok := message.NewMessage("t1", []byte(`{"order_id":"o-1","amount":5}`))
	ok.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderPlaced")
	require.NoError(t, typed(ok))
	require.Equal(t, []OrderPlaced{{OrderID: "o-1", Amount: 5}}, got)

	garbled := message.NewMessage("t2", []byte(`{"order_id":`))
	garbled.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderPlaced")
	require.NoError(t, typed(garbled), "undecodable: dead-lettered at once")
	unknown := message.NewMessage("t3", []byte(`{}`))
	unknown.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderShipped")
	require.NoError(t, typed(unknown), "unknown type: dead-lettered at once")
	require.Len(t, got, 1)

	dead, err := e.ob.AllTenants().InboxDeadLetters(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 3)
	byID := map[string]outbox.InboxDeadLetter{}
	for _, d := range dead {
		byID[d.MessageID] = d
	}
	require.Equal(t, 3, byID["m1"].Attempts)
	require.Equal(t, "downstream rejected it", byID["m1"].LastError)
	require.Contains(t, byID["t2"].LastError, outbox.ErrUndecodable.Error())
	require.Contains(t, byID["t3"].LastError, outbox.ErrUnknownMessageType.Error())
	require.Equal(t, `{"order_id":`, string(byID["t2"].Payload), "the message is kept to look at")
	require.Equal(t, "orders.OrderPlaced", byID["t2"].MessageType)

	st, err := e.ob.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.InboxStats{Handled: 1, DeadLettered: 3}, withoutAge(st))
	n, err := e.ob.AllTenants().DiscardInbox(ctx, "t3")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = e.ob.AllTenants().DiscardInbox(ctx, "t3")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.Zero(t, n)

	ignoring := e.inbox.Handler("lenient", outbox.NewHandlers(nil, true).Func())
	require.NoError(t, ignoring(unknown))
	require.EqualValues(t, 1, e.count("inbox", "handler = 'lenient' AND outcome = 'handled'"))
}

func withoutAge(s outbox.InboxStats) outbox.InboxStats {
	s.OldestEntryAge = 0
	return s
}

// The middleware form: the transaction and publisher come from the message context; returning messages to the
// router is refused, since a router would publish them after the commit.
func TestInboxMiddleware(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	mw := e.inbox.Middleware("mw")
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := outbox.InboxTx(msg.Context())
		require.True(t, ok)
		out, ok := outbox.InboxPublisher(msg.Context())
		require.True(t, ok)
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+pgtest.Q(e.schema, "payments")+" VALUES ($1, 1)",
			msg.UUID); err != nil {
			return nil, err
		}
		return nil, out.Publish("t", message.NewMessage("out-"+msg.UUID, nil))
	})
	_, err := h(message.NewMessage("a", nil))
	require.NoError(t, err)
	_, err = h(message.NewMessage("a", nil))
	require.NoError(t, err)
	require.EqualValues(t, 1, e.count("payments"))
	require.EqualValues(t, 1, e.count("outbox"))

	returning := mw(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("x", nil)}, nil
	})
	b := message.NewMessage("b", nil)
	_, err = returning(b)
	requireRetried(t, err, b, "refused, and retried")
	require.EqualValues(t, 1, e.count("inbox_attempts", "message_id = 'b' AND last_error LIKE '%InboxPublisher%'"))
	require.EqualValues(t, 0, e.count("inbox", "message_id = 'b'"))
}

// Inbox cleanup removes entries older than the retention (default DefaultInboxRetention), per scope.
func TestInboxStatsAndCleanup(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	e := setupInbox(t, nil, clock)
	ctx := context.Background()
	noop := e.inbox.Handler("h", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error { return nil })
	for _, id := range []string{"a", "b", "c"} {
		m := message.NewMessage(id, nil)
		if id == "c" {
			m.Metadata.Set(stagehand.HeaderTenantID, "acme")
		}
		require.NoError(t, noop(m))
	}
	now.Add(int64(3 * 24 * time.Hour))
	require.NoError(t, noop(message.NewMessage("d", nil)))
	now.Add(int64(5 * 24 * time.Hour)) // a, b, c are 8 days old, d is 5

	st, err := e.ob.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, st.Handled)
	require.Equal(t, 8*24*time.Hour, st.OldestEntryAge)

	n, err := e.ob.Tenant("acme").CleanupInbox(ctx, 0, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only acme's entry")
	n, err = e.ob.AllTenants().CleanupInbox(ctx, 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the default retention (7 days) removes a and b, in batches of one")
	require.EqualValues(t, 1, e.count("inbox"))
	require.NoError(t, noop(message.NewMessage("d", nil)))
	require.EqualValues(t, 1, e.count("inbox"), "d is still remembered")
}
