package outbox

import (
	"context"
	"slices"
	"strings"
	"sync"
)

// unit is what one worker delivers at a time: a single unordered row, or the claimed run of one partition key,
// delivered in sequence order.
type unit struct {
	key  *tenantKey // nil for an unordered row
	rows []*row
}

// inflight is the rows a claim loop holds (leased to it and not yet resolved in the database), the units they are
// grouped into, and the queue of units waiting for a worker. Its signals: work (a unit was queued), room (rows
// were acknowledged or resolved: the claimer may have room) and wake (rows were resolved: keys this loop held may
// be claimable again).
type inflight struct {
	mu      sync.Mutex
	queue   []*unit
	keys    map[tenantKey]*unit // keys with rows held here (queued or being delivered)
	held    map[int64]*row      // every row leased here and not yet resolved in the database
	pending int                 // rows queued or being delivered (not yet acknowledged)

	work, room, wake chan struct{}
}

func newInflight() *inflight {
	return &inflight{keys: map[tenantKey]*unit{}, held: map[int64]*row{}, work: make(chan struct{}, 1),
		room: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
}

// signal wakes whoever waits on ch, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// add groups claimed rows into units, queued for the workers: every unordered row alone, the rows of a key in
// sequence order, after the rows of the key already here.
func (f *inflight) add(rows []*row) {
	if len(rows) == 0 {
		return
	}
	sortRows(rows)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rw := range rows {
		if _, dup := f.held[rw.rid]; dup {
			continue // a lease of ours that lapsed and was claimed again: it is already here
		}
		f.held[rw.rid] = rw
		f.pending++
		if !rw.ordered() {
			f.queue = append(f.queue, &unit{rows: []*row{rw}})
			continue
		}
		k := rw.key()
		if u, ok := f.keys[k]; ok {
			u.rows = append(u.rows, rw)
			continue
		}
		u := &unit{key: &k, rows: []*row{rw}}
		f.keys[k] = u
		f.queue = append(f.queue, u)
	}
	signal(f.work)
}

// take returns the next queued unit, waiting for one; nil when ctx ends or ready reports false.
func (f *inflight) take(ctx context.Context, ready func() bool) *unit {
	for {
		if !ready() {
			return nil
		}
		f.mu.Lock()
		if len(f.queue) > 0 {
			u := f.queue[0]
			f.queue[0] = nil
			f.queue = f.queue[1:]
			more := len(f.queue) > 0
			f.mu.Unlock()
			if more {
				signal(f.work)
			}
			return u
		}
		f.mu.Unlock()
		select {
		case <-f.work:
		case <-ctx.Done():
			return nil
		}
	}
}

// next pops the unit's next row, or reports that the unit is finished (and forgets its key).
func (f *inflight) next(u *unit) *row {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(u.rows) == 0 {
		f.forgetKey(u)
		return nil
	}
	rw := u.rows[0]
	u.rows[0] = nil
	u.rows = u.rows[1:]
	return rw
}

// remaining takes the unit's undelivered rows away from it and forgets its key.
func (f *inflight) remaining(u *unit) []*row {
	f.mu.Lock()
	defer f.mu.Unlock()
	rows := u.rows
	u.rows = nil
	f.forgetKey(u)
	return rows
}

func (f *inflight) forgetKey(u *unit) {
	if u.key != nil && f.keys[*u.key] == u {
		delete(f.keys, *u.key)
	}
}

// finished reports whether the unit has no row left to deliver.
func (f *inflight) finished(u *unit) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(u.rows) == 0
}

// delivered counts a row as no longer pending (acknowledged: its mark is the marker's).
func (f *inflight) delivered() {
	f.mu.Lock()
	f.pending--
	f.mu.Unlock()
	signal(f.room)
}

// forget drops rows whose fate the database records now (or is about to: call it before the statement that lets
// them go commits, since a claim may return them the moment it does, and must not find them still held here).
func (f *inflight) forget(rows ...*row) {
	f.mu.Lock()
	for _, rw := range rows {
		delete(f.held, rw.rid)
	}
	f.mu.Unlock()
}

// settled counts n rows as no longer pending once the database recorded what happened to them.
func (f *inflight) settled(n int) {
	f.mu.Lock()
	f.pending -= n
	f.mu.Unlock()
	signal(f.room)
	signal(f.wake)
}

// roomFor is how many rows the claimer may claim now: up to a batch, while fewer than two batches (and at least
// two rows per worker) are waiting or in flight, so claims overlap deliveries and no worker waits for one. Once
// rows are pending, it waits for room for half a batch: room opens a row at a time, as deliveries are
// acknowledged, and under a backlog a claim for each opening (a statement per row or two, whose cost is mostly
// its own) took the relay's time from delivering. Half a batch still pending is work for the workers while the
// next claim runs.
func (f *inflight) roomFor(batch, parallelism int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	hold := max(2*batch, 2*parallelism)
	room := hold - f.pending
	if room < max(1, batch/2) {
		return 0
	}
	return min(batch, room)
}

// busy reports whether rows are queued or being delivered (their acknowledgements are still to come).
func (f *inflight) busy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pending > 0
}

// empty reports whether no row is held or pending.
func (f *inflight) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held) == 0 && f.pending == 0
}

// heldIDs are the row IDs held now.
func (f *inflight) heldIDs() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]int64, 0, len(f.held))
	for rid := range f.held {
		ids = append(ids, rid)
	}
	return ids
}

// takeAll forgets every row held and returns them, with, per key, the earliest of them.
func (f *inflight) takeAll() (held []int64, first map[tenantKey]*row) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held = make([]int64, 0, len(f.held))
	first = map[tenantKey]*row{}
	for rid, rw := range f.held {
		held = append(held, rid)
		if rw.ordered() {
			if e, ok := first[rw.key()]; !ok || *rw.seq < *e.seq {
				first[rw.key()] = rw
			}
		}
	}
	f.held = map[int64]*row{}
	f.queue = nil
	return held, first
}

// sortRows orders claimed rows by key and sequence (unordered rows first, in claim order).
func sortRows(rows []*row) {
	slices.SortStableFunc(rows, func(a, b *row) int {
		switch {
		case !a.ordered() && !b.ordered():
			return 0
		case !a.ordered():
			return -1
		case !b.ordered():
			return 1
		}
		if c := strings.Compare(a.partitionKey, b.partitionKey); c != 0 {
			return c
		}
		switch {
		case *a.seq < *b.seq:
			return -1
		case *a.seq > *b.seq:
			return 1
		}
		return 0
	})
}
