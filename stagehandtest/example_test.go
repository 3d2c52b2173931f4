package stagehandtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/stagehandtest"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// A program (or an Example) gets the shared throwaway server, migrates a schema of its own and uses the store.
func Example() {
	ctx := context.Background()
	url, err := stagehandtest.SharedURL(ctx) // DATABASE_URL, else a throwaway cluster stopped by Main
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	const schema = "stagehandtest_example"
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		fmt.Println(err)
		return
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	res, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "acc-1", StreamType: "bank.account",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "opened", Payload: []byte(`{}`)}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acc-1 at version", res.Version)
	// Output: acc-1 at version 1
}

// Each test gets a clean, migrated schema of its own, dropped when it ends.
func TestMigratedSchemasAreCleanAndSeparate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, a := stagehandtest.Migrated(t)
	_, b := stagehandtest.Migrated(t)
	if a == b {
		t.Fatalf("two tests share schema %q", a)
	}
	for _, schema := range []string{a, b} {
		store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		head, err := store.HeadPosition(ctx)
		if err != nil || head != 0 {
			t.Fatalf("schema %s: head %d, %v: want a clean, migrated schema", schema, head, err)
		}
		if _, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "s", StreamType: "t",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}}); err != nil {
			t.Fatalf("schema %s: %v", schema, err)
		}
		store.Close()
	}
	name := stagehandtest.SchemaName(t)
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: name}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`,
		name).Scan(&n); err != nil || n != 1 {
		t.Fatalf("SchemaName's schema was not created by Migrate: %d, %v", n, err)
	}
}
