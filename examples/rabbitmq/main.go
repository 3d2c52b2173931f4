// Command rabbitmq shows stagehand's outbox and inbox on RabbitMQ, through Watermill's AMQP Pub/Sub
// (watermill-amqp): shopping carts are event-sourced on PostgreSQL, each item added stages a message in the
// outbox in the same transaction, a relay publishes them to RabbitMQ with publisher confirms, and consumers behind
// the inbox apply each one once, in each cart's order, with several consumers on every queue.
//
//	go run ./examples/rabbitmq                       # a throwaway PostgreSQL and RabbitMQ node, no setup
//	go run ./examples/rabbitmq -amqp-url "$AMQP_URL" # or your broker (and -database-url, or DATABASE_URL)
//	go run ./examples/rabbitmq -single-active=false  # consumers in turn: handlers see carts' items out of order
//	go run ./examples/rabbitmq -prefetch 10          # so they do when a failed message comes back after later ones
//
// See broker.go for the queue settings that carry each key's order to the handler.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

type config struct {
	databaseURL, amqpURL, schema string
	carts, items                 int     // items added to each cart, one save each
	partitions                   int     // queues, each key's messages on one of them
	consumers                    int     // consumers on every queue (as if in that many processes)
	nackRate                     float64 // deliveries nacked after the inbox committed, so they come again
	failRate                     float64 // deliveries failed before the inbox committed: delivered again
	queues                       queueOptions
	timeout                      time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default: $DATABASE_URL, else a throwaway cluster)")
	flag.StringVar(&cfg.amqpURL, "amqp-url", os.Getenv("AMQP_URL"),
		"RabbitMQ URL (default: $AMQP_URL, else a throwaway node from the local rabbitmq-server)")
	flag.StringVar(&cfg.schema, "schema", "rabbitmq_example", "schema for the example's tables")
	flag.IntVar(&cfg.carts, "carts", 20, "carts")
	flag.IntVar(&cfg.items, "items", 25, "items added to each cart")
	flag.IntVar(&cfg.partitions, "partitions", 4, "queues (each cart's messages on one)")
	flag.IntVar(&cfg.consumers, "consumers", 2, "consumers on every queue")
	flag.Float64Var(&cfg.nackRate, "nacks", 0.05, "fraction of deliveries nacked after the inbox committed")
	flag.Float64Var(&cfg.failRate, "failures", 0.05, "fraction of deliveries failed before the inbox committed")
	flag.BoolVar(&cfg.queues.singleActive, "single-active", true,
		"queues with a single active consumer (false: consumers in turn, and per-cart order is lost)")
	flag.IntVar(&cfg.queues.prefetch, "prefetch", 1, "unacknowledged messages per consumer (above 1: order is lost)")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "wait for every message to be handled")
	flag.Parse()
	if _, err := run(context.Background(), os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq:", err)
		os.Exit(1)
	}
}

// summary is what a run counted.
type summary struct {
	staged, handled, deliveries, failed, nacked, appliedTwice, orderViolations int64
}

