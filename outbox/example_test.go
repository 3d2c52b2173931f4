package outbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
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

// Stage a message in the business transaction, and relay it to a broker (here Watermill's gochannel; in
// production Kafka, NATS, AMQP or watermill-sql) through a Watermill router.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()

	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer ob.Close()

	// The business transaction: the order and its message commit together, or neither does.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ...
		_, err := ob.StageTx(ctx, tx, outbox.Message{
			ID:           "order-42-placed",
			Topic:        "orders",
			Type:         "orders.OrderPlaced",
			Payload:      []byte(`{"order_id":"42","amount":1999}`),
			PartitionKey: "order-42", // messages of one order reach the broker in commit order
		})
		return err
	})
	if err != nil {
		panic(err)
	}
	ob.Notify() // wake the relays now rather than at their next poll

	broker := gochannel.NewGoChannel(gochannel.Config{}, nil)
	received, err := broker.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}

	relay, err := ob.NewRelay(outbox.Balanced())
	if err != nil {
		panic(err)
	}
	defer relay.Close()
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		panic(err)
	}
	relay.AddToRouter(router, broker, nil)
	go func() { _ = router.Run(ctx) }()
	defer router.Close()

	msg := <-received
	msg.Ack()
	fmt.Println(msg.UUID, msg.Metadata.Get(stagehand.HeaderMessageType), string(msg.Payload))
	// Output: order-42-placed orders.OrderPlaced {"order_id":"42","amount":1999}
}

// An idempotent consumer: the handler's writes and the messages it produces share the inbox transaction, so a
// redelivered message changes nothing.
func ExampleInbox_Handler() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer ob.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "shipments"}.Sanitize()+
		" (order_id text PRIMARY KEY)"); err != nil {
		panic(err)
	}

	type OrderPlaced struct {
		OrderID string `json:"order_id"`
	}
	handlers := outbox.NewHandlers(nil, false) // JSON payloads; unknown types are dead-lettered
	outbox.Handle(handlers, "orders.OrderPlaced", func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message, e OrderPlaced) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "shipments"}.Sanitize()+" VALUES ($1)",
			e.OrderID); err != nil {
			return err
		}
		// Staged in the same transaction, with causation = the incoming message.
		return out.Publish("shipping", message.NewMessage("ship-"+e.OrderID, nil))
	})
	inbox, err := ob.NewInbox(nil)
	if err != nil {
		panic(err)
	}
	handle := inbox.Handler("shipping", handlers.Func()) // router.AddConsumerHandler("shipping", "orders", sub, handle)

	for range 3 { // the broker delivers the same message three times
		msg := message.NewMessage("order-42-placed", []byte(`{"order_id":"42"}`))
		msg.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderPlaced")
		if err := handle(msg); err != nil {
			panic(err)
		}
	}
	var shipments, staged int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "shipments"}.Sanitize()).Scan(&shipments)
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()).Scan(&staged)
	fmt.Println("shipments:", shipments, "staged:", staged)
	// Output: shipments: 1 staged: 1
}

// Serverless: no background loop; a timer trigger drains what is due and returns.
func ExampleRelay_Drain() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer ob.Close()
	for i := range 3 {
		if _, err := ob.Stage(ctx, outbox.Message{ID: fmt.Sprint("m", i), Topic: "t"}); err != nil {
			panic(err)
		}
	}

	relay, err := ob.NewRelay(&outbox.RelayConfig{BatchSize: 50, MaxRetryCount: outbox.Retries(3)})
	if err != nil {
		panic(err)
	}
	defer relay.Close()
	res, err := relay.Drain(ctx, gochannel.NewGoChannel(gochannel.Config{}, nil))
	fmt.Printf("%+v %v\n", res, err)
	// Output: {Published:3 Failed:0 DeadLettered:0 Unreachable:0} <nil>
}

// Operations: statistics, dead letters and cleanup, estate-wide (AllTenants) or for one tenant.
func ExampleOutbox_AllTenants() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer ob.Close()
	_, _ = ob.Stage(stagehand.WithTenant(ctx, "acme"), outbox.Message{ID: "a", Topic: "t"})
	_, _ = ob.Stage(ctx, outbox.Message{ID: "b", Topic: "t", ScheduledAt: time.Now().Add(time.Hour)})

	all, _ := ob.AllTenants().Stats(ctx)
	acme, _ := ob.Tenant("acme").Stats(ctx)
	fmt.Println("pending:", all.Pending, "scheduled:", all.Scheduled, "acme pending:", acme.Pending)

	dead, _ := ob.AllTenants().DeadLetters(ctx, outbox.ListOptions{Limit: 20})
	fmt.Println("dead letters:", len(dead))
	removed, _ := ob.AllTenants().CleanupSent(ctx, 7*24*time.Hour, 1000)
	fmt.Println("cleaned:", removed)
	// Output:
	// pending: 1 scheduled: 1 acme pending: 1
	// dead letters: 0
	// cleaned: 0
}
