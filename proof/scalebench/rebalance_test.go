package scalebench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// handover is one measured move of partitions between processes.
type handover struct {
	balanced time.Duration // until the partitions were evenly held by the live processes
	taken    time.Duration // until the last moved partition was held by its new process
	flowed   time.Duration // until every moved partition had made progress under its new process
	moved    int
}

func (h handover) String() string {
	return fmt.Sprintf("%d partitions moved: taken %s, flowing %s, balanced %s", h.moved,
		h.taken.Round(10*time.Millisecond), h.flowed.Round(10*time.Millisecond), h.balanced.Round(10*time.Millisecond))
}

// progress returns each partition's progress marker (a count or a position that only grows).
type progress func() (map[int]int64, error)

// watchHandover polls every 10 ms from t0 until the partitions in parts are held by to and each has made
// progress under it (its marker grew after to was first seen holding it), and until the partitions are evenly held
// by live.
func (r *rig) watchHandover(t0 time.Time, projection string, parts []int, to *Worker, prog progress,
	live ...*Worker) handover {
	r.tb.Helper()
	slots := make([]string, len(live))
	for i, w := range live {
		slots[i] = w.Slot
	}
	base := map[int]int64{}
	takenAt := map[int]time.Duration{}
	flowedAt := map[int]time.Duration{}
	h := handover{moved: len(parts)}
	for {
		held, err := r.held(context.Background(), projection)
		require.NoError(r.tb, err)
		marks, err := prog()
		require.NoError(r.tb, err)
		now := time.Since(t0)
		for _, p := range parts {
			if _, ok := takenAt[p]; !ok && held[p] == to.Slot {
				takenAt[p], base[p] = now, marks[p]
			} else if _, done := flowedAt[p]; ok && !done && marks[p] > base[p] {
				flowedAt[p] = now
			}
		}
		if h.balanced == 0 && even(held, r.partitions, slots...) {
			h.balanced = now
		}
		if len(flowedAt) == len(parts) && h.balanced != 0 {
			for _, p := range parts {
				h.taken, h.flowed = max(h.taken, takenAt[p]), max(h.flowed, flowedAt[p])
			}
			return h
		}
		require.NoError(r.tb, r.fleet.Failed(live...))
		if now > 3*time.Minute {
			r.tb.Fatalf("scalebench: handover to %s not done within 3 minutes (taken %v, flowed %v, held %v)",
				to.Slot, takenAt, flowedAt, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ledBy lists the partitions slot holds.
func ledBy(held map[int]string, slot string) []int {
	var out []int
	for p, s := range held {
		if s == slot {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func summarize(name string, hs []handover) string {
	pick := func(f func(handover) time.Duration) string {
		var ds []time.Duration
		for _, h := range hs {
			ds = append(ds, f(h))
		}
		slices.Sort(ds)
		return fmt.Sprintf("median %s, max %s", ds[len(ds)/2].Round(10*time.Millisecond),
			ds[len(ds)-1].Round(10*time.Millisecond))
	}
	return fmt.Sprintf("REBALANCE %s (%d runs): taken %s | flowing %s | balanced %s", name, len(hs),
		pick(func(h handover) time.Duration { return h.taken }),
		pick(func(h handover) time.Duration { return h.flowed }),
		pick(func(h handover) time.Duration { return h.balanced }))
}

// BenchmarkRebalance measures how long partitions take to move when a process joins (1 → 2) or is killed with
// SIGKILL (2 → 1), for relays (8 partitions, LeaderTTL 5s, the default) under a steady stream of staged
// messages, and for a projection (8 partitions, LeaseTTL 5s, the default) under a steady stream of appends. A
// join is timed from the new process's start, a kill from the SIGKILL: until the moved partitions are held by
// their new process (taken), until each has made progress there (flowing: a message of the partition published,
// a projection checkpoint advanced) and until the split is even (balanced).
func BenchmarkRebalance(b *testing.B) {
	ctx := context.Background()
	srv, err := StartServer(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Stop() })
	reps := envInt("STAGEHAND_SCALE_REBALANCE_RUNS", 3)
	const ttl = 5 * time.Second

	b.Run("relays", func(b *testing.B) {
		r := newRig(b, rigConfig{url: srv.URL(), dataDir: srv.DataDir(), partitions: partitions, ttl: ttl, batch: 100})
		keys, err := Keys(ctx, r.pool, partitions, 50)
		require.NoError(b, err)
		flat := flatKeys(keys)
		stop := r.produce(func(ctx context.Context, i int) error { // 1,000 messages a second over 400 keys
			return stageBacklog(ctx, r.pool, r.ob, "live"+strconv.Itoa(i), flat[i*10%len(flat):][:10], 10, true)
		})
		defer stop()
		var joins, kills []handover
		for rep := range reps {
			a := r.start("relay", fmt.Sprintf("a%d-", rep), 1)[0]
			r.evenly(time.Minute, "", a)
			t0 := time.Now()
			nw, err := r.fleet.Start("relay", fmt.Sprintf("b%d-1", rep))
			require.NoError(b, err)
			require.NoError(b, WaitReady(time.Minute, nw))
			// The partitions the newcomer will lead are known once it leads them: watch all eight, keep its own.
			joined := r.relayHandover(t0, nw, []*Worker{a, nw}, allParts())
			joins = append(joins, joined)
			fmt.Printf("REBALANCE relays join %d: %s\n", rep, joined)

			held, err := r.held(ctx, "")
			require.NoError(b, err)
			victimParts := ledBy(held, nw.Slot)
			t1 := time.Now()
			nw.Kill()
			killed := r.relayHandover(t1, a, []*Worker{a}, victimParts)
			kills = append(kills, killed)
			fmt.Printf("REBALANCE relays kill %d: %s\n", rep, killed)
			a.Stop(10 * time.Second)
		}
		fmt.Println(summarize("relays, a process joins (1 → 2)", joins))
		fmt.Println(summarize("relays, a process is killed (2 → 1)", kills))
	})

	b.Run("projections", func(b *testing.B) {
		r := newRig(b, rigConfig{url: srv.URL(), dataDir: srv.DataDir(), partitions: partitions, ttl: ttl,
			batch: 1000})
		store, err := eventstore.NewPostgres(r.pool, &eventstore.PostgresConfig{Schema: r.schema})
		require.NoError(b, err)
		b.Cleanup(store.Close)
		stop := r.produce(func(ctx context.Context, i int) error { // 500 events a second over 64 streams
			_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "live-" + strconv.Itoa(i%64),
				StreamType: "order", Expected: eventstore.AnyVersion, Events: []eventstore.EventData{
					{Type: "orders.OrderPlaced", Payload: payload}, {Type: "orders.OrderPlaced", Payload: payload},
					{Type: "orders.OrderPlaced", Payload: payload}, {Type: "orders.OrderPlaced", Payload: payload},
					{Type: "orders.OrderPlaced", Payload: payload}}})
			return err
		})
		defer stop()
		var joins, kills []handover
		for rep := range reps {
			name := fmt.Sprintf("rb%d", rep)
			prog := r.checkpointProgress(name)
			a := r.start("projection", fmt.Sprintf("a%d-", rep), 1)[0]
			require.NoError(b, a.Send("go "+name))
			r.evenly(time.Minute, name, a)
			t0 := time.Now()
			nw, err := r.fleet.Start("projection", fmt.Sprintf("b%d-1", rep))
			require.NoError(b, err)
			require.NoError(b, WaitReady(time.Minute, nw))
			require.NoError(b, nw.Send("go "+name))
			joined := r.projectionHandover(t0, name, nw, []*Worker{a, nw}, allParts(), prog)
			joins = append(joins, joined)
			fmt.Printf("REBALANCE projections join %d: %s\n", rep, joined)

			held, err := r.held(ctx, name)
			require.NoError(b, err)
			victimParts := ledBy(held, nw.Slot)
			t1 := time.Now()
			nw.Kill()
			killed := r.projectionHandover(t1, name, a, []*Worker{a}, victimParts, prog)
			kills = append(kills, killed)
			fmt.Printf("REBALANCE projections kill %d: %s\n", rep, killed)
			a.Stop(10 * time.Second)
		}
		fmt.Println(summarize("projections, a process joins (1 → 2)", joins))
		fmt.Println(summarize("projections, a process is killed (2 → 1)", kills))
	})
}

func allParts() []int {
	out := make([]int, partitions)
	for i := range out {
		out[i] = i
	}
	return out
}

// relayHandover watches the partitions of candidates that end up led by to: for a join, to's share (which ones is
// known only once it leads them), for a kill, the victim's.
func (r *rig) relayHandover(t0 time.Time, to *Worker, live []*Worker, candidates []int) handover {
	prog := func() (map[int]int64, error) { return to.Parts(), nil }
	return r.handoverOf(t0, "", to, live, candidates, prog)
}

func (r *rig) projectionHandover(t0 time.Time, name string, to *Worker, live []*Worker, candidates []int,
	prog progress) handover {
	return r.handoverOf(t0, name, to, live, candidates, prog)
}

// handoverOf waits until the split is even, then measures the handover of the candidates that to leads then.
func (r *rig) handoverOf(t0 time.Time, projection string, to *Worker, live []*Worker, candidates []int,
	prog progress) handover {
	r.tb.Helper()
	if len(candidates) == r.partitions { // a join: the newcomer's share, once the split is even
		r.evenly(3*time.Minute, projection, live...)
		held, err := r.held(context.Background(), projection)
		require.NoError(r.tb, err)
		candidates = ledBy(held, to.Slot)
	}
	return r.watchHandover(t0, projection, candidates, to, prog, live...)
}

// checkpointProgress is each partition's checkpoint position of the projection name.
func (r *rig) checkpointProgress(name string) progress {
	q := `/* scalebench */ SELECT name, position FROM ` + r.q("checkpoints") + ` WHERE reset_group = $1`
	return func() (map[int]int64, error) {
		rows, err := r.pool.Query(context.Background(), q, name)
		if err != nil {
			return nil, fmt.Errorf("scalebench: checkpoints: %w", err)
		}
		defer rows.Close()
		out := map[int]int64{}
		for rows.Next() {
			var cp string
			var pos int64
			if err := rows.Scan(&cp, &pos); err != nil {
				return nil, fmt.Errorf("scalebench: checkpoints: %w", err)
			}
			_, rest, _ := strings.Cut(cp, "#")
			num, _, _ := strings.Cut(rest, "/")
			if p, err := strconv.Atoi(num); err == nil {
				out[p] = pos
			}
		}
		return out, rows.Err()
	}
}

// produce calls step every 10 ms (i counting up) until the returned stop is called.
func (r *rig) produce(step func(ctx context.Context, i int) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed error
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := step(ctx, i); err != nil && ctx.Err() == nil {
				failed = err
				return
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		require.NoError(r.tb, failed, "the producer")
	}
}
