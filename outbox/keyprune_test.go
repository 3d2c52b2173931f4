package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Idle key counters are pruned; the counters of keys with a pending message or a dead letter holding them are
// kept; a pruned key starts afresh and keeps its order; a tenant scope prunes only its own counters.
func TestPruneKeysDeletesOnlyIdleCounters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	keyed := func(prefix, key string, n int) []outbox.Message {
		return msgs(prefix, n, func(int) string { return key })
	}
	_, err := e.ob.Stage(ctx, append(keyed("a", "ka", 3), keyed("c", "kc", 1)...)...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if m.UUID == "c-00000" {
			return errRejected
		}
		return nil
	})
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	require.Equal(t, 1, res.DeadLettered)
	_, err = e.ob.Stage(ctx, keyed("b", "kb", 2)...) // pending, never claimed in this test
	require.NoError(t, err)
	_, err = e.ob.Stage(stagehand.WithTenant(ctx, "acme"), keyed("x", "kx", 1)...)
	require.NoError(t, err)
	require.Equal(t, int64(4), e.count("outbox_keys"))

	n, err := e.ob.Tenant("globex").PruneKeys(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n, "another tenant's scope prunes nothing")

	n, err = e.ob.AllTenants().PruneKeys(ctx, 1) // batches of one key: the cursor walks every key
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only ka is idle")
	require.Zero(t, e.count("outbox_keys", "partition_key = 'ka'"))
	require.Equal(t, int64(3), e.count("outbox_keys", "partition_key IN ('kb', 'kc', 'kx')"))

	// ka starts afresh and its messages still go out in order.
	next := []outbox.Message{
		{ID: "a2-0", Topic: "a", Payload: []byte("0"), PartitionKey: "ka"},
		{ID: "a2-1", Topic: "a", Payload: []byte("1"), PartitionKey: "ka"},
	}
	_, err = e.ob.Stage(ctx, next...)
	require.NoError(t, err)
	require.Equal(t, int64(1), e.count("outbox_keys", "partition_key = 'ka' AND last_seq = 2"))
	b2 := newBroker()
	_, err = e.relay(nil).Drain(ctx, b2)
	require.NoError(t, err)
	var got []string
	for _, p := range b2.snapshot() {
		if p.key == "ka" {
			got = append(got, p.id)
		}
	}
	require.Equal(t, []string{"a2-0", "a2-1"}, got)

	// CleanupSent prunes too: ka is idle again.
	_, err = e.ob.AllTenants().CleanupSent(ctx, 0, 0)
	require.NoError(t, err)
	require.Zero(t, e.count("outbox_keys", "partition_key = 'ka'"))
}

// Pruning while transactions stage on the same keys and a relay publishes them never reorders a key: first
// publications at the broker follow each key's staging order.
func TestPruneKeysBesideStagingKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newBroker()
	r := e.relay(func(c *outbox.RelayConfig) { c.PollingInterval = 10 * time.Millisecond })
	runRouter(t, r, b, nil)

	const keys, perKey = 8, 40
	var pruned atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := e.ob.AllTenants().PruneKeys(ctx, 3)
			if err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
			pruned.Add(n)
			time.Sleep(2 * time.Millisecond)
		}
	})
	var stagers sync.WaitGroup
	for k := range keys {
		stagers.Go(func() {
			for i := range perKey {
				m := outbox.Message{ID: fmt.Sprintf("k%d-%03d", k, i), Topic: "t", Payload: []byte("x"),
					PartitionKey: fmt.Sprintf("k%d", k)}
				if _, err := e.ob.Stage(ctx, m); err != nil {
					t.Error(err)
					return
				}
				e.ob.Notify()
				if i%5 == 4 {
					time.Sleep(15 * time.Millisecond) // let the key go idle now and then
				}
			}
		})
	}
	stagers.Wait()
	pgtest.Eventually(t, 30*time.Second, func() bool { return b.distinct() == keys*perKey }, "all published")
	close(stop)
	wg.Wait()

	next := map[string]int{}
	seen := map[string]bool{}
	for _, p := range b.snapshot() {
		if seen[p.id] {
			continue
		}
		seen[p.id] = true
		var k, i int
		_, err := fmt.Sscanf(p.id, "k%d-%03d", &k, &i)
		require.NoError(t, err)
		key := fmt.Sprintf("k%d", k)
		require.Equal(t, next[key], i, "first publication of %s out of order", p.id)
		next[key]++
	}
	require.Positive(t, pruned.Load(), "the pruner deleted counters while keys were in use")
	t.Logf("counters pruned while staging: %d", pruned.Load())
}
