package pgtest

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSecondConnection is the cause of the context a guarded pool gives an Acquire it refuses (see GuardedPool).
var ErrSecondConnection = errors.New("pgtest: a second pool connection was acquired inside a one-connection path")

// OneConnection marks ctx as an operation (named for the failure message) that may hold at most one connection of
// a GuardedPool at a time: its transaction's. The connection it first acquires with ctx (pool.Begin(ctx)) is
// counted as held until it is released; any Acquire made with ctx, or a context derived from it, while it is held
// fails the test and is refused at once (its context is cancelled with ErrSecondConnection), so the path reports
// an error instead of waiting for a connection.
//
// Mark the context of a Tx call (LoadTx, AppendTx...) and begin the caller's transaction with it, or the context a
// transaction-opening component (an inbox) starts from: whatever runs while that transaction is open must use it,
// or nothing.
func OneConnection(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, guardKey{}, &guardMark{name: name})
}

type guardKey struct{}

// guardMark is one marked operation: how many connections it holds.
type guardMark struct {
	name string
	held int // guarded by the tracer's mutex
}

// GuardedPool opens a pool of at most maxConns connections on the test server (closed when the test ends) whose
// Acquire fails tb when an operation marked by OneConnection acquires a connection while it holds one (see
// OneConnection). Unmarked contexts are not watched.
func GuardedPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("pgtest: parse the test server's URL: %v", err)
	}
	cfg.MaxConns = maxConns
	g := &guardTracer{tb: tb, owner: map[*pgx.Conn]*guardMark{}}
	cfg.ConnConfig.Tracer = g
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(func() { // runs before the pool closes
		g.mu.Lock()
		g.done = true
		g.mu.Unlock()
	})
	return pool
}

// GuardedMigrated returns a GuardedPool of at most maxConns connections and a new schema with every stagehand
// migration applied (made through another pool; the schema is dropped when the test ends).
func GuardedMigrated(tb testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	tb.Helper()
	_, schema := Migrated(tb)
	return GuardedPool(tb, maxConns), schema
}

// guardTracer implements pgxpool.AcquireTracer and pgxpool.ReleaseTracer for GuardedPool (and pgx.QueryTracer,
// the type of pgx.ConnConfig.Tracer, doing nothing).
type guardTracer struct {
	tb    testing.TB
	mu    sync.Mutex
	owner map[*pgx.Conn]*guardMark // the held connections of marked operations
	done  bool                     // the test has ended: report nothing more
}

var (
	_ pgxpool.AcquireTracer = (*guardTracer)(nil)
	_ pgxpool.ReleaseTracer = (*guardTracer)(nil)
	_ pgx.QueryTracer       = (*guardTracer)(nil)
)

func (g *guardTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool,
	_ pgxpool.TraceAcquireStartData) context.Context {
	m, ok := ctx.Value(guardKey{}).(*guardMark)
	if !ok {
		return ctx
	}
	g.mu.Lock()
	held := m.held
	g.mu.Unlock()
	if held == 0 {
		return ctx
	}
	g.report("pgtest: %s acquired a second pool connection while holding %d:\n%s", m.name, held, debug.Stack())
	refused, cancel := context.WithCancelCause(ctx)
	cancel(fmt.Errorf("%w (%s)", ErrSecondConnection, m.name))
	return refused
}

func (g *guardTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	m, ok := ctx.Value(guardKey{}).(*guardMark)
	if !ok || data.Err != nil || data.Conn == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	m.held++
	g.owner[data.Conn] = m
}

func (g *guardTracer) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.owner[data.Conn]; ok {
		m.held--
		delete(g.owner, data.Conn)
	}
}

func (g *guardTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (g *guardTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// report fails the test, unless it has ended (a component still running after it must not panic the test binary).
func (g *guardTracer) report(format string, args ...any) {
	g.mu.Lock()
	done := g.done
	g.mu.Unlock()
	if !done {
		g.tb.Errorf(format, args...)
	}
}
