package scalebench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) {
	RunChildIfRequested() // a worker process: runs and exits here
	pgtest.Main(m)
}

// TestSmoke is the CI-size check that the rig works: two relay processes, leader-elected with four partitions,
// share the partitions two and two and drain a small outbox between them; one is killed with SIGKILL and the
// other takes its partitions over within a bound set by the lease TTL, and publishes the messages of those
// partitions staged afterwards. The full measurement is the benchmarks (README.md).
func TestSmoke(t *testing.T) {
	ctx := context.Background()
	const ttl = time.Second
	r := newRig(t, rigConfig{url: pgtest.URL(t), partitions: 4, ttl: ttl, batch: 100})
	keys, err := Keys(ctx, r.pool, 4, 25)
	require.NoError(t, err)
	for p, ks := range keys {
		for _, k := range ks {
			got, ok := KeyPartition(k)
			require.True(t, ok, k)
			require.Equal(t, p, got, k)
		}
	}
	start := time.Now()
	ws := r.start("relay", "r", 2)
	a, b := ws[0], ws[1]
	t.Logf("relays ready after %s", time.Since(start).Round(time.Millisecond))
	r.evenly(30*time.Second, "", a, b)
	t.Logf("partitions evenly led after %s", time.Since(start).Round(time.Millisecond))

	require.NoError(t, stageBacklog(ctx, r.pool, r.ob, "smoke1", flatKeys(keys), 2000, true))
	r.waitFor(60*time.Second, "first backlog drained", r.empty("outbox"), a, b)
	r.waitFor(5*time.Second, "every publish reported", func() (bool, error) {
		return a.Count()+b.Count() >= 2000, nil
	}, a, b)
	require.Positive(t, a.Count(), "both relays published")
	require.Positive(t, b.Count(), "both relays published")

	t.Logf("first backlog drained after %s", time.Since(start).Round(time.Millisecond))
	held, err := r.held(ctx, "")
	require.NoError(t, err)
	var moved []int
	for p, slot := range held {
		if slot == b.Slot {
			moved = append(moved, p)
		}
	}
	require.Len(t, moved, 2, "b led two of four partitions: %v", held)
	before := a.Parts()
	b.Kill()
	// A killed leader's partitions are taken over after about LeaderTTL plus one contention interval (at most
	// 1s); the bound leaves room for a loaded machine and a race-enabled binary.
	took := r.evenly(ttl+10*time.Second, "", a)
	t.Logf("the survivor led every partition %s after the kill (LeaderTTL %s)", took.Round(time.Millisecond), ttl)

	require.NoError(t, stageBacklog(ctx, r.pool, r.ob, "smoke2", flatKeys(keys), 400, true))
	r.waitFor(60*time.Second, "second backlog drained", r.empty("outbox"), a)
	r.waitFor(5*time.Second, "the survivor published from the partitions it took over", func() (bool, error) {
		after := a.Parts()
		for _, p := range moved {
			if after[p] <= before[p] {
				return false, nil
			}
		}
		return true, nil
	}, a)
	require.Equal(t, int64(0), pgtest.Count(t, r.pool, "SELECT count(*) FROM "+r.q("outbox")))
	require.Equal(t, int64(2400), pgtest.Count(t, r.pool, "SELECT count(*) FROM "+r.q("outbox_sent")),
		"every message moved to the ledger once")
}

// TestRawCeilingsWork checks the hand-written ceilings in-process on a few rows: the raw claim and mark move a
// backlog to the raw ledger, and the raw follower's read takes each partition's streams only.
func TestRawCeilingsWork(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, rigConfig{url: pgtest.URL(t), partitions: 2, ttl: time.Second, batch: 10})
	require.NoError(t, rawBacklog(ctx, r.pool, r.schema, "raw", []string{"a", "b", "c"}, 25))
	claim, mark := rawRelayStatements(r.schema)
	total := 0
	for {
		n, err := rawClaimAndMark(ctx, r.pool, claim, mark, 10)
		require.NoError(t, err)
		if n == 0 {
			break
		}
		total += n
	}
	require.Equal(t, 25, total)
	require.Equal(t, int64(25), pgtest.Count(t, r.pool, "SELECT count(*) FROM "+r.q("raw_sent")))

	store, err := eventstore.NewPostgres(r.pool, &eventstore.PostgresConfig{Schema: r.schema})
	require.NoError(t, err)
	defer store.Close()
	require.NoError(t, appendLog(ctx, store, "s", 10, 3))
	var perPart [2]int64
	for p := range perPart {
		perPart[p] = pgtest.Count(t, r.pool, fmt.Sprintf(`SELECT count(*) FROM %s
			WHERE abs(hashtext(stream_id) %% 2) = %d`, r.q("events"), p))
	}
	require.Equal(t, int64(30), perPart[0]+perPart[1])
	require.Positive(t, perPart[0])
	require.Positive(t, perPart[1])
}

// TestCPUAccounting checks the /proc readers on this process and this machine.
func TestCPUAccounting(t *testing.T) {
	st, err := procStat(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, int64(os.Getppid()), st.ppid)
	busy, total, err := MachineCPU()
	require.NoError(t, err)
	require.Positive(t, total)
	require.LessOrEqual(t, busy, total)
}
