package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// keepLeases renews the leases of the rows in flight, every third of the lease duration.
func (loop *claimLoop) keepLeases() {
	t := time.NewTicker(loop.cfg.ClaimDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-loop.ctx.Done():
			return
		}
		held := loop.flight.heldIDs()
		if len(held) == 0 {
			continue
		}
		b := &pgx.Batch{}
		st := loop.db.st.extend
		b.Queue(st.SQL, loop.db.args(st, &relayRow{IDs: held, Until: loop.relay.o.now().Add(loop.cfg.ClaimDuration)})...)
		if _, err := loop.db.written(loop.ctx, "lease renewal", b, nil); err != nil && loop.ctx.Err() == nil &&
			!errors.Is(err, ErrFenced) {
			loop.cfg.Logger.Warn("stagehand: outbox could not renew leases", "count", len(held), "error", err)
		}
	}
}

// vacuumer vacuums the outbox table while this loop moves rows out of it, off the marker's path: at an interval,
// once VacuumAfterRows rows have moved since its last vacuum (a trickle is autovacuum's). SKIP_LOCKED: when another
// relay is vacuuming it, there is nothing to add. PARALLEL 0: the table is small by design, and parallel index
// vacuuming would take cores from staging and the relay for nothing.
func (loop *claimLoop) vacuumer() {
	if loop.cfg.VacuumInterval <= 0 {
		return
	}
	t := time.NewTicker(loop.cfg.VacuumInterval)
	defer t.Stop()
	var moved int64
	for {
		select {
		case <-t.C:
		case <-loop.ctx.Done():
			return
		}
		if moved += loop.moved.Swap(0); moved < int64(loop.cfg.VacuumAfterRows) {
			continue
		}
		moved = 0
		// No truncation: it would lock staging out of the table (migration 027 says the same to autovacuum).
		if _, err := loop.relay.o.pool.Exec(loop.ctx, loop.relay.o.q.vacuum); err != nil && loop.ctx.Err() == nil {
			loop.cfg.Logger.Debug("stagehand: outbox vacuum failed; autovacuum remains", "error", err)
		}
	}
}

// releaseAll gives back every row still held when the loop ends, without counting an attempt; the earliest row of
// each key becomes due.
func (loop *claimLoop) releaseAll() {
	held, first := loop.flight.takeAll()
	if len(held) == 0 {
		return
	}
	due := make([]int64, 0, len(first))
	for _, rw := range first {
		due = append(due, rw.rid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	st := loop.db.st.release
	b.Queue(st.SQL, loop.db.args(st, &relayRow{IDs: held, FirstIDs: due, Now: loop.relay.o.now()})...)
	if err := loop.db.exec(ctx, b, nil); err != nil {
		loop.cfg.Logger.Warn("stagehand: outbox could not release leases on close; they will lapse",
			"count", len(held), "error", err)
	}
}
