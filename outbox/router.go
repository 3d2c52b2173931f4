package outbox

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RouterConfig configures AddToRouter. A nil *RouterConfig uses the defaults.
type RouterConfig struct {
	// HandlerName names the router handler. Default "stagehand-outbox-relay".
	HandlerName string
	// Topics limits the relay to these outbox topics. Default: every topic.
	Topics []string
	// Middlewares wrap the publishing handler, inside the step that records its error for the relay, so an error
	// they return (a circuit breaker's "open", say) is classified like a publish error. Watermill's Retry,
	// CircuitBreaker, Timeout or Throttle belong here rather than on the router, where the relay would only see a
	// Nack without its cause.
	Middlewares []message.HandlerMiddleware
}

// AddToRouter adds a handler to router that publishes every message this relay delivers to pub, on the topic it
// was staged for, with the same UUID, payload and metadata. A publish error is recorded (RecordError) and the
// message nacked, so the relay counts the attempt, or backs off without counting it when the broker is
// unreachable. Run the router to run the relay; closing the router ends the handler's subscription (the relay itself
// stays open until its own Close). A publish that fails after the subscription ended (a stopping router may have
// closed the publisher) counts no attempt and logs no error: the message is released, for a later run. See the
// outbox README's Lifecycle for the order in which to stop a router, a relay and a gochannel Pub/Sub.
func (r *Relay) AddToRouter(router *message.Router, pub message.Publisher, cfg *RouterConfig) *message.Handler {
	var c RouterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.HandlerName == "" {
		c.HandlerName = "stagehand-outbox-relay"
	}
	var h message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		topic, _ := DestinationTopic(msg)
		out := message.NewMessage(msg.UUID, msg.Payload)
		out.Metadata = maps.Clone(msg.Metadata)
		if out.Metadata == nil {
			out.Metadata = message.Metadata{}
		}
		out.SetContext(msg.Context())
		return nil, pub.Publish(topic, out)
	}
	for i := len(c.Middlewares) - 1; i >= 0; i-- {
		h = c.Middlewares[i](h)
	}
	inner := h
	recorder := func(msg *message.Message) ([]*message.Message, error) {
		produced, err := inner(msg)
		if err != nil && msg.Context().Err() != nil {
			// The relay subscription ended while the message was being published (the router is stopping,
			// and may have closed the publisher too: a gochannel Pub/Sub it consumes). The relay releases the
			// message without counting an attempt; the error goes back as a cancellation, which the router does
			// not log.
			return nil, fmt.Errorf("outbox: relay subscription ended during the publish (%w): %w", context.Canceled,
				err)
		}
		if err != nil {
			RecordError(msg, err)
		}
		return produced, err
	}
	return router.AddConsumerHandler(c.HandlerName, "stagehand-outbox", &topicSubscriber{r: r, topics: c.Topics},
		func(msg *message.Message) error {
			_, err := recorder(msg)
			return err
		})
}

// topicSubscriber subscribes to a fixed topic set whatever topic the router asks for. Its Close, which the router
// calls when it closes, ends only the subscriptions it made, not the relay.
type topicSubscriber struct {
	r      *Relay
	topics []string

	mu     sync.Mutex
	closed bool
	subs   []*group
}

func (t *topicSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	out, sub, err := t.r.subscribe(ctx, t.topics)
	if err != nil {
		return nil, err
	}
	t.subs = append(t.subs, sub)
	return out, nil
}

func (t *topicSubscriber) Close() error {
	t.mu.Lock()
	t.closed = true
	subs := t.subs
	t.subs = nil
	t.mu.Unlock()
	for _, s := range subs {
		s.cancel()
	}
	for _, s := range subs {
		<-s.ended
	}
	return nil
}
