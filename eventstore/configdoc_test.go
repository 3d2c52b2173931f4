package eventstore

import (
	"reflect"
	"testing"

	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's PostgresConfig table has a row for every field, with the default withDefaults applies.
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	c, err := (*PostgresConfig)(nil).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	tbl := doctable.Find(t, "../README.md", "### `eventstore.PostgresConfig`")
	doctable.Check(t, tbl, reflect.TypeFor[PostgresConfig](), "", map[string]any{
		"Schema": c.Schema, "DisableNotify": c.DisableNotify, "MaxGapWait": c.MaxGapWait,
	})
}

// The README's PartitionConfig table has a row for every field, with the default withDefaults applies.
func TestREADMEPartitionConfigTable(t *testing.T) {
	t.Parallel()
	c, err := (*PartitionConfig)(nil).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	tbl := doctable.Find(t, "../README.md", "### `eventstore.PartitionConfig`")
	doctable.Check(t, tbl, reflect.TypeFor[PartitionConfig](), "", map[string]any{
		"Schema": c.Schema, "Ahead": c.Ahead, "Headroom": c.Headroom, "LockTimeout": c.LockTimeout,
	})
}
