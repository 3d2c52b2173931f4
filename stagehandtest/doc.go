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
// Migrated's pool has search_path set to the test's schema (then public), so a read model's unqualified
// CREATE TABLE lands in that schema and is dropped with it; no test sees another's tables through public.
//
// A test of a service waits for what it did to go through instead of polling: WaitIdle returns once every
// projection and staging worker has reached the log head of the call, every message staged so far has been sent,
// and the inbox handlers named for its topic have handled it; it fails the test with what is outstanding (messages
// pending with their IDs and last errors, followers with their positions and the head) at its timeout, and at once
// on a dead letter or a parked event:
//
//	app.OpenLoan(ctx, "loan-1") // appends, stages
//	stagehandtest.WaitIdle(t, pool, schema, &stagehandtest.IdleConfig{
//		Followers: []string{"loans"},                        // a projection that may not have started yet
//		Handlers:  map[string][]string{"loans": {"notify"}}, // topic → inbox handlers that must handle it
//	})
//	// loans_view and the notify handler's effects are up to date here.
//
// Programs (examples, demos) call Start for a server of their own and Stop it when done.
package stagehandtest
