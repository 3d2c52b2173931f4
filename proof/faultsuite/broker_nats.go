package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/proof/natsjs"
)

// NATS JetStream: one stream for every partition topic (subjects fault-messages.*), stored in files, replicated on
// every node; per partition, one durable push consumer filtered to its topic, with at most one message
// unacknowledged (MaxAckPending 1): the next message of the partition is delivered only once this one is
// acknowledged, and a nacked or timed-out one is delivered again before any later one. No Nats-Msg-Id is set, so
// every copy a relay publishes is stored and counted.

const (
	streamName    = "faults"
	consumerGroup = "faults-consumer"
)

// consumerAckWait is how long a delivered, unacknowledged message waits before the broker delivers it again.
// Short, so that deliveries whose acknowledgement was lost in a broker fault come back soon after it.
const consumerAckWait = 5 * time.Second

type natsBroker struct {
	cfg    Config
	logger *slog.Logger
	dir    string
	nodes  []*natsNodeProcess
}

// startNATS starts size NATS server processes (a cluster when size > 1) on free ports of 127.0.0.1, with their
// JetStream stores in a new temporary directory that stop removes (and, should this process die first, a
// watchdog process removes).
func startNATS(ctx context.Context, cfg Config, size int, logger *slog.Logger) (*natsBroker, error) {
	dir, err := os.MkdirTemp("", "stagehand-faults-nats-")
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats store directory: %w", err)
	}
	b := &natsBroker{cfg: cfg, logger: logger, dir: dir}
	if err := removeWhenDead(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// The ports are free when drawn, but another process may bind one before the node does (the CI runs other
	// packages' servers and connections beside the suite), and the node then never becomes ready: start the
	// nodes again on other ports, in fresh directories.
	for attempt := 1; ; attempt++ {
		err := b.startNodes(ctx, size, filepath.Join(dir, fmt.Sprintf("attempt%d", attempt)))
		if err == nil {
			break
		}
		for _, n := range b.nodes {
			n.stop()
		}
		b.nodes = nil
		if attempt == 3 || ctx.Err() != nil {
			_ = b.stop()
			return nil, err
		}
		logger.Warn("faultsuite: NATS did not start; trying other ports", "attempt", attempt, "error", err)
	}
	return b, nil
}

