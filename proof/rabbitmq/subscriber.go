package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Subscriber is watermill-amqp's Subscriber, made safe to use under the race detector across broker restarts.
// The connection, its reconnection, the queue's declaration, its QoS, the messages and their acknowledgements are
// all watermill-amqp's, from the Config given; what Subscriber adds is the order in which a subscription is torn
// down and set up again around a broken connection.
//
// watermill-amqp's subscription loop reads the connection's state (ConnectionWrapper.connected) 100 ms after its
// channel closed, while the connection's own goroutine replaces it on reconnecting, without synchronisation: the
// race detector reports that on every broker restart. Here each subscription is a watermill-amqp Subscriber on one
// shared connection; the moment that connection breaks, the Subscriber is closed (before its loop looks again),
// and once watermill-amqp has reconnected (it logs "Connected to AMQP", which Subscriber watches for) a new one
// subscribes.
type Subscriber struct {
	cfg    wamqp.Config
	logger watermill.LoggerAdapter
	conn   *wamqp.ConnectionWrapper

	mu          sync.Mutex
	reconnected chan struct{} // closed (and replaced) each time watermill-amqp has (re)connected

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// NewSubscriber connects and returns a Subscriber for cfg (cfg.Connection.AmqpURI is required;
// cfg.Connection.Reconnect defaults to a backoff from 100 ms to 1 s).
func NewSubscriber(cfg wamqp.Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := cfg.ValidateSubscriber(); err != nil {
		return nil, fmt.Errorf("rabbitmq: subscriber: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	if cfg.Connection.Reconnect == nil {
		cfg.Connection.Reconnect = &wamqp.ReconnectConfig{BackoffInitialInterval: 100 * time.Millisecond,
			BackoffRandomizationFactor: 0.5, BackoffMultiplier: 2, BackoffMaxInterval: time.Second}
	}
	s := &Subscriber{cfg: cfg, logger: logger, reconnected: make(chan struct{}), closing: make(chan struct{})}
	conn, err := wamqp.NewConnection(cfg.Connection, connectionLogger{LoggerAdapter: logger, s: s})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: subscriber: %w", err)
	}
	s.conn = conn
	return s, nil
}

// connectionLogger is the connection's logger: it tells the Subscriber when watermill-amqp has connected. The log
// line is written by the connection's goroutine after it replaced the connection and its state, so a subscription
// set up after it sees them (the race detector agrees).
type connectionLogger struct {
	watermill.LoggerAdapter
	s *Subscriber
}

func (l connectionLogger) Info(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Info(msg, fields)
	if msg == "Connected to AMQP" {
		l.s.mu.Lock()
		close(l.s.reconnected)
		l.s.reconnected = make(chan struct{})
		l.s.mu.Unlock()
	}
}

func (l connectionLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return connectionLogger{LoggerAdapter: l.LoggerAdapter.With(fields), s: l.s}
}

// Subscribe returns the messages of topic's queue, across reconnections, until ctx ends or the Subscriber closes.
// Like watermill-amqp's, it fails when it cannot declare and consume the queue now.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("rabbitmq: subscriber closed")
	default:
	}
	sess, err := s.open(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for {
			err := sess.forward(ctx, s.closing, out)
			if err == nil {
				return // ctx ended or the Subscriber closed
			}
			s.logger.Info("rabbitmq: subscription interrupted; subscribing again once reconnected",
				watermill.LogFields{"topic": topic, "error": err.Error()})
			wait := sess.reconnected
			for {
				select {
				case <-ctx.Done():
					return
				case <-s.closing:
					return
				case <-wait:
				}
				next, err := s.open(ctx, topic)
				if err == nil {
					sess = next
					break
				}
				// The new connection broke again, or the queue cannot be consumed: wait for the next connection
				// (the state of this one is read again only after watermill-amqp replaced it).
				s.logger.Info("rabbitmq: cannot subscribe yet", watermill.LogFields{"topic": topic,
					"error": err.Error()})
				s.mu.Lock()
				wait = s.reconnected
				s.mu.Unlock()
			}
		}
	}()
	return out, nil
}

// session is one subscription on one connection.
type session struct {
	msgs        <-chan *message.Message
	reconnected <-chan struct{} // closes when watermill-amqp has connected again after this session's connection
	stop        func()
	watched     chan struct{}
	cause       error // set by the watcher before watched closes
}

// open subscribes on the current connection.
func (s *Subscriber) open(ctx context.Context, topic string) (*session, error) {
	s.mu.Lock()
	reconnected := s.reconnected
	s.mu.Unlock()
	inner, err := wamqp.NewSubscriberWithConnection(s.cfg, s.logger, s.conn)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: subscribe to %s: %w", topic, err)
	}
	amqpConn := s.conn.Connection()
	if amqpConn == nil || amqpConn.IsClosed() {
		_ = inner.Close()
		return nil, errors.New("rabbitmq: not connected")
	}
	broken := amqpConn.NotifyClose(make(chan *amqp.Error, 1))
	msgs, err := inner.Subscribe(ctx, topic)
	if err != nil {
		_ = inner.Close()
		return nil, fmt.Errorf("rabbitmq: subscribe to %s: %w", topic, err)
	}
	// Close the inner subscriber the moment its connection breaks (not when the forwarding notices), so its
	// subscription loop ends before it would read the connection state again.
	stopped := make(chan struct{})
	sess := &session{msgs: msgs, reconnected: reconnected, stop: sync.OnceFunc(func() { close(stopped) }),
		watched: make(chan struct{})}
	go func() {
		defer close(sess.watched)
		select {
		case e := <-broken:
			sess.cause = amqp.ErrClosed
			if e != nil {
				sess.cause = e
			}
		case <-stopped:
		}
		_ = inner.Close() // the subscription only: the connection is shared and reconnects by itself
	}()
	return sess, nil
}

// forward passes the session's messages on until its connection breaks (the error says why), ctx ends or closing
// closes (nil).
func (sess *session) forward(ctx context.Context, closing <-chan struct{}, out chan<- *message.Message) error {
	defer func() {
		sess.stop()
		<-sess.watched
	}()
	for {
		select {
		case msg, ok := <-sess.msgs:
			if !ok {
				sess.stop()
				<-sess.watched
				if sess.cause != nil {
					return sess.cause
				}
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("rabbitmq: the subscription ended")
			}
			select {
			case out <- msg:
			case <-ctx.Done():
				msg.Nack()
				return nil
			case <-closing:
				msg.Nack()
				return nil
			}
		case <-ctx.Done():
			return nil
		case <-closing:
			return nil
		}
	}
}

// Close ends every subscription, waits for them and closes the connection. Safe to call twice.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return s.conn.Close()
}
