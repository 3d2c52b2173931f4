package e2ebench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/proof/natsjs"
)

// The broker: an in-process NATS server with JetStream (file storage), one stream and one durable consumer per
// path, wired as examples/orders wires it.

type broker struct {
	srv *server.Server
	dir string
}

// startBroker starts a NATS server with JetStream on a free port of 127.0.0.1, its store in a new temporary
// directory that stop removes.
func startBroker(logger *slog.Logger) (*broker, error) {
	dir, err := os.MkdirTemp("", "stagehand-e2ebench-nats-")
	if err != nil {
		return nil, fmt.Errorf("e2ebench: nats store directory: %w", err)
	}
	srv, err := natsjs.Start("e2ebench", server.RANDOM_PORT, dir, logger)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("e2ebench: %w", err)
	}
	return &broker{srv: srv, dir: dir}, nil
}

// URL is the client URL.
func (b *broker) URL() string { return b.srv.ClientURL() }

// stop shuts the server down and removes its store.
func (b *broker) stop() {
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	_ = os.RemoveAll(b.dir)
}

// consumerGroup is the durable consumer of a topic's stream.
func consumerGroup(topic string) string { return topic + "-consumer" }

// provision creates one stream per topic (file storage) and its durable push consumer, before anything publishes
// or subscribes.
func (b *broker) provision(ctx context.Context, topics ...string) error {
	nc, err := nats.Connect(b.URL(), nats.Name("e2ebench setup"))
	if err != nil {
		return fmt.Errorf("e2ebench: nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("e2ebench: nats: %w", err)
	}
	for _, topic := range topics {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:     topic,
			Subjects: []string{topic},
			Storage:  jetstream.FileStorage,
			MaxAge:   time.Hour,
		}); err != nil {
			return fmt.Errorf("e2ebench: nats: stream %s: %w", topic, err)
		}
		group := consumerGroup(topic)
		if _, err := js.CreateOrUpdatePushConsumer(ctx, topic, jetstream.ConsumerConfig{
			Durable:        group,
			DeliverSubject: "e2ebench.deliver." + group,
			DeliverGroup:   group,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        30 * time.Second,
			// A window of a few messages per subscription: a message's AckWait runs while it waits in the client,
			// so a deep window in front of a slower consumer turns into redeliveries, which would be measured.
			MaxAckPending: 4 * subscriptions,
		}); err != nil {
			return fmt.Errorf("e2ebench: nats: consumer %s: %w", group, err)
		}
	}
	return nil
}

// newPublisher is a JetStream publisher: Publish returns once the stream has stored the message.
func newPublisher(url, name string, logger watermill.LoggerAdapter) (*wmnats.Publisher, error) {
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL:         url,
		NatsOptions: []nats.Option{nats.Name(name), nats.MaxReconnects(-1)},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: nats publisher: %w", err)
	}
	return pub, nil
}

// subscriptions is how many messages a path's consumer handles at once.
const subscriptions = 16

// newSubscriber subscribes through topic's durable consumer (see provision), subscriptions messages in flight.
func newSubscriber(url, topic string, logger watermill.LoggerAdapter) (*wmnats.Subscriber, error) {
	group := consumerGroup(topic)
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: group,
		SubscribersCount: subscriptions,
		AckWaitTimeout:   30 * time.Second,
		CloseTimeout:     10 * time.Second,
		NakDelay:         wmnats.NewStaticDelay(100 * time.Millisecond),
		NatsOptions:      []nats.Option{nats.Name("e2ebench " + group), nats.MaxReconnects(-1)},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix:    group,
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck()},
			AckAsync:         true,
		},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: nats subscriber %s: %w", group, err)
	}
	return sub, nil
}
