package staging

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's staging table has a row for every field of Config and WorkerConfig, with the default the code
// applies (the worker passes its batch and polling settings to the log follower unchanged).
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	var zero Config
	tbl := doctable.Find(t, "../README.md", "### `staging.Config` and `staging.WorkerConfig`")
	doctable.Check(t, tbl, reflect.TypeFor[Config](), "Config.", map[string]any{
		"Strategy":       zero.Strategy,
		"ReconcilerName": strings.TrimPrefix(workerName("reconciler", zero.ReconcilerName), "reconciler:"),
	})
	doctable.Check(t, tbl, reflect.TypeFor[WorkerConfig](), "WorkerConfig.", map[string]any{
		"Name":          strings.TrimPrefix(workerName("stager", ""), "stager:"),
		"BatchSize":     logfollow.DefaultBatchSize,
		"PollInterval":  logfollow.DefaultPollInterval,
		"MaxAttempts":   logfollow.DefaultMaxAttempts,
		"RetryDelay":    logfollow.DefaultRetryDelay,
		"MaxRetryDelay": logfollow.DefaultMaxRetryDelay,
	})
}
