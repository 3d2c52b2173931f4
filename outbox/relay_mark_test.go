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

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A mark whose rows are partly in the ledger already (a re-staging that raced their first mark) fails on the
// ledger's key and is run again with the insert that skips them: every row leaves the outbox, the ledger keeps
// one entry per message (the earlier one untouched), and the promotions carried by the mark still happen.
func TestMarkOfMessagesAlreadyInTheLedger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	key := func(i int) string {
		if i < 3 {
			return "k"
		}
		return ""
	}
	staged := msgs("ledger", 5, key) // ledger-00000..02 on key k, 03 and 04 unordered
	_, err := e.ob.Stage(ctx, staged...)
	require.NoError(t, err)
	earlier := time.Now().Add(-time.Minute).Truncate(time.Second) // recent: the drain's cleanup keeps it
	pgtest.Exec(t, e.pool, `INSERT INTO `+pgtest.Q(e.schema, "outbox_sent")+` (message_id, tenant_id, topic,
		message_type, source_position, attempts, created_at, sent_at)
		SELECT message_id, tenant_id, topic, message_type, source_position, 1, created_at, $1
		FROM `+pgtest.Q(e.schema, "outbox")+` WHERE message_id IN ('ledger-00000', 'ledger-00004')`, earlier)

	// One row per claim and one worker: the key's first message ends its run, so its mark promotes the next.
	r := e.relay(func(c *outbox.RelayConfig) { c.BatchSize, c.MaxDegreeOfParallelism = 1, 1 })
	b := newBroker()
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 5, res.Published)
	require.Zero(t, e.count("outbox"), "every row left the outbox")
	require.EqualValues(t, 5, e.count("outbox_sent"), "one ledger entry per message")
	require.EqualValues(t, 2, e.count("outbox_sent", "sent_at = '"+earlier.Format(time.RFC3339)+"'"),
		"the entries already there are kept as they were")
	var order []string
	for _, p := range b.log {
		if p.key == "k" {
			order = append(order, p.id)
		}
	}
	require.Equal(t, []string{"ledger-00000", "ledger-00001", "ledger-00002"}, order)

	res, err = r.Drain(ctx, b)
	require.NoError(t, err)
	require.Zero(t, res.Published, "nothing is published again")
}

// The claimer claims when something may have fallen due: a wake-up for a staged message, a poll, a mark that
// promoted a key's next message. A mark that promoted nothing does not wake it: at moderate rates that made a
// second, empty claim (a round trip and a transaction) per message.
func TestMarkWakesTheClaimerOnlyWhenItPromoted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var claims, empty atomic.Int64
	r := e.relay(func(c *outbox.RelayConfig) {
		c.PollingInterval = time.Minute // no poll during the test: every claim below follows a wake-up
		c.Hooks.Claimed = func(_ context.Context, rows int, _ time.Duration, _ error) {
			claims.Add(1)
			if rows == 0 {
				empty.Add(1)
			}
		}
	})
	b := newBroker()
	runRouter(t, r, b, nil)
	waitPublished := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(b.snapshot()) >= n }, 10*time.Second, time.Millisecond)
	}

	// Messages one at a time, each on a key of its own (a mark with a promotion that finds nothing parked).
	const n = 20
	start := claims.Load()
	for i := range n {
		_, err := e.ob.Stage(ctx, outbox.Message{ID: fmt.Sprintf("alone-%d", i), Topic: "alone",
			PartitionKey: fmt.Sprintf("k%d", i), Payload: []byte("{}")})
		require.NoError(t, err)
		waitPublished(i + 1)
		require.Eventually(t, func() bool { return e.count("outbox") == 0 }, 10*time.Second, time.Millisecond)
	}
	got := claims.Load() - start
	require.LessOrEqual(t, got, int64(n+2), "one claim per staged message (%d empty)", empty.Load())

	// A key's second message, staged while the first is being delivered, is parked behind it; the mark of the
	// first promotes it, and the claimer claims it then, not at a poll a minute later.
	b.mu.Lock()
	b.hold = 300 * time.Millisecond
	b.mu.Unlock()
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "pair-1", Topic: "pair", PartitionKey: "pair", Payload: []byte("{}")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.count("outbox", "lease_owner IS NOT NULL") == 1 }, 10*time.Second,
		time.Millisecond)
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "pair-2", Topic: "pair", PartitionKey: "pair", Payload: []byte("{}")})
	require.NoError(t, err)
	require.EqualValues(t, 1, e.count("outbox", "next_attempt_at = 'infinity'"), "the second waits behind the first")
	waitPublished(n + 2)
	require.Equal(t, "pair-2", b.snapshot()[n+1].id)
}

