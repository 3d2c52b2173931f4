package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/lease"
)

// Sharing the partitions of a leader-elected relay among processes.
//
// Every relay running a partitioned, leader-elected subscription holds one membership slot, a lease named
// LeaderElection + "/members/" + a slot number below Partitions (a bounded set of rows, however often relays
// restart). The number of slots held is the number of live relays, so each relay's fair share is
// ceil(Partitions / members). A relay contends for a free partition lease only while it leads fewer than its share,
// and a relay leading more than its share (a relay joined) ends the term of its highest-numbered partition and
// releases the lease, so the newcomer takes it. A relay that dies stops renewing: its slot and partitions lapse
// after LeaderTTL, and the others take its partitions over. More relays than partitions: the extra ones hold no
// slot and stand by.

// errShed ends a term whose partition is handed over to another relay.
var errShed = errors.New("outbox: partition handed over to balance the relays")

// sharing is a subscription's view of the partitions it leads and of the live relays.
type sharing struct {
	g *group

	mu      sync.Mutex
	led     map[int]bool
	members int       // live relays, as of checked
	checked time.Time // when members was counted
}

func (sh *sharing) leading(p int, on bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if on {
		sh.led[p] = true
	} else {
		delete(sh.led, p)
	}
}

// share is this relay's fair share of the partitions, counting the live relays at most once per acquire interval.
func (sh *sharing) share(ctx context.Context) int {
	r := sh.g.r
	sh.mu.Lock()
	fresh := time.Since(sh.checked) < r.leases.Config().AcquireInterval
	members := sh.members
	sh.mu.Unlock()
	if !fresh {
		infos, err := lease.List(ctx, r.o.pool, r.o.schema, r.s.leader+"/members/")
		if err == nil {
			members = 0
			for _, in := range infos {
				if in.Held {
					members++
				}
			}
			sh.mu.Lock()
			sh.members, sh.checked = members, time.Now()
			sh.mu.Unlock()
		}
	}
	n := r.s.partitions
	if members < 1 {
		return n // alone, or the count failed: take what is free (safety comes from the fence, not the share)
	}
	return (n + members - 1) / members
}

// mayTake reports whether the relay leads fewer partitions than its share.
func (sh *sharing) mayTake(ctx context.Context) bool {
	share := sh.share(ctx)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.led) < share
}

// shouldShed reports whether partition p is the one to hand over: the relay leads more than its share and p is its
// highest-numbered partition.
func (sh *sharing) shouldShed(ctx context.Context, p int) bool {
	share := sh.share(ctx)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.led) <= share {
		return false
	}
	for q := range sh.led {
		if q > p {
			return false
		}
	}
	return true
}

// member holds a membership slot until ctx ends, taking a free one again whenever it is lost.
func (sh *sharing) member(ctx context.Context) {
	r := sh.g.r
	mgr := r.leases
	every := mgr.Config().AcquireInterval
	for ctx.Err() == nil {
		for slot := range r.s.partitions {
			l, ok, err := mgr.TryAcquire(ctx, fmt.Sprintf("%s/members/%d", r.s.leader, slot))
			if err != nil || !ok {
				continue
			}
			kept, stop := mgr.Keep(ctx, l)
			<-kept.Done()
			l = stop()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = mgr.Release(rctx, l)
			cancel()
			break
		}
		backoff.Sleep(ctx, every)
	}
}

// leadShared runs partition p of a shared, leader-elected subscription: it contends for the partition's lease
// while the relay leads fewer than its share, runs a term while it holds it, and hands it over when the relay
// leads more than its share.
func (g *group) leadShared(sh *sharing, p int, wake chan struct{}) {
	r := g.r
	mgr := r.leases
	name := r.leaseName(p)
	every := mgr.Config().AcquireInterval
	for g.ctx.Err() == nil {
		if !sh.mayTake(g.ctx) {
			backoff.Sleep(g.ctx, every)
			continue
		}
		l, ok, err := mgr.TryAcquire(g.ctx, name)
		if err != nil && g.ctx.Err() == nil {
			r.s.logger.Warn("stagehand: outbox relay could not contend for a partition", "lease", name, "error", err)
		}
		if !ok {
			// Jitter, so relays started together do not contend in lockstep.
			backoff.Sleep(g.ctx, every+rand.N(every/2+1))
			continue
		}
		sh.leading(p, true)
		r.s.logger.Info("stagehand: outbox relay leads", "lease", l.Name, "token", l.Token, "partition", p)
		sctx, end := context.WithCancelCause(g.ctx)
		tctx, stop := mgr.Keep(sctx, l)
		shed := make(chan struct{})
		go func() { // hand the partition over when the relay leads more than its share
			defer close(shed)
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-tctx.Done():
					return
				case <-t.C:
				}
				if sh.shouldShed(tctx, p) {
					end(errShed)
					return
				}
			}
		}()
		loss := g.term(tctx, p, wake, &l)
		cause := context.Cause(tctx)
		end(nil)
		l = stop()
		<-shed
		sh.leading(p, false)
		if loss == nil && !errors.Is(cause, lease.ErrLost) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(g.ctx), 5*time.Second)
			if err := mgr.Release(rctx, l); err != nil {
				r.s.logger.Warn("stagehand: outbox could not release a partition lease; it expires by itself",
					"lease", name, "error", err)
			}
			cancel()
		}
		if errors.Is(cause, errShed) {
			r.s.logger.Info("stagehand: outbox relay handed a partition over", "lease", name, "partition", p)
			backoff.Sleep(g.ctx, every) // leave the lease to the relay that needs it
		}
	}
}
