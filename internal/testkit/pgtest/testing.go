package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/stagehand-es/stagehand/internal/migrate"
)

// EnvURL is the environment variable naming an existing server to test against.
const EnvURL = "DATABASE_URL"

// lazyServer is a cluster started on first use and stopped by Main.
type lazyServer struct {
	mu     sync.Mutex
	server *Server
	url    string
	err    error
}

func (l *lazyServer) get(ctx context.Context, opts Options) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url == "" && l.err == nil {
		srv, err := Start(ctx, opts)
		l.server, l.err = srv, err
		if err == nil {
			l.url = srv.URL()
		}
	}
	return l.url, l.err
}

func (l *lazyServer) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.server != nil {
		_ = l.server.Stop()
	}
}

var shared, durable lazyServer

// Main runs the tests of a package and stops the shared throwaway cluster afterwards. Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	shared.stop()
	durable.stop()
	os.Exit(code)
}

// URL returns the connection string of the server tests use: DATABASE_URL when set, else a throwaway cluster
// started once per process. It fails the test (never skips it) when no PostgreSQL can be found.
func URL(tb testing.TB) string {
	tb.Helper()
	url, err := SharedURL(context.Background())
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return url
}

// SharedURL is URL for code that has no testing.TB (examples, helper processes).
func SharedURL(ctx context.Context) (string, error) {
	if url := os.Getenv(EnvURL); url != "" {
		return url, nil
	}
	return shared.get(ctx, Options{})
}

// DurableURL is URL for benchmarks: DATABASE_URL when set, else a throwaway cluster with fsync,
// synchronous_commit and full_page_writes on (as in production), started once per process.
func DurableURL(tb testing.TB) string {
	tb.Helper()
	if url := os.Getenv(EnvURL); url != "" {
		return url
	}
	url, err := durable.get(context.Background(), Options{Durable: true})
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return url
}

// MigratedOn is Migrated on the server at url (for example DurableURL).
func MigratedOn(tb testing.TB, url string) (*pgxpool.Pool, string) {
	tb.Helper()
	pool := PoolFor(tb, url)
	schema := NewSchemaName(tb)
	if _, err := migrate.Up(context.Background(), pool, schema, nil); err != nil {
		tb.Fatalf("pgtest: migrate %s: %v", schema, err)
	}
	tb.Cleanup(func() { DropSchema(tb, pool, schema) })
	return pool, schema
}

// Pool opens a pool on the test server and closes it when the test ends.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return PoolFor(tb, URL(tb))
}

// PoolFor opens a pool on url and closes it when the test ends.
func PoolFor(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", url, err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// NewSchemaName returns a fresh, unused-looking schema name derived from the test name.
func NewSchemaName(tb testing.TB) string {
	base := nonIdent.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(b[:])
}

// Schema returns a pool and the name of a new, empty schema that is dropped when the test ends.
func Schema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool := Pool(tb)
	schema := NewSchemaName(tb)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create schema %s: %v", schema, err)
	}
	tb.Cleanup(func() { DropSchema(tb, pool, schema) })
	return pool, schema
}

// Migrated returns a pool and a new schema with every stagehand migration applied; the schema is dropped when
// the test ends.
func Migrated(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := Schema(tb)
	if _, err := migrate.Up(context.Background(), pool, schema, nil); err != nil {
		tb.Fatalf("pgtest: migrate %s: %v", schema, err)
	}
	return pool, schema
}

// DropSchema drops a schema and everything in it. Failures are reported, not fatal.
func DropSchema(tb testing.TB, pool *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		tb.Logf("pgtest: drop schema %s: %v", schema, err)
	}
}

// HelperEnv returns environment entries that let a child process (a re-executed test binary) reach the same
// server and schema.
func HelperEnv(tb testing.TB, schema string) []string {
	return []string{EnvURL + "=" + URL(tb), "STAGEHAND_TEST_SCHEMA=" + schema}
}

// HelperSchema returns the schema passed to a child process by HelperEnv.
func HelperSchema() string { return os.Getenv("STAGEHAND_TEST_SCHEMA") }

// Exec runs sql on the pool and fails the test on error.
func Exec(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// Count returns the result of a single-integer query and fails the test on error.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
	return n
}

// Q qualifies a table name with a schema, quoting both.
func Q(schema, table string) string { return pgx.Identifier{schema, table}.Sanitize() }

// Eventually polls cond every 10ms until it returns true or timeout passes, then fails the test with msg.
func Eventually(tb testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: timed out after %s: %s", timeout, fmt.Sprintf(msg, args...))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CheckLeaks fails the test if goroutines started during it are still running when it ends, apart from the
// test's own pools (closed by their cleanups). Call it first in a test: it snapshots the goroutines running now.
func CheckLeaks(tb testing.TB) {
	tb.Helper()
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).triggerHealthCheck.func1"),
	}
	tb.Cleanup(func() {
		if err := goleak.Find(opts...); err != nil {
			tb.Errorf("goroutine leak: %v", err)
		}
	})
}
