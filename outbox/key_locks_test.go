package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A key's sequence numbers are drawn under the key's lock, and a new message is parked behind what the key still has
// (pending messages, a dead letter holding it), probed under that lock. These cases are the ones that design makes
// possible to get wrong: a key that empties and refills around a dead letter, redriven and discarded, and a
// released dead letter coming back to a refilled key. Places in the key's order are compared (e.seqs), and a
// number is never reused.
func TestKeySequenceAroundDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	one := func(id string) outbox.Message {
		return outbox.Message{ID: id, Topic: "accounts", PartitionKey: "k", Payload: []byte(id)}
	}
	stage := func(e *env, ids ...string) {
		t.Helper()
		for _, id := range ids { // one transaction each: the commits set the order
			_, err := e.ob.Stage(ctx, one(id))
			require.NoError(t, err)
		}
	}
	drain := func(e *env, b *broker, retries int) outbox.DrainResult {
		t.Helper()
		res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(retries) }).Drain(ctx, b)
		require.NoError(t, err)
		return res
	}
	key := func(e *env) map[string][2]int64 { // id -> (place, parked) for the key's pending rows
		out := map[string][2]int64{}
		for k, v := range e.seqs() {
			out[k[len(stagehand.NoTenant)+1:]] = v
		}
		return out
	}

	t.Run("redriven", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		b := newBroker()
		b.setFail(rejectPrefix("m1"))
		stage(e, "m1")
		require.Equal(t, outbox.DrainResult{Failed: 1, DeadLettered: 1}, drain(e, b, 0))
		// The key is empty but held: new messages number after the dead letter, parked behind it.
		stage(e, "m2", "m3")
		require.Equal(t, map[string][2]int64{"m2": {2, 1}, "m3": {3, 1}}, key(e))
		b.setFail(nil)
		n, err := e.ob.AllTenants().Redrive(ctx, "m1")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, map[string][2]int64{"m1": {1, 0}, "m2": {2, 1}, "m3": {3, 1}}, key(e),
			"the redriven message keeps its place at the head")
		last := rawSeq(e, "m3")
		require.Equal(t, 3, drain(e, b, 0).Published)
		require.Equal(t, []string{"m1", "m2", "m3"}, firstOrder(b.snapshot())["k"])
		// Empty and free: due at once, numbered after every earlier message of the key.
		stage(e, "m4")
		require.Equal(t, map[string][2]int64{"m4": {1, 0}}, key(e))
		require.Greater(t, rawSeq(e, "m4"), last, "a number is never reused")
	})

	t.Run("discarded", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		b := newBroker()
		b.setFail(rejectPrefix("m1"))
		stage(e, "m1", "m2")
		require.Equal(t, outbox.DrainResult{Failed: 1, DeadLettered: 1}, drain(e, b, 0))
		stage(e, "m3")
		require.Equal(t, map[string][2]int64{"m2": {2, 1}, "m3": {3, 1}}, key(e))
		_, err := e.ob.AllTenants().Discard(ctx, "m1")
		require.NoError(t, err)
		require.Equal(t, map[string][2]int64{"m2": {1, 0}, "m3": {2, 1}}, key(e), "the discard released the key")
		b.setFail(nil)
		require.Equal(t, 2, drain(e, b, 0).Published)
		require.Equal(t, []string{"m2", "m3"}, firstOrder(b.snapshot())["k"])
	})

	t.Run("released", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		b := newBroker()
		b.setFail(rejectPrefix("m1"))
		stage(e, "m1")
		res, err := e.relay(func(c *outbox.RelayConfig) {
			c.MaxRetryCount = outbox.Retries(0)
			c.ReleaseKeyOnDeadLetter = true
		}).Drain(ctx, b)
		require.NoError(t, err)
		require.Equal(t, outbox.DrainResult{Failed: 1, DeadLettered: 1}, res)
		// A dead letter that released its key holds nothing, but keeps its number: the key goes on after it.
		stage(e, "m2", "m3")
		require.Equal(t, map[string][2]int64{"m2": {2, 0}, "m3": {3, 1}}, key(e))
		// Redriven, the released message keeps its number, so it goes before the key's messages still pending.
		b.setFail(nil)
		_, err = e.ob.AllTenants().Redrive(ctx, "m1")
		require.NoError(t, err)
		require.Equal(t, 3, drain(e, b, 0).Published)
		require.Equal(t, []string{"m1", "m2", "m3"}, firstOrder(b.snapshot())["k"])
	})
}

