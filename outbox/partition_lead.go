package outbox

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/lease"
)

// Sharing the partitions of a leader-elected relay among processes: lease.Share, with the membership slots
// LeaderElection + "/members/" + slot. Each relay leads at most ceil(Partitions / live relays) partitions; a relay
// leading more than that (a relay joined) ends the term of its highest-numbered partition and releases its lease,
// so the newcomer takes it; a relay that dies stops renewing, and its slot and partitions lapse after LeaderTTL.

// leadShared runs partition p of a shared, leader-elected subscription: it contends for the partition's lease
// while the relay leads fewer than its share, runs a term while it holds it, and hands it over when the relay
// leads more than its share.
func (g *group) leadShared(sh *lease.Share, p int, wake chan struct{}) {
	r := g.r
	mgr := r.leases
	name := r.leaseName(p)
	every := mgr.Config().AcquireInterval
	for g.ctx.Err() == nil {
		if !sh.MayTake(g.ctx) {
			backoff.Sleep(g.ctx, every)
			continue
		}
		l, ok, err := mgr.TryAcquire(g.ctx, name)
		if err != nil && g.ctx.Err() == nil {
			r.s.Logger.Warn("stagehand: outbox relay could not contend for a partition", "lease", name, "error", err)
		}
		if !ok {
			// Jitter, so relays started together do not contend in lockstep.
			backoff.Sleep(g.ctx, every+rand.N(every/2+1))
			continue
		}
		sh.Leading(p, true)
		r.s.Logger.Info("stagehand: outbox relay leads", "lease", l.Name, "token", l.Token, "partition", p)
		sctx, stopWatch := sh.Watch(g.ctx, p) // ends the term when the partition is to be handed over
		tctx, stop := mgr.Keep(sctx, l)
		loss := g.term(tctx, p, wake, &l)
		cause := context.Cause(tctx)
		l = stop()
		stopWatch()
		sh.Leading(p, false)
		if loss == nil && !errors.Is(cause, lease.ErrLost) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(g.ctx), 5*time.Second)
			if err := mgr.Release(rctx, l); err != nil {
				r.s.Logger.Warn("stagehand: outbox could not release a partition lease; it expires by itself",
					"lease", name, "error", err)
			}
			cancel()
		}
		if errors.Is(cause, lease.ErrShed) {
			r.s.Logger.Info("stagehand: outbox relay handed a partition over", "lease", name, "partition", p)
			backoff.Sleep(g.ctx, every) // leave the lease to the relay that needs it
		}
	}
}
