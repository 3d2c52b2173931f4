package histories_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
	"github.com/stagehand-es/stagehand/proof/rabbitmq"
)

// envBroker=rabbitmq runs TestPipelineThroughRabbitMQUnderNetworkFaults at the CI size (the full size runs it
// anyway): a throwaway RabbitMQ node takes 5-10 s to boot, too long to add to every CI run.
const envBroker = "STAGEHAND_HISTORIES_BROKER"

// The RabbitMQ topology: one durable topic exchange; per partition topic, one durable queue bound with the topic as
// routing key, with a single active consumer and a prefetch of 1, so each key's messages reach the handler in the
// order the relay published them (as in proof/faultsuite).
const rabbitExchange = "histories-ticked"

var rabbitQueueArgs = amqp.Table{"x-single-active-consumer": true}

// rabbitBroker starts a throwaway node, declares the topology, and returns the broker as the pipeline sees it:
// the relay's publisher and the handlers' subscriber both connect through a raw fault proxy, whose URL it returns
// too (the spec a worker process builds its own publisher and subscriber from: rabbitWorkerBroker). For a run
// whose worker processes connect, it connects no publisher or subscriber of its own.
func rabbitBroker(t *testing.T, ctx context.Context, seed uint64, partitions int, workers bool) (*histories.Broker,
	string) {
	t.Helper()
	began := time.Now()
	node, err := rabbitmq.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop() })
	t.Logf("RabbitMQ node up in %s", time.Since(began).Round(time.Millisecond))
	conn, err := amqp.Dial(node.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(rabbitExchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for p := range partitions {
		topic := fmt.Sprintf("%s.p%02d", rabbitExchange, p)
		if _, err := ch.QueueDeclare(topic, true, false, false, false, rabbitQueueArgs); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(topic, topic, rabbitExchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(node.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := histories.NewProxy(u.Host, histories.ProxyOptions{Raw: true, Seed: seed, Logger: verboseLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = proxy.Addr()
	if workers {
		return &histories.Broker{Name: "one RabbitMQ node behind a raw fault proxy, the worker processes' " +
			"connections", Proxy: proxy}, u.String()
	}
	brk, closeBroker, err := rabbitWorkerBroker(ctx, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeBroker)
	brk.Proxy = proxy
	return brk, u.String()
}

// rabbitWorkerBroker connects a publisher and a subscriber to the node at URL spec (through its fault proxy),
// for the pipeline's topology: it is the histories.WorkerBroker of this test binary's worker processes.
func rabbitWorkerBroker(_ context.Context, spec string, _ *slog.Logger) (*histories.Broker, func(), error) {
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{URL: spec,
		Exchange:       func(string) string { return rabbitExchange },
		RoutingKey:     func(topic string) string { return topic },
		ConfirmTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	cfg := wamqp.NewDurableTopicConfig(spec, rabbitExchange, "")
	cfg.Exchange.Durable = true
	cfg.Queue.GenerateName = func(topic string) string { return topic }
	cfg.Queue.Arguments = rabbitQueueArgs
	cfg.Consume.Qos.PrefetchCount = 1
	sub, err := rabbitmq.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		_ = pub.Close()
		return nil, nil, err
	}
	closeBoth := func() { _ = sub.Close(); _ = pub.Close() }
	return &histories.Broker{Name: "one RabbitMQ node behind a raw fault proxy", Publisher: pub, Subscriber: sub,
		Unavailable: rabbitmq.Unavailable}, closeBoth, nil
}

// TestPipelineThroughRabbitMQUnderNetworkFaults is TestPipelineUnderNetworkFaults with RabbitMQ as the broker, the
// relay's publisher and the handlers' subscriber reaching it through a second fault proxy, where the nemesis
// injects half of its black holes, delays, cuts and half-opens. In "worker-kills", the relay and the handlers run
// in a worker process the nemesis kills with SIGKILL mid-work, as in TestCrashesUnderNetworkFaults: the delivery a
// killed handler had not acknowledged goes back to its queue, and the next worker's handler gets it again. It
// runs with STAGEHAND_HISTORIES=full or STAGEHAND_HISTORIES_BROKER=rabbitmq.
func TestPipelineThroughRabbitMQUnderNetworkFaults(t *testing.T) {
	full := os.Getenv(envSize) == "full"
	if !full && !strings.EqualFold(os.Getenv(envBroker), "rabbitmq") {
		t.Skipf("set %s=rabbitmq (or %s=full) to run the pipeline through RabbitMQ", envBroker, envSize)
	}
	t.Run("in-process", func(t *testing.T) {
		pgtest.CheckLeaks(t)
		admin, schema := pgtest.Migrated(t)
		seed := runSeed(t)
		cfg := histories.PipelineRunConfig{Seed: seed, DatabaseURL: pgtest.URL(t), Schema: schema, Admin: admin,
			Duration: 6 * time.Second, Partitions: 3, Logger: verboseLogger()}
		if full {
			cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 6, 24, 4, 3*time.Minute
			cfg.SaveEvery = fullSaveEvery
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+5*time.Minute)
		defer cancel()
		cfg.Broker, _ = rabbitBroker(t, ctx, seed, cfg.Partitions, false)
		checkRabbitRun(t, ctx, cfg)
	})
	t.Run("worker-kills", func(t *testing.T) {
		pgtest.CheckLeaks(t)
		admin, schema := pgtest.Migrated(t)
		seed := runSeed(t)
		// Two producers, as in TestCrashesUnderNetworkFaults: every message goes through the one worker process.
		cfg := histories.PipelineRunConfig{Seed: seed, DatabaseURL: pgtest.URL(t), Schema: schema, Admin: admin,
			Producers: 2, Keys: 4, Partitions: 3, Duration: 6 * time.Second,
			WorkerCommand: []string{os.Args[0], "-test.run=^$"}, Logger: verboseLogger()}
		if full {
			cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 3, 12, 4, 3*time.Minute
			cfg.DrainTimeout, cfg.SaveEvery = 4*time.Minute, 40*time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+max(cfg.DrainTimeout, 2*time.Minute)+
			3*time.Minute)
		defer cancel()
		cfg.Broker, cfg.WorkerBroker = rabbitBroker(t, ctx, seed, cfg.Partitions, true)
		run := checkRabbitRun(t, ctx, cfg)
		checkWorkerKills(t, seed, run)
	})
}

// checkRabbitRun runs a pipeline through RabbitMQ and checks it: every checker, drained, and faults reached the
// broker's connections.
func checkRabbitRun(t *testing.T, ctx context.Context, cfg histories.PipelineRunConfig) histories.PipelineRun {
	t.Helper()
	run, err := histories.RunPipeline(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", run.Summary())
	if err := run.Check(cfg.Seed); err != nil {
		t.Fatal(err)
	}
	if !run.Drained {
		t.Fatalf("seed %d: the pipeline did not drain within the timeout", cfg.Seed)
	}
	if run.BrokerProxy == nil || run.BrokerProxy.Cut+run.BrokerProxy.HalfOpened+run.BrokerProxy.MessagesDelayed == 0 {
		t.Fatalf("seed %d: no fault reached the broker's connections", cfg.Seed)
	}
	return run
}
