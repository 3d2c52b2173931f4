package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	schema string
	pool   *pgxpool.Pool
	mgr    func(owner string, cfg *lease.Config) *lease.Manager
}

func setup(t *testing.T) env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return env{schema: schema, pool: pool, mgr: func(owner string, cfg *lease.Config) *lease.Manager {
		c := lease.Config{}
		if cfg != nil {
			c = *cfg
		}
		c.Schema, c.Owner = schema, owner
		m, err := lease.New(pool, &c)
		require.NoError(t, err)
		return m
	}}
}

func TestTwoContendersOneHolder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	a, b := e.mgr("a", nil), e.mgr("b", nil)

	la, ok, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(1), la.Token)

	_, ok, err = b.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.False(t, ok, "a held lease must not be acquired by another owner")
	_, ok, err = a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.False(t, ok, "not even by its own owner a second time")

	require.NoError(t, a.Release(ctx, la))
	lb, ok, err := b.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok, "a released lease is free at once")
	require.Equal(t, int64(2), lb.Token, "the fencing token increases with every change of hands")

	_, err = a.Renew(ctx, la)
	require.ErrorIs(t, err, lease.ErrLost)
	_, err = b.Renew(ctx, lb)
	require.NoError(t, err)
}

func TestTakeoverAfterExpiryFencesTheOldHolder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	cfg := &lease.Config{TTL: 300 * time.Millisecond}
	a, b := e.mgr("a", cfg), e.mgr("b", cfg)
	pgtest.Exec(t, e.pool, `CREATE TABLE `+pgtest.Q(e.schema, "work")+` (who text)`)

	la, ok, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)

	// a stops renewing (it "died" or froze); b takes over once the lease expires on the database clock.
	var lb lease.Lease
	pgtest.Eventually(t, 5*time.Second, func() bool {
		lb, ok, err = b.TryAcquire(ctx, "job")
		require.NoError(t, err)
		return ok
	}, "b never took over the expired lease")
	require.Equal(t, la.Token+1, lb.Token)

	// The zombie wakes up and tries a fenced write: rejected, and nothing it wrote commits.
	pool := e.pool
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgtest.Q(e.schema, "work")+` VALUES ('zombie')`)
	require.NoError(t, err)
	err = lease.CheckTx(ctx, tx, e.schema, la)
	require.ErrorIs(t, err, lease.ErrFenced)
	var fe *lease.FencedError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, lb.Token, fe.Current)
	require.Equal(t, "b", fe.CurrentOwner)
	require.NoError(t, tx.Rollback(ctx))

	// The new holder's fenced write goes through.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b.CheckTx(ctx, tx, lb))
	_, err = tx.Exec(ctx, `INSERT INTO `+pgtest.Q(e.schema, "work")+` VALUES ('b')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, int64(0), pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "work")+
		` WHERE who = 'zombie'`))
}

func TestFenceCheckHoldsOffATakeoverUntilCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	cfg := &lease.Config{TTL: 100 * time.Millisecond}
	a, b := e.mgr("a", cfg), e.mgr("b", cfg)
	pool := e.pool

	la, ok, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, a.CheckTx(ctx, tx, la))

	// The lease expires while a's fenced transaction is still open: b's takeover must wait for it to end, or a
	// could commit after b started from the old state.
	got := make(chan lease.Lease, 1)
	go func() {
		for {
			lb, ok, err := b.TryAcquire(ctx, "job")
			if err == nil && ok {
				got <- lb
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	select {
	case <-got:
		t.Fatal("the lease changed hands while the holder's fenced transaction was open")
	case <-time.After(400 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case lb := <-got:
		require.Equal(t, la.Token+1, lb.Token)
	case <-time.After(5 * time.Second):
		t.Fatal("b did not take over after the fenced transaction ended")
	}
}

func TestRunRenewsAndReleasesOnStop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Renewals every 50ms keep a 1s lease through 2.5s even on a loaded machine.
	cfg := &lease.Config{TTL: time.Second, RenewInterval: 50 * time.Millisecond,
		AcquireInterval: 20 * time.Millisecond}
	a, b := e.mgr("a", cfg), e.mgr("b", cfg)

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan lease.Lease, 1)
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, "job", func(ctx context.Context, l lease.Lease) error {
			started <- l
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	// Well past the TTL, renewals keep the lease with a.
	deadline := time.Now().Add(5 * cfg.TTL / 2)
	for time.Now().Before(deadline) {
		_, ok, err := b.TryAcquire(context.Background(), "job")
		require.NoError(t, err)
		require.False(t, ok, "a renewing holder lost its lease")
		time.Sleep(30 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
	// Released on stop: b gets it at once, without waiting for expiry.
	_, ok, err := b.TryAcquire(context.Background(), "job")
	require.NoError(t, err)
	require.True(t, ok, "the lease was not released when Run stopped")
}

func TestRunCancelsWorkWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool := e.pool
	cfg := &lease.Config{TTL: time.Second, RenewInterval: 50 * time.Millisecond, AcquireInterval: 20 * time.Millisecond}
	a := e.mgr("a", cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	causes := make(chan error, 10)
	tokens := make(chan int64, 10)
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, "job", func(ctx context.Context, l lease.Lease) error {
			tokens <- l.Token
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		})
	}()
	require.Equal(t, int64(1), <-tokens)
	// Someone else takes the lease (as after an expiry a's renewer did not see in time).
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(e.schema, "leases")+
		` SET owner = 'thief', token = token + 1, expires_at = now() + interval '300 milliseconds'`)
	select {
	case cause := <-causes:
		require.ErrorIs(t, cause, lease.ErrLost)
	case <-time.After(5 * time.Second):
		t.Fatal("work was not cancelled when the lease was lost")
	}
	// Run contends again and gets the lease back once the thief's expires, with a newer token.
	select {
	case tok := <-tokens:
		require.Equal(t, int64(3), tok)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not re-acquire the lease")
	}
	cancel()
	require.NoError(t, <-done)
}

func TestRunOneActiveAmongMany(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := &lease.Config{TTL: 5 * time.Second, RenewInterval: 100 * time.Millisecond,
		AcquireInterval: 20 * time.Millisecond}
	var active, maxActive, runs atomic.Int32
	work := func(ctx context.Context, l lease.Lease) error {
		n := active.Add(1)
		for {
			m := maxActive.Load()
			if n <= m || maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		runs.Add(1)
		<-ctx.Done()
		active.Add(-1)
		return nil
	}
	ctxs := make([]context.CancelFunc, 3)
	dones := make([]chan error, 3)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i], dones[i] = cancel, make(chan error, 1)
		m := e.mgr(string(rune('a'+i)), cfg)
		go func() { dones[i] <- m.Run(ctx, "job", work) }()
	}
	// Stop the runners one by one: each stop hands the lease to another, never to two.
	for i := range 3 {
		want := int32(i + 1)
		pgtest.Eventually(t, 5*time.Second, func() bool { return runs.Load() >= want }, "no runner took over")
		infos, err := lease.List(context.Background(), e.pool, e.schema, "job")
		require.NoError(t, err)
		require.Len(t, infos, 1)
		holder := int(infos[0].Owner[0] - 'a')
		ctxs[holder]()
		require.NoError(t, <-dones[holder])
		ctxs[holder] = func() {}
	}
	require.Equal(t, int32(1), maxActive.Load(), "two runners worked at once")
	require.Equal(t, int32(3), runs.Load())
}

func TestRunReturnsWorkErrorAndReleases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := e.mgr("a", nil), e.mgr("b", nil)
	boom := errors.New("boom")
	err := a.Run(context.Background(), "job", func(context.Context, lease.Lease) error { return boom })
	require.ErrorIs(t, err, boom)
	_, ok, err := b.TryAcquire(context.Background(), "job")
	require.NoError(t, err)
	require.True(t, ok)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for field, cfg := range map[string]*lease.Config{
		"TTL":             {TTL: time.Millisecond},
		"RenewInterval":   {TTL: time.Second, RenewInterval: time.Second},
		"AcquireInterval": {AcquireInterval: -1},
		"Schema":          {Schema: " "},
	} {
		_, err := lease.New(e.pool, cfg)
		require.ErrorIs(t, err, lease.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field)
	}
	_, err := lease.New(nil, nil)
	require.ErrorIs(t, err, lease.ErrInvalidConfig)
	m := e.mgr("x", nil)
	_, _, err = m.TryAcquire(context.Background(), "")
	require.ErrorIs(t, err, lease.ErrInvalidConfig)
}

// TestRunLeavesNoGoroutines is not parallel: the leak check sees every goroutine of the process, and sequential
// tests run while the parallel ones wait.
func TestRunLeavesNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	e := setup(t)
	cfg := &lease.Config{TTL: 300 * time.Millisecond, RenewInterval: 20 * time.Millisecond,
		AcquireInterval: 10 * time.Millisecond}
	a, b := e.mgr("a", cfg), e.mgr("b", cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	done := make(chan error, 2)
	for _, m := range []*lease.Manager{a, b} {
		go func() {
			done <- m.Run(ctx, "job", func(ctx context.Context, l lease.Lease) error {
				if runs.Add(1) == 1 { // the first holder loses its lease once
					pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "leases")+` SET token = token + 1`)
				}
				<-ctx.Done()
				return ctx.Err()
			})
		}()
	}
	pgtest.Eventually(t, 5*time.Second, func() bool { return runs.Load() >= 2 }, "lease lost and taken again")
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
}

// Once runs work under the lease when it can take it, and releases it afterwards; a lease another owner holds is
// not waited for: work does not run, and Once reports it was not acquired, without an error.
func TestOnceRunsUnderTheLeaseOrNotAtAll(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	a, b := e.mgr("a", nil), e.mgr("b", nil)

	var ran atomic.Int32
	acquired, err := a.Once(ctx, "drain", func(ctx context.Context, l lease.Lease) error {
		ran.Add(1)
		_, ok, err := b.TryAcquire(ctx, "drain")
		require.NoError(t, err)
		require.False(t, ok, "held while work runs")
		require.Equal(t, "a", l.Owner)
		return nil
	})
	require.NoError(t, err)
	require.True(t, acquired)
	require.EqualValues(t, 1, ran.Load())

	held, ok, err := b.TryAcquire(ctx, "drain")
	require.NoError(t, err)
	require.True(t, ok, "released when work returned")
	acquired, err = a.Once(ctx, "drain", func(context.Context, lease.Lease) error {
		ran.Add(1)
		return nil
	})
	require.NoError(t, err)
	require.False(t, acquired)
	require.EqualValues(t, 1, ran.Load(), "work does not run without the lease")
	require.NoError(t, b.Release(ctx, held))

	failure := errors.New("work failed")
	acquired, err = a.Once(ctx, "drain", func(context.Context, lease.Lease) error { return failure })
	require.True(t, acquired)
	require.ErrorIs(t, err, failure)
}
