package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// stageKeyed stages n messages over keys k000..k(keys-1), round robin, in batches, and returns the IDs of each key
// in staging order.
func stageKeyed(t *testing.T, e *env, topic string, n, keys int) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	var batch []outbox.Message
	for i := range n {
		key := fmt.Sprintf("k%03d", i%keys)
		id := fmt.Sprintf("%s-%05d", topic, i)
		want[key] = append(want[key], id)
		batch = append(batch, outbox.Message{ID: id, Topic: topic, PartitionKey: key, Payload: []byte(id)})
		if len(batch) == 500 || i == n-1 {
			_, err := e.ob.Stage(context.Background(), batch...)
			require.NoError(t, err)
			batch = nil
		}
	}
	return want
}

// Contract 6 under load: several relays, a destination rejecting 20% of publishes at random. Every message is
// published, first publications reach the broker in per-key staging order, and a key whose messages keep failing
// holds back only itself.
func TestRelaysKeepPerKeyOrderUnderRandomRejections(t *testing.T) {
	t.Parallel()
	for _, relays := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d relays", relays), func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.Migrated(t)
			e := setupOn(t, pool, schema, nil)
			want := stageKeyed(t, e, "orders", 10000, 100)

			var blocked sync.Map // key -> rejecting until released
			blocked.Store("k007", true)
			b := newBroker()
			var rngMu sync.Mutex
			rng := rand.New(rand.NewPCG(1, uint64(relays)))
			b.setFail(func(m *message.Message) error {
				if _, ok := blocked.Load(m.Metadata.Get(outbox.HeaderPartitionKey)); ok {
					return errRejected
				}
				rngMu.Lock()
				defer rngMu.Unlock()
				if rng.Float64() < 0.2 {
					return errRejected
				}
				return nil
			})
			for range relays {
				other := setupOn(t, pool, schema, nil) // one Outbox per relay, as in separate processes
				r := other.relay(func(c *outbox.RelayConfig) {
					c.BatchSize = 200
					c.MaxDegreeOfParallelism = 8
					c.MaxRetryCount = outbox.Retries(1000)
					c.RetryDelay = 5 * time.Millisecond
					c.MaxRetryDelay = 20 * time.Millisecond
				})
				runRouter(t, r, b, nil)
			}

			// Every other key drains while k007 is still rejected.
			pgtest.Eventually(t, 90*time.Second, func() bool {
				return b.distinct() == 10000-len(want["k007"])
			}, "the other keys did not drain while k007 was failing (%d published)", b.distinct())
			require.EqualValues(t, len(want["k007"]), e.count("outbox", "partition_key = 'k007'"))
			blocked.Delete("k007")
			pgtest.Eventually(t, 30*time.Second, func() bool { return b.distinct() == 10000 },
				"not every message was published")

			got := firstOrder(b.snapshot())
			for key, ids := range want {
				require.Equal(t, ids, got[key], "first publications of key %s out of staging order", key)
			}
			pgtest.Eventually(t, 10*time.Second, func() bool { return e.count("outbox") == 0 },
				"rows left in the outbox")
			require.EqualValues(t, 10000, e.count("outbox_sent"))
			require.Zero(t, e.count("outbox_dead_letters"))
		})
	}
}

// A broker that cannot be reached costs no attempt and dead-letters nothing: the relay backs off as a whole and
// delivers everything once the broker is back.
func TestUnreachableBrokerCountsNoAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stageKeyed(t, e, "t", 300, 10)
	_, err := e.ob.Stage(context.Background(), msgs("u", 50, nil)...)
	require.NoError(t, err)

	b := newBroker()
	down := time.Now().Add(10 * time.Second)
	b.setFail(func(*message.Message) error {
		if time.Now().Before(down) {
			return fmt.Errorf("publish: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
		}
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(0) // a single counted attempt would dead-letter
		c.BrokerBackoff = 100 * time.Millisecond
		c.MaxBrokerBackoff = time.Second
	})
	runRouter(t, r, b, nil)

	for time.Now().Before(down.Add(-time.Second)) {
		require.Zero(t, e.count("outbox", "attempts > 0"), "an unreachable broker must not count attempts")
		require.Zero(t, e.count("outbox_dead_letters"))
		time.Sleep(200 * time.Millisecond)
	}
	require.EqualValues(t, 350, e.count("outbox"), "nothing is published while the broker is down")
	require.NotZero(t, e.count("outbox", "last_error LIKE '%connection refused%'"),
		"the reason a message is still pending is recorded")
	pgtest.Eventually(t, 20*time.Second, func() bool { return b.distinct() == 350 },
		"not delivered after the broker came back (%d)", b.distinct())
	require.Zero(t, e.count("outbox_dead_letters"))
	require.Zero(t, e.count("outbox_sent", "attempts <> 1"), "every message took exactly one counted attempt")
}

