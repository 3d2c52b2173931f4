package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/internal/lease"
)

// maxPartitions bounds RelayConfig.Partitions: each partition is a claim loop with its own workers and
// statements, so more loops than that cost more connections than they can win.
const maxPartitions = 256

// partitionRange returns the inclusive bounds of partition p of n in the 32-bit hash space: the space is cut into
// n contiguous ranges, so a partition's claim is a range test on an index column (migration 024).
func partitionRange(p, n int) (lo, hi int32) {
	const span = int64(1) << 32
	l := math.MinInt32 + span*int64(p)/int64(n)
	h := math.MinInt32 + span*int64(p+1)/int64(n) - 1
	return int32(l), int32(h)
}

// group is what one Subscribe or Drain runs: a claim loop per partition, each in leadership terms when the relay
// is fenced. Results of drains add up here.
type group struct {
	r       *Relay
	topics  []string
	drain   bool
	deliver func(context.Context, *delivery) outcome

	ctx    context.Context
	cancel context.CancelFunc
	ended  chan struct{} // closed when every loop has ended (and the subscription's channel is closed)

	sweeps sweepClock // one sweep per interval for all the group's partitions

	mu       sync.Mutex
	result   DrainResult
	drainErr error
	notLed   int // drain: partitions another relay leads
}