// startNodes draws free ports for size nodes whose stores are under dir and starts them together (a cluster node
// waits for its peers).
func (b *natsBroker) startNodes(ctx context.Context, size int, dir string) error {
	var routes []int
	for i := range size {
		n := natsjs.Node{Name: fmt.Sprintf("n%d", i+1), Dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		var err error
		if n.Port, err = freePort(); err != nil {
			return err
		}
		if size > 1 {
			n.Cluster = "faults"
			if n.ClusterPort, err = freePort(); err != nil {
				return err
			}
			routes = append(routes, n.ClusterPort)
		}
		b.nodes = append(b.nodes, &natsNodeProcess{node: n, command: b.cfg.ChildCommand, logger: b.logger})
	}
	errs := make(chan error, size)
	for _, n := range b.nodes {
		n.node.Routes = routes
		go func() { errs <- n.start(ctx) }()
	}
	var first error
	for range size {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (b *natsBroker) describe() string {
	if len(b.nodes) == 1 {
		return "one NATS JetStream server (a child process)"
	}
	return fmt.Sprintf("a %d-node NATS JetStream cluster (child processes), stream and consumers replicated on "+
		"all %d (R%d)", len(b.nodes), len(b.nodes), len(b.nodes))
}

// url lists every node: clients reconnect to another when theirs dies.
func (b *natsBroker) url() string {
	urls := make([]string, len(b.nodes))
	for i, n := range b.nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", n.node.Port)
	}
	return strings.Join(urls, ",")
}

func (b *natsBroker) stop() error {
	for _, n := range b.nodes {
		n.stop()
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("faultsuite: remove %s: %w", b.dir, err)
	}
	return nil
}

// connect is a short-lived client connection for the suite's own requests.
func (b *natsBroker) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(b.url(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("faultsuite: nats: connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("faultsuite: nats: %w", err)
	}
	return nc, js, nil
}

func durableName(p int) string { return fmt.Sprintf("%s-p%02d", consumerGroup, p) }

// provision creates the stream and the partitions' durable consumers. Created up front, a consumer outlives the
// subscriptions and keeps its position across broker restarts. A cluster answers once its nodes have elected a
// meta leader, so the first requests are retried for a while.
func (b *natsBroker) provision(ctx context.Context) error {
	nc, js, err := b.connect("faultsuite setup")
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a request with no meta leader yet waits for one
		_, err = js.CreateOrUpdateStream(rctx, jetstream.StreamConfig{
			Name:     streamName,
			Subjects: []string{topicPrefix + ".*"},
			Storage:  jetstream.FileStorage,
			Replicas: len(b.nodes),
		})
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("faultsuite: nats: stream: %w", err)
	}
	for p := range b.cfg.Partitions {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := js.CreateOrUpdatePushConsumer(rctx, streamName, jetstream.ConsumerConfig{
			Durable:        durableName(p),
			FilterSubject:  partitionTopic(p),
			DeliverSubject: "faultsuite.deliver." + durableName(p),
			DeliverGroup:   consumerGroup,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        consumerAckWait,
			// One unacknowledged message at a time: the partition's order (the stream's) reaches the handler.
			MaxAckPending: 1,
		})
		cancel()
		if err != nil {
			return fmt.Errorf("faultsuite: nats: consumer %s: %w", durableName(p), err)
		}
	}
	return nil
}

// fault kills the node that leads the stream (the only node of a single server) with SIGKILL, waits outage, and
// starts it again. In a cluster it measures how long the stream had no leader.
func (b *natsBroker) fault(ctx context.Context, outage time.Duration, step func(string, ...any)) (brokerFault, error) {
	victim := b.nodes[0]
	role := "the only server"
	if len(b.nodes) > 1 {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		leader, err := b.streamLeader(rctx)
		cancel()
		if err != nil {
			return brokerFault{}, err
		}
		for _, n := range b.nodes {
			if n.node.Name == leader {
				victim = n
			}
		}
		role = "the stream leader"
	}
	f := brokerFault{what: fmt.Sprintf("killed NATS node %s (%s) with SIGKILL", victim.node.Name, role)}
	step("killing NATS node %s (%s) with SIGKILL for %s", victim.node.Name, role, outage)
	killed := time.Now()
	victim.kill()
	if len(b.nodes) > 1 {
		leader, err := b.waitForLeader(ctx, victim.node.Name, outage+time.Minute)
		if err != nil {
			return f, err
		}
		f.leaderless = time.Since(killed)
		step("the stream has a new leader, %s, %.1fs after the kill", leader, f.leaderless.Seconds())
	}
	if err := sleep(ctx, time.Until(killed.Add(outage))); err != nil {
		return f, err
	}
	if err := victim.start(ctx); err != nil {
		return f, err
	}
	f.down = time.Since(killed)
	return f, nil
}

// streamLeader names the node that leads the stream.
func (b *natsBroker) streamLeader(ctx context.Context) (string, error) {
	nc, js, err := b.connect("faultsuite leader")
	if err != nil {
		return "", err
	}
	defer nc.Close()
	s, err := js.Stream(ctx, streamName)
	if err != nil {
		return "", fmt.Errorf("faultsuite: nats: stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("faultsuite: nats: stream info: %w", err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", errors.New("faultsuite: nats: the stream has no leader")
	}
	return info.Cluster.Leader, nil
}

// waitForLeader waits until a node other than old leads the stream.
func (b *natsBroker) waitForLeader(ctx context.Context, old string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		leader, err := b.streamLeader(rctx)
		cancel()
		if err == nil && leader != old {
			return leader, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("faultsuite: nats: no new stream leader within %s of killing %s (last: %q, %v)",
				within, old, leader, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// subscriber subscribes the consumers through the partitions' durable consumers made by provision.
func (b *natsBroker) subscriber(logger *slog.Logger) (message.Subscriber, error) {
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              b.url(),
		QueueGroupPrefix: consumerGroup,
		SubscribersCount: 1, // one message in flight per partition anyway (MaxAckPending 1)
		AckWaitTimeout:   consumerAckWait,
		CloseTimeout:     10 * time.Second,
		NakDelay:         wmnats.NewStaticDelay(100 * time.Millisecond),
		NatsOptions: []nats.Option{nats.Name("faultsuite consumer"), nats.MaxReconnects(-1),
			nats.ReconnectWait(100 * time.Millisecond), natsErrors(logger)},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix: consumerGroup,
			DurableCalculator: func(_, topic string) string {
				var p int
				_, _ = fmt.Sscanf(strings.TrimPrefix(topic, topicPrefix+".p"), "%d", &p)
				return durableName(p)
			},
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck()},
			AckAsync:         true,
		},
	}, watermill.NewSlogLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats subscriber: %w", err)
	}
	return sub, nil
}

// settled reports whether every partition's consumer has delivered everything in the stream and every delivery
// was acknowledged.
func (b *natsBroker) settled(ctx context.Context) (bool, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc, js, err := b.connect("faultsuite check")
	if err != nil {
		return false, "", err
	}
	defer nc.Close()
	var pending, ackPending, redelivered uint64
	for p := range b.cfg.Partitions {
		cons, err := js.PushConsumer(ctx, streamName, durableName(p))
		if err != nil {
			return false, "", fmt.Errorf("faultsuite: nats: consumer: %w", err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, "", fmt.Errorf("faultsuite: nats: consumer info: %w", err)
		}
		pending += info.NumPending
		ackPending += uint64(info.NumAckPending)
		redelivered += uint64(info.NumRedelivered)
	}
	state := fmt.Sprintf("pending %d, awaiting ack %d, redelivered %d", pending, ackPending, redelivered)
	return pending == 0 && ackPending == 0, state, nil
}

// readStored reads the whole stream in stream-sequence order with an ordered consumer.
func (b *natsBroker) readStored(ctx context.Context, fn func(storedCopy) error) error {
	nc, js, err := b.connect("faultsuite check")
	if err != nil {
		return err
	}
	defer nc.Close()
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return fmt.Errorf("faultsuite: nats: stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("faultsuite: nats: stream info: %w", err)
	}
	if info.State.FirstSeq > 1 && info.State.Msgs > 0 {
		return fmt.Errorf("faultsuite: the stream starts at sequence %d: messages were removed from it",
			info.State.FirstSeq)
	}
	var read, lastSeq uint64
	cons, err := orderedFrom(ctx, stream, 1)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	var stalledSince time.Time // the first of a run of fetches that brought nothing
	for read < info.State.Msgs {
		if time.Now().After(deadline) {
			return fmt.Errorf("faultsuite: read %d of %d stream messages in 5 minutes", read, info.State.Msgs)
		}
		if !stalledSince.IsZero() && time.Since(stalledSince) > 10*time.Second {
			// A cluster whose nodes came back can leave an ordered consumer without a server side for good: start
			// a new one after the last message read.
			if cons, err = orderedFrom(ctx, stream, lastSeq+1); err != nil {
				return err
			}
			stalledSince = time.Time{}
		}
		batch, err := cons.Fetch(int(min(1000, info.State.Msgs-read)), jetstream.FetchMaxWait(5*time.Second))
		if errors.Is(err, nats.ErrNoResponders) {
			// In a cluster the ordered consumer's first fetch can come before the consumer is up on its node.
			if stalledSince.IsZero() {
				stalledSince = time.Now()
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("faultsuite: nats: fetch: %w", err)
		}
		before := read
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("faultsuite: nats: metadata: %w", err)
			}
			if meta.Sequence.Stream <= lastSeq {
				return fmt.Errorf("faultsuite: stream sequence %d after %d", meta.Sequence.Stream, lastSeq)
			}
			lastSeq = meta.Sequence.Stream
			read++
			if err := fn(storedCopy{id: msg.Headers().Get(wmnats.WatermillUUIDHdr),
				version: msg.Headers().Get(HeaderVersion), position: lastSeq}); err != nil {
				return err
			}
		}
		// A fetch's request can also find no responder after it was sent (the consumer's server side not up, or
		// gone with a node that restarted): like an empty fetch, it counts toward a stall, which starts a new
		// consumer after the last message read.
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) &&
			!errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("faultsuite: nats: fetch: %w", err)
		}
		switch {
		case read > before:
			stalledSince = time.Time{}
		case stalledSince.IsZero():
			stalledSince = time.Now()
		}
	}
	return nil
}

// orderedFrom returns an ordered consumer of stream starting at sequence seq, retrying while a cluster whose
// nodes just came back answers that it is unavailable.
func orderedFrom(ctx context.Context, stream jetstream.Stream, seq uint64) (jetstream.Consumer, error) {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq}
	for attempt := 0; ; attempt++ {
		cons, err := stream.OrderedConsumer(ctx, cfg)
		if err == nil {
			return cons, nil
		}
		if !natsjs.Unavailable(err) || attempt == 100 {
			return nil, fmt.Errorf("faultsuite: nats: ordered consumer: %w", err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// newNATSPublisher is a relay process's JetStream publisher. It connects in the background when the broker is
// down at start (a relay restarted during the outage must still start) and reconnects forever, to any node.
func newNATSPublisher(url, name string, logger *slog.Logger) (message.Publisher, func(error) bool, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(100*time.Millisecond), natsErrors(logger))
	if err != nil {
		return nil, nil, fmt.Errorf("faultsuite: nats: connect: %w", err)
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
		return nil, nil, fmt.Errorf("faultsuite: nats publisher: %w", err)
	}
	return &natsPublisher{nc: nc, pub: pub}, natsjs.Unavailable, nil
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
