package outbox

import (
	"context"
	"testing"
	"time"
)

// The relay's parts that hold no connection, tested on their own: the rows in flight, the broker pause, the
// promoter and the marker. (The parts that run statements are tested through the relay, against PostgreSQL.)

func seqOf(n int64) *int64 { return &n }

func orderedRow(rid int64, key string, seq int64) *row {
	return &row{rid: rid, id: key + "-" + string(rune('a'+seq)), tenant: "t", partitionKey: key, seq: seqOf(seq)}
}

func TestInflightGroupsAKeysRowsIntoOneUnitInSequenceOrder(t *testing.T) {
	f := newInflight()
	f.add([]*row{orderedRow(3, "k", 2), {rid: 9, id: "loose"}, orderedRow(1, "k", 1), orderedRow(7, "j", 5)})
	f.add([]*row{orderedRow(4, "k", 3), orderedRow(1, "k", 1)}) // a later claim: k's next row, and a re-claim of ours
	ctx := context.Background()
	ready := func() bool { return true }
	var units []*unit
	for range 3 {
		units = append(units, f.take(ctx, ready))
	}
	if units[0].key != nil || units[0].rows[0].rid != 9 {
		t.Fatalf("unordered rows come first, alone: %+v", units[0])
	}
	var k *unit
	for _, u := range units[1:] {
		if u.key != nil && u.key.key == "k" {
			k = u
		}
	}
	if k == nil {
		t.Fatal("no unit for key k")
	}
	var order []int64
	for rw := f.next(k); rw != nil; rw = f.next(k) {
		order = append(order, rw.rid)
	}
	if len(order) != 3 || order[0] != 1 || order[1] != 3 || order[2] != 4 {
		t.Fatalf("key k delivered %v, want rows 1, 3, 4 (its sequence order, the re-claim dropped)", order)
	}
	if _, ok := f.keys[tenantKey{"t", "k"}]; ok {
		t.Fatal("a finished unit's key is still held")
	}
	if got := f.roomFor(4, 1); got != 8-5 {
		t.Fatalf("room with 5 rows pending: %d, want 3", got)
	}
	f.mu.Lock()
	f.pending += 2 // two more claimed
	f.mu.Unlock()
	if got := f.roomFor(4, 1); got != 0 {
		t.Fatalf("room with 7 of 8 rows pending: %d, want 0 (a claim waits for room for half a batch)", got)
	}
	f.delivered()
	if got := f.roomFor(4, 1); got != 2 {
		t.Fatalf("room with 6 of 8 rows pending: %d, want 2 (half a batch)", got)
	}
	f.mu.Lock()
	f.pending -= 1
	f.mu.Unlock()
	f.settled(5)
	if f.empty() {
		t.Fatal("empty while five rows are still held (leased, not yet resolved)")
	}
	held, first := f.takeAll()
	if len(held) != 5 || first[tenantKey{"t", "k"}].rid != 1 || first[tenantKey{"t", "j"}].rid != 7 {
		t.Fatalf("takeAll: held %v, first %v", held, first)
	}
	if !f.empty() {
		t.Fatal("rows remain after takeAll")
	}
}

func TestInflightTakeEndsWithItsContext(t *testing.T) {
	f := newInflight()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if u := f.take(ctx, func() bool { return true }); u != nil {
		t.Fatalf("took %+v from an empty queue", u)
	}
}

func TestBrokerPauseDoublesUntilReachable(t *testing.T) {
	p := newBrokerPause(10*time.Millisecond, func(d time.Duration) time.Duration { return min(2*d, 40*time.Millisecond) })
	var pauses []time.Duration
	for range 4 {
		pauses = append(pauses, p.unreachable())
	}
	want := []time.Duration{10, 20, 40, 40}
	for i, w := range want {
		if pauses[i] != w*time.Millisecond {
			t.Fatalf("pauses %v, want %v ms", pauses, want)
		}
	}
	start := time.Now()
	if !p.wait(context.Background()) || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("wait returned after %s, before the pause ended", time.Since(start))
	}
	p.reachable()
	if got := p.unreachable(); got != 10*time.Millisecond {
		t.Fatalf("after a delivery got through, the pause is %s, want the base 10ms", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if p.wait(ctx) {
		t.Fatal("wait reported the pause over though its context ended first")
	}
}

func TestPromoterKeepsOnlyTheKeysItCouldNotLock(t *testing.T) {
	var p promoter
	a, b, c := tenantKey{"t", "a"}, tenantKey{"t", "b"}, tenantKey{"u", "a"}
	p.later([]tenantKey{a, b, c}, []tenantKey{b})
	p.later([]tenantKey{a}, nil)
	if !p.waiting() {
		t.Fatal("nothing waits")
	}
	got := p.takeAll()
	if len(got) != 2 || got[0] != a || got[1] != c {
		t.Fatalf("takeAll = %v, want [t/a u/a]", got)
	}
	if p.waiting() || len(p.takeAll()) != 0 {
		t.Fatal("keys remain after takeAll")
	}
}

func TestMarkerCoalescesUpToItsCap(t *testing.T) {
	m := newMarker()
	for i := range maxMark + 3 {
		m.add(&row{rid: int64(i)})
	}
	if first := m.take(); len(first) != maxMark || m.idle() {
		t.Fatalf("first mark takes %d rows, want %d, and the marker is busy", len(first), maxMark)
	}
	m.marked()
	if second := m.take(); len(second) != 3 {
		t.Fatalf("second mark takes %d rows, want 3", len(second))
	}
	m.marked()
	if !m.idle() {
		t.Fatal("the marker is not idle once everything is marked")
	}
}

func TestMarkerGathersOnlyWhileDeliveriesAreUnderWay(t *testing.T) {
	m := newMarker()
	if got := m.gathering(true, 100, time.Now()); got != 0 {
		t.Fatalf("nothing acknowledged: waits %v, want 0", got)
	}
	m.add(&row{rid: 1})
	arrived := m.since
	if got := m.gathering(false, 100, arrived); got != 0 {
		t.Fatalf("nothing else under way: waits %v, want 0 (a lone message is marked at once)", got)
	}
	if got := m.gathering(true, 100, arrived.Add(time.Millisecond)); got != markGather-time.Millisecond {
		t.Fatalf("deliveries under way, 1ms after the ack: waits %v, want %v", got, markGather-time.Millisecond)
	}
	m.add(&row{rid: 2})
	if m.since != arrived {
		t.Fatal("a later acknowledgement moved the start of the wait: rows could wait for ever under a steady flow")
	}
	if got := m.gathering(true, 100, arrived.Add(markGather)); got != 0 {
		t.Fatalf("markGather after the oldest ack: waits %v, want 0", got)
	}
	if got := m.gathering(true, 2, arrived); got != 0 {
		t.Fatalf("a full mark waiting: waits %v, want 0", got)
	}
	m.take()
	m.marked()
	m.add(&row{rid: 3})
	if m.since.Before(arrived) || m.gathering(true, 100, m.since) != markGather {
		t.Fatal("the wait does not start again with the first acknowledgement after a mark")
	}
}
