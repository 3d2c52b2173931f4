package eventstore

import (
	"reflect"
	"testing"

	"github.com/stagehand-es/stagehand/internal/doctable"
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
