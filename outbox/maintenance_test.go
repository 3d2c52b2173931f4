package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// TestMaintenanceRetention plants rows of every age in every table maintenance touches and checks what one pass
// removes and keeps: the watermark rule of the ledger, a dead letter holding its key, an inbox entry whose dead
// letter still exists, and negative retentions that keep everything.
func TestMaintenanceRetention(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	e := setupOn(t, pool, schema, &outbox.Config{Clock: func() time.Time { return now }})
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	day := 24 * time.Hour
	old, recent := now.Add(-40*day), now.Add(-time.Hour)
	sent := pgtest.Q(schema, "outbox_sent")
	for _, r := range []struct {
		id  string
		pos any
		at  time.Time
	}{{"sent-old-nopos", nil, old}, {"sent-old-10", 10, old}, {"sent-old-50", 50, old}, {"sent-new-5", 5, recent}} {
		exec(`INSERT INTO `+sent+` (message_id, topic, tenant_id, message_type, source_position, attempts, created_at,
			sent_at) VALUES ($1, 't', 'acme', 'x', $2, 1, $3, $3)`, r.id, r.pos, r.at)
	}
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, pool, "stager", 20))

	dead := pgtest.Q(schema, "outbox_dead_letters")
	for _, r := range []struct {
		id   string
		hold bool
		at   time.Time
	}{{"dead-old-free", false, old}, {"dead-old-holding", true, old}, {"dead-new-free", false, recent}} {
		exec(`INSERT INTO `+dead+` (message_id, topic, tenant_id, message_type, payload, metadata, correlation_id,
			causation_id, partition_key, seq, attempts, last_error, holds_key, created_at, dead_at)
			VALUES ($1, 't', 'acme', 'x', '', '{}', '', '', 'k-'||$1, 1, 3, 'boom', $2, $3, $3)`, r.id, r.hold, r.at)
	}

	inbox, attempts, inboxDead := pgtest.Q(schema, "inbox"), pgtest.Q(schema, "inbox_attempts"),
		pgtest.Q(schema, "inbox_dead_letters")
	for _, r := range []struct {
		id, outcome string
		at          time.Time
	}{{"in-old", "handled", old}, {"in-new", "handled", recent}, {"in-old-dead", "dead-lettered", old},
		{"in-old-dead-expired", "dead-lettered", old}} {
		exec(`INSERT INTO `+inbox+` (message_id, handler, tenant_id, outcome, processed_at) VALUES ($1, 'h', 'acme', $2, $3)`,
			r.id, r.outcome, r.at)
	}
	exec(`INSERT INTO `+inboxDead+` (message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts,
		last_error, dead_at) VALUES ('in-old-dead', 'h', 'acme', 'x', 't', '', '{}', 5, 'boom', $1),
		('in-old-dead-expired', 'h', 'acme', 'x', 't', '', '{}', 5, 'boom', $2)`, now.Add(-2*day), old)
	exec(`INSERT INTO `+attempts+` (message_id, handler, tenant_id, attempts, last_error, first_failed_at,
		last_failed_at) VALUES ('att-old', 'h', 'acme', 2, 'boom', $1, $1), ('att-new', 'h', 'acme', 2, 'boom', $2, $2)`,
		old, recent)

	// Negative retentions keep everything.
	keep, err := e.ob.NewMaintainer(&outbox.MaintenanceConfig{SentRetention: -1, InboxRetention: -1,
		DeadLetterRetention: -1})
	require.NoError(t, err)
	rep, err := keep.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.MaintenanceReport{}, rep)

	rec := telemetrytest.New(t)
	m, err := e.ob.NewMaintainer(&outbox.MaintenanceConfig{BatchSize: 1, MeterProvider: rec.MeterProvider})
	require.NoError(t, err)
	rep, err = m.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.MaintenanceReport{
		SentRemoved:             2, // sent-old-nopos and sent-old-10; sent-old-50 is above the watermark, and the
		InboxRemoved:            2, // discarded dead letter's ledger entry is new; in-old and in-old-dead-expired
		InboxAttemptsRemoved:    1,
		DeadLettersExpired:      1,
		InboxDeadLettersExpired: 1,
	}, rep)

	ids := func(table, col string) []string {
		rows, err := pool.Query(ctx, `SELECT `+col+` FROM `+pgtest.Q(schema, table)+` ORDER BY 1`)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, []string{"dead-old-free", "sent-new-5", "sent-old-50"}, ids("outbox_sent", "message_id"),
		"the expired dead letter is remembered as discarded")
	require.EqualValues(t, 1, e.count("outbox_sent", "message_id = 'dead-old-free' AND outcome = 'discarded'"))
	require.Equal(t, []string{"dead-new-free", "dead-old-holding"}, ids("outbox_dead_letters", "message_id"),
		"a dead letter holding its key is never discarded for its age")
	require.Equal(t, []string{"in-new", "in-old-dead"}, ids("inbox", "message_id"),
		"an inbox entry stays while its dead letter does")
	require.Equal(t, []string{"in-old-dead"}, ids("inbox_dead_letters", "message_id"))
	require.Equal(t, []string{"att-new"}, ids("inbox_attempts", "message_id"))

	n, err := e.ob.Stage(stagehand.WithTenant(ctx, "acme"), outbox.Message{ID: "dead-old-free", Topic: "t"})
	require.NoError(t, err)
	require.Zero(t, n, "re-staging an expired dead letter publishes nothing")

	st, ok, err := e.ob.AllTenants().Maintenance(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, rep, st.Removed)
	require.EqualValues(t, 2, st.Passes)
	require.Equal(t, now, st.StartedAt)
	require.Equal(t, now, st.FinishedAt)
	require.Empty(t, st.LastError)
	require.Equal(t, outbox.DefaultMaintenanceInterval, st.Interval)
	require.False(t, st.Overdue(now.Add(3*outbox.DefaultMaintenanceInterval)))
	require.True(t, st.Overdue(now.Add(3*outbox.DefaultMaintenanceInterval+time.Second)))

	for table, want := range map[string]int64{"outbox_sent": 2, "inbox": 2, "inbox_attempts": 1,
		"outbox_dead_letters": 1, "inbox_dead_letters": 1} {
		got, _ := rec.Int64(t, telemetry.MetricMaintenanceRemoved, telemetry.AttrTable.String(table))
		require.Equal(t, want, got, table)
	}
	passes, _ := rec.Int64(t, telemetry.MetricMaintenancePasses, telemetry.AttrOutcome.String("ok"))
	require.EqualValues(t, 1, passes)

	// A pass is due only an interval after the latest one started, whichever process ran it.
	ran, err := m.RunIfDue(ctx)
	require.NoError(t, err)
	require.False(t, ran)
	now = now.Add(outbox.DefaultMaintenanceInterval)
	ran, err = m.RunIfDue(ctx)
	require.NoError(t, err)
	require.True(t, ran)
}

