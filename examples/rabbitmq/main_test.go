package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

func testConfig(t *testing.T) config {
	return config{databaseURL: stagehandtest.URL(t), schema: stagehandtest.SchemaName(t), carts: 12, items: 20,
		partitions: 4, consumers: 2, nackRate: 0.05, failRate: 0.05, queues: ordered(), timeout: 2 * time.Minute}
}

// The example runs to completion on its own throwaway RabbitMQ node: every message handled once, and each cart's
// items applied in the order they were added, with two consumers on every queue and 5% of deliveries coming again.
func TestRabbitMQExample(t *testing.T) {
	var out bytes.Buffer
	sum, err := run(context.Background(), &out, testConfig(t))
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.Equal(t, int64(240), sum.staged)
	require.Equal(t, sum.staged, sum.handled)
	require.Zero(t, sum.appliedTwice)
	require.Zero(t, sum.orderViolations)
	require.Positive(t, sum.nacked, "redeliveries happened, so order held through them")
	require.Positive(t, sum.failed)
}

// Either setting alone loses each key's order at the handler (measured here, so the settings in broker.go are
// shown to be the ones that matter): without a single active consumer the queue hands its messages to its
// consumers in turn; with a prefetch above 1 a consumer holds later messages while one that failed goes back to the
// queue, and applies them first. Nothing is lost or applied twice either way: the inbox does not depend on order.
func TestEitherSettingAloneLosesOrder(t *testing.T) {
	for _, q := range []queueOptions{{singleActive: false, prefetch: 1}, {singleActive: true, prefetch: 10}} {
		t.Run(q.String(), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.queues = q
			var out bytes.Buffer
			sum, err := run(context.Background(), &out, cfg)
			require.NoError(t, err, out.String())
			t.Log(out.String())
			require.Equal(t, sum.staged, sum.handled)
			require.Zero(t, sum.appliedTwice)
			require.Positive(t, sum.orderViolations, "a key's messages applied out of order")
		})
	}
}
