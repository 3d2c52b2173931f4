package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/outbox"
)

// The broker: NATS JetStream, through watermill-nats. Nothing in stagehand is NATS-specific: the relay takes any
// Watermill publisher and the inbox wraps handlers of any Watermill subscriber.

// embeddedNATS is an in-process NATS server with JetStream, for running the example with no setup.
type embeddedNATS struct {
	srv     *server.Server
	dir     string
	ownsDir bool
}

// startNATS starts a NATS server with JetStream on a free port of 127.0.0.1, storing its streams in dir (a new
// temporary directory, removed by stop, when dir is empty).
func startNATS(dir string, logger *slog.Logger) (*embeddedNATS, error) {
	e := &embeddedNATS{dir: dir}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "orders-example-nats-")
		if err != nil {
			return nil, fmt.Errorf("nats: storage directory: %w", err)
		}
		e.dir, e.ownsDir = tmp, true
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "orders-example",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   e.dir,
		NoSigs:     true, // Ctrl-C is this program's to handle
	})
	if err != nil {
		e.removeDir()
		return nil, fmt.Errorf("nats: %w", err)
	}
	srv.SetLoggerV2(natsLogger{logger}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		e.removeDir()
		return nil, errors.New("nats: the embedded server was not ready within 10s")
	}
	e.srv = srv
	return e, nil
}

// URL is the client URL of the server.
func (e *embeddedNATS) URL() string { return e.srv.ClientURL() }

// stop shuts the server down, waits for it, and removes the storage directory it created.
func (e *embeddedNATS) stop() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.removeDir()
}

func (e *embeddedNATS) removeDir() {
	if e.ownsDir {
		_ = os.RemoveAll(e.dir)
	}
}

// subscription is a consumer group reading a topic.
type subscription struct{ topic, group string }

// provisionBroker creates (or updates) one JetStream stream per topic and one durable consumer per subscription,
// before anything publishes or subscribes. Like the database migrations, it is an explicit step, safe to repeat:
//
//   - a publish to a subject that no stream listens on fails, so the streams must exist before the relay runs;
//   - a durable consumer that the NATS client creates itself at subscription is deleted again when the
//     subscription closes, and a new one would replay the whole stream; created here, it outlives the process, and
//     a restarted consumer resumes where its group left off.
func provisionBroker(ctx context.Context, url string, subs []subscription) error {
	nc, err := nats.Connect(url, nats.Name("orders-example setup"))
	if err != nil {
		return fmt.Errorf("nats: connect to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	for _, sub := range subs {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:     sub.topic,
			Subjects: []string{sub.topic + ".*"}, // its partitions (partitions.go)
			Storage:  jetstream.FileStorage,
			MaxAge:   24 * time.Hour, // consumers ack within seconds; a day is plenty for a demo
		}); err != nil {
			return fmt.Errorf("nats: stream %s: %w", sub.topic, err)
		}
		for p := range partitions {
			subject := partitionSubject(sub.topic, p)
			if _, err := js.CreateOrUpdatePushConsumer(ctx, sub.topic, jetstream.ConsumerConfig{
				Durable:        sub.group + "-" + partitionName(subject),
				FilterSubject:  subject,
				DeliverSubject: "orders-example.deliver." + sub.group + "." + subject,
				DeliverGroup:   sub.group, // the group's processes share the messages
				DeliverPolicy:  jetstream.DeliverAllPolicy,
				AckPolicy:      jetstream.AckExplicitPolicy,
				AckWait:        30 * time.Second, // unacknowledged for this long: delivered again
				// One unacknowledged message at a time across the whole group: the next message of the
				// partition is delivered only once this one is acknowledged, and a nacked or timed-out one is
				// delivered again before any later one. That is what carries each key's order (the stream's
				// order) to the handler, whatever the number of subscribers and processes; without it they hand a
				// key's messages to handlers concurrently and redeliveries overtake. It caps a group at one
				// message in flight per partition (see partitions.go).
				MaxAckPending: 1,
			}); err != nil {
				return fmt.Errorf("nats: consumer %s on %s: %w", sub.group, subject, err)
			}
		}
	}
	return nil
}

// newPublisher is the relay's JetStream publisher: Publish returns once the stream has stored the message.
//
// JetStream can also drop duplicate publishes by message ID (TrackMsgId, within the stream's duplicate window,
// two minutes by default); it is left off here so that the duplicates this example injects reach the consumers
// and the inbox has something to do. The inbox is what covers duplicates arriving after any such window.
func newPublisher(url string, logger watermill.LoggerAdapter) (*wmnats.Publisher, error) {
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL:         url,
		NatsOptions: []nats.Option{nats.Name("orders-example relay"), nats.MaxReconnects(-1)},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("nats publisher: %w", err)
	}
	return pub, nil
}

// newSubscriber subscribes a consumer group through its durable JetStream consumer (see provisionBroker): every
// process running the group shares its messages (a queue group of the same name).
func newSubscriber(url, group string, logger watermill.LoggerAdapter) (*wmnats.Subscriber, error) {
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: group,
		SubscribersCount: 8, // messages of this process handled at once, per topic
		AckWaitTimeout:   30 * time.Second,
		CloseTimeout:     10 * time.Second,
		NakDelay:         wmnats.NewStaticDelay(250 * time.Millisecond), // a failed message comes back after this
		NatsOptions:      []nats.Option{nats.Name("orders-example " + group), nats.MaxReconnects(-1)},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix: group,
			// The durable consumer of each partition the group reads: group-p0, group-p1, ...
			DurableCalculator: func(prefix, subject string) string { return prefix + "-" + partitionName(subject) },
			SubscribeOptions:  []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck()},
			AckAsync:          true, // a lost ack means a redelivery, which the inbox absorbs
		},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("nats subscriber %s: %w", group, err)
	}
	return sub, nil
}

// natsUnavailable is the relay's RelayConfig.IsBrokerUnavailable: besides what outbox.BrokerUnavailable knows
// (refused connections, dial timeouts, open circuit breakers), the NATS client's own errors for a server it cannot
// reach. The relay then pauses without counting an attempt against the message, so an outage fills no dead letters.
func natsUnavailable(err error) bool {
	return outbox.BrokerUnavailable(err) ||
		errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded)
}

// countingPublisher is the relay's view of the broker: it publishes to NATS and counts what the broker took. With
// a duplicate rate above zero it publishes that fraction of messages a second time, which is what happens when a
// relay dies after the broker stored a message but before the outbox marked it sent: the consumers' inbox must
// absorb them.
type countingPublisher struct {
	next          message.Publisher
	duplicateRate float64
	stats         *stats
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, msg := range msgs {
		p.stats.published(msg, false)
		if p.duplicateRate > 0 && rand.Float64() < p.duplicateRate {
			if err := p.next.Publish(topic, msg); err == nil {
				p.stats.published(msg, true)
			}
		}
	}
	return nil
}

func (p *countingPublisher) Close() error { return nil } // the NATS publisher is closed by its owner

// natsLogger sends the embedded server's log lines to the example's logger (silent unless -v; its notices, such as
// the start-up banner, at debug level).
type natsLogger struct{ l *slog.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
