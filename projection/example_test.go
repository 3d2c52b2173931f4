package projection_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// exampleDB opens a pool on a fresh, migrated schema (in your code: pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
// and stagehand.Migrate once at deployment).
func exampleDB(ctx context.Context) (*pgxpool.Pool, string, func()) {
	url, err := pgtest.SharedURL(ctx)
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		panic(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
}

// appendEvent encodes an event with the registry and appends it (in an application: repo.Save).
func appendEvent(ctx context.Context, store eventstore.Store, reg *aggregate.Registry, id string,
	expected eventstore.ExpectedVersion, event any) {
	name, version, payload, err := reg.Encode(event)
	if err != nil {
		panic(err)
	}
	if _, err := store.Append(ctx, eventstore.AppendRequest{StreamID: id, StreamType: "account",
		Expected: expected, Events: []eventstore.EventData{{Type: name, TypeVersion: version,
			Payload: payload}}}); err != nil {
		panic(err)
	}
}

// A balance read model: typed handlers on a Mux, the read model written in the projection's transaction (so
// each event is applied exactly once), a reset hook for rebuilds, and status read back from the database.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	store, _ := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	defer store.Close()
	balances := pgx.Identifier{schema, "balances"}.Sanitize()
	_, _ = pool.Exec(ctx, "CREATE TABLE "+balances+" (id text PRIMARY KEY, owner text, balance bigint)")

	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterEvent[Opened](reg, "account.opened")
	_ = aggregate.RegisterEvent[Deposited](reg, "account.deposited")
	_ = aggregate.RegisterEvent[Withdrawn](reg, "account.withdrawn")

	mux := projection.NewMux(reg)
	_ = projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Opened) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+balances+" VALUES ($1, $2, 0)", e.StreamID, d.Owner)
		return err
	})
	_ = projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Deposited) error {
		_, err := tx.Exec(ctx, "UPDATE "+balances+" SET balance = balance + $2 WHERE id = $1", e.StreamID, d.Amount)
		return err
	})
	_ = projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Withdrawn) error {
		_, err := tx.Exec(ctx, "UPDATE "+balances+" SET balance = balance - $2 WHERE id = $1", e.StreamID, d.Amount)
		return err
	})
	mux.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "TRUNCATE "+balances)
		return err
	})

	p, err := projection.New(pool, store, mux, &projection.Config{Name: "balances", Schema: schema,
		StreamTypes: []string{"account"}})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()

	appendEvent(ctx, store, reg, "acct-1", eventstore.NoStream, Opened{Owner: "ann"})
	appendEvent(ctx, store, reg, "acct-1", 1, Deposited{Amount: 100})
	appendEvent(ctx, store, reg, "acct-1", 2, Withdrawn{Amount: 30})

	for { // wait until caught up (a health check would read the same status)
		st, _ := projection.ListStatus(ctx, pool, store, schema)
		if len(st) == 1 && st[0].Position == 3 {
			fmt.Println("projection:", st[0].Projection, "state:", st[0].State, "lag:", st[0].Lag)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var owner string
	var balance int64
	_ = pool.QueryRow(ctx, "SELECT owner, balance FROM "+balances+" WHERE id = 'acct-1'").Scan(&owner, &balance)
	fmt.Println(owner, balance)
	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// projection: balances state: running lag: 0
	// ann 70
	// stopped: <nil>
}

// The global log as a Watermill subscriber: a router handler receives the account events in order; the consumer
// group's checkpoint advances as messages are acked, so a restarted router resumes where it stopped.
func ExampleSubscriber() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	store, _ := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	defer store.Close()
	reg := registry()
	appendEvent(ctx, store, reg, "acct-1", eventstore.NoStream, Opened{Owner: "ann"})
	appendEvent(ctx, store, reg, "acct-1", 1, Deposited{Amount: 100})

	sub, err := projection.NewSubscriber(pool, store, &projection.SubscriberConfig{ConsumerGroup: "emails",
		Schema: schema})
	if err != nil {
		panic(err)
	}
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	got := make(chan string, 2)
	router.AddConsumerHandler("emails", projection.Topic(projection.Filter{StreamTypes: []string{"account"}}),
		sub, func(msg *message.Message) error {
			got <- msg.Metadata.Get(projection.HeaderPosition) + " " + msg.Metadata.Get(stagehand.HeaderEventType) +
				" " + string(msg.Payload)
			return nil
		})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	fmt.Println(<-got)
	fmt.Println(<-got)
	_ = router.Close()
	_ = sub.Close()
	// Output:
	// 1 account.opened {"Owner": "ann"}
	// 2 account.deposited {"Amount": 100}
}
