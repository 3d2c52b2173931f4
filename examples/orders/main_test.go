package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// The example runs to completion on the test PostgreSQL and an embedded NATS server, with every component stopped
// at the end (no goroutine left), and its printed counts add up: every message the orders imply is staged,
// published and handled exactly once behind the inbox, the duplicates published on purpose are suppressed, and
// the projection has caught up.
func TestOrdersExample(t *testing.T) {
	for _, tc := range []struct {
		strategy staging.Strategy
		orders   string // the orders repository's resolved strategy
	}{
		{staging.Auto, "transactional"},
		{staging.Deferred, "deferred"},
	} {
		t.Run(tc.strategy.String(), func(t *testing.T) {
			stagehandtest.CheckLeaks(t)
			const orders = 100
			out := runExample(t, config{
				orders:      orders,
				warmup:      5, // a run of its own: nothing below counts it
				concurrency: 8,
				strategy:    tc.strategy,
				duplicates:  0.05,
				timeout:     60 * time.Second,
			})
			require.Contains(t, out, "warm-up: 5 orders placed and handled in ")

			// The strategies, as configured and as resolved, before the run and in the summary.
			require.Contains(t, out, "  orders    "+tc.strategy.String()+" -> "+tc.orders)
			require.Contains(t, out,
				`  payments  eventually-consistent -> eventually-consistent, worker "reconciler:payments" running`)
			require.Contains(t, out, `  shipping  deferred -> deferred, worker "stager:shipping" running`)
			require.Contains(t, out, fmt.Sprintf("strategies:             orders=%s (requested %s), "+
				"payments=eventually-consistent (requested eventually-consistent), shipping=deferred (requested deferred)",
				tc.orders, tc.strategy))

			messages := orders * messagesPerOrder
			events := match(t, out, `events appended: +(\d+) \(order placed (\d+), payment authorized (\d+), `+
				`payment captured (\d+), order shipped (\d+)\)`)
			require.Equal(t, []int{4 * orders, orders, orders, orders, orders}, events)
			require.Equal(t, []int{messages}, match(t, out, `messages staged: +(\d+)`))

			published := match(t, out, `messages published: +(\d+) \((\d+) unique, (\d+) published twice on purpose`)
			require.Equal(t, messages, published[1], "every staged message reached the broker")
			require.Positive(t, published[2], "some messages were published twice on purpose")
			require.GreaterOrEqual(t, published[0], published[1]+published[2])

			handled := match(t, out, `messages handled: +(\d+) unique \(billing (\d+), warehouse (\d+), notifier (\d+)\); `+
				`inbox entries \+(\d+)`)
			require.Equal(t, []int{messages, orders, orders, 2 * orders, messages}, handled)
			suppressed := match(t, out, `duplicates suppressed: +(\d+) \(by the inbox\)`)
			require.GreaterOrEqual(t, suppressed[0], published[2], "every duplicate published was suppressed")
			require.Equal(t, 0, match(t, out, `failed deliveries: +\d+ retried, (\d+) dead-lettered`)[0])

			effects := match(t, out, `effects applied: +(\d+) \(invoices (\d+), shipments (\d+), notifications (\d+)\); `+
				`applied twice: (\d+)`)
			require.Equal(t, []int{messages, orders, orders, 2 * orders, 0}, effects, "each message's effects once")

			latency := match(t, out, `append->handled: +p50 [\d.]+ms, p99 [\d.]+ms \((\d+) messages`)
			require.Equal(t, []int{messages}, latency)
			require.Equal(t, []int{0, orders, orders, orders},
				match(t, out, `projection lag: +(\d+) events \(order-board: (\d+) orders, (\d+) paid, (\d+) shipped\)`))
		})
	}
}

// runExample runs the example on the test server in a new schema (dropped afterwards) and an embedded NATS server
// storing into a temporary directory, and returns what it printed.
func runExample(t *testing.T, cfg config) string {
	t.Helper()
	cfg.databaseURL = stagehandtest.URL(t)
	cfg.schema = stagehandtest.SchemaName(t)
	cfg.natsStore = t.TempDir()
	var out bytes.Buffer
	err := run(context.Background(), &out, cfg)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	return out.String()
}

// match returns the integers captured by pattern in out; the test fails when the pattern does not match.
func match(t *testing.T, out, pattern string) []int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	require.NotNil(t, m, "no line matches %q", pattern)
	var nums []int
	for _, s := range m[1:] {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		nums = append(nums, n)
	}
	return nums
}
