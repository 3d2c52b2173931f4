package histories_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
)

// crashMinAfter is how many saves (appends) a crash run must acknowledge, and effects it must commit, after its
// last crash ended: a crash that left the run doing nothing would let the checkers pass on nothing.
const crashMinAfter = 3

// TestCrashesUnderNetworkFaults runs the stream and the pipeline histories on a PostgreSQL cluster private to the
// test (synchronous_commit on, so an acknowledged commit survives a crash), whose nemesis injects, besides every
// network fault, immediate restarts of PostgreSQL (pg_ctl restart -m immediate: no checkpoint, crash recovery at
// start) and, in the pipeline, SIGKILLs of a worker process (the test binary re-executed) running a second relay
// and set of handlers, replaced at once. Every checker runs; the run must have injected every kind of fault,
// killed a worker that had handled messages, and saved and handled after its last crash.
func TestCrashesUnderNetworkFaults(t *testing.T) {
	pgtest.CheckLeaks(t)
	ctx := context.Background()
	// Never the shared cluster of DATABASE_URL: this one is restarted.
	srv, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	full := os.Getenv(envSize) == "full"

	t.Run("streams", func(t *testing.T) {
		admin, schema := pgtest.MigratedOn(t, srv.URL())
		restart := func(ctx context.Context) error {
			err := srv.RestartImmediate(ctx)
			admin.Reset() // its connections died with the server
			return err
		}
		cfg := histories.StreamRunConfig{Seed: runSeed(t), DatabaseURL: srv.URL(), Schema: schema, Admin: admin,
			Duration: 3 * time.Second, RestartPostgres: restart, Logger: verboseLogger()}
		if full {
			cfg.Clients, cfg.Streams, cfg.Duration = 10, 5, 3*time.Minute
		}
		run := checkStreamRun(t, cfg)
		if run.Faults["restart PostgreSQL (immediate)"] == 0 {
			t.Fatalf("seed %d: PostgreSQL was never restarted", cfg.Seed)
		}
		if n := run.AfterLastCrash(); n < crashMinAfter {
			t.Fatalf("seed %d: %d appends acknowledged after the last crash, want at least %d", cfg.Seed, n,
				crashMinAfter)
		}
	})

	t.Run("pipeline", func(t *testing.T) {
		admin, schema := pgtest.MigratedOn(t, srv.URL())
		restart := func(ctx context.Context) error {
			err := srv.RestartImmediate(ctx)
			admin.Reset()
			return err
		}
		// Two producers: every message goes through the one worker process, which handles fewer a second than
		// three producers save on this machine; the drain after the run stays short.
		cfg := histories.PipelineRunConfig{Seed: runSeed(t), DatabaseURL: srv.URL(), Schema: schema, Admin: admin,
			Producers: 2, Keys: 4, Duration: 4 * time.Second, RestartPostgres: restart,
			WorkerCommand: []string{os.Args[0], "-test.run=^$"}, Logger: verboseLogger()}
		if full {
			// Unpaced, three producers saved 137-157 saves a second (about 300 messages) for 3 minutes, the one
			// worker process handled 18-176 a second, and the backlog did not drain in 4 minutes: a producer pauses
			// 40 ms after each save.
			cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 3, 12, 4, 3*time.Minute
			cfg.DrainTimeout, cfg.SaveEvery = 4*time.Minute, 40*time.Millisecond
		}
		run := checkPipelineRun(t, cfg)
		if run.Faults["restart PostgreSQL (immediate)"] == 0 {
			t.Fatalf("seed %d: PostgreSQL was never restarted", cfg.Seed)
		}
		checkWorkerKills(t, cfg.Seed, run)
	})
}

// checkWorkerKills checks that a pipeline run with worker processes killed one, that the killed ones had handled
// messages, and that the run saved and handled after its last crash.
func checkWorkerKills(t *testing.T, seed uint64, run histories.PipelineRun) {
	t.Helper()
	if run.Worker == nil || run.Worker.Kills == 0 {
		t.Fatalf("seed %d: the worker process was never killed", seed)
	}
	if run.Worker.Effects == 0 {
		t.Fatalf("seed %d: the worker processes handled nothing: their kills tested nothing", seed)
	}
	if saves, effects := run.AfterLastCrash(); saves < crashMinAfter || effects < crashMinAfter {
		t.Fatalf("seed %d: %d saves acknowledged and %d effects committed after the last crash, want at least "+
			"%d of each", seed, saves, effects, crashMinAfter)
	}
}
