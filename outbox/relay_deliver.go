package outbox

import "time"

type outcome struct {
	kind Outcome
	err  error
}

// worker delivers units, one row at a time, until the loop ends.
func (loop *claimLoop) worker() {
	ready := func() bool { return loop.pause.wait(loop.ctx) }
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		u := loop.flight.take(loop.ctx, ready)
		if u == nil {
			return
		}
		loop.deliverUnit(u, timer)
	}
}

// deliverUnit delivers u's rows in order, and stops at a row whose delivery leaves the rest to wait (a backoff, a
// dead letter holding the key, an unreachable broker, the loop ending). timer is the worker's ack-deadline timer.
func (loop *claimLoop) deliverUnit(u *unit, timer *time.Timer) {
	for {
		if loop.ctx.Err() != nil {
			return // closing: releaseAll gives the rest back
		}
		if !loop.pause.wait(loop.ctx) {
			return
		}
		rw := loop.flight.next(u)
		if rw == nil {
			return
		}
		d := &delivery{row: rw, timer: timer}
		start := time.Now()
		dctx, span := loop.relay.tel.startPublish(loop.ctx, rw)
		out := loop.classify(loop.deliver(dctx, d))
		loop.relay.tel.published(dctx, span, rw, out)
		if h := loop.cfg.Hooks.Delivered; h != nil {
			h(loop.ctx, rw.info(), out.kind, out.err, time.Since(start))
		}
		switch out.kind {
		case Published:
			loop.published(rw, loop.flight.finished(u))
		case Released:
			return
		case Unreachable:
			loop.unreachable(rw, u, out.err)
			return
		case Rejected:
			if !loop.rejected(rw, u, out.err) {
				return
			}
		}
	}
}

// classify turns a rejection into "unreachable" when the classifier says so.
func (loop *claimLoop) classify(out outcome) outcome {
	if out.kind == Rejected && out.err != nil && loop.cfg.IsBrokerUnavailable(out.err) {
		out.kind = Unreachable
	}
	return out
}

// published hands rw to the marker. last says rw ends its key's run here: its mark then promotes the key's next
// message (a run in progress needs none: this loop delivers the next one itself).
func (loop *claimLoop) published(rw *row, last bool) {
	rw.lastOfRun = last
	loop.flight.delivered()
	loop.pause.reachable()
	loop.marks.add(rw)
}
