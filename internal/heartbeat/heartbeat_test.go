package heartbeat_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/heartbeat"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func only(t *testing.T, ps []heartbeat.Process) heartbeat.Process {
	t.Helper()
	require.Len(t, ps, 1)
	return ps[0]
}

// Run writes a row at once and every interval with the activity counted in memory, ends with its context (no
// goroutine left), and records that the component stopped; a row is gone once its beat is three intervals old.
func TestRunBeatsCountsAndStops(t *testing.T) {
	pgtest.CheckLeaks(t)
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	b, err := heartbeat.New(pool, heartbeat.Config{Schema: schema, Kind: "relay", Name: "relay",
		Interval: 100 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(runCtx)
	}()
	list := func() []heartbeat.Process {
		ps, err := heartbeat.List(ctx, pool, schema)
		require.NoError(t, err)
		return ps
	}
	pgtest.Eventually(t, 5*time.Second, func() bool { return len(list()) == 1 }, "the first beat")
	p := only(t, list())
	require.Equal(t, "relay", p.Kind)
	require.True(t, p.LastActivityAt.IsZero(), "nothing done yet")
	require.False(t, p.Gone())

	at := time.Now()
	b.Add(3, at)
	b.Add(2, at)
	pgtest.Eventually(t, 5*time.Second, func() bool { return only(t, list()).Activity == 5 }, "the count")
	require.WithinDuration(t, at, only(t, list()).LastActivityAt, time.Millisecond)

	cancel()
	<-done
	p = only(t, list())
	require.False(t, p.StoppedAt.IsZero(), "it stopped cleanly")
	require.True(t, p.Gone())

	// A process that died: its beat ages past three intervals.
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(schema, "heartbeats")+` SET stopped_at = NULL,
		heartbeat_at = now() - interval '1 second'`)
	p = only(t, list())
	require.True(t, p.StoppedAt.IsZero())
	require.True(t, p.Gone(), "no beat for %s", p.Age)
}

// Touch writes at most once per interval, however often it is called; Add never writes.
func TestTouchWritesOncePerInterval(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	b, err := heartbeat.New(pool, heartbeat.Config{Schema: schema, Kind: "inbox", Name: "billing",
		Interval: time.Hour})
	require.NoError(t, err)
	b.Add(1, time.Now())
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "heartbeats")))
	for range 100 {
		b.Touch(1, time.Now())
	}
	ps, err := heartbeat.List(ctx, pool, schema)
	require.NoError(t, err)
	p := only(t, ps)
	require.EqualValues(t, 2, p.Activity, "written once, by the first Touch, with what was counted then")
}

// Stale rows (no beat for PruneAfter) are deleted by a beat; live ones are kept.
func TestBeatsPruneStaleRows(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	q := pgtest.Q(schema, "heartbeats")
	pgtest.Exec(t, pool, `INSERT INTO `+q+` (kind, name, instance, started_at, heartbeat_at, interval_ms)
		VALUES ('relay', 'relay', 'dead-long-ago', now() - interval '3 hours', now() - interval '2 hours', 5000),
		       ('relay', 'relay', 'died-lately', now() - interval '3 hours', now() - interval '10 minutes', 5000)`)
	b, err := heartbeat.New(pool, heartbeat.Config{Schema: schema, Kind: "inbox", Name: "billing"})
	require.NoError(t, err)
	b.Touch(1, time.Now())
	ps, err := heartbeat.List(ctx, pool, schema)
	require.NoError(t, err)
	var names []string
	for _, p := range ps {
		names = append(names, p.Instance)
	}
	require.Len(t, names, 2)
	require.Contains(t, names, "died-lately", "gone, shown until pruned")
	require.NotContains(t, names, "dead-long-ago")
}

// What a beat costs: one single-row UPSERT per interval per component (measured here, logged).
func TestBeatCost(t *testing.T) {
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	b, err := heartbeat.New(pool, heartbeat.Config{Schema: schema, Kind: "relay", Name: "relay",
		Interval: time.Nanosecond})
	require.NoError(t, err)
	const n = 500
	start := time.Now()
	for range n {
		b.Touch(1, time.Now().Add(time.Millisecond)) // every call is due
	}
	took := time.Since(start)
	t.Logf("%d beats in %s: %s per beat (one UPSERT of one row, HOT update)", n, took, took/n)
	var size int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, pgtest.Q(schema,
		"heartbeats")).Scan(&size))
	t.Logf("table and index after %d beats of one component: %d bytes", n, size)
}
