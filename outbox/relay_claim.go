package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimer claims batches while there is room and rows are due, and otherwise waits for a wake-up, a poll, or the
// next row falling due, and then until ClaimInterval has passed since its last claim began (pace; never in a
// drain). It sweeps for missed promotions every few polls.
func (loop *claimLoop) claimer() {
	poll := time.NewTimer(0)
	defer poll.Stop()
	var lastClaim time.Time // when the last claim started, on the real clock (ClaimInterval)
	sweepEvery := min(max(5*loop.cfg.PollingInterval, time.Second), 30*time.Second)
	for {
		if loop.ctx.Err() != nil {
			return
		}
		if loop.sweeper() && loop.sweeps.begin(sweepEvery) {
			loop.sweep()
			loop.sweeps.end()
		}
		if !loop.pause.wait(loop.ctx) {
			return
		}
		limit := loop.flight.roomFor(loop.cfg.BatchSize, loop.cfg.MaxDegreeOfParallelism)
		if limit == 0 {
			select {
			case <-loop.flight.room:
				continue
			case <-loop.ctx.Done():
				return
			}
		}
		// The claim's instant bounds the next-due query below: a row falling due while the claim runs is not
		// claimed, and must not be skipped as already past either.
		claimedAt := loop.relay.o.now()
		// A drain ends on a claim that finds nothing while nothing was in flight before it: a mark that ends
		// while a claim runs can promote a key's next message after the claim's snapshot, so a claim that ran
		// beside a mark proves nothing.
		idleBefore := loop.drain && loop.idle()
		lastClaim = time.Now()
		n, next, err := loop.claim(claimedAt, limit)
		if err != nil {
			if loop.ctx.Err() != nil {
				return
			}
			loop.cfg.Logger.Warn("stagehand: outbox claim failed; retrying at the next poll", "error", err)
			if loop.drain {
				loop.tally.fail(err)
				loop.waitIdle()
				return
			}
		}
		if err == nil && n == limit {
			continue // more may be due
		}
		if loop.drain {
			if idleBefore && n == 0 {
				return
			}
			if loop.idle() {
				continue // claim again: nothing in flight now, so that claim decides
			}
			select {
			case <-loop.flight.wake:
			case <-loop.flight.room:
			case <-loop.ctx.Done():
				return
			}
			continue
		}
		wait := loop.cfg.PollingInterval
		if err == nil && next != nil {
			// Compare on the outbox clock, wait on the real one.
			wait = min(wait, max(next.Sub(loop.relay.o.now()), time.Millisecond))
		}
		poll.Reset(wait)
		select {
		case <-loop.listen:
		case <-loop.flight.wake:
		case <-poll.C:
		case <-loop.ctx.Done():
			return
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		if !loop.pace(poll, lastClaim) {
			return
		}
	}
}

// pace waits until ClaimInterval has passed since the last claim started (see RelayConfig.ClaimInterval), on
// poll, which it leaves stopped and drained. It reports false when the loop is ending.
func (loop *claimLoop) pace(poll *time.Timer, lastClaim time.Time) bool {
	wait := time.Until(lastClaim.Add(loop.cfg.ClaimInterval))
	if wait <= 0 {
		return true
	}
	poll.Reset(wait)
	select {
	case <-poll.C:
		return true
	case <-loop.ctx.Done():
		poll.Stop()
		return false
	}
}

// waitIdle waits until a drain has nothing left in flight.
func (loop *claimLoop) waitIdle() {
	for !loop.idle() {
		select {
		case <-loop.flight.wake:
		case <-loop.flight.room:
		case <-time.After(10 * time.Millisecond):
		case <-loop.ctx.Done():
			return
		}
	}
}

// claim claims up to limit due rows (see queries.claim) and queues them for the workers. Outside a drain it also
// returns when the earliest row not yet due at now falls due (nil: none), asked in the same round trip: a claim
// that leaves room is followed by a wait, which ends then at the latest. Asking from the claim's instant rather
// than from the time of the answer keeps a row that fell due in between: it comes back already due, and the
// claimer claims it at once instead of a poll later.
func (loop *claimLoop) claim(now time.Time, limit int) (n int, next *time.Time, err error) {
	start := time.Now()
	var claimed []*row
	defer func() {
		took := time.Since(start)
		loop.relay.tel.claimed(loop.ctx, start, took, claimed, err)
		if h := loop.cfg.Hooks.Claimed; h != nil {
			h(loop.ctx, n, took, err)
		}
	}()
	claim := loop.db.st.claim
	b := &pgx.Batch{}
	b.Queue(claim.SQL, loop.db.args(claim, &relayRow{Now: now, Limit: limit, ClaimUntil: now.Add(loop.cfg.ClaimDuration),
		Topics: loop.topics, RunLength: loop.runLength() - 1, RunHeads: loop.runHeads(), PartLo: loop.lo,
		PartHi: loop.hi})...)
	if !loop.drain {
		b.Queue(loop.relay.o.q.nextDue, now, loop.topics)
	}
	// A claim once sent is waited for, even when the loop is ending: a client that gives up on a statement does not
	// stop it (pgx abandons the connection), so the server may still commit the claim, after the loop has given its
	// rows back. The rows it leased would then stay leased to nobody who knows of them until the lease lapsed, kept
	// from every relay, and from a drain started right after (which then ended without them). Read to the end, the
	// claim's rows are held here, and given back with the rest when the loop ends.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loop.ctx), claimTimeout)
	defer cancel()
	err = loop.db.exec(ctx, b, func(res pgx.BatchResults) error {
		if err := loop.scanClaimed(res, &claimed); err != nil {
			return err
		}
		if loop.drain {
			return nil
		}
		return res.QueryRow().Scan(&next)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	loop.flight.add(claimed)
	return len(claimed), next, nil
}

// claimTimeout bounds the wait for a claim's answer (see claim: it is not cut short when the loop ends).
const claimTimeout = 30 * time.Second

// scanClaimed reads the claim's rows.
func (loop *claimLoop) scanClaimed(res pgx.BatchResults, claimed *[]*row) error {
	rows, err := res.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		rw := &row{}
		if err := rows.Scan(&rw.rid, &rw.id, &rw.topic, &rw.msgType, &rw.payload, &rw.metadata, &rw.tenant,
			&rw.correlationID, &rw.causationID, &rw.partitionKey, &rw.seq, &rw.attempts, &rw.createdAt,
			&rw.scheduledAt); err != nil {
			return err
		}
		*claimed = append(*claimed, rw)
	}
	return rows.Err()
}

// runLength is how many messages of one key a claim takes at most: enough for the batch to fill with runs of
// twice as many keys as there are workers, so workers stay busy while promotions (one per run, when it ends) stay
// rare.
func (loop *claimLoop) runLength() int {
	per := 2 * loop.cfg.MaxDegreeOfParallelism
	return max(1, (loop.cfg.BatchSize+per-1)/per)
}

// runHeads is how many of a claim's heads may bring their runs: at least two per worker, and enough for deep keys
// to fill the batch with runs (one promotion per run rather than per message), while bounding what the claim reads.
func (loop *claimLoop) runHeads() int {
	return max(2*loop.cfg.MaxDegreeOfParallelism, (loop.cfg.BatchSize+7)/8)
}

// sweepClock spaces the sweeps of one subscription's (or drain's) claim loops. A sweep visits every parked key of
// the outbox, whatever its partition, so one sweep per interval serves every partition of the relay; each loop
// sweeping on its own clock made Partitions sweeps of the whole table per interval. Sweeps never overlap: the
// interval runs from the end of the previous one.
type sweepClock struct {
	mu      sync.Mutex
	running bool
	last    time.Time // when the latest sweep ended; zero: none yet
}

// begin reports whether a sweep is due and none is running, and if so claims it for the caller (of loops asking
// at once, one gets true), who calls end when it is done.
func (c *sweepClock) begin(every time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running || !c.last.IsZero() && time.Since(c.last) < every {
		return false
	}
	c.running = true
	return true
}

func (c *sweepClock) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running, c.last = false, time.Now()
}

// sweeper reports whether this loop sweeps. Under leader election only the loop of partition 0 does, in whichever
// relay leads it, so the relays sharing the partitions sweep once per interval between them (a sweep visits every
// parked key, and sweeps of several processes ran side by side: with 4 relay processes and a backlog of 36,000
// parked messages they took most of the database's time). A relay that takes partition 0 over after its leader
// died sweeps when its term starts. Without leader election every relay sweeps (each on its own clock).
func (loop *claimLoop) sweeper() bool {
	return loop.cfg.LeaderElection == "" || loop.part == 0
}

// sweep promotes the first message of keys whose promotion was missed (see queries.sweep).
func (loop *claimLoop) sweep() {
	b := &pgx.Batch{}
	b.Queue(loop.relay.o.q.sweep, loop.relay.o.now())
	var tag pgconn.CommandTag
	err := loop.db.exec(loop.ctx, b, func(res pgx.BatchResults) (err error) {
		tag, err = res.Exec()
		return err
	})
	if err != nil {
		if loop.ctx.Err() == nil {
			loop.cfg.Logger.Warn("stagehand: outbox sweep failed", "error", err)
		}
		return
	}
	if tag.RowsAffected() > 0 {
		loop.cfg.Logger.Debug("stagehand: outbox sweep promoted messages", "count", tag.RowsAffected())
	}
}
