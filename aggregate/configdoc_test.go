package aggregate

import (
	"reflect"
	"testing"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

type docAccount struct{ Root }

func (*docAccount) Apply(any) {}

// The README's RepositoryConfig table has a row for every field, with the default NewRepository applies.
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	reg := NewRegistry(nil)
	if err := RegisterAggregate(reg, "doc.account", func(id string) *docAccount {
		return &docAccount{Root: NewRoot(id)}
	}); err != nil {
		t.Fatal(err)
	}
	repo, err := NewRepository[*docAccount](eventstore.NewMemory(nil), reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := repo.cfg
	tbl := doctable.Find(t, "../README.md", "### `aggregate.RepositoryConfig`")
	doctable.Check(t, tbl, reflect.TypeFor[RepositoryConfig](), "", map[string]any{
		"SnapshotEvery": c.SnapshotEvery, "SnapshotSchemaVersion": c.SnapshotSchemaVersion,
		"UpdateRetries": c.UpdateRetries,
	})
}
