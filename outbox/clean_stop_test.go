package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A service as the outbox README's "Lifecycle" describes it, on gochannel: a relay publishing through a router,
// inbox handlers consuming on the same router. It is stopped in the documented order while messages are being
// staged, relayed and handled, and while one handler waits to retry a failed message: neither stagehand nor
// Watermill logs an ERROR, and nothing prints a panic or a stack trace.
func TestCleanStopLogsNoError(t *testing.T) {
	t.Parallel()
	var captured logs
	pool, schema := pgtest.Migrated(t)
	e := setupOn(t, pool, schema, &outbox.Config{Logger: captured.logger()})
	pgtest.Exec(t, pool, "CREATE TABLE "+pgtest.Q(schema, "loans")+" (id text PRIMARY KEY)")
	relay := e.relay(func(c *outbox.RelayConfig) { c.Logger = captured.logger() })
	in, err := e.ob.NewInbox(&outbox.InboxConfig{RetryDelay: time.Minute})
	require.NoError(t, err)

	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, captured.watermillLogger())
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, captured.watermillLogger())
	require.NoError(t, err)
	held := make(chan struct{})
	relay.AddToRouter(router, &closingPublisher{broker: broker, held: held}, nil)
	var handled atomic.Int64
	router.AddConsumerHandler("loans", "loans", broker, in.Handler("loans",
		func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
			if string(msg.Payload) == "fails" {
				return errors.New("the catalogue is down") // waits a minute for its retry: the stop ends the wait
			}
			time.Sleep(2 * time.Millisecond)
			if _, err := tx.Exec(ctx, "INSERT INTO "+pgtest.Q(schema, "loans")+" VALUES ($1)", msg.UUID); err != nil {
				return err
			}
			handled.Add(1)
			return nil
		}))
	runCtx, cancelRun := context.WithCancel(context.Background())
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	t.Cleanup(func() { cancelRun(); _ = router.Close() })
	<-router.Running()

	ctx := context.Background()
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "loan-fails", Topic: "loans", Payload: []byte("fails")})
	require.NoError(t, err)
	staging, stopStaging := context.WithCancel(ctx)
	stagerDone := make(chan struct{})
	go func() { // the application keeps staging until it is stopped
		defer close(stagerDone)
		for i := 0; staging.Err() == nil; i++ {
			if _, err := e.ob.Stage(ctx, outbox.Message{ID: fmt.Sprintf("loan-%04d", i), Topic: "loans",
				Payload: []byte("ok")}); err != nil {
				t.Errorf("stage: %v", err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return handled.Load() >= 50 && len(captured.lines(false, "message_id=loan-fails", "retry_in=")) == 1
	}, "the service did not get going")

	// The documented order: stop producing; cancel the router's Run context and wait for Run to return (its
	// handlers, the relay subscription among them, end with it); close the relay, the Pub/Sub and the outbox;
	// the pool last.
	stopStaging()
	<-stagerDone
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "loan-at-stop", Topic: "loans", Payload: []byte("ok")})
	require.NoError(t, err)
	<-held // its publish waits for the stop, then fails as the Pub/Sub is closed
	start := time.Now()
	cancelRun()
	require.NoError(t, <-routerDone)
	require.Less(t, time.Since(start), 5*time.Second, "the handler waiting a minute to retry returned at once")
	require.NoError(t, relay.Close())
	require.NoError(t, broker.Close())
	require.NoError(t, e.ob.Close())

	for _, line := range captured.all() {
		require.NotContains(t, line, "level=ERROR", "a clean stop logs no error")
		for _, trace := range []string{"goroutine ", "panic", "Stack:", ".go:"} {
			require.NotContains(t, line, trace, "a clean stop prints no stack trace")
		}
	}
	require.NotEmpty(t, captured.lines(true, "Router closed"), "Watermill's log was captured")
	require.Zero(t, e.count("inbox", "message_id = 'loan-fails'"), "the failed message is not acknowledged")
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'loan-at-stop' AND attempts = 0 AND lease_owner IS NULL"),
		"a publish the stop failed is released, no attempt counted")
	require.EqualValues(t, 1, e.count("inbox_attempts", "message_id = 'loan-fails'"))
	// A connection whose statement a stop interrupted is closed by pgx in the background, then leaves the pool.
	pgtest.Eventually(t, 5*time.Second, func() bool { return pool.Stat().AcquiredConns() == 0 },
		"connections still acquired: %d", pool.Stat().AcquiredConns())
	t.Logf("handled %d messages; %d log lines, none an error", handled.Load(), len(captured.all()))
}

// closingPublisher publishes to broker, except "loan-at-stop": that publish waits until the relay subscription
// has ended, closes the Pub/Sub (as a router closing its consumers may) and then publishes, which fails with
// gochannel's "Pub/Sub closed".
type closingPublisher struct {
	broker *gochannel.GoChannel
	held   chan struct{}
}

func (p *closingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.UUID == "loan-at-stop" {
			close(p.held)
			<-m.Context().Done()
			_ = p.broker.Close()
		}
	}
	return p.broker.Publish(topic, msgs...)
}

func (p *closingPublisher) Close() error { return nil }