// start checks that a fenced relay can be fenced, then starts a group. Without onEnd it is a drain; onEnd runs
// when every loop has ended, before Close returns.
func (r *Relay) start(ctx context.Context, topics []string, deliver func(context.Context, *delivery) outcome,
	onEnd func()) (*group, error) {
	if err := r.checkFenceable(ctx); err != nil {
		return nil, err
	}
	if onEnd != nil {
		r.checkPool()
		if err := r.checkListen(ctx); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if len(topics) == 0 {
		topics = nil
	}
	ctx, cancel := context.WithCancel(ctx)
	g := &group{r: r, topics: topics, drain: onEnd == nil, deliver: deliver, ctx: ctx, cancel: cancel,
		ended: make(chan struct{})}
	r.groups[g] = struct{}{}
	if !g.drain {
		r.maint.retain()
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if !g.drain {
			defer r.maint.release()
		}
		g.run()
		if onEnd != nil {
			onEnd()
		}
		r.mu.Lock()
		delete(r.groups, g)
		r.mu.Unlock()
		close(g.ended)
	}()
	return g, nil
}

// run runs a loop per partition until all have ended. A subscription shares one listening connection among its
// partitions.
func (g *group) run() {
	defer g.cancel()
	n := g.r.s.Partitions
	wakes := make([]chan struct{}, n)
	for p := range wakes {
		wakes[p] = make(chan struct{}, 1)
	}
	var loops sync.WaitGroup
	if !g.r.s.DisableNotify && !g.drain {
		listen, stop := listenFor(g.ctx, g.r.o, min(g.r.s.PollingInterval, time.Second), g.r.s.Logger)
		loops.Add(1)
		go func() {
			defer loops.Done()
			defer stop()
			for {
				select {
				case <-listen:
					for _, w := range wakes {
						signal(w)
					}
				case <-g.ctx.Done():
					return
				}
			}
		}()
	} else if !g.drain {
		wakes = make([]chan struct{}, n) // nil channels: poll only
	}
	if g.r.beat != nil { // a drain beats too: an operator's drain of a backlog can run for minutes
		loops.Add(1)
		go func() {
			defer loops.Done()
			g.r.beat.Run(g.ctx)
		}()
	}
	var sh *lease.Share
	if g.r.leases != nil && n > 1 && !g.drain {
		sh = lease.NewShare(g.r.leases, g.r.s.LeaderElection+"/members/", n)
		loops.Add(1)
		go func() {
			defer loops.Done()
			sh.Member(g.ctx)
		}()
	}
	var parts sync.WaitGroup
	for p := range n {
		parts.Add(1)
		go func() {
			defer parts.Done()
			g.runPartition(sh, p, wakes[p])
		}()
	}
	parts.Wait()
	g.cancel()
	loops.Wait()
	if g.drain && g.r.leases != nil && g.notLed == n && g.drainErr == nil {
		g.drainErr = fmt.Errorf("%w: every partition of %q is led by another relay", ErrNotLeader, g.r.s.LeaderElection)
	}
}

// runPartition runs partition p's claim loop: once when the relay is not fenced, else in leadership terms, each
// under the partition's lease (lease.Manager.Run), contending again whenever a term ends with the lease lost. A
// partitioned, leader-elected subscription shares its partitions with other relays (sh, lease.Manager.RunShared):
// a relay leads at most its share of them. A drain takes the lease once (lease.Manager.Once): a partition another
// relay leads is left to it.
//
// Sharing uses the membership slots LeaderElection + "/members/" + slot. Each relay leads at most
// ceil(Partitions / live relays) partitions; a relay leading more than that (a relay joined) ends the term of its
// highest-numbered partition and releases its lease, so the newcomer takes it; a relay that dies stops renewing,
// and its slot and partitions lapse after LeaderTTL.
func (g *group) runPartition(sh *lease.Share, p int, wake chan struct{}) {
	if g.r.leases == nil {
		g.term(g.ctx, p, wake, nil)
		return
	}
	name := g.r.leaseName(p)
	mgr := g.r.leases
	var err error
	switch {
	case g.drain:
		var led bool
		led, err = mgr.Once(g.ctx, name, g.lead(p, nil))
		if !led {
			g.mu.Lock()
			if err != nil && g.drainErr == nil {
				g.drainErr = fmt.Errorf("outbox: drain: %w", err)
			} else if err == nil {
				g.notLed++
			}
			g.mu.Unlock()
			return
		}
	case sh != nil:
		err = mgr.RunShared(g.ctx, sh, p, name, g.lead(p, wake))
	default:
		err = mgr.Run(g.ctx, name, g.lead(p, wake))
	}
	if err != nil && !errors.Is(err, lease.ErrLost) && g.ctx.Err() == nil {
		g.r.s.Logger.Error("stagehand: outbox relay stopped contending for leadership", "lease", name, "error", err)
	}
}

// lead is the work of one leadership term of partition p: its claim loop, fenced by the term's lease. A term
// fenced out ends with an error matching lease.ErrLost, so the lease is not released (it is another relay's now).
func (g *group) lead(p int, wake chan struct{}) lease.Work {
	return func(ctx context.Context, l lease.Lease) error {
		g.r.s.Logger.Info("stagehand: outbox relay leads", "lease", l.Name, "token", l.Token, "partition", p)
		if loss := g.term(ctx, p, wake, &l); loss != nil {
			return loss.leaseErr // matches lease.ErrLost: contend again
		}
		return ctx.Err()
	}
}

// term runs one claim loop of partition p until ctx ends (or a drain is done, or the term is fenced out), and
// returns how it was fenced out, if it was.
func (g *group) term(ctx context.Context, p int, wake chan struct{}, fence *lease.Lease) *fenceLoss {
	r := g.r
	ctx, cancel := context.WithCancel(ctx)
	owner := newLeaseOwner(r.s.ProcessorID)
	if fence != nil {
		owner = fmt.Sprintf("%s/%d#%d", r.owner, p, fence.Token) // one row-lease owner per term
	}
	loop := &claimLoop{
		relay: r, cfg: &r.s, topics: g.topics, drain: g.drain, listen: wake, part: p, deliver: g.deliver,
		sweeps: &g.sweeps, ctx: ctx, cancel: cancel,
		db:     &relayDB{o: r.o, st: &r.st, owner: owner, fence: fence, logger: r.s.Logger, part: p, end: cancel},
		flight: newInflight(), marks: newMarker(), promos: &promoter{},
		pause: newBrokerPause(r.s.BrokerBackoff, r.s.nextBrokerBackoff),
		done:  make(chan struct{}), stopped: make(chan struct{}),
	}
	loop.lo, loop.hi = partitionRange(p, r.s.Partitions)
	loop.run()
	loss := loop.db.demote.Load()
	result, drainErr := loop.tally.get()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.result.Published += result.Published
	g.result.Failed += result.Failed
	g.result.DeadLettered += result.DeadLettered
	g.result.Unreachable += result.Unreachable
	if g.drainErr == nil {
		switch {
		case drainErr != nil:
			g.drainErr = drainErr
		case loss != nil && g.drain:
			g.drainErr = loss.err
		}
	}
	return loss
}
