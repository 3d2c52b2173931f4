package histories_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
)

// envDuration overrides a pipeline run's duration ("90s").
const envDuration = "STAGEHAND_HISTORIES_DURATION"

// runSeed returns the seed of a run: STAGEHAND_HISTORIES_SEED, or a new one.
func runSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, v, err)
		}
		seed = s
	}
	t.Logf("seed %d (replay with %s=%d)", seed, envSeed, seed)
	return seed
}

func verboseLogger() *slog.Logger {
	if os.Getenv("STAGEHAND_HISTORIES_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return nil
}

// TestPipelineUnderNetworkFaults runs the pipeline (saves with Transactional staging, a relay, handlers behind the
// inbox doing LoadTx and UpsertTx, a projection and its reader) with every component's connections behind the
// fault proxy while the nemesis injects network faults and terminates server processes, records the history and
// checks it: every acknowledged save's messages handled exactly once in effect, none of a failed save, per-key
// order at the handler, each handler's LoadTx seeing its cause, and every projection read the fold of a prefix of
// the committed log. A failure prints the seed and the operations of each violation.
// fullSaveEvery paces the producers of the full-size pipeline runs with the handlers in the test process: unpaced,
// six producers on a quiet machine staged about 346 messages a second for 3 minutes, the handlers (one per
// partition, each key's messages one at a time) handled 232 a second, and the backlog did not drain in the 2
// minutes after (seed 1796528938800201069).
const fullSaveEvery = 100 * time.Millisecond

func TestPipelineUnderNetworkFaults(t *testing.T) {
	pgtest.CheckLeaks(t)
	admin, schema := pgtest.Migrated(t)
	seed := runSeed(t)
	cfg := histories.PipelineRunConfig{Seed: seed, DatabaseURL: pgtest.URL(t), Schema: schema, Admin: admin,
		Duration: 5 * time.Second, Logger: verboseLogger()}
	if os.Getenv(envSize) == "full" {
		cfg.Producers, cfg.Keys, cfg.Partitions, cfg.Duration = 6, 24, 4, 3*time.Minute
		cfg.SaveEvery = fullSaveEvery
	}
	if d, err := time.ParseDuration(os.Getenv(envDuration)); err == nil {
		cfg.Duration = d
	}
	checkPipelineRun(t, cfg)
}

// checkPipelineRun runs cfg and checks its history with every pipeline checker; the run must have injected every
// kind of fault it was told to, drained, lost a save's commit reply, and saved, handled and read something. It
// returns the run.
func checkPipelineRun(t *testing.T, cfg histories.PipelineRunConfig) histories.PipelineRun {
	t.Helper()
	var logs *ringLog
	if cfg.Logger == nil {
		logs = &ringLog{max: 300}
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	defer func() {
		if t.Failed() && logs != nil {
			t.Logf("the components' last warnings:\n%s", logs)
		}
	}()
	seed := cfg.Seed
	budget := cfg.Duration + max(cfg.DrainTimeout, 2*time.Minute) + 3*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	run, err := histories.RunPipeline(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", run.Summary())
	if len(run.Missing) > 0 {
		t.Fatalf("seed %d: the run ended before the nemesis injected %v", seed, run.Missing)
	}
	if err := run.Check(seed); err != nil {
		t.Fatal(err)
	}
	if !run.Drained {
		t.Fatalf("seed %d: the pipeline did not drain within the timeout", seed)
	}
	if run.SaveDrops() == 0 {
		t.Fatalf("seed %d: no save lost its commit's reply: the run tested nothing of commit resolution", seed)
	}
	c := histories.Counts(run.History)
	if c["save/ok"] == 0 || c["effect/ok"] == 0 || c["projection-read/ok"] == 0 {
		t.Fatalf("seed %d: the run did too little to check anything: %s", seed, histories.FormatCounts(run.History))
	}
	return run
}

// ringLog keeps the last max lines written to it.
type ringLog struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (r *ringLog) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, strings.TrimRight(string(p), "\n"))
	if len(r.lines) > r.max {
		r.lines = r.lines[len(r.lines)-r.max:]
	}
	return len(p), nil
}

func (r *ringLog) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}
