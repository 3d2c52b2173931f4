package pgnotify_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func waitWake(t *testing.T, wake <-chan struct{}, within time.Duration) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(within):
		t.Fatalf("no wake-up within %s", within)
	}
}

func drain(wake <-chan struct{}) {
	for {
		select {
		case <-wake:
		default:
			return
		}
	}
}

func TestNotifyWakesListenerAndSurvivesKilledConnection(t *testing.T) {
	pgtest.CheckLeaks(t)
	pool := pgtest.Pool(t)
	ctx := context.Background()
	channel := pgnotify.Channel(pgtest.NewSchemaName(t), "test")

	wake, stop := pgnotify.Listen(ctx, pool, channel, 50*time.Millisecond, nil)
	defer stop()
	waitWake(t, wake, 5*time.Second) // the signal sent on connect

	n := pgnotify.NewNotifier(pool, channel, nil)
	defer n.Close()
	n.Notify()
	waitWake(t, wake, 5*time.Second)

	// Kill the listening backend: the listener must reconnect (and signal on reconnect), then still deliver.
	pgtest.Eventually(t, 5*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "+
			"WHERE query ILIKE 'listen %' AND pid <> pg_backend_pid()") > 0
	}, "listening backend not found")
	waitWake(t, wake, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	drain(wake)
	n.Notify()
	waitWake(t, wake, 5*time.Second)
}

func TestNotifierCoalescesBursts(t *testing.T) {
	pgtest.CheckLeaks(t)
	pool := pgtest.Pool(t)
	channel := pgnotify.Channel(pgtest.NewSchemaName(t), "burst")
	counter := &countingExecer{inner: pool}
	n := pgnotify.NewNotifier(counter, channel, nil)
	for range 1000 {
		n.Notify()
	}
	n.Close()
	require.GreaterOrEqual(t, counter.calls(), 1)
	require.Less(t, counter.calls(), 100, "a burst of notifications must be coalesced")
}

// A direct connection passes CheckDelivery without the probe (the refusal through PgBouncer in transaction pooling
// mode, and the pass in session pooling mode, are tested in proof/histories, which runs PgBouncer).
func TestCheckDeliveryPassesADirectConnection(t *testing.T) {
	pool, _ := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	reason, err := pgnotify.CheckDelivery(ctx, pool)
	if err != nil || reason != "" {
		t.Fatalf("CheckDelivery on a direct pool: %q, %v", reason, err)
	}
	if waited := time.Since(began); waited >= pgnotify.ProbeTimeout {
		t.Fatalf("a direct pool was probed (%s): the process ID check should have passed it", waited)
	}
}
