package histories_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
)

// EnvSize picks the size of TestStreamsUnderNetworkFaults: unset or "ci" for the CI size, "full" for the long run.
// STAGEHAND_HISTORIES_SEED replays one seed (the default is a new seed each run, printed in the test log).
const (
	envSize = "STAGEHAND_HISTORIES"
	envSeed = "STAGEHAND_HISTORIES_SEED"
)

// TestStreamsUnderNetworkFaults runs clients appending to and loading streams through eventstore on pools behind
// the fault proxy while the nemesis injects network faults (the COMMIT's reply dropped among them) and terminates
// server processes, records the history, and checks every stream is linearizable with indeterminate appends as
// possibly applied. It logs the seed, the faults and how the store classified the appends; a failure prints the
// shortest failing prefix of the bad stream's history and the path of its rendering.
func TestStreamsUnderNetworkFaults(t *testing.T) {
	pgtest.CheckLeaks(t)
	admin, schema := pgtest.Migrated(t)
	cfg := histories.StreamRunConfig{Seed: runSeed(t), DatabaseURL: pgtest.URL(t), Schema: schema, Admin: admin,
		Duration: 6 * time.Second, Logger: verboseLogger()}
	if os.Getenv(envSize) == "full" {
		cfg.Clients, cfg.Streams, cfg.Duration = 10, 5, 3*time.Minute
	}
	checkStreamRun(t, cfg)
}

// checkStreamRun runs cfg and checks its history: every kind of fault injected, every stream linearizable, at
// least one commit reply lost and resolved, none reported as failed. It returns the run.
func checkStreamRun(t *testing.T, cfg histories.StreamRunConfig) histories.StreamRun {
	t.Helper()
	seed := cfg.Seed
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+2*time.Minute)
	defer cancel()
	run, err := histories.RunStreams(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", run.Summary())
	if len(run.Missing) > 0 {
		t.Fatalf("seed %d: the run ended before the nemesis injected %v", seed, run.Missing)
	}
	rep, err := histories.CheckStreams(run.History, histories.StreamCheckOptions{Seed: seed,
		VisualizationDir: os.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Streams {
		t.Logf("stream %s: %d operations, %s", s.Stream, s.Ops, s.Result)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	// The run must have exercised what it is for: commits whose reply was lost, resolved by the store.
	if run.Proxy.CommitReplies == 0 || run.Classified["commit reply dropped -> ok"]+
		run.Classified["commit reply dropped -> info"] == 0 {
		t.Fatalf("no append lost its commit's reply (seed %d): the run tested nothing of commit resolution", seed)
	}
	if run.Classified["commit reply dropped -> fail"]+run.Classified["commit reply dropped -> conflict"] != 0 {
		t.Fatalf("an append whose commit's reply was dropped after the server committed was reported as failed "+
			"(seed %d)", seed)
	}
	return run
}
