package faultsuite

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stagehand-es/stagehand/proof/rabbitmq"
)

// RabbitMQ: one durable topic exchange for every partition topic, and per partition one durable classic queue
// bound to its topic, with a single active consumer (x-single-active-consumer: of all the consumers of a queue,
// one receives, the others stand by) and a prefetch of 1 (one unacknowledged message at a time; a nacked one is
// requeued to its place at the head of the queue). Messages are persistent and every publish waits for the
// broker's confirmation. A second durable queue, bound to every partition topic and never consumed, keeps a copy
// of everything the broker took, in its order: the suite reads it at the end as it reads a JetStream stream.

const (
	rabbitExchange   = topicPrefix
	rabbitAuditQueue = topicPrefix + ".all"
)

type rabbitBroker struct {
	cfg  Config
	node *rabbitmq.Node
}

func startRabbitMQ(ctx context.Context, cfg Config, logger *slog.Logger) (*rabbitBroker, error) {
	node, err := rabbitmq.Start(ctx, logger)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: %w", err)
	}
	return &rabbitBroker{cfg: cfg, node: node}, nil
}

func (b *rabbitBroker) describe() string {
	return "one RabbitMQ node (the local rabbitmq-server, a child process), classic durable queues"
}

func (b *rabbitBroker) url() string { return b.node.URL() }

func (b *rabbitBroker) stop() error { return b.node.Stop() }

// queueArgs are the partition queues' arguments, the same for the declaration here and the subscriber's.
var queueArgs = amqp.Table{"x-single-active-consumer": true}

// rabbitConfig is the consumers' watermill-amqp configuration: the partition topic names the queue and the routing
// key it is bound with, on the one exchange.
func (b *rabbitBroker) rabbitConfig() wamqp.Config {
	cfg := wamqp.NewDurableTopicConfig(b.node.URL(), rabbitExchange, "")
	cfg.Exchange.Durable = true
	cfg.Queue.GenerateName = func(topic string) string { return topic }
	cfg.Queue.Arguments = queueArgs
	cfg.Consume.Qos.PrefetchCount = 1
	return cfg
}

func (b *rabbitBroker) channel() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(b.node.URL())
	if err != nil {
		return nil, nil, fmt.Errorf("faultsuite: rabbitmq: connect: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("faultsuite: rabbitmq: channel: %w", err)
	}
	return conn, ch, nil
}

// provision declares the exchange, the partition queues and the copy of everything, before anything publishes: a
// message published to an exchange with no queue bound for it is dropped by the broker (the relay's publisher
// publishes mandatory, so it would fail instead).
func (b *rabbitBroker) provision(context.Context) error {
	conn, ch, err := b.channel()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := ch.ExchangeDeclare(rabbitExchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: exchange: %w", err)
	}
	for _, topic := range partitionTopics(b.cfg.Partitions) {
		if _, err := ch.QueueDeclare(topic, true, false, false, false, queueArgs); err != nil {
			return fmt.Errorf("faultsuite: rabbitmq: queue %s: %w", topic, err)
		}
		if err := ch.QueueBind(topic, topic, rabbitExchange, false, nil); err != nil {
			return fmt.Errorf("faultsuite: rabbitmq: bind %s: %w", topic, err)
		}
	}
	if _, err := ch.QueueDeclare(rabbitAuditQueue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: queue %s: %w", rabbitAuditQueue, err)
	}
	if err := ch.QueueBind(rabbitAuditQueue, topicPrefix+".*", rabbitExchange, false, nil); err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: bind %s: %w", rabbitAuditQueue, err)
	}
	return nil
}

// fault kills the node with SIGKILL, waits outage, and starts it again on the same directory and ports.
func (b *rabbitBroker) fault(ctx context.Context, outage time.Duration, step func(string, ...any)) (brokerFault, error) {
	step("killing the RabbitMQ node with SIGKILL for %s", outage)
	killed := time.Now()
	if err := b.node.Kill(); err != nil {
		return brokerFault{}, fmt.Errorf("faultsuite: %w", err)
	}
	if err := sleep(ctx, outage); err != nil {
		return brokerFault{}, err
	}
	if err := b.node.Restart(ctx); err != nil {
		return brokerFault{}, fmt.Errorf("faultsuite: %w", err)
	}
	down := time.Since(killed)
	return brokerFault{what: "killed the RabbitMQ node with SIGKILL", down: down}, nil
}

func (b *rabbitBroker) subscriber(logger *slog.Logger) (message.Subscriber, error) {
	sub, err := rabbitmq.NewSubscriber(b.rabbitConfig(), watermill.NewSlogLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("faultsuite: %w", err)
	}
	return sub, nil
}

// settled reports whether the partition queues hold no message ready for delivery. The consumers' own count of
// handlers in progress completes it (what a queue has delivered and not yet had acknowledged is not in its ready
// count): see waitDrained.
func (b *rabbitBroker) settled(context.Context) (bool, string, error) {
	conn, ch, err := b.channel()
	if err != nil {
		return false, "", err
	}
	defer conn.Close()
	ready := 0
	for _, topic := range partitionTopics(b.cfg.Partitions) {
		q, err := ch.QueueDeclarePassive(topic, true, false, false, false, queueArgs)
		if err != nil {
			return false, "", fmt.Errorf("faultsuite: rabbitmq: queue %s: %w", topic, err)
		}
		ready += q.Messages
	}
	return ready == 0, fmt.Sprintf("%d messages ready in the partition queues", ready), nil
}

// readStored reads the copy of everything, in queue order.
func (b *rabbitBroker) readStored(ctx context.Context, fn func(storedCopy) error) error {
	conn, ch, err := b.channel()
	if err != nil {
		return err
	}
	defer conn.Close()
	q, err := ch.QueueDeclarePassive(rabbitAuditQueue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: queue %s: %w", rabbitAuditQueue, err)
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, rabbitAuditQueue, "faultsuite-check", false, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("faultsuite: rabbitmq: consume %s: %w", rabbitAuditQueue, err)
	}
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for read := uint64(0); read < uint64(q.Messages); {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("faultsuite: rabbitmq: the copy of everything closed after %d of %d messages", read,
					q.Messages)
			}
			read++
			id, _ := d.Headers[wamqp.DefaultMessageUUIDHeaderKey].(string)
			version, _ := d.Headers[HeaderVersion].(string)
			if err := fn(storedCopy{id: id, version: version, position: read}); err != nil {
				return err
			}
			if read%500 == 0 {
				if err := d.Ack(true); err != nil {
					return fmt.Errorf("faultsuite: rabbitmq: ack: %w", err)
				}
			}
		case <-timeout.C:
			return fmt.Errorf("faultsuite: rabbitmq: read %d of %d messages in 5 minutes", read, q.Messages)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// newRabbitMQPublisher is a relay process's publisher: confirmed, persistent (watermill-amqp's marshaler),
// mandatory, to the one exchange with the partition topic as routing key.
func newRabbitMQPublisher(url string, logger *slog.Logger) (message.Publisher, func(error) bool, error) {
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		URL:            url,
		Exchange:       func(string) string { return rabbitExchange },
		RoutingKey:     func(topic string) string { return topic },
		ConfirmTimeout: 5 * time.Second,
		Logger:         logger,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("faultsuite: %w", err)
	}
	return pub, rabbitmq.Unavailable, nil
}
