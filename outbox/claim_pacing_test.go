package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

// countedRelay runs a router relaying e's outbox to a recording broker, with polls a minute apart (every claim in
// these tests follows a wake-up or a full batch), and counts its claims.
func countedRelay(t *testing.T, e *env, mod func(*outbox.RelayConfig)) (*broker, *atomic.Int64) {
	t.Helper()
	var claims atomic.Int64
	r := e.relay(func(c *outbox.RelayConfig) {
		c.PollingInterval = time.Minute
		c.Hooks.Claimed = func(context.Context, int, time.Duration, error) { claims.Add(1) }
		mod(c)
	})
	b := newBroker()
	runRouter(t, r, b, nil)
	return b, &claims
}

// started waits for the claim a relay makes as it starts and counts from there, so a slow start (a loaded
// machine) cannot make one claim of a whole trickle staged before the relay ran.
func started(t *testing.T, claims *atomic.Int64) {
	t.Helper()
	require.Eventually(t, func() bool { return claims.Load() > 0 }, 10*time.Second, time.Millisecond)
	claims.Store(0)
}

// trickle stages n messages one at a time, gap apart, each on a key of its own, and waits until all are
// published. It returns how long the staging took.
func trickle(t *testing.T, e *env, b *broker, n int, gap time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for i := range n {
		_, err := e.ob.Stage(context.Background(), outbox.Message{ID: fmt.Sprintf("trickle-%d", i), Topic: "trickle",
			PartitionKey: fmt.Sprintf("k%d", i), Payload: []byte("{}")})
		require.NoError(t, err)
		time.Sleep(gap)
	}
	took := time.Since(start)
	require.Eventually(t, func() bool { return b.distinct() == n }, 10*time.Second, time.Millisecond)
	return took
}

// A steady trickle of messages is claimed in groups, a claim at most every ClaimInterval, where without pacing each
// message's wake-up starts a claim of its own.
func TestClaimIntervalGathersATrickle(t *testing.T) {
	t.Parallel()
	const n, gap, interval = 60, 10 * time.Millisecond, 100 * time.Millisecond

	paced := setup(t)
	b, claims := countedRelay(t, paced, func(c *outbox.RelayConfig) { c.ClaimInterval = interval })
	started(t, claims)
	took := trickle(t, paced, b, n, gap)
	bound := int64(took/interval) + 3
	require.LessOrEqual(t, claims.Load(), bound, "a claim at most every %v over %v", interval, took)

	unpaced := setup(t)
	b, claims = countedRelay(t, unpaced, func(*outbox.RelayConfig) {}) // the default: no pacing
	started(t, claims)
	trickle(t, unpaced, b, n, gap)
	require.Greater(t, claims.Load(), int64(n/2), "without pacing, a wake-up per message starts a claim")
}

// The first message after a quiet spell is claimed at once: pacing only holds back a claim that follows another
// within ClaimInterval.
func TestClaimIntervalDoesNotDelayTheFirstMessageAfterAQuietSpell(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	e := setup(t)
	b, _ := countedRelay(t, e, func(c *outbox.RelayConfig) { c.ClaimInterval = interval })
	ctx := context.Background()
	// The least of three waits, so a pause of a loaded machine cannot fail the test; a paced claim would make every
	// one of them about an interval long.
	least := time.Hour
	for i := range 3 {
		time.Sleep(interval + 300*time.Millisecond) // longer than the interval since the last claim
		staged := time.Now()
		_, err := e.ob.Stage(ctx, outbox.Message{ID: fmt.Sprintf("quiet-%d", i), Topic: "quiet", Payload: []byte("{}")})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return b.distinct() == i+1 }, 10*time.Second, time.Millisecond)
		log := b.snapshot()
		least = min(least, log[len(log)-1].at.Sub(staged))
	}
	require.Less(t, least, interval/2, "every message waited for a claim interval after a quiet spell")
}

// A claim that fills its batch is followed by the next at once: a backlog drains at the rate of the claims, not
// one batch per ClaimInterval.
func TestClaimIntervalDoesNotHoldBackABacklog(t *testing.T) {
	t.Parallel()
	const n, batch, interval = 300, 10, 500 * time.Millisecond
	e := setup(t)
	_, err := e.ob.Stage(context.Background(), msgs("backlog", n, nil)...)
	require.NoError(t, err)
	start := time.Now()
	b, claims := countedRelay(t, e, func(c *outbox.RelayConfig) {
		c.BatchSize = batch
		c.ClaimInterval = interval
	})
	require.Eventually(t, func() bool { return b.distinct() == n }, 20*time.Second, time.Millisecond)
	took := time.Since(start)
	// A claim's hook runs as the claim returns, which may be after its rows were delivered.
	require.Eventually(t, func() bool { return claims.Load() >= int64(n/batch) }, 5*time.Second, time.Millisecond,
		"a claim takes at most a batch")
	require.Less(t, took, time.Duration(n/batch)*interval/4,
		"%d claims of full batches took %v: they were paced", claims.Load(), took)
}

// A Drain is never paced: its claims that leave room (the last of a batch, the empty one that ends it) follow at
// once, so it returns as soon as the outbox is empty, not a ClaimInterval per claim later.
func TestClaimIntervalDoesNotPaceADrain(t *testing.T) {
	t.Parallel()
	const interval = 30 * time.Second
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("drain", 3, nil)...)
	require.NoError(t, err)
	r := e.relay(func(c *outbox.RelayConfig) {
		c.BatchSize = 2 // a full claim of 2, then one of 1 that leaves room, then an empty one
		c.PollingInterval = time.Minute
		c.ClaimInterval = interval
	})
	b := newBroker()
	start := time.Now()
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	require.Less(t, time.Since(start), interval/6, "the drain's claims were paced")
}
