package health

import (
	"reflect"
	"testing"

	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's health.Config table has a row for every field, with the default withDefaults applies.
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	c, err := (*Config)(nil).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	tbl := doctable.Find(t, "../README.md", "### `health.Config`")
	doctable.Check(t, tbl, reflect.TypeFor[Config](), "", map[string]any{
		"DegradedInactivity": c.DegradedInactivity, "UnhealthyInactivity": c.UnhealthyInactivity,
		"DegradedFailureRate": c.DegradedFailureRate, "UnhealthyFailureRate": c.UnhealthyFailureRate,
		"FailureWindow": c.FailureWindow, "MinDeliveries": c.MinDeliveries, "DeadLetters": c.DeadLetters,
		"Timeout": c.Timeout,
	})
}