// staggered is a publisher that accepts one publication at a time, each taking gap: acknowledgements of the
// deliveries in flight arrive one by one, gap apart.
type staggered struct {
	mu    sync.Mutex
	gap   time.Duration
	last  time.Time   // when the latest publication returned
	times []time.Time // when each publication returned
}

func (s *staggered) Publish(string, ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	time.Sleep(s.gap)
	s.last = time.Now()
	s.times = append(s.times, s.last)
	return nil
}

// windows counts the gathering windows the acknowledgements observed fall into: a window opens at the first
// acknowledgement not in the previous one and holds those within width of it. A machine that slows the publisher
// spreads the acknowledgements and makes more windows, so a bound drawn from them holds on any machine.
func (s *staggered) windows(width time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var open time.Time
	for _, at := range s.times {
		if n == 0 || at.Sub(open) > width {
			n++
			open = at
		}
	}
	return n
}

func (s *staggered) Close() error { return nil }

// Acknowledgements that arrive while other deliveries are under way share a mark: the marker waits a few
// milliseconds for them rather than marking each as it comes (a mark is a round trip of four statements), and a
// message with nothing else in flight is marked at once.
func TestMarkGathersTheAcknowledgementsOfDeliveriesUnderWay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var marks, marked atomic.Int64
	var lastMark atomic.Value // when the latest mark started
	r := e.relay(func(c *outbox.RelayConfig) {
		c.MaxDegreeOfParallelism = 4
		c.Hooks.Marked = func(_ context.Context, rows int, took time.Duration, err error) {
			if err == nil && rows > 0 {
				lastMark.Store(time.Now().Add(-took))
				marked.Add(int64(rows))
				marks.Add(1)
			}
		}
	})
	const n = 60
	_, err := e.ob.Stage(ctx, msgs("gathered", n, nil)...)
	require.NoError(t, err)
	pub := &staggered{gap: time.Millisecond}
	runRouter(t, r, pub, nil)
	require.Eventually(t, func() bool { return marked.Load() == n }, 20*time.Second, time.Millisecond)
	// An acknowledgement a millisecond: marking each as it came made 40-60 marks here (the ones that arrived while
	// a mark ran went into the next); gathering for markGather (5ms) makes about one mark per 5ms window of
	// acknowledgements, n / 5 when the sleeps keep time. The bound is drawn from the windows observed, with room
	// for a mark that starts mid-window, and stays well below one mark per acknowledgement.
	windows := pub.windows(5 * time.Millisecond)
	require.LessOrEqual(t, marks.Load(), int64(min(2*windows+2, n*2/3)),
		"%d marks for %d acknowledgements in %d windows of 5ms", marks.Load(), n, windows)

	// Alone, a message is marked as soon as it is acknowledged: from the publication's return to the mark's start,
	// less than the gathering time (the least of five, so a pause of the machine cannot fail the test; gathering
	// would make every one of them longer).
	least := time.Hour
	for i := range 5 {
		before := marks.Load()
		_, err = e.ob.Stage(ctx, outbox.Message{ID: fmt.Sprintf("alone-%d", i), Topic: "alone", Payload: []byte("{}")})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return marks.Load() == before+1 }, 10*time.Second, time.Millisecond)
		pub.mu.Lock()
		wait := lastMark.Load().(time.Time).Sub(pub.last)
		pub.mu.Unlock()
		least = min(least, wait)
	}
	require.Less(t, least, 4*time.Millisecond, "a lone message waited before its mark")
	require.EqualValues(t, 0, e.count("outbox"))
}
