package stagehandtest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
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

// In a test, WaitIdle(t, pool, schema, cfg) waits until what the test did has gone through the service: the
// projections have applied every event appended so far, the relay has sent every message staged so far and the
// named inbox handlers have handled them. Idle is the same wait for code without a testing.TB.
func ExampleIdle() {
	ctx := context.Background()
	url, err := stagehandtest.SharedURL(ctx)
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
	const schema = "stagehandtest_example_idle"
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".loans_view (id text PRIMARY KEY)"); err != nil {
		fmt.Println(err)
		return
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ob.Close()

	// The service: a projection writing a read model, and a consumer behind the inbox.
	view := projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".loans_view VALUES ($1)", e.StreamID)
		return err
	})
	loans, err := projection.New(pool, store, view, &projection.Config{Name: "loans", Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	relay, err := ob.NewRelay(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Close()
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	relay.AddToRouter(router, broker, nil)
	inbox, err := ob.NewInbox(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	var notified atomic.Int64
	router.AddConsumerHandler("notify", "loans", broker, inbox.Handler("notify",
		func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
			notified.Add(1)
			return nil
		}))
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Add(2)
	go func() { defer wg.Done(); _ = loans.Run(runCtx) }()
	go func() { defer wg.Done(); _ = router.Run(runCtx) }()

	// What the test does: an event appended, and a message staged.
	if _, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "loan-1", StreamType: "loan",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "loan.opened", Payload: []byte(`{}`)}}},
	); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := ob.Stage(ctx, outbox.Message{ID: "loan-1-opened", Topic: "loans", Payload: []byte(`{}`)}); err != nil {
		fmt.Println(err)
		return
	}

	// Wait for it to go through: the projection is named, as it may not have started yet.
	err = stagehandtest.Idle(ctx, pool, schema, &stagehandtest.IdleConfig{Followers: []string{"loans"},
		Handlers: map[string][]string{"loans": {"notify"}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	var rows int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".loans_view").Scan(&rows)
	fmt.Println("read model rows:", rows, "notified:", notified.Load())
	// Output: read model rows: 1 notified: 1
}