// A message the destination always rejects is dead-lettered with its error after its retries; the later messages
// of its key wait (a sequenced dead-letter queue) while other keys flow; redriving it delivers it and releases
// the key, in order.
func TestPoisonMessageHoldsItsKeyUntilRedriven(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var batch []outbox.Message
	for i := range 5 {
		batch = append(batch, outbox.Message{ID: fmt.Sprintf("p%d", i), Topic: "t", PartitionKey: "poisoned"})
	}
	_, err := e.ob.Stage(ctx, batch...)
	require.NoError(t, err)

	b := newBroker()
	poison := errors.New("schema validation failed: amount must be positive")
	b.setFail(func(m *message.Message) error {
		if m.UUID == "p1" {
			return poison
		}
		return nil
	})
	var hookMu sync.Mutex
	var deadHooked []string
	var outcomes []outbox.Outcome
	r := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(2)
		c.Hooks.DeadLettered = func(_ context.Context, d outbox.Delivery, err error) {
			hookMu.Lock()
			defer hookMu.Unlock()
			deadHooked = append(deadHooked, fmt.Sprintf("%s attempt %d: %v", d.MessageID, d.Attempt, err))
		}
		c.Hooks.Delivered = func(_ context.Context, d outbox.Delivery, o outbox.Outcome, _ error, _ time.Duration) {
			if d.MessageID == "p1" {
				hookMu.Lock()
				defer hookMu.Unlock()
				outcomes = append(outcomes, o)
			}
		}
	})
	runRouter(t, r, b, nil)

	// The hooks run after the dead-letter move commits: wait for both. Read under the lock, assert outside it (a
	// failed assertion must not leave the relay's next hook call blocked for ever).
	hooked := func() ([]string, []outbox.Outcome) {
		hookMu.Lock()
		defer hookMu.Unlock()
		return slices.Clone(deadHooked), slices.Clone(outcomes)
	}
	pgtest.Eventually(t, 10*time.Second, func() bool {
		dead, outs := hooked()
		return e.count("outbox_dead_letters") == 1 && len(dead) > 0 && len(outs) >= 3
	}, "p1 was not dead-lettered")
	dead, outs := hooked()
	require.Equal(t, []string{"p1 attempt 3: " + poison.Error()}, dead)
	require.Equal(t, []outbox.Outcome{outbox.Rejected, outbox.Rejected, outbox.Rejected}, outs)
	dl, err := e.ob.AllTenants().DeadLetter(ctx, "p1")
	require.NoError(t, err)
	require.Equal(t, 3, dl.Attempts, "MaxRetryCount 2 means three attempts")
	require.Contains(t, dl.LastError, poison.Error(), "the publisher's own error is recorded")
	require.True(t, dl.HoldsKey)
	require.Len(t, b.attemptsOf("p1"), 3)

	// Later messages of the key are held, other keys flow.
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "other", Topic: "t", PartitionKey: "healthy"},
		outbox.Message{ID: "p5", Topic: "t", PartitionKey: "poisoned"})
	require.NoError(t, err)
	pgtest.Eventually(t, 5*time.Second, func() bool { return b.distinct() == 2 }, "the healthy key was blocked")
	time.Sleep(300 * time.Millisecond) // several polls
	require.Equal(t, []string{"p0", "other"}, ids(b.snapshot()))
	st, err := e.ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 4, st.Parked)
	require.EqualValues(t, 4, st.HeldByDeadLetter, "p2..p5 are held by p1's dead letter")
	require.Zero(t, st.WaitingBehindPending)

	list, err := e.ob.AllTenants().DeadLetters(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "p1", list[0].ID)

	b.setFail(nil)
	n, err := e.ob.AllTenants().Redrive(ctx, "p1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 7 }, "redrive did not release the key")
	require.Equal(t, []string{"p0", "p1", "p2", "p3", "p4", "p5"}, firstOrder(b.snapshot())["poisoned"])
	require.Zero(t, e.count("outbox_dead_letters"))
}

