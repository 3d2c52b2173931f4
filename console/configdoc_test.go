package console

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's console.Config table has a row for every field, with the defaults withDefaults applies.
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://doc@127.0.0.1:1/doc") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := (&Config{Pool: pool}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	doctable.Check(t, doctable.Find(t, "README.md", "`console.Config` (`Pool` required"), reflect.TypeFor[Config](), "",
		map[string]any{"Schema": c.Schema, "Actions": c.Actions, "AuthenticateReads": c.AuthenticateReads,
			"Challenge": c.Challenge, "Prefix": c.Prefix, "Title": c.Title, "PageSize": c.PageSize,
			"MaxPayload": c.MaxPayload, "SampleInterval": c.SampleInterval, "History": c.History})
}