func run(ctx context.Context, out io.Writer, cfg config) (*summary, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dbURL := cfg.databaseURL
	if dbURL == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (set DATABASE_URL or -database-url to use yours)...")
		srv, err := stagehandtest.Start(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = srv.Stop() }()
		dbURL = srv.URL()
	}
	amqpURL := cfg.amqpURL
	if amqpURL == "" {
		fmt.Fprintln(out, "starting a throwaway RabbitMQ node (set AMQP_URL or -amqp-url to use yours)...")
		node, err := startRabbitMQ(ctx)
		if err != nil {
			return nil, err
		}
		defer node.stop()
		amqpURL = node.URL()
	}
	opts := cfg.queues
	if err := declareTopology(amqpURL, cfg.partitions, opts); err != nil {
		return nil, err
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: cfg.schema}); err != nil {
		return nil, err
	}
	lines := pgx.Identifier{cfg.schema, "cart_lines"}.Sanitize()
	// applied numbers the lines in the order the handlers applied them; no unique key on the message, so a
	// message applied twice would show as two rows.
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+lines+`; CREATE TABLE `+lines+` (applied bigserial,
		cart_id text NOT NULL, item int NOT NULL, message_id text NOT NULL)`); err != nil {
		return nil, fmt.Errorf("cart_lines: %w", err)
	}

	// The producing side: carts saved with the Transactional strategy, each item added staging its message.
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.schema})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: cfg.schema})
	if err != nil {
		return nil, err
	}
	defer ob.Close()
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "shop.cart", NewCart)
	_ = aggregate.RegisterEvent[ItemAdded](reg, "shop.cart.item-added")
	mapping := staging.NewMapping(reg)
	_ = staging.Map(mapping, "cart-items.v1", func(src eventstore.Record, e ItemAdded) ([]staging.Message, error) {
		payload, err := json.Marshal(ItemAddedMessage{CartID: src.StreamID, Item: e.N})
		return []staging.Message{{Topic: topicFor(src.StreamID, cfg.partitions), Type: "shop.v1.ItemAdded",
			Payload: payload}}, err // partition key: the cart (the stream ID, the default)
	})
	if err := errors.Join(reg.Err(), mapping.Err()); err != nil {
		return nil, err
	}
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob,
		Mapping: mapping})
	if err != nil {
		return nil, err
	}
	repo, err := aggregate.NewRepository[*Cart](store, reg, &aggregate.RepositoryConfig{Stager: stager})
	if err != nil {
		return nil, err
	}

	wlog := watermill.NopLogger{}
	var wg sync.WaitGroup
	defer wg.Wait()
	runRouter := func(r *message.Router) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(ctx)
		}()
		<-r.Running()
	}

	// The consumers: on every queue, cfg.consumers subscribers (each its own connection, as separate processes
	// would be), all behind the inbox. With a single active consumer per queue one of them receives at a time.
	inbox, err := ob.NewInbox(nil)
	if err != nil {
		return nil, err
	}
	var sum summary
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	chance := func(rate float64) bool {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.Float64() < rate
	}
	apply := inbox.Handler("cart-lines", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		if chance(cfg.failRate) { // rolled back: the broker delivers it again, and the inbox applies it then
			atomic.AddInt64(&sum.failed, 1)
			return errors.New("failed on purpose before the inbox committed")
		}
		var m ItemAddedMessage
		if err := json.Unmarshal(msg.Payload, &m); err != nil {
			return outbox.Permanent(fmt.Errorf("decode %s: %w", msg.UUID, err))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+lines+` (cart_id, item, message_id) VALUES ($1, $2, $3)`,
			m.CartID, m.Item, msg.UUID)
		return err
	})
	handle := func(msg *message.Message) error {
		atomic.AddInt64(&sum.deliveries, 1)
		if err := apply(msg); err != nil {
			return err
		}
		select {
		case <-msg.Nacked(): // the inbox retries it (after its RetryDelay): nothing was committed
			return nil
		default:
		}
		if chance(cfg.nackRate) { // as if the acknowledgement were lost: the broker delivers it again, the inbox skips it
			atomic.AddInt64(&sum.nacked, 1)
			return errors.New("nacked on purpose after the inbox committed")
		}
		return nil
	}
	for c := range cfg.consumers {
		sub, err := wamqp.NewSubscriber(amqpConfig(amqpURL, opts), wlog)
		if err != nil {
			return nil, fmt.Errorf("subscriber: %w", err)
		}
		defer sub.Close()
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
		if err != nil {
			return nil, err
		}
		for p := range cfg.partitions {
			topic := exchange + ".p" + strconv.Itoa(p)
			router.AddConsumerHandler(fmt.Sprintf("cart-lines-%d-%d", c, p), topic, sub, handle)
		}
		runRouter(router)
	}

	// The relay: the outbox as a Watermill subscriber, forwarded by a router to watermill-amqp's publisher.
	rc := outbox.HighThroughput()
	rc.IsBrokerUnavailable = brokerUnavailable // an outage costs no attempt
	relay, err := ob.NewRelay(rc)
	if err != nil {
		return nil, err
	}
	defer relay.Close()
	pub, err := wamqp.NewPublisher(amqpConfig(amqpURL, opts), wlog)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	relayRouter, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	relay.AddToRouter(relayRouter, pub, nil)
	runRouter(relayRouter)

	// Add the items: a save per item, carts in parallel.
	fmt.Fprintf(out, "adding %d items to each of %d carts; relay -> RabbitMQ (%d queues, %d consumers each, %s)\n",
		cfg.items, cfg.carts, cfg.partitions, cfg.consumers, opts)
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for c := range cfg.carts {
		id := fmt.Sprintf("cart-%03d", c)
		g.Go(func() error {
			add := func(cart *Cart) error { cart.Add(); return nil }
			if _, err := repo.Create(gctx, id, add); err != nil {
				return fmt.Errorf("create %s: %w", id, err)
			}
			for range cfg.items - 1 {
				if _, err := repo.Update(gctx, id, add); err != nil {
					return fmt.Errorf("add to %s: %w", id, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	sum.staged = int64(cfg.carts * cfg.items)

	// Wait until every message was handled, then look at what the handlers did.
	deadline := time.Now().Add(cfg.timeout)
	for {
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM `+lines).Scan(&sum.handled); err != nil {
			return nil, fmt.Errorf("count: %w", err)
		}
		if sum.handled >= sum.staged {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d messages handled after %s", sum.handled, sum.staged, cfg.timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	handledIn := time.Since(began)
	if err := pool.QueryRow(ctx, `SELECT count(*) - count(DISTINCT message_id) FROM `+lines).
		Scan(&sum.appliedTwice); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	// Order at the handler: within a cart, items must have been applied in the order they were added.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT item, lag(item) OVER (PARTITION BY cart_id
		ORDER BY applied) AS before FROM (SELECT DISTINCT ON (message_id) * FROM `+lines+`
		ORDER BY message_id, applied) first) l WHERE item < before`).Scan(&sum.orderViolations); err != nil {
		return nil, fmt.Errorf("order: %w", err)
	}
	fmt.Fprintf(out, "staged %d messages; every one handled %.1fs after the first save\n", sum.staged,
		handledIn.Seconds())
	fmt.Fprintf(out, "handled: %d unique messages (%d deliveries; %d failed on purpose before the commit and "+
		"delivered again; %d nacked on purpose after it, delivered again and skipped by the inbox)\n", sum.handled,
		sum.deliveries, sum.failed, sum.nacked)
	fmt.Fprintf(out, "effects applied twice: %d\n", sum.appliedTwice)
	fmt.Fprintf(out, "per-cart order violations at the handler: %d\n", sum.orderViolations)
	switch {
	case sum.appliedTwice != 0:
		return &sum, fmt.Errorf("%d effects applied twice", sum.appliedTwice)
	case sum.orderViolations != 0 && opts == ordered():
		return &sum, fmt.Errorf("%d items applied out of their cart's order", sum.orderViolations)
	}
	return &sum, nil
}

func (o queueOptions) String() string {
	if o.singleActive {
		return fmt.Sprintf("single active consumer, prefetch %d", o.prefetch)
	}
	return fmt.Sprintf("consumers in turn (no single active consumer), prefetch %d", o.prefetch)
}

// Cart is the aggregate: its n-th event is ItemAdded{N: n}.
type Cart struct {
	aggregate.Root
	Items int
}

// ItemAdded is a cart's n-th item.
type ItemAdded struct {
	N int `json:"n"`
}

// ItemAddedMessage is the integration message of each item added.
type ItemAddedMessage struct {
	CartID string `json:"cart_id"`
	Item   int    `json:"item"`
}

// NewCart is the registered constructor.
func NewCart(id string) *Cart { return &Cart{Root: aggregate.NewRoot(id)} }

// Add raises the next item.
func (c *Cart) Add() { aggregate.Raise(c, ItemAdded{N: c.Items + 1}) }

// Apply implements aggregate.Aggregate.
func (c *Cart) Apply(e any) {
	if e, ok := e.(ItemAdded); ok {
		c.Items = e.N
	}
}