func TestMaintenanceConfigErrors(t *testing.T) {
	e := setup(t)
	for field, cfg := range map[string]outbox.MaintenanceConfig{
		"Interval":  {Interval: time.Millisecond},
		"BatchSize": {BatchSize: -1},
		"LeaseTTL":  {LeaseTTL: time.Millisecond},
	} {
		_, err := e.ob.NewMaintainer(&cfg)
		var ce *outbox.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		_, err = e.ob.NewRelay(&outbox.RelayConfig{Maintenance: &cfg})
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, "Maintenance."+field, ce.Field)
	}
	_, err := e.ob.NewRelay(&outbox.RelayConfig{Maintenance: &outbox.MaintenanceConfig{Disabled: true,
		Interval: time.Millisecond}})
	require.NoError(t, err, "a disabled maintenance configuration is not validated")
}

// TestRelayMaintainsByDefault: a subscribed relay runs maintenance with no setting at all, two relays in two
// "processes" keep one maintainer active, and Disabled opts out.
func TestRelayMaintainsByDefault(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	_, ok, err := e.ob.AllTenants().Maintenance(ctx)
	require.NoError(t, err)
	require.False(t, ok)

	off := e.relay(func(c *outbox.RelayConfig) { c.Maintenance = &outbox.MaintenanceConfig{Disabled: true} })
	offPub := newBroker()
	router := runRouter(t, off, offPub, nil)
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "probe", Topic: "t"})
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool { return offPub.distinct() == 1 }, "the relay does not run")
	_, ok, err = e.ob.AllTenants().Maintenance(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a relay with maintenance disabled runs none")
	require.NoError(t, router.Close())

	a := e.relay(func(c *outbox.RelayConfig) { c.Maintenance = &outbox.MaintenanceConfig{Interval: time.Second} })
	b := e.relay(func(c *outbox.RelayConfig) { c.Maintenance = &outbox.MaintenanceConfig{Interval: time.Second} })
	runRouter(t, a, newBroker(), nil)
	runRouter(t, b, newBroker(), nil)
	var first outbox.MaintenanceStatus
	pgtest.Eventually(t, 10*time.Second, func() bool {
		first, ok, err = e.ob.AllTenants().Maintenance(ctx)
		return err == nil && ok && first.Passes >= 3
	}, "the relays ran no maintenance")
	holders := pgtest.Count(t, e.pool, `SELECT count(DISTINCT owner) FROM `+pgtest.Q(e.schema, "leases")+
		` WHERE name = $1 AND expires_at > now()`, outbox.MaintenanceLease)
	require.EqualValues(t, 1, holders)

	// The passes are an interval apart: two relays do not each run one per interval.
	time.Sleep(2500 * time.Millisecond)
	later, _, err := e.ob.AllTenants().Maintenance(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, later.Passes-first.Passes, int64(4), "more passes than one maintainer runs")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// TestMaintenanceBesideStagingRelaysAndRestaging runs maintenance that keeps the ledger for no time at all,
// every second, beside stagers, two relays and a component re-staging from a "log" behind a watermark it
// advances. Whatever the interleaving, no message is published twice: the ledger entries re-staging still needs
// (at or above the watermark) survive every pass.
func TestMaintenanceBesideStagingRelaysAndRestaging(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := setup(t)
	const total = 600
	pub := newBroker()
	maint := &outbox.MaintenanceConfig{Interval: time.Second, SentRetention: time.Nanosecond,
		InboxRetention: time.Nanosecond, DeadLetterRetention: time.Nanosecond}
	for range 2 {
		r := e.relay(func(c *outbox.RelayConfig) { c.Maintenance = maint })
		runRouter(t, r, pub, nil)
	}
	m, err := e.ob.NewMaintainer(maint)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_, _ = m.RunOnce(ctx) // passes as fast as they go, beside the relays' own
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// Positions start at 1 (0 means "no position": only age protects such a ledger entry).
	msg := func(i int) outbox.Message {
		pos := i + 1
		return outbox.Message{ID: fmt.Sprintf("m-%04d", pos), Topic: "t", SourcePosition: int64(pos),
			PartitionKey: fmt.Sprintf("k-%d", pos%7), Payload: []byte("x")}
	}
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, e.pool, "restager", 0))
	var staged atomic.Int64
	// The first-time stager writes positions in order; the re-stager follows behind it, re-staging everything
	// from its watermark on (as a Deferred stager restarting from its checkpoint does) and advancing the mark.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pos := range total {
			n, err := e.ob.Stage(ctx, msg(pos))
			if err != nil {
				t.Error(err)
				return
			}
			staged.Add(int64(n))
		}
	}()
	restaged := 0
	for mark := 0; mark < total; {
		head := int(staged.Load())
		for pos := mark; pos < head; pos++ {
			n, err := e.ob.Stage(ctx, msg(pos))
			require.NoError(t, err)
			restaged += n
		}
		// Keep a few positions behind the head: those are re-staged again next round.
		if next := head - 5; next > mark {
			mark = next
			_, err := e.ob.AdvanceWatermark(ctx, "restager", int64(mark+1))
			require.NoError(t, err)
		}
		if head == total && mark >= total-5 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.Zero(t, restaged, "re-staging at or above the watermark staged a message again")
	pgtest.Eventually(t, 30*time.Second, func() bool { return pub.distinct() == total }, "not all published")
	cancel()
	wg.Wait()
	counts := map[string]int{}
	for _, p := range pub.snapshot() {
		counts[p.id]++
	}
	for id, n := range counts {
		require.Equal(t, 1, n, "%s published %d times", id, n)
	}
	st, ok, err := e.ob.AllTenants().Maintenance(context.Background())
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, st.Passes, int64(3))
	require.Less(t, e.count("outbox_sent"), int64(total), "maintenance removed no ledger entry")
}

