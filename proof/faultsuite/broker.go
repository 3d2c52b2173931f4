package faultsuite

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The broker under test, as the suite drives it. The suite knows nothing of any one broker: it provisions the
// topology, hands the relay processes a publisher and the consumers a subscriber, injects the broker's fault, asks
// whether everything was delivered, and reads back every copy the broker stored. broker_nats.go and
// broker_rabbitmq.go are the two implementations.
type broker interface {
	// describe says what runs, for the report ("a 3-node NATS JetStream cluster, stream and consumers R3").
	describe() string
	// url is what a relay process's publisher connects to (newPublisherFor).
	url() string
	// provision creates what the messages flow through (streams and consumers, exchanges and queues) before
	// anything publishes: one destination per partition topic, each consumed one message at a time.
	provision(ctx context.Context) error
	// fault injects the broker's fault (a node killed with SIGKILL and restarted after outage) and returns what
	// happened once the broker is back.
	fault(ctx context.Context, outage time.Duration, step func(string, ...any)) (brokerFault, error)
	// subscriber is the consumers' Watermill subscriber; they subscribe to every partition topic.
	subscriber(logger *slog.Logger) (message.Subscriber, error)
	// settled reports whether the broker has nothing left to deliver to the consumers, or to have acknowledged.
	settled(ctx context.Context) (bool, string, error)
	// readStored calls fn for every copy of every message the broker took from the relays, in the order the
	// broker stored them (a copy published again is stored again).
	readStored(ctx context.Context, fn func(storedCopy) error) error
	// stop stops the broker and removes its files. Safe to call twice.
	stop() error
}

// brokerFault is what a broker fault did.
type brokerFault struct {
	what string        // "killed node n2 (the stream leader)"
	down time.Duration // from the kill until the broker accepted messages again
	// leaderless is how long a cluster's stream had no leader: from the kill until another node was elected.
	leaderless time.Duration
}

// storedCopy is one message as the broker stored it.
type storedCopy struct {
	id, version string
	position    uint64 // the broker's order: a stream sequence, a place in a queue
}

// The brokers a run can use (Config.Broker).
const (
	// BrokerNATS is one NATS JetStream server; its fault kills it and starts it again.
	BrokerNATS = "nats"
	// BrokerNATSCluster is a 3-node NATS JetStream cluster with the stream and its consumers replicated on all
	// three (R3); its fault kills the node that leads the stream, so the stream has no leader until the others
	// elect one, and starts it again.
	BrokerNATSCluster = "nats-cluster"
	// BrokerRabbitMQ is one RabbitMQ node (the local rabbitmq-server); its fault kills it and starts it again.
	BrokerRabbitMQ = "rabbitmq"
)

// Brokers lists every broker the suite runs against.
func Brokers() []string { return []string{BrokerNATS, BrokerNATSCluster, BrokerRabbitMQ} }

// startBroker starts the broker cfg names.
func startBroker(ctx context.Context, cfg Config, logger *slog.Logger) (broker, error) {
	switch cfg.Broker {
	case BrokerNATS:
		return startNATS(ctx, cfg, 1, logger)
	case BrokerNATSCluster:
		return startNATS(ctx, cfg, 3, logger)
	case BrokerRabbitMQ:
		return startRabbitMQ(ctx, cfg, logger)
	}
	return nil, fmt.Errorf("faultsuite: unknown broker %q", cfg.Broker)
}

// newPublisherFor is a relay process's publisher for the broker kind at url, and the relay's classification of
// its errors (RelayConfig.IsBrokerUnavailable).
func newPublisherFor(kind, url, name string, logger *slog.Logger) (message.Publisher, func(error) bool, error) {
	switch kind {
	case BrokerNATS, BrokerNATSCluster:
		return newNATSPublisher(url, name, logger)
	case BrokerRabbitMQ:
		return newRabbitMQPublisher(url, logger)
	}
	return nil, nil, fmt.Errorf("faultsuite: unknown broker %q", kind)
}

// Partition topics. Each key's messages go to one topic (of Config.Partitions), chosen by a hash of the key when
// they are staged, and each topic is consumed one message at a time: that is what carries each key's order to
// the handler, while the partitions are handled in parallel.
const topicPrefix = "fault-messages"

func partitionTopic(p int) string { return fmt.Sprintf("%s.p%02d", topicPrefix, p) }

func topicOf(key string, partitions int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return partitionTopic(int(h.Sum32() % uint32(partitions)))
}

func partitionTopics(partitions int) []string {
	topics := make([]string, partitions)
	for p := range partitions {
		topics[p] = partitionTopic(p)
	}
	return topics
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
// timeout leaves no broker store behind (internal/testkit/pgtest does the same for its clusters).
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
