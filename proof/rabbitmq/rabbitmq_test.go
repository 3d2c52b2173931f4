package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/stagehand-es/stagehand/outbox"
)

func TestUnavailableClassifiesReachability(t *testing.T) {
	t.Parallel()
	for _, err := range []error{amqp.ErrClosed, &amqp.Error{Code: amqp.ConnectionForced},
		&amqp.Error{Code: amqp.ResourceError}, outbox.ErrBrokerUnavailable, context.DeadlineExceeded} {
		require.True(t, Unavailable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
	for _, err := range []error{errors.New("message too large"), &amqp.Error{Code: amqp.NotFound},
		&amqp.Error{Code: amqp.AccessRefused}, &amqp.Error{Code: amqp.PreconditionFailed}} {
		require.False(t, Unavailable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
}

// TestPublishAndConsumeAcrossACrash publishes through Publisher and consumes through Subscriber (watermill-amqp's,
// reconnecting) while the node is killed with SIGKILL and restarted: every message confirmed before, during and
// after the crash is consumed, publishes during the crash fail as "broker unavailable", and nothing is reported by
// the race detector.
func TestPublishAndConsumeAcrossACrash(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node, err := Start(ctx, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Stop()) }()

	cfg := wamqp.NewDurableQueueConfig(node.URL())
	pub, err := NewPublisher(PublisherConfig{URL: node.URL(), Exchange: func(string) string { return "" },
		RoutingKey: func(topic string) string { return topic }})
	require.NoError(t, err)
	defer pub.Close()
	sub, err := NewSubscriber(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "crash-test")
	require.NoError(t, err)

	var mu sync.Mutex
	got := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			mu.Lock()
			got[m.UUID] = true
			mu.Unlock()
			m.Ack()
		}
	}()

	confirmed := map[string]bool{}
	var unavailable int
	publish := func(phase string, n int) {
		for range n {
			m := message.NewMessage(watermill.NewUUID(), []byte("x"))
			switch err := pub.Publish("crash-test", m); {
			case err == nil:
				confirmed[m.UUID] = true
			case Unavailable(err):
				unavailable++
			default:
				t.Fatalf("publish %s: %v", phase, err)
			}
		}
	}
	publish("before the crash", 100)
	require.NoError(t, node.Kill())
	publish("while the node is down", 20) // unavailable, not rejected
	require.NoError(t, node.Restart(ctx))
	// A node that accepts connections again may, for a moment, route nothing to the durable queue (1 run in 8 saw
	// NO_ROUTE on the first publish after the restart): wait until a probe is routed, as a relay's retry would.
	require.Eventually(t, func() bool {
		return pub.Publish("crash-test", message.NewMessage(watermill.NewUUID(), []byte("probe"))) == nil
	}, time.Minute, 50*time.Millisecond, "a publish is routed to the queue after the restart")
	publish("after the restart", 100)
	require.Equal(t, 20, unavailable)
	require.Len(t, confirmed, 200)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range confirmed {
			if !got[id] {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "every confirmed message is consumed, across the crash")
	require.NoError(t, sub.Close())
	<-done
}

func TestPublishUnroutableIsARejection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node, err := Start(ctx, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Stop()) }()
	pub, err := NewPublisher(PublisherConfig{URL: node.URL(), Exchange: func(string) string { return "" },
		RoutingKey: func(topic string) string { return topic }})
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("no-such-queue", message.NewMessage(watermill.NewUUID(), nil))
	require.ErrorContains(t, err, "unroutable")
	require.False(t, Unavailable(err))
	err = pub.Publish("x", message.NewMessage(watermill.NewUUID(), nil)) // the channel is still usable
	require.ErrorContains(t, err, "unroutable")
	pub2, err := NewPublisher(PublisherConfig{URL: node.URL()}) // exchange named after the topic: none exists
	require.NoError(t, err)
	defer pub2.Close()
	err = pub2.Publish("no-such-exchange", message.NewMessage(watermill.NewUUID(), nil))
	require.Error(t, err)
	require.False(t, Unavailable(err), "%v", err)
}
