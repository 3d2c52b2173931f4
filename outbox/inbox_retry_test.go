package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A message that keeps failing behind a router on gochannel (which redelivers a nacked message at once) is retried
// after waits of RetryDelay, doubled per attempt up to MaxRetryDelay, then dead-lettered after MaxAttempts and
// acknowledged. Every failed attempt makes exactly one log line, the inbox's: Watermill logs no error for it.
func TestInboxRetriesBackOffThenDeadLetter(t *testing.T) {
	t.Parallel()
	var captured logs
	pool, schema := pgtest.Migrated(t)
	e := setupOn(t, pool, schema, &outbox.Config{Logger: captured.logger()})
	const delay, maxDelay = 60 * time.Millisecond, 120 * time.Millisecond
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 4, RetryDelay: delay, MaxRetryDelay: maxDelay,
		Jitter: 1e-9})
	require.NoError(t, err)
	var (
		mu       sync.Mutex
		attempts []time.Time
	)
	h := in.Handler("ledger", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return errors.New("ledger is read-only today")
	})
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, captured.watermillLogger())
	router, err := message.NewRouter(message.RouterConfig{}, captured.watermillLogger())
	require.NoError(t, err)
	router.AddConsumerHandler("ledger", "orders", broker, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = router.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()
	require.NoError(t, broker.Publish("orders", message.NewMessage("m1", []byte("x"))))

	pgtest.Eventually(t, 10*time.Second, func() bool { return e.count("inbox_dead_letters") == 1 }, "not dead-lettered")
	time.Sleep(3 * delay) // a redelivery after the dead letter would show here
	mu.Lock()
	got := append([]time.Time(nil), attempts...)
	mu.Unlock()
	require.Len(t, got, 4, "MaxAttempts runs, then acknowledged: no more redeliveries")
	for n, least := range []time.Duration{delay, 2 * delay, maxDelay} { // the third wait saturates at the cap
		require.GreaterOrEqual(t, got[n+1].Sub(got[n]), least, "the wait before attempt %d", n+2)
	}
	require.EqualValues(t, 1, e.count("inbox_dead_letters", "attempts = 4 AND last_error = 'ledger is read-only today'"))

	require.Len(t, captured.lines(false, "message_id=m1", "level=WARN"), 4, "one line per failed attempt:\n%s",
		captured.all())
	require.Len(t, captured.lines(false, "inbox handler failed; the message will be redelivered", "attempt=",
		"retry_in="), 3)
	require.Len(t, captured.lines(false, "inbox dead-lettered a message", "attempts=4"), 1)
	require.Empty(t, captured.lines(true, "level=ERROR"), "Watermill logs no error for a failure the inbox handled")
}

// A stop during the wait before a retry ends the wait at once: the message is nacked (redelivered later), not lost
// and not acknowledged.
func TestInboxRetryWaitEndsWithTheSubscription(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, &outbox.InboxConfig{RetryDelay: time.Minute}, nil)
	h := e.inbox.Handler("ledger", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return errors.New("not yet")
	})
	ctx, cancel := context.WithCancel(context.Background())
	msg := message.NewMessage("m1", nil)
	msg.SetContext(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	requireRetried(t, h(msg), msg)
	require.Less(t, time.Since(start), 10*time.Second, "the minute's wait ended with the subscription")
	require.EqualValues(t, 1, e.count("inbox_attempts", "attempts = 1"), "the failed attempt was counted")
	require.Zero(t, e.count("inbox"))
}

// A handler that blocks until its context ends is stopped by HandlerTimeout: its transaction is rolled back, its
// connection goes back to the pool, and the run counts as a failed attempt (here the only one: dead-lettered).
func TestInboxHandlerTimeoutFreesTheConnection(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, &outbox.InboxConfig{HandlerTimeout: 300 * time.Millisecond, MaxAttempts: 2}, nil)
	started := make(chan struct{}, 2)
	h := e.inbox.Handler("stuck", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher, _ *message.Message) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgtest.Q(e.schema, "payments")+" VALUES ('o-1', 1)"); err != nil {
			return err
		}
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	msg := message.NewMessage("m1", nil)
	errs := make(chan error, 1)
	go func() { errs <- h(msg) }()
	<-started
	require.EqualValues(t, 1, e.pool.Stat().AcquiredConns(), "the handler holds its transaction's connection")
	select {
	case err := <-errs:
		requireRetried(t, err, msg)
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's deadline did not end it")
	}
	require.Zero(t, e.pool.Stat().AcquiredConns(), "the connection is back in the pool")
	require.Zero(t, e.count("payments"), "rolled back")
	require.EqualValues(t, 1, e.count("inbox_attempts", "attempts = 1 AND last_error LIKE "+
		"'%ran past its HandlerTimeout (300ms)%context deadline exceeded%'"))

	msg = message.NewMessage("m1", nil)
	requireSettled(t, h(msg), msg, "the second timeout dead-letters")
	require.EqualValues(t, 1, e.count("inbox_dead_letters", "attempts = 2 AND payload = ''"),
		"a message without a payload is dead-lettered with an empty one")
	require.Zero(t, e.pool.Stat().AcquiredConns())
}

// The inbox's new settings are checked at construction, each error naming its field.
func TestInboxRetrySettingsAreValidated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for field, cfg := range map[string]*outbox.InboxConfig{
		"RetryDelay":    {RetryDelay: -time.Second},
		"MaxRetryDelay": {RetryDelay: time.Minute, MaxRetryDelay: time.Second},
		"Jitter":        {Jitter: 1.5},
	} {
		_, err := e.ob.NewInbox(cfg)
		var ce *outbox.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	}
	_, err := e.ob.NewInbox(&outbox.InboxConfig{HandlerTimeout: -1, RetryDelay: time.Hour})
	require.NoError(t, err, "a negative HandlerTimeout means none; MaxRetryDelay follows a longer RetryDelay")
}

// A stop while the handler runs (the message's context ends) counts no attempt: the message is nacked and nil is
// returned, whatever error the interrupted handler returns, so the router logs nothing for it.
func TestInboxStopDuringAHandlerRunCountsNothing(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	h := e.inbox.Handler("ledger", func(ctx context.Context, _ pgx.Tx, _ *outbox.Publisher, _ *message.Message) error {
		<-ctx.Done()
		return errors.New("the remote call was interrupted") // not a context error: a router would log it
	})
	ctx, cancel := context.WithCancel(context.Background())
	msg := message.NewMessage("m1", nil)
	msg.SetContext(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	requireRetried(t, h(msg), msg)
	require.Zero(t, e.count("inbox_attempts"), "a stop is not the message's failure")
	require.Zero(t, e.count("inbox"))
}
