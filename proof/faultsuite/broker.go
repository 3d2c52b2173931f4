package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/proof/natsjs"
)

// The broker: an in-process NATS server with JetStream, which the suite can stop and start again on the same port
// and store directory (the streams and the durable consumer survive, as they would a broker restart).

const (
	streamName    = "faults"
	consumerGroup = "faults-consumer"
)

type broker struct {
	logger *slog.Logger
	port   int
	dir    string

	mu  sync.Mutex
	srv *server.Server
}

// startBroker starts a NATS server on a free port of 127.0.0.1 with its JetStream store in a new temporary
// directory, which stop removes (and, should this process die first, a watchdog process removes).
func startBroker(logger *slog.Logger) (*broker, error) {
	dir, err := os.MkdirTemp("", "stagehand-faults-nats-")
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats store directory: %w", err)
	}
	if err := removeWhenDead(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	b := &broker{logger: logger, port: port, dir: dir}
	if err := b.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// URL is the client URL; it stays the same across restarts.
func (b *broker) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", b.port) }

// start starts the server (again) on the broker's port and store directory.
func (b *broker) start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		return errors.New("faultsuite: the nats server is already running")
	}
	srv, err := natsjs.Start("faultsuite", b.port, b.dir, b.logger)
	if err != nil {
		return fmt.Errorf("faultsuite: %w", err)
	}
	b.srv = srv
	return nil
}

// shutdown stops the server and waits for it; clients see their connection drop and reconnect later.
func (b *broker) shutdown() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		b.srv = nil
	}
}

// stop shuts the server down for good and removes its store.
func (b *broker) stop() error {
	b.shutdown()
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("faultsuite: remove %s: %w", b.dir, err)
	}
	return nil
}

// provision creates the stream (file storage, every message kept: the check reads it all afterwards) and the
// consumers' durable push consumer, as examples/orders does: created up front, the consumer outlives the
// subscriptions and keeps its position across broker restarts.
func (b *broker) provision(ctx context.Context) error {
	nc, err := nats.Connect(b.URL(), nats.Name("faultsuite setup"))
	if err != nil {
		return fmt.Errorf("faultsuite: nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("faultsuite: nats: %w", err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     streamName,
		Subjects: []string{Topic},
		Storage:  jetstream.FileStorage,
		// No duplicate window matters: publishes carry no Nats-Msg-Id (TrackMsgId is off), so every copy a relay
		// publishes is stored and counted.
	}); err != nil {
		return fmt.Errorf("faultsuite: nats: stream: %w", err)
	}
	if _, err := js.CreateOrUpdatePushConsumer(ctx, streamName, jetstream.ConsumerConfig{
		Durable:        consumerGroup,
		DeliverSubject: "faultsuite.deliver." + consumerGroup,
		DeliverGroup:   consumerGroup,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        consumerAckWait,
		// At most this many deliveries unacknowledged at once. A message waits in the client for the ones before
		// it, and its AckWait runs while it waits: with thousands pushed ahead of a consumer that handles tens a
		// second (a loaded machine), every one of them outlived its AckWait and was delivered again, and the
		// copies, skipped by the inbox one transaction each, took the consumer's time (measured: 4,000 of 4,096
		// pending redelivered, handling down to ~40/s). A window of a few per subscription keeps the wait far
		// below AckWait.
		MaxAckPending: consumerMaxAckPending,
	}); err != nil {
		return fmt.Errorf("faultsuite: nats: consumer: %w", err)
	}
	return nil
}

// consumerAckWait is how long a delivered, unacknowledged message waits before JetStream delivers it again. Short,
// so that deliveries whose acknowledgement was lost in the broker outage come back soon after it.
const consumerAckWait = 5 * time.Second

// consumerSubscriptions is the number of subscriptions (messages handled at once) of the consumers, and
// consumerMaxAckPending the durable consumer's window: four waiting per subscription.
const (
	consumerSubscriptions = 16
	consumerMaxAckPending = 4 * consumerSubscriptions
)

// newPublisher is a relay process's JetStream publisher. It connects in the background when the broker is down
// at start (a relay restarted during the outage must still start) and reconnects forever.
func newPublisher(url, name string, logger *slog.Logger) (*natsPublisher, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(100*time.Millisecond), natsErrors(logger))
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: connect: %w", err)
	}
	pub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         &wmnats.NATSMarshaler{},
		SubjectCalculator: wmnats.DefaultSubjectCalculator,
		JetStream: wmnats.JetStreamConfig{
			// Publish acknowledgements wait at most this long; a timeout is "broker unavailable" (no attempt).
			PublishOptions: []nats.PubOpt{nats.AckWait(2 * time.Second)},
		},
	}, watermill.NewSlogLogger(logger))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("faultsuite: nats publisher: %w", err)
	}
	return &natsPublisher{nc: nc, pub: pub}, nil
}

// natsPublisher publishes through watermill-nats, and marks every failure that happens while its connection is
// down as outbox.ErrBrokerUnavailable, whatever the NATS client returned. That matters for a client that has never
// been connected yet (nats.RetryOnFailedConnect): it refuses messages with headers with ErrHeadersNotSupported,
// because it has not yet learnt that the server supports them; classified as a rejection, that would spend the
// message's attempts on an outage.
type natsPublisher struct {
	nc  *nats.Conn
	pub *wmnats.Publisher
}

func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.nc.IsConnected() {
		return fmt.Errorf("%w: nats connection %s", outbox.ErrBrokerUnavailable, p.nc.Status())
	}
	if err := p.pub.Publish(topic, msgs...); err != nil {
		if !p.nc.IsConnected() {
			return fmt.Errorf("%w: nats connection %s: %w", outbox.ErrBrokerUnavailable, p.nc.Status(), err)
		}
		return err
	}
	return nil
}

// Close closes the publisher and its connection.
func (p *natsPublisher) Close() error {
	err := p.pub.Close() // closes nc
	p.nc.Close()
	return err
}

// newSubscriber subscribes the consumers through the durable consumer made by provision.
func newSubscriber(url string, logger *slog.Logger) (*wmnats.Subscriber, error) {
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: consumerGroup,
		SubscribersCount: consumerSubscriptions,
		AckWaitTimeout:   consumerAckWait,
		CloseTimeout:     10 * time.Second,
		NakDelay:         wmnats.NewStaticDelay(100 * time.Millisecond),
		NatsOptions: []nats.Option{nats.Name("faultsuite consumer"), nats.MaxReconnects(-1),
			nats.ReconnectWait(100 * time.Millisecond), natsErrors(logger)},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix:    consumerGroup,
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck()},
			AckAsync:         true,
		},
	}, watermill.NewSlogLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats subscriber: %w", err)
	}
	return sub, nil
}

// natsErrors sends the NATS client's asynchronous errors to the logger (by default the client writes them to
// standard error).
func natsErrors(logger *slog.Logger) nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		logger.Warn("faultsuite: nats client error", "subject", subject, "error", err)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("faultsuite: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// removeWhenDead starts a detached process that removes dir once this process has died, so a run killed by a test
// timeout leaves no broker store behind (internal/pgtest does the same for its clusters).
func removeWhenDead(dir string) error {
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`while [ -d /proc/%d ]; do sleep 1; done; rm -rf %q`,
		os.Getpid(), dir))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("faultsuite: start the store watchdog: %w", err)
	}
	return cmd.Process.Release() // it outlives this process by design
}