// A pass cut short by the end of its context (its process stopping) returns that error but is not recorded as a
// failed pass: health would otherwise report "the latest maintenance pass failed: context canceled" after every
// shutdown that caught a pass. The inbox step is held on a table lock until the context is cancelled.
func TestInterruptedMaintenancePassIsNotAFailure(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m, err := e.ob.NewMaintainer(nil)
	require.NoError(t, err)
	bg := context.Background()
	lock, err := e.pool.Begin(bg)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(bg) }()
	_, err = lock.Exec(bg, "LOCK TABLE "+pgtest.Q(e.schema, "inbox")+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	// Cancelled once the pass waits for the lock (not after a fixed time, which a loaded machine may spend before
	// the pass reaches the inbox step).
	ctx, cancel := context.WithCancel(bg)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		defer cancel()
		for ctx.Err() == nil {
			var n int
			if err := e.pool.QueryRow(bg, `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass
				AND NOT granted`, pgtest.Q(e.schema, "inbox")).Scan(&n); err != nil || n > 0 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	_, err = m.RunOnce(ctx)
	<-waiting
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, lock.Rollback(bg))

	st, ok, err := e.ob.AllTenants().Maintenance(bg)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, st.FinishedAt.IsZero(), "the pass is recorded as ended")
	require.Empty(t, st.LastError, "an interrupted pass is not a failed one")

	// A step that fails for its own reason is still recorded.
	_, err = e.pool.Exec(bg, "ALTER TABLE "+pgtest.Q(e.schema, "inbox_attempts")+" RENAME TO inbox_attempts_gone")
	require.NoError(t, err)
	_, err = m.RunOnce(bg)
	require.Error(t, err)
	st, _, err = e.ob.AllTenants().Maintenance(bg)
	require.NoError(t, err)
	require.Contains(t, st.LastError, "inbox_attempts")
}