// rawSeq is the sequence number of the pending message id.
func rawSeq(e *env, id string) int64 {
	e.t.Helper()
	return pgtest.Count(e.t, e.pool, `SELECT seq FROM `+pgtest.Q(e.schema, "outbox")+` WHERE message_id = $1`, id)
}

// Staging transactions of one key are serialized by the key's lock from their staging statement to their end, so
// their messages reach the broker in commit order even while a relay empties the key and it refills. The commit
// order is recorded inside each transaction, after its staging (so under the key's lock), with a sequence.
func TestConcurrentStagersOfOneKeyPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	log := pgtest.Q(e.schema, "commit_log")
	pgtest.Exec(t, e.pool, `CREATE TABLE `+log+` (n bigserial, message_id text)`)
	b := newBroker()
	runRouter(t, e.relay(nil), b, nil)
	const writers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("w%d-%03d", w, i)
				msgs := []outbox.Message{{ID: id, Topic: "t", PartitionKey: "k", Payload: []byte(id)}}
				if i%3 == 0 { // some transactions stage two messages of the key, and one unordered
					msgs = append(msgs, outbox.Message{ID: id + "b", Topic: "t", PartitionKey: "k"},
						outbox.Message{ID: id + "u", Topic: "t"})
				}
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if _, err := e.ob.StageTx(ctx, tx, msgs...); err != nil {
						return err
					}
					for _, m := range msgs {
						if m.PartitionKey != "" {
							if _, err := tx.Exec(ctx, `INSERT INTO `+log+` (message_id) VALUES ($1)`, m.ID); err != nil {
								return err
							}
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				e.ob.Notify()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var want []string
	rows, err := e.pool.Query(ctx, `SELECT message_id FROM `+log+` ORDER BY n`)
	require.NoError(t, err)
	want, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	pgtest.Eventually(t, 60*time.Second, func() bool { return len(firstOrder(b.snapshot())["k"]) >= len(want) },
		"the relay did not publish the key's %d messages", len(want))
	require.Equal(t, want, firstOrder(b.snapshot())["k"])
}

// Staging a batch probes the key indexes a bounded number of times per message, whatever the batch's size: a plan
// that joined the messages with their keys as a nested loop probed a thousand keys a thousand times each (a minute to
// stage 15,000 messages over 1,000 keys). Counted in index scans of the key indexes, not in time.
func TestStagingProbesEachKeyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	scans := func() int64 {
		// The staging connection's counters reach the statistics views when it flushes them.
		_, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		return pgtest.Count(t, e.pool, `SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes
			WHERE schemaname = $1 AND indexrelname IN ('outbox_key_idx', 'outbox_dead_letters_key_idx')`, e.schema)
	}
	before := scans()
	const keys = 1000
	batch := msgs("t", 2*keys, func(i int) string { return fmt.Sprint("k", i%keys) })
	n, err := e.ob.StageTx(ctx, conn, batch...)
	require.NoError(t, err)
	require.Equal(t, 2*keys, n)
	probes := scans() - before
	require.Positive(t, probes)
	require.LessOrEqual(t, probes, int64(4*len(batch)), "staging %d messages over %d keys scanned the key indexes %d "+
		"times", len(batch), keys, probes)
	require.Equal(t, int64(keys), e.count("outbox", "next_attempt_at = 'infinity'"), "each key's second message waits")
}