// With ReleaseKeyOnDeadLetter the key flows on past a dead letter; a discarded dead letter stays known.
func TestDeadLetterCanReleaseItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("t", 4, func(int) string { return "k" })...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if m.UUID == "t-00001" {
			return errRejected
		}
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(0)
		c.ReleaseKeyOnDeadLetter = true
	})
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 3, Failed: 1, DeadLettered: 1}, res)
	require.Equal(t, []string{"t-00000", "t-00002", "t-00003"}, ids(b.snapshot()))

	dl, err := e.ob.AllTenants().DeadLetter(ctx, "t-00001")
	require.NoError(t, err)
	require.False(t, dl.HoldsKey)
	n, err := e.ob.AllTenants().Discard(ctx, "t-00001")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = e.ob.Stage(ctx, msgs("t", 2, func(int) string { return "k" })...)
	require.NoError(t, err)
	require.Zero(t, n, "a discarded message's ID stays known")
}

// Discarding a dead letter that holds its key releases the messages waiting behind it.
func TestDiscardReleasesTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("t", 3, func(int) string { return "k" })...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if m.UUID == "t-00000" {
			return errRejected
		}
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) })
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 1, res.DeadLettered)
	require.Empty(t, b.snapshot())
	_, err = e.ob.AllTenants().Discard(ctx, "t-00000")
	require.NoError(t, err)
	_, err = r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []string{"t-00001", "t-00002"}, ids(b.snapshot()))
}

// Backoff genuinely throttles redelivery: attempts are spaced by at least RetryDelay doubling per attempt, capped by
// MaxRetryDelay.
func TestBackoffSpacesAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.ob.Stage(context.Background(), outbox.Message{ID: "flaky", Topic: "t"})
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if len(b.attemptsOf(m.UUID)) <= 4 {
			return errRejected
		}
		return nil
	})
	retry, maxDelay := 150*time.Millisecond, 400*time.Millisecond
	r := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(10)
		c.RetryDelay = retry
		c.MaxRetryDelay = maxDelay
		c.PollingInterval = 10 * time.Millisecond
	})
	runRouter(t, r, b, nil)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 1 }, "never delivered")
	at := b.attemptsOf("flaky")
	require.Len(t, at, 5)
	floors := []time.Duration{retry, 2 * retry, maxDelay, maxDelay} // 150ms, 300ms, then capped at 400ms
	for i, floor := range floors {
		// On the wall clock, which the relay schedules by (next_attempt_at is a time of day, stored in PostgreSQL):
		// a virtual machine's wall clock can run measurably faster than its monotonic clock while the host syncs
		// it (5,000 ppm measured here), and a backoff of exactly 400 ms then measured 399.5 ms on the monotonic one.
		gap := at[i+1].Round(0).Sub(at[i].Round(0))
		require.GreaterOrEqual(t, gap, floor, "attempt %d came %s after the previous one", i+2, gap)
		require.Less(t, gap, floor+time.Second, "attempt %d waited far too long (%s)", i+2, gap)
	}
}

// A delivery nobody acknowledges counts as a rejected attempt once the ack deadline passes.
func TestAckDeadlineCountsAnAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.ob.Stage(context.Background(), outbox.Message{ID: "ignored", Topic: "t"})
	require.NoError(t, err)
	r := e.relay(func(c *outbox.RelayConfig) {
		c.AckDeadline = 200 * time.Millisecond
		c.RetryDelay = time.Hour
		c.MaxRetryDelay = time.Hour
	})
	ch, err := r.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	first := <-ch
	require.Equal(t, "ignored", first.UUID)
	pgtest.Eventually(t, 5*time.Second, func() bool { return e.count("outbox", "attempts = 1") == 1 },
		"the ack deadline did not count an attempt")
	require.EqualValues(t, 1, e.count("outbox", "last_error = '"+outbox.ErrAckDeadline.Error()+"'"))
	require.True(t, first.Ack(), "a late ack is accepted by Watermill but changes nothing")
	require.EqualValues(t, 1, e.count("outbox"))
}

