package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stagehand-es/stagehand/outbox"
)

// PublisherConfig configures NewPublisher. Only URL is required.
type PublisherConfig struct {
	// URL is the broker's AMQP URL.
	URL string
	// Exchange names the exchange a topic's messages go to, RoutingKey their routing key. Default: an exchange
	// named after the topic and an empty routing key (a fanout exchange, as watermill-amqp's durable Pub/Sub
	// configuration declares it).
	Exchange, RoutingKey func(topic string) string
	// Marshaler turns a Watermill message into an AMQP publishing. Default: watermill-amqp's DefaultMarshaler
	// (persistent delivery mode, the message UUID in a header), so watermill-amqp's Subscriber reads what this
	// publishes.
	Marshaler wamqp.Marshaler
	// ConfirmTimeout bounds the wait for the broker's confirmation; a publish that gets none in time fails with a
	// timeout (the relay's classifier treats it as "unreachable"). Default 5s.
	ConfirmTimeout time.Duration
	// Logger receives reconnections. Default: discarded.
	Logger *slog.Logger
}

// Publisher is a Watermill publisher for RabbitMQ that returns only once the broker has confirmed each message
// (publisher confirms): a message the broker has not taken responsibility for is never reported as published.
// Messages are published mandatory: one that no queue is bound for comes back from the broker and fails as a
// rejection (the relay counts an attempt) instead of being confirmed and dropped.
//
// It connects on first use and again after the connection broke, on the next Publish; while it cannot, Publish
// fails with an error wrapping outbox.ErrBrokerUnavailable, so a relay backs off without counting an attempt. Each
// concurrent Publish uses a channel of its own.
//
// It exists beside watermill-amqp's Publisher because that one's reconnection has a data race
// (ConnectionWrapper.connected is replaced on every broken connection while Publish reads it without
// synchronisation) which the race detector reports on every broker restart with a publish in flight; the fault
// suite restarts its broker under -race. The wire format is watermill-amqp's, through its Marshaler.
type Publisher struct {
	cfg PublisherConfig

	mu     sync.Mutex
	conn   *amqp.Connection
	idle   []*confirmChannel
	closed bool
}

// confirmChannel is a channel in confirm mode, its return notifications and the reason it closed.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// NewPublisher returns a Publisher; it connects on the first Publish.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq: PublisherConfig.URL is required")
	}
	if cfg.Exchange == nil {
		cfg.Exchange = func(topic string) string { return topic }
	}
	if cfg.RoutingKey == nil {
		cfg.RoutingKey = func(string) string { return "" }
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = wamqp.DefaultMarshaler{}
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg}, nil
}

// maxIdleChannels is how many confirm-mode channels are kept open between publishes.
const maxIdleChannels = 16

// Publish publishes msgs to topic's exchange, one after the other, each confirmed before the next.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if err := p.publish(topic, msg); err != nil {
			return err
		}
	}
	return nil
}

func (p *Publisher) publish(topic string, msg *message.Message) error {
	pub, err := p.cfg.Marshaler.Marshal(msg)
	if err != nil {
		return fmt.Errorf("rabbitmq: marshal message %s: %w", msg.UUID, err)
	}
	cc, err := p.channel()
	if err != nil {
		return err
	}
	ch := cc.ch
	exchange, key := p.cfg.Exchange(topic), p.cfg.RoutingKey(topic)
	ctx, cancel := context.WithTimeout(msg.Context(), p.cfg.ConfirmTimeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, pub)
	if err != nil {
		_ = ch.Close()
		return p.failed(fmt.Errorf("rabbitmq: publish message %s: %w", msg.UUID, err))
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		_ = ch.Close() // a late confirmation must not be taken for the next publish's
		return fmt.Errorf("rabbitmq: no confirmation for message %s within %s: %w", msg.UUID, p.cfg.ConfirmTimeout,
			err)
	}
	if !acked {
		_ = ch.Close()
		if ch.IsClosed() {
			// The reason says which: the connection broke (unavailable), or the broker closed the channel over
			// this message (a missing exchange is 404 NOT_FOUND: a rejection).
			var reason error = amqp.ErrClosed
			select {
			case e := <-cc.closed:
				if e != nil {
					reason = e
				}
			case <-time.After(100 * time.Millisecond):
			}
			return p.failed(fmt.Errorf("rabbitmq: message %s: the channel closed before the broker confirmed it: %w",
				msg.UUID, reason))
		}
		return fmt.Errorf("rabbitmq: the broker refused message %s (basic.nack)", msg.UUID)
	}
	select {
	case r := <-cc.returns: // the broker returns an unroutable message before it confirms it
		p.release(cc)
		return fmt.Errorf("rabbitmq: message %s is unroutable (%d %s): no queue is bound to exchange %q for "+
			"routing key %q", msg.UUID, r.ReplyCode, r.ReplyText, exchange, key)
	default:
	}
	p.release(cc)
	return nil
}

// failed marks err as "broker unavailable" when the connection is gone (the next Publish connects again).
func (p *Publisher) failed(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || p.conn.IsClosed() {
		return fmt.Errorf("%w: %w", outbox.ErrBrokerUnavailable, err)
	}
	return err
}

// channel returns an idle confirm-mode channel, or opens one (connecting first when needed).
func (p *Publisher) channel() (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("rabbitmq: publisher closed")
	}
	for len(p.idle) > 0 {
		cc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !cc.ch.IsClosed() {
			return cc, nil
		}
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second),
			Heartbeat: 10 * time.Second, Locale: "en_US"})
		if err != nil {
			return nil, fmt.Errorf("%w: rabbitmq: connect: %w", outbox.ErrBrokerUnavailable, err)
		}
		if p.conn != nil {
			p.cfg.Logger.Info("rabbitmq: publisher reconnected")
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		if p.conn.IsClosed() {
			return nil, fmt.Errorf("%w: rabbitmq: open a channel: %w", outbox.ErrBrokerUnavailable, err)
		}
		return nil, fmt.Errorf("rabbitmq: open a channel: %w", err)
	}
	return &confirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closed: ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

// release keeps a channel for the next publish, or closes it.
func (p *Publisher) release(cc *confirmChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleChannels || cc.ch.IsClosed() {
		_ = cc.ch.Close()
		return
	}
	p.idle = append(p.idle, cc)
}

// Close closes the channels and the connection. Publishes in flight fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cc := range p.idle {
		_ = cc.ch.Close()
	}
	p.idle = nil
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn.Close()
	}
	return nil
}
