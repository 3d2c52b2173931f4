package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/internal/backoff"
)

// ErrShed ends the work on a partition that was handed over to balance the processes (see Share).
var ErrShed = errors.New("partition handed over to balance the processes")

// Share divides n partitions, each under a lease of its own, among the live processes that run them.
//
// Every process holds one membership slot, a lease named prefix + a slot number below n (a bounded set of rows,
// however often processes restart). The number of slots held is the number of live processes, so each process's
// fair share is ceil(n / members). A process contends for a free partition lease only while it leads fewer than
// its share (MayTake), and a process leading more than its share (another one joined) hands over its
// highest-numbered partition (ShouldShed) and releases the lease, so the newcomer takes it. A process that dies
// stops renewing: its slot and partitions lapse after the TTL, and the others take its partitions over. With more
// processes than partitions, the extra ones hold no slot and stand by. The share only spreads the load; safety
// comes from each partition's lease and its fencing token, so a transiently uneven split (while the count of
// processes catches up) is harmless.
//
// One Share serves one process's partitions of one partitioned component: the relay's partitions under leader
// election, a partitioned projection's followers.
type Share struct {
	m      *Manager
	prefix string
	n      int

	mu      sync.Mutex
	led     map[int]bool
	members int       // live processes, as of checked
	checked time.Time // when members was counted
}

// NewShare returns the share of n partitions whose membership slots are the leases prefix + "0" ... prefix +
// (n-1), taken with m (its owner, TTL and intervals).
func NewShare(m *Manager, prefix string, n int) *Share {
	return &Share{m: m, prefix: prefix, n: n, led: map[int]bool{}}
}

// Leading records that this process now leads partition p (on) or no longer does.
func (s *Share) Leading(p int, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.led[p] = true
	} else {
		delete(s.led, p)
	}
}

// share is this process's fair share of the partitions, counting the live processes at most once per acquire
// interval.
func (s *Share) share(ctx context.Context) int {
	s.mu.Lock()
	fresh := time.Since(s.checked) < s.m.cfg.AcquireInterval
	members := s.members
	s.mu.Unlock()
	if !fresh {
		infos, err := List(ctx, s.m.db, s.m.cfg.Schema, s.prefix)
		if err == nil {
			members = 0
			for _, in := range infos {
				if in.Held {
					members++
				}
			}
			s.mu.Lock()
			s.members, s.checked = members, time.Now()
			s.mu.Unlock()
		}
	}
	if members < 1 {
		return s.n // alone, or the count failed: take what is free (safety comes from the fence, not the share)
	}
	return (s.n + members - 1) / members
}

// MayTake reports whether this process leads fewer partitions than its share.
func (s *Share) MayTake(ctx context.Context) bool {
	share := s.share(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.led) < share
}

// ShouldShed reports whether partition p is the one to hand over: this process leads more than its share and p is
// its highest-numbered partition.
func (s *Share) ShouldShed(ctx context.Context, p int) bool {
	share := s.share(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.led) <= share {
		return false
	}
	for q := range s.led {
		if q > p {
			return false
		}
	}
	return true
}

// Member holds a membership slot until ctx ends, taking a free one again whenever it is lost, and releases it at
// the end.
func (s *Share) Member(ctx context.Context) {
	every := s.m.cfg.AcquireInterval
	for ctx.Err() == nil {
		for slot := range s.n {
			l, ok, err := s.m.TryAcquire(ctx, fmt.Sprintf("%s%d", s.prefix, slot))
			if err != nil || !ok {
				continue
			}
			kept, stop := s.m.Keep(ctx, l)
			<-kept.Done()
			l = stop()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.m.Release(rctx, l)
			cancel()
			break
		}
		backoff.Sleep(ctx, every)
	}
}

// Watch returns a context derived from ctx that is cancelled, with cause ErrShed, once partition p is the one
// this process should hand over (checked every acquire interval), and a function that stops watching.
func (s *Share) Watch(ctx context.Context, p int) (context.Context, func()) {
	wctx, end := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.m.cfg.AcquireInterval)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if s.ShouldShed(wctx, p) {
				end(ErrShed)
				return
			}
		}
	}()
	return wctx, func() {
		end(nil)
		<-done
	}
}

// RunShared is Run for partition p of sh: it contends for the lease name only while this process leads fewer
// than its share, and ends the work (its context's cause matching ErrShed), releases the lease and contends
// again after an acquire interval when this process leads more than its share and p is its highest-numbered
// partition. It returns as Run does.
func (m *Manager) RunShared(ctx context.Context, sh *Share, p int, name string, work Work) error {
	every := m.cfg.AcquireInterval
	for ctx.Err() == nil {
		if !sh.MayTake(ctx) {
			backoff.Sleep(ctx, every)
			continue
		}
		l, ok, err := m.contend(ctx, name)
		if err != nil {
			return err
		}
		if !ok {
			// Jitter, so processes started together do not contend in lockstep.
			backoff.Sleep(ctx, every+rand.N(every/2+1))
			continue
		}
		sh.Leading(p, true)
		wctx, stopWatch := sh.Watch(ctx, p)
		err = m.hold(wctx, l, work)
		shed := errors.Is(context.Cause(wctx), ErrShed)
		stopWatch()
		sh.Leading(p, false)
		switch {
		case ctx.Err() != nil:
			return nil
		case shed:
			m.cfg.Logger.InfoContext(ctx, "stagehand: lease handed over to balance the processes", "lease", name)
			backoff.Sleep(ctx, every) // leave the lease to the process that needs it
		case errors.Is(err, ErrLost):
			m.cfg.Logger.WarnContext(ctx, "stagehand: lease lost; contending again", "lease", name,
				"token", l.Token, "error", err)
		default:
			return err
		}
	}
	return nil
}