// Exactly MaxDegreeOfParallelism deliveries are in flight at the peak, and never two of one key.
func TestMaxDegreeOfParallelismBoundsDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("free", 40, nil)...)
	require.NoError(t, err)
	b := newBroker()
	b.hold = 50 * time.Millisecond
	r := e.relay(func(c *outbox.RelayConfig) { c.MaxDegreeOfParallelism = 5 })
	runRouter(t, r, b, nil)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 40 }, "not all delivered")
	require.Equal(t, 5, b.peakInFlight(), "peak deliveries in flight")

	// Two keys: never more than one delivery per key in flight, so the peak is two.
	e2 := setup(t)
	_, err = e2.ob.Stage(ctx, msgs("keyed", 20, func(i int) string { return fmt.Sprint(i % 2) })...)
	require.NoError(t, err)
	b2 := newBroker()
	b2.hold = 20 * time.Millisecond
	r2 := e2.relay(func(c *outbox.RelayConfig) { c.MaxDegreeOfParallelism = 5 })
	runRouter(t, r2, b2, nil)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b2.distinct() == 20 }, "not all delivered")
	require.Equal(t, 2, b2.peakInFlight())
}

// A scheduled message is not delivered before its time.
func TestScheduledMessageWaitsForItsTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A time of day without the monotonic reading, so the checks below compare wall clocks, as the relay does (a
	// virtual machine's wall clock can run measurably faster than its monotonic one: see TestBackoffSpacesAttempts).
	at := time.Now().Add(2 * time.Second).Round(0)
	_, err := e.ob.Stage(context.Background(), outbox.Message{ID: "later", Topic: "t", ScheduledAt: at},
		outbox.Message{ID: "now", Topic: "t"})
	require.NoError(t, err)
	b := newBroker()
	r := e.relay(func(c *outbox.RelayConfig) { c.PollingInterval = 5 * time.Second })
	runRouter(t, r, b, nil)
	pgtest.Eventually(t, 5*time.Second, func() bool { return b.distinct() == 2 }, "scheduled message not delivered")
	log := b.snapshot()
	require.Equal(t, "now", log[0].id)
	require.Equal(t, "later", log[1].id)
	require.False(t, log[1].at.Before(at), "delivered %s before its time", at.Sub(log[1].at))
	require.Less(t, log[1].at.Sub(at), time.Second, "the relay wakes for the next due row, not the next poll")
}

func TestInvalidSettingsNameTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg     outbox.RelayConfig
		field   string
		message string
	}{
		{outbox.RelayConfig{BatchSize: -1}, "BatchSize", "must be between 1 and 10000"},
		{outbox.RelayConfig{BatchSize: 10001}, "BatchSize", "must be between 1 and 10000"},
		{outbox.RelayConfig{PollingInterval: 5 * time.Millisecond}, "PollingInterval",
			"must be at least 10ms"},
		{outbox.RelayConfig{PollingInterval: 50 * time.Millisecond, ClaimInterval: 60 * time.Millisecond},
			"ClaimInterval", "must not be longer than PollingInterval"},
		{outbox.RelayConfig{ClaimInterval: -time.Millisecond}, "ClaimInterval", "must not be negative"},
		{outbox.RelayConfig{MaxRetryCount: outbox.Retries(-1)}, "MaxRetryCount", "must not be negative"},
		{outbox.RelayConfig{MaxDegreeOfParallelism: -2}, "MaxDegreeOfParallelism",
			"must be at least 1"},
		{outbox.RelayConfig{RetryDelay: -time.Second}, "RetryDelay", "must be positive"},
		{outbox.RelayConfig{ProcessorID: "  "}, "ProcessorID", "must not be blank"},
		{outbox.RelayConfig{RetryDelay: time.Hour, MaxRetryDelay: time.Minute}, "MaxRetryDelay",
			"must be at least RetryDelay"},
		{outbox.RelayConfig{ClaimDuration: time.Millisecond}, "ClaimDuration", "must be at least 100ms"},
		{outbox.RelayConfig{Jitter: 2}, "Jitter", "must be between 0 and 1"},
	}
	pool := pgtest.Pool(t)
	ob, err := outbox.New(pool, &outbox.Config{Schema: "unused"})
	require.NoError(t, err)
	for _, c := range cases {
		_, err := ob.NewRelay(&c.cfg)
		var ce *outbox.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", c.cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.Equal(t, c.field, ce.Field)
		require.Equal(t, c.message, ce.Reason)
		require.ErrorAs(t, c.cfg.Validate(), &ce)
	}
	for _, p := range []*outbox.RelayConfig{nil, outbox.HighThroughput(), outbox.Balanced(), outbox.HighReliability()} {
		require.NoError(t, p.Validate())
	}
	_, err = ob.NewInbox(&outbox.InboxConfig{MaxAttempts: -1})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	_, err = ob.NewInbox(&outbox.InboxConfig{ContentionRetries: -2})
	require.ErrorContains(t, err, "ContentionRetries")
	_, err = ob.NewInbox(&outbox.InboxConfig{ContentionRetries: -1})
	require.NoError(t, err)
	_, err = outbox.New(nil, nil)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

