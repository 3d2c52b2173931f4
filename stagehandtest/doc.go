// Package stagehandtest gives tests and example programs a throwaway PostgreSQL with the stagehand schema, so they
// run against the real database without any setup.
//
// The server is DATABASE_URL when that is set; otherwise a cluster started from the local PostgreSQL binaries
// (pg_config --bindir, or initdb on PATH) on a free 127.0.0.1 port, as the postgres OS user when running as root,
// with fsync off, and removed when it is stopped or when the process that started it dies. Without either, the
// test fails (never skips) with a message saying how to get PostgreSQL.
//
// In tests, share one cluster per test binary and give each test a clean, migrated schema of its own:
//
//	func TestMain(m *testing.M) { stagehandtest.Main(m) } // stops the shared cluster at the end
//
//	func TestDeposit(t *testing.T) {
//		pool, schema := stagehandtest.Migrated(t) // dropped when the test ends
//		store, _ := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
//		...
//	}
//
// Programs (examples, demos) call Start for a server of their own and Stop it when done.
package stagehandtest
