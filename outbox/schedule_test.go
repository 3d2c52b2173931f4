package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Scheduled messages go out when due, whatever the polling interval: the relay wakes for the next due row, and a
// row falling due while a claim runs (after the claim's instant, before the next-due query) is claimed at once, not
// a poll later. Each message stands alone (nothing else wakes the relay near its time), so a missed one is late
// until the next message's time or the next poll.
func TestScheduledMessagesGoOutOnTime(t *testing.T) {
	t.Parallel()
	const (
		count   = 8
		spacing = 500 * time.Millisecond
		// Quiet, the latest of them goes out within about 30 ms here; the bound leaves room for a machine loaded
		// by the race detector and parallel tests, and stays under the spacing (how late a missed row is, at the
		// least).
		allowed = 400 * time.Millisecond
	)
	for _, poll := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(poll.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			// The relay runs first (its first claim made), so the messages' times count from a running relay, not
			// from a start that a loaded machine may delay past the first of them.
			var claims atomic.Int64
			b := newBroker()
			r := e.relay(func(c *outbox.RelayConfig) {
				c.PollingInterval = poll
				c.Hooks.Claimed = func(context.Context, int, time.Duration, error) { claims.Add(1) }
			})
			runRouter(t, r, b, nil)
			pgtest.Eventually(t, 10*time.Second, func() bool { return claims.Load() > 0 }, "the relay never claimed")
			start := time.Now().Add(500 * time.Millisecond)
			due := map[string]time.Time{}
			var staged []outbox.Message
			for i := range count {
				// Offsets off the millisecond grid, so due times fall anywhere within a claim's round trip.
				at := start.Add(time.Duration(i)*spacing + time.Duration(i*137)*time.Microsecond)
				id := fmt.Sprintf("at-%02d", i)
				due[id] = at.Truncate(time.Microsecond) // as stored
				staged = append(staged, outbox.Message{ID: id, Topic: "t", ScheduledAt: at})
			}
			_, err := e.ob.Stage(ctx, staged...)
			require.NoError(t, err)
			last := start.Add(count * spacing)
			pgtest.Eventually(t, time.Until(last)+poll+5*time.Second,
				func() bool { return b.distinct() == count }, "scheduled messages not delivered")
			var worst time.Duration
			for _, p := range b.snapshot() {
				late := p.at.Sub(due[p.id])
				require.GreaterOrEqual(t, late, time.Duration(0), "%s delivered before its time", p.id)
				require.LessOrEqual(t, late, allowed, "%s delivered %s late (poll %s)", p.id, late, poll)
				worst = max(worst, late)
			}
			t.Logf("poll %s: %d scheduled messages, latest %s after its time", poll, count, worst)
		})
	}
}

// The race behind a scheduled message going out a whole poll late, forced: a wake-up (a notification) just before
// a row's time starts a claim that does not find it due, the claim is held up until after that time (here by a table
// lock; in production by a busy pool or a slow server), and the relay then asks what falls due next. The row that
// fell due in between must count as due, not as past, so it goes out as soon as the claim ends.
func TestRowFallingDueDuringAClaimIsNotLeftForThePoll(t *testing.T) {
	t.Parallel()
	for _, poll := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(poll.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			at := time.Now().Add(1500 * time.Millisecond)
			_, err := e.ob.Stage(ctx, outbox.Message{ID: "due", Topic: "t", ScheduledAt: at})
			require.NoError(t, err)
			b := newBroker()
			r := e.relay(func(c *outbox.RelayConfig) { c.PollingInterval = poll })
			runRouter(t, r, b, nil)

			time.Sleep(time.Until(at.Add(-60 * time.Millisecond)))
			tx, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "LOCK TABLE "+pgtest.Q(e.schema, "outbox")+" IN EXCLUSIVE MODE")
			require.NoError(t, err)
			time.Sleep(time.Until(at.Add(-30 * time.Millisecond)))
			_, err = e.pool.Exec(ctx, "SELECT pg_notify($1, '')", pgnotify.Channel(e.schema, "outbox"))
			require.NoError(t, err)
			time.Sleep(time.Until(at.Add(20 * time.Millisecond)))
			require.Zero(t, b.distinct(), "delivered through the table lock")
			require.NoError(t, tx.Commit(ctx))

			pgtest.Eventually(t, poll+5*time.Second, func() bool { return b.distinct() == 1 }, "not delivered")
			late := b.snapshot()[0].at.Sub(at)
			// A whole poll late is the bug; half a poll leaves room for a loaded machine (measured: about 60 ms).
			require.Less(t, late, poll/2, "delivered %s late (poll %s)", late, poll)
			t.Logf("poll %s: delivered %s after its time, the claim held up until %s after it", poll, late, 20*time.Millisecond)
		})
	}
}
