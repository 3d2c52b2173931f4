package projection

import (
	"reflect"
	"testing"

	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's Config table has a row for every field, with the default the projection applies (withDefaults,
// then the log follower for the fields it passes through unchanged).
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	c, err := (&Config{Name: "doc"}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	tbl := doctable.Find(t, "README.md", "| field | default | validation / meaning |")
	doctable.Check(t, tbl, reflect.TypeFor[Config](), "", map[string]any{
		"Schema": c.Schema, "Partitions": c.Partitions, "OnFailure": c.OnFailure, "DisableListen": c.DisableListen,
		"BatchSize": logfollow.DefaultBatchSize, "PagesPerTx": logfollow.DefaultPagesPerTx, "PollInterval": logfollow.DefaultPollInterval,
		"MaxAttempts": logfollow.DefaultMaxAttempts, "RetryDelay": logfollow.DefaultRetryDelay, "MaxRetryDelay": logfollow.DefaultMaxRetryDelay,
	})
}
