package stagehandtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
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
//
// The pool's connections have search_path set to the schema, then public (see SchemaPool): the test's own
// unqualified tables (a read model's CREATE TABLE loans_view) are created in the test's schema and dropped with
// it, so tests never share them through public.
func Migrated(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	schema := SchemaName(tb)
	pool := SchemaPool(tb, schema)
	if _, err := stagehand.Migrate(context.Background(), pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		tb.Fatalf("stagehandtest: migrate %s: %v", schema, err)
	}
	return pool, schema
}

// SchemaPool opens a pool on URL's server whose connections have search_path set to schema, then public, closed
// when the test ends: unqualified names resolve to, and unqualified CREATE TABLE creates in, schema. It does not
// create the schema (Migrated and stagehand.Migrate do).
func SchemaPool(tb testing.TB, schema string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("stagehandtest: parse the server URL: %v", err)
	}
	cfg.MaxConns = 32
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize() + ", public"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("stagehandtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
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
