package stagehandtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// EnvURL is the environment variable naming an existing server to use instead of a throwaway cluster. Tests on it
// create and drop schemas of their own; nothing else is touched.
const EnvURL = pgtest.EnvURL

// Main runs a test binary's tests and then stops the cluster they shared. Call it from TestMain.
func Main(m *testing.M) { pgtest.Main(m) }

// URL returns the connection string tests use: DATABASE_URL when set, else a throwaway cluster started on first
// use and shared by the test binary (stopped by Main). It fails the test when no PostgreSQL can be found.
func URL(tb testing.TB) string {
	tb.Helper()
	return pgtest.URL(tb)
}

// SharedURL is URL for code without a testing.TB (Example functions, helper processes).
func SharedURL(ctx context.Context) (string, error) { return pgtest.SharedURL(ctx) }

// Pool opens a pool on URL's server, closed when the test ends.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return pgtest.Pool(tb)
}

// SchemaName returns the name of a fresh schema, derived from the test's name, that is dropped (with everything
// in it) when the test ends. Nothing creates it: hand it to code that migrates it itself (stagehand.Migrate
// creates a missing schema).
func SchemaName(tb testing.TB) string {
	tb.Helper()
	pool := Pool(tb)
	name := pgtest.NewSchemaName(tb)
	tb.Cleanup(func() { pgtest.DropSchema(tb, pool, name) })
	return name
}

// Migrated returns a pool and a fresh schema with every stagehand migration applied (stagehand.Migrate), dropped
// when the test ends: a clean database per test, on a cluster shared by the test binary.
func Migrated(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	return pgtest.Migrated(tb)
}

// CheckLeaks fails the test if goroutines started during it are still running when it ends (the test's own pools
// aside). Call it first in a test.
func CheckLeaks(tb testing.TB) {
	tb.Helper()
	pgtest.CheckLeaks(tb)
}

// Server is a PostgreSQL server a program started with Start.
type Server struct {
	url string
	srv *pgtest.Server // nil when the server is DATABASE_URL's
}

// Start returns DATABASE_URL's server when that is set (Stop then does nothing), else starts a fresh throwaway
// cluster from the local PostgreSQL binaries, removed by Stop (and when this process dies).
func Start(ctx context.Context) (*Server, error) {
	if url := os.Getenv(EnvURL); url != "" {
		return &Server{url: url}, nil
	}
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return nil, err
	}
	return &Server{url: srv.URL(), srv: srv}, nil
}

// URL is the server's connection string.
func (s *Server) URL() string { return s.url }

// Stop stops and removes a cluster Start started. Safe to call more than once.
func (s *Server) Stop() error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Stop()
}