func TestProfilesMatchTheSeed(t *testing.T) {
	t.Parallel()
	type p struct {
		batch     int
		poll      time.Duration
		retries   int
		delay     time.Duration
		parallel  int
		horizonLE time.Duration
	}
	check := func(c *outbox.RelayConfig, want p) {
		require.Equal(t, want.batch, c.BatchSize)
		require.Equal(t, want.poll, c.PollingInterval)
		require.Equal(t, want.retries, *c.MaxRetryCount)
		require.Equal(t, want.delay, c.RetryDelay)
		require.Equal(t, want.parallel, c.MaxDegreeOfParallelism)
		h, err := c.RetryHorizon()
		require.NoError(t, err)
		require.LessOrEqual(t, h, want.horizonLE)
	}
	check(outbox.HighThroughput(), p{1000, 100 * time.Millisecond, 3, time.Minute, 8, 10 * time.Minute})
	check(outbox.Balanced(), p{100, time.Second, 5, 5 * time.Minute, 4, 3 * time.Hour})
	check(outbox.HighReliability(), p{10, 5 * time.Second, 10, 15 * time.Minute, 1, 10 * time.Hour})
}

// RetryHorizon saturates at the largest time.Duration instead of overflowing (it came out as about -2 million
// hours for RetryDelay 1m, MaxRetryDelay at its maximum and 30 retries), and a huge MaxRetryCount returns at once.
func TestRetryHorizonSaturates(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{30, 64, 1000, math.MaxInt} {
		h, err := (&outbox.RelayConfig{RetryDelay: time.Minute, MaxRetryDelay: math.MaxInt64,
			MaxRetryCount: outbox.Retries(retries)}).RetryHorizon()
		require.NoError(t, err)
		require.Equal(t, time.Duration(math.MaxInt64), h, "retries=%d", retries)
	}
	// Below saturation the sum is exact: 1m, 2m, 4m with no jitter headroom past the 4m cap.
	h, err := (&outbox.RelayConfig{RetryDelay: time.Minute, MaxRetryDelay: 4 * time.Minute, Jitter: 1e-12,
		MaxRetryCount: outbox.Retries(5)}).RetryHorizon()
	require.NoError(t, err)
	require.InDelta(t, float64(15*time.Minute), float64(h), float64(time.Millisecond))
	h, err = (&outbox.RelayConfig{RetryDelay: math.MaxInt64, MaxRetryCount: outbox.Retries(math.MaxInt)}).RetryHorizon()
	require.NoError(t, err)
	require.Equal(t, time.Duration(math.MaxInt64), h)
}

func ids(log []published) []string {
	out := make([]string, len(log))
	for i, p := range log {
		out[i] = p.id
	}
	return out
}

// A drain publishes every message of deep keys, however its claims and marks interleave: a mark promotes a key's
// next message, and a claim that ran beside that mark cannot see it, so a drain ends only on a claim that finds
// nothing with nothing in flight before it. Many short keys, a publisher slow enough for claims to run beside
// marks, and several rounds.
func TestDrainPublishesEveryMessageOfDeepKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const keys, perKey, rounds = 40, 5, 12
	b := newBroker()
	b.setFail(func(*message.Message) error {
		time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) { c.BatchSize, c.MaxDegreeOfParallelism = 10, 2 })
	for round := range rounds {
		topic := fmt.Sprintf("deep%d", round)
		_, err := e.ob.Stage(ctx, msgs(topic, keys*perKey, func(i int) string { return fmt.Sprintf("k%d", i%keys) })...)
		require.NoError(t, err)
		res, err := r.Drain(ctx, b)
		require.NoError(t, err)
		require.Equal(t, keys*perKey, res.Published, "round %d", round)
	}
	require.Zero(t, e.count("outbox"))
}
