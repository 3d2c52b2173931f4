package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stagehand-es/stagehand/outbox"
)

// The broker: RabbitMQ, through watermill-amqp. Nothing in stagehand is RabbitMQ-specific: the relay takes any
// Watermill publisher and the inbox wraps handlers of any Watermill subscriber. What carries each key's order to
// the handler is the queues' configuration, declared here:
//
//   - the staging mapping puts each key's messages on one of `partitions` topics (a hash of the key), and the
//     relay publishes a topic's messages to one durable topic exchange with the topic as routing key;
//   - each topic has one durable queue, bound with its topic, declared with x-single-active-consumer: of all the
//     consumers of a queue (every process of the group subscribes), one receives and the others stand by, taking
//     over when it goes away;
//   - consumers take one unacknowledged message at a time (prefetch 1), and a nacked message goes back to the
//     head of its queue, so it is delivered again before any later one.
//
// What the relay relies on: publisher confirms (a publish returns once the broker has taken responsibility for the
// message; without them the relay would mark sent what the broker may have lost), durable exchanges and queues and
// persistent messages (they survive a broker restart), and the queues existing before the relay publishes (a
// message no queue is bound for is confirmed, and dropped).

const exchange = "cart-events"

// topicFor is the topic (and routing key, and queue) of a key's messages.
func topicFor(key string, partitions int) string {
	var h uint32 = 2166136261 // FNV-1a: any stable hash does
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return fmt.Sprintf("%s.p%d", exchange, h%uint32(partitions))
}

// queueOptions are the consumers' settings; ordered() is what the example runs with.
type queueOptions struct {
	singleActive bool // x-single-active-consumer on every queue
	prefetch     int  // unacknowledged messages per consumer
}

func ordered() queueOptions { return queueOptions{singleActive: true, prefetch: 1} }

func (o queueOptions) args() amqp.Table {
	if o.singleActive {
		return amqp.Table{"x-single-active-consumer": true}
	}
	return nil
}

// amqpConfig is watermill-amqp's configuration for both sides: durable topic exchange, durable queue per topic,
// persistent messages (its DefaultMarshaler), publisher confirms, and the consumers' QoS.
func amqpConfig(url string, o queueOptions) wamqp.Config {
	cfg := wamqp.NewDurableTopicConfig(url, exchange, "")
	cfg.Exchange.Durable = true
	cfg.Queue.GenerateName = func(topic string) string { return topic }
	cfg.Queue.Arguments = o.args()
	cfg.Publish.ConfirmDelivery = true // Publish returns once the broker confirmed the message
	cfg.Publish.ChannelPoolSize = 8    // confirm-mode channels kept open for the relay's concurrent publishes
	cfg.Consume.Qos.PrefetchCount = o.prefetch
	return cfg
}

// declareTopology declares the exchange and one queue per partition topic before anything publishes, like a
// migration: explicit and safe to repeat.
func declareTopology(url string, partitions int, o queueOptions) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("rabbitmq: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: channel: %w", err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("rabbitmq: exchange %s: %w", exchange, err)
	}
	for p := range partitions {
		topic := fmt.Sprintf("%s.p%d", exchange, p)
		if _, err := ch.QueueDelete(topic, false, false, false); err != nil { // a fresh queue for each run
			return fmt.Errorf("rabbitmq: queue %s: %w", topic, err)
		}
		if _, err := ch.QueueDeclare(topic, true, false, false, false, o.args()); err != nil {
			return fmt.Errorf("rabbitmq: queue %s: %w", topic, err)
		}
		if err := ch.QueueBind(topic, topic, exchange, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: bind %s: %w", topic, err)
		}
	}
	return nil
}

// brokerUnavailable is the relay's RelayConfig.IsBrokerUnavailable: besides what outbox.BrokerUnavailable knows
// (refused connections, timeouts), the AMQP errors of a broker that cannot take messages now, so an outage costs
// no attempt. A refusal about the message or the topology (404 for a missing exchange, 403, 406) is a rejection.
func brokerUnavailable(err error) bool {
	var e *amqp.Error
	switch {
	case outbox.BrokerUnavailable(err), errors.Is(err, amqp.ErrClosed):
		return true
	case errors.As(err, &e):
		return e.Code == amqp.ConnectionForced || e.Code == amqp.ChannelError || e.Code == amqp.ResourceError
	default:
		// watermill-amqp's own words for a publisher whose connection is down (a plain error, not a type).
		return strings.Contains(err.Error(), "not connected to AMQP")
	}
}

// rabbitNode is a throwaway RabbitMQ node for running the example with no setup: the local rabbitmq-server (Debian:
// apt-get install rabbitmq-server; nothing needs to be running) started with a directory, node name, ports and
// epmd of its own, so it never touches a system service, as any user, root included.
type rabbitNode struct {
	dir        string
	port       int
	epmd, node *exec.Cmd
}

func startRabbitMQ(ctx context.Context) (*rabbitNode, error) {
	const script = "/usr/lib/rabbitmq/bin/rabbitmq-server" // Debian's; /usr/sbin's switches to the rabbitmq user
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("rabbitmq: %s not found: install rabbitmq-server, or pass -amqp-url", script)
	}
	dir, err := os.MkdirTemp("", "rabbitmq-example-")
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	n := &rabbitNode{dir: dir}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			n.stop()
			return nil, err
		}
	}
	n.port = ports[0]
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nlog.console = true\nlog.console.level = error\n"+
		"log.file = false\n", n.port)
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			n.stop()
			return nil, fmt.Errorf("rabbitmq: %w", err)
		}
	}
	env := append(os.Environ(), "HOME="+dir, "ERL_EPMD_PORT="+strconv.Itoa(ports[2]),
		"RABBITMQ_NODENAME=rabbitmq-example-"+strconv.Itoa(os.Getpid())+"@localhost",
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[1]), "RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"), "RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "none.conf"))
	start := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		// Its own process group (a stop reaches the server's helpers too), and killed if this process dies.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	n.epmd = start("epmd", "-port", strconv.Itoa(ports[2]), "-address", "127.0.0.1")
	n.node = start(script)
	for _, cmd := range []*exec.Cmd{n.epmd, n.node} {
		if err := cmd.Start(); err != nil {
			n.stop()
			return nil, fmt.Errorf("rabbitmq: start %s: %w", cmd.Path, err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		conn, err := amqp.Dial(n.URL())
		if err == nil {
			_ = conn.Close()
			return n, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			n.stop()
			return nil, fmt.Errorf("rabbitmq: the node did not start: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URL is the node's AMQP URL (RabbitMQ's guest user is admitted from the loopback interface only).
func (n *rabbitNode) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// stop ends the node (SIGTERM: RabbitMQ's clean shutdown) and its epmd, and removes its directory.
func (n *rabbitNode) stop() {
	for _, cmd := range []*exec.Cmd{n.node, n.epmd} {
		if cmd == nil || cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // helpers left in the group
	}
	_ = os.RemoveAll(n.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
