package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// rejected records a rejected attempt: the row backs off (and the rest of its key's run with it) or, with its
// retries used up, moves to the dead letters. It reports whether the unit may go on with its next row (only after
// a dead letter that does not hold its key).
func (loop *claimLoop) rejected(rw *row, u *unit, cause error) bool {
	if cause == nil {
		cause = ErrNacked
	}
	attempt := rw.attempts + 1
	now := loop.relay.o.now()
	msg := truncateError(cause)
	rec := recordFailure(cause)
	dead := attempt > loop.cfg.maxRetryCount
	holds := dead && rw.ordered() && !loop.cfg.ReleaseKeyOnDeadLetter
	continues := dead && !holds
	var waiting []*row // the rest of the run, which waits behind rw
	if !continues {
		waiting = loop.flight.remaining(u)
	}
	loop.flight.forget(append(waiting, rw)...)
	// The rest of the key's run stays parked behind the row (backing off, or dead-lettered and holding the key);
	// only a dead letter that releases its key promotes the next message.
	b := &pgx.Batch{}
	op := "backoff"
	if dead {
		op = "dead-letter move"
		st := loop.db.st.deadLetter
		b.Queue(st.SQL, loop.db.args(st, &relayRow{ID: rw.rid, Error: msg, HoldsKey: !loop.cfg.ReleaseKeyOnDeadLetter,
			Now: now, ErrorType: rec.typ, ErrorSignature: rec.signature})...)
	} else {
		st := loop.db.st.fail
		b.Queue(st.SQL, loop.db.args(st, &relayRow{ID: rw.rid, Error: msg,
			NextAttemptAt: now.Add(loop.cfg.backoff(attempt))})...)
	}
	if len(waiting) > 0 {
		st := loop.db.st.release
		b.Queue(st.SQL, loop.db.args(st, &relayRow{IDs: rowIDs(waiting), FirstIDs: []int64{}, Now: now})...)
	}
	var promoted []tenantKey
	if continues && rw.ordered() && loop.flight.finished(u) {
		promoted = []tenantKey{rw.key()}
		loop.relay.o.queuePromote(b, promoted, now)
	}
	// The attempt's entry in the failure history, last (nothing reads its result). It is written by the rejection's
	// own batch, so a delivery that succeeds costs nothing; a relay fenced out by a new leader still records the
	// attempt it made.
	loop.relay.o.queueFailure(b, "outbox", rw.id, rw.topic, rw.tenant, attempt, rec, now)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loop.ctx), 30*time.Second)
	_, err := loop.db.written(ctx, op, b, func(res pgx.BatchResults) error {
		if len(waiting) > 0 {
			if _, err := res.Exec(); err != nil {
				return err
			}
		}
		if promoted == nil {
			return nil
		}
		locked, err := lockedKeys(res, promoted)
		if err == nil {
			loop.promos.later(promoted, locked)
		}
		return err
	})
	cancel()
	switch {
	case errors.Is(err, ErrFenced):
		continues = false // logged by checkFence; the new leader retries the message
	case err != nil:
		loop.cfg.Logger.Warn("stagehand: outbox could not record a failed delivery; the lease will lapse and the "+
			"message will be retried", "message_id", rw.id, "error", err)
	default:
		loop.cfg.Logger.Debug("stagehand: outbox delivery rejected", "message_id", rw.id, "attempt", attempt,
			"dead_lettered", dead, "error", cause)
	}
	loop.tally.add(func(r *DrainResult) {
		r.Failed++
		if dead {
			r.DeadLettered++
		}
	})
	loop.relay.tel.failed(loop.ctx, rw, dead && err == nil)
	if h := loop.cfg.Hooks.DeadLettered; dead && err == nil && h != nil {
		h(loop.ctx, rw.info(), cause)
	}
	loop.flight.settled(1 + len(waiting))
	return continues
}

// unreachable gives the row (and the rest of its unit) back without counting an attempt and pauses the loop, with
// a backoff that doubles while the broker stays unreachable. A drain ends with ErrBrokerUnavailable.
func (loop *claimLoop) unreachable(rw *row, u *unit, cause error) {
	waiting := loop.flight.remaining(u)
	loop.flight.forget(append(waiting, rw)...) // before the release commits; see rejected
	b := &pgx.Batch{}
	now := loop.relay.o.now()
	st := loop.db.st.unreachable
	b.Queue(st.SQL, loop.db.args(st, &relayRow{ID: rw.rid, Error: truncateError(cause), Now: now})...)
	if len(waiting) > 0 {
		st := loop.db.st.release
		b.Queue(st.SQL, loop.db.args(st, &relayRow{IDs: rowIDs(waiting), FirstIDs: []int64{}, Now: now})...)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loop.ctx), 30*time.Second)
	_, err := loop.db.written(ctx, "release", b, nil)
	cancel()
	if err != nil && !errors.Is(err, ErrFenced) {
		loop.cfg.Logger.Warn("stagehand: outbox could not release a message", "message_id", rw.id, "error", err)
	}
	pause := loop.pause.unreachable()
	loop.tally.add(func(r *DrainResult) { r.Unreachable++ })
	loop.cfg.Logger.Warn("stagehand: outbox broker unreachable; relay backing off", "pause", pause, "error", cause)
	loop.flight.settled(1 + len(waiting))
	if loop.drain {
		loop.tally.fail(fmt.Errorf("%w: %w", ErrBrokerUnavailable, cause))
		loop.cancel()
	}
}

func rowIDs(rows []*row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.rid
	}
	return out
}

func truncateError(err error) string {
	msg := err.Error()
	if len(msg) > 4000 {
		msg = msg[:4000] + "…"
	}
	return msg
}
