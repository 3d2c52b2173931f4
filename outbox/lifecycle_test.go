package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Every background goroutine (claimers, workers, ackers, lease keepers, listeners, notifiers) ends with its
// owner; Close is safe to call twice; a closed relay refuses new subscriptions; a subscription ends with its
// context. Not parallel: the leak check sees the whole process.
func TestLifecycleLeavesNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("t", 20, func(i int) string { return string(rune('a' + i%3)) })...)
	require.NoError(t, err)

	r := e.relay(nil)
	subCtx, cancel := context.WithCancel(ctx)
	ch, err := r.Subscribe(subCtx, "t")
	require.NoError(t, err)
	first := <-ch
	first.Ack()
	<-ch // delivered, never answered: released on close
	cancel()
	for range ch { // the channel closes when the subscription's context ends
	}

	b := newBroker()
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 19, res.Published)

	router := runRouter(t, r, b, nil)
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "late", Topic: "t"})
	require.NoError(t, err)
	pgtest.Eventually(t, 5*time.Second, func() bool { return b.distinct() == 20 }, "router relay did not deliver")
	require.NoError(t, router.Close())
	res, err = r.Drain(ctx, b)
	require.NoError(t, err, "closing the router ends its subscription, not the relay")
	require.Zero(t, res.Published)

	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	_, err = r.Subscribe(ctx, "t")
	require.ErrorIs(t, err, outbox.ErrClosed)
	_, err = r.Drain(ctx, b)
	require.ErrorIs(t, err, outbox.ErrClosed)

	in, err := e.ob.NewInbox(nil)
	require.NoError(t, err)
	require.NoError(t, in.Handler("h", e.noop())(message.NewMessage("x", nil)))

	pub := e.ob.Publisher(ctx, e.pool)
	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close())
	require.ErrorIs(t, pub.Publish("t", message.NewMessage("y", nil)), outbox.ErrPublisherClosed)

	require.NoError(t, e.ob.Close())
	require.NoError(t, e.ob.Close())
	require.Zero(t, e.count("outbox", "lease_owner IS NOT NULL"), "closing released every lease")
}
