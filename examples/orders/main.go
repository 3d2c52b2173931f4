// Command orders is stagehand's flagship example: a small shop whose orders and payments are event-sourced on
// PostgreSQL, whose integration messages go through the transactional outbox to NATS JetStream, and whose
// consumers handle them effectively once behind the inbox, while a projection keeps a read model up to date.
//
//	checkout ─ Save ─▶ Order    orders repository    (-strategy, default auto → transactional) ─▶ OrderPlaced
//	         ─ Save ─▶ Payment  payments repository  (eventually-consistent, + Reconciler)     ─▶ PaymentCaptured
//	relay: outbox ─▶ NATS JetStream
//	billing    (inbox)  OrderPlaced      → invoice row; stages InvoiceIssued in the same transaction
//	warehouse  (inbox)  PaymentCaptured  → Order.Ship, UpdateTx through the shipping repository
//	                                       (deferred, + DeferredStager)                          ─▶ OrderShipped
//	notifier   (inbox)  InvoiceIssued, OrderShipped → notification rows
//	projection order-board: placed, paid, shipped → the order_board table
//
// After a warm-up (-warmup orders, left out of the figures), it places -orders orders, at most -rate a second and
// -concurrency at a time, waits until every message is handled and the projection has caught up, and prints what
// happened: events appended, messages staged, published and handled, duplicates the inbox suppressed, append →
// handled latency, projection lag.
//
//	go run ./examples/orders                                   # throwaway PostgreSQL and in-process NATS
//	go run ./examples/orders -rate 0 -orders 10000 -concurrency 32   # as fast as it goes
//	go run ./examples/orders -strategy deferred                # the orders repository's staging strategy
//	go run ./examples/orders -database-url "$URL" -nats-url nats://127.0.0.1:4222   # yours
//	go run ./examples/orders -console 127.0.0.1:8080           # and watch it in the operator console
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

type config struct {
	databaseURL string           // "": a throwaway PostgreSQL
	natsURL     string           // "": an in-process NATS server
	natsStore   string           // the in-process server's storage directory ("": a temporary one)
	schema      string           // schema of every table
	orders      int              // orders to place
	warmup      int              // orders placed and handled before anything is measured
	concurrency int              // checkouts at once
	rate        int              // orders per second at most (0: as fast as the checkouts go)
	strategy    staging.Strategy // of the orders repository
	duplicates  float64          // fraction of messages published twice on purpose
	timeout     time.Duration    // wait for everything to be handled after the last order
	console     string           // address to serve the operator console on ("": none)
	verbose     bool
}

func main() {
	cfg := config{strategy: staging.Auto}
	flag.StringVar(&cfg.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default: $DATABASE_URL, else a throwaway cluster)")
	flag.StringVar(&cfg.natsURL, "nats-url", os.Getenv("NATS_URL"),
		"NATS server with JetStream (default: $NATS_URL, else an in-process server)")
	flag.StringVar(&cfg.natsStore, "nats-store", "", "storage directory of the in-process NATS server "+
		"(default: a temporary directory, removed at the end)")
	flag.StringVar(&cfg.schema, "schema", "orders_example", "schema for every table of the example")
	flag.IntVar(&cfg.orders, "orders", 1000, "orders to place")
	flag.IntVar(&cfg.warmup, "warmup", 20, "orders placed and handled first, outside the figures (0: none)")
	flag.IntVar(&cfg.concurrency, "concurrency", 8, "checkouts running at once")
	flag.IntVar(&cfg.rate, "rate", 50, "orders per second at most (0: as fast as the checkouts go)")
	flag.Func("strategy", "staging strategy of the orders repository: auto, transactional, "+
		"eventually-consistent or deferred (default auto)", func(s string) error {
		st, err := staging.ParseStrategy(s)
		cfg.strategy = st
		return err
	})
	flag.Float64Var(&cfg.duplicates, "duplicates", 0.01,
		"fraction of messages the relay publishes twice, as a relay crash would, for the inbox to suppress (0-1)")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute,
		"how long to wait, after the last order, for every message to be handled")
	flag.StringVar(&cfg.console, "console", "", "serve the operator console (read-only) on this address, "+
		"127.0.0.1:8080 say, and keep serving after the summary until Ctrl-C (default: none)")
	flag.BoolVar(&cfg.verbose, "v", false, "log what the components do (to stderr)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, cfg)
	// With the console, Ctrl-C after the summary is how the demo ends.
	interrupted := ctx.Err() != nil && (err != nil || cfg.console == "")
	stop()
	if interrupted {
		fmt.Fprintln(os.Stderr, "orders: interrupted; everything was stopped")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.orders < 1:
		return errors.New("-orders must be at least 1")
	case c.warmup < 0:
		return errors.New("-warmup must not be negative")
	case c.concurrency < 1:
		return errors.New("-concurrency must be at least 1")
	case c.rate < 0 || c.rate > 100_000:
		return errors.New("-rate must be between 0 and 100000")
	case c.duplicates < 0 || c.duplicates > 1:
		return errors.New("-duplicates must be between 0 and 1")
	case c.timeout <= 0:
		return errors.New("-timeout must be positive")
	case c.schema == "":
		return errors.New("-schema cannot be empty")
	}
	if c.console != "" {
		host, _, err := net.SplitHostPort(c.console)
		if err != nil {
			return fmt.Errorf("-console %q is not HOST:PORT: %w", c.console, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("-console %s would serve beyond this machine a console that asks for no credentials: "+
				"use 127.0.0.1:PORT (stagehand console has --token and --basic-auth)", c.console)
		}
	}
	return nil
}

// Every event of one order carries this tenant; every message, the order's correlation ID.
const tenant = "acme-shop"

// messagesPerOrder: OrderPlaced, PaymentCaptured, InvoiceIssued and OrderShipped.
const messagesPerOrder = 4

func run(ctx context.Context, out io.Writer, cfg config) (err error) {
	if err := cfg.validate(); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler) // quiet by default
	if cfg.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	runID := fmt.Sprintf("%06x", rand.Uint32()&0xffffff) // in every order ID: this run's data, in a shared schema

	// 1. PostgreSQL and NATS JetStream: yours when given, else throwaway ones, removed at the end.
	dbURL := cfg.databaseURL
	if dbURL == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (set DATABASE_URL or -database-url to use yours)...")
		srv, err := stagehandtest.Start(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop() }()
		dbURL = srv.URL()
	}
	pool, err := connect(ctx, dbURL, cfg.concurrency)
	if err != nil {
		return err
	}
	defer pool.Close()
	natsURL := cfg.natsURL
	if natsURL == "" {
		fmt.Fprintln(out, "starting an in-process NATS JetStream server (set NATS_URL or -nats-url to use yours)...")
		ns, err := startNATS(cfg.natsStore, logger)
		if err != nil {
			return err
		}
		defer ns.stop()
		natsURL = ns.URL()
	}
	if err := provisionBroker(ctx, natsURL, subscriptions); err != nil {
		return err
	}

	// 2. Schema: stagehand's tables (one explicit, idempotent call), then the example's own.
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: cfg.schema}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	tbl := newTables(cfg.schema)
	if err := tbl.create(ctx, pool); err != nil {
		return err
	}

	// 3. The event store, the outbox, and the repositories, each staging with its own strategy.
	reg, err := newRegistry()
	if err != nil {
		return err
	}
	maps, err := newMappings(reg)
	if err != nil {
		return err
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.schema, Logger: logger})
	if err != nil {
		return fmt.Errorf("event store: %w", err)
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: cfg.schema, Logger: logger})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer ob.Close()
	s, err := newShop(store, ob, reg, maps, cfg, logger)
	if err != nil {
		return err
	}
	s.printStrategies(out)
	if cfg.console != "" {
		stopConsole, err := serveConsole(ctx, out, pool, store, ob, cfg)
		if err != nil {
			return err
		}
		defer stopConsole()
	}

	// 4. In the background: the staging workers, the relay to NATS, the consumers and the projection.
	board, err := newOrderBoard(pool, store, reg, tbl, cfg.schema, logger)
	if err != nil {
		return err
	}
	st := newStats(runID + "w")
	bg, err := startBackground(ctx, s, board, tbl, natsURL, st, cfg, logger)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := bg.stop(); err == nil {
			err = stopErr
		}
	}()

	// The warm-up: a few orders of a run of their own, placed at the run's pace and handled before anything is
	// measured, so the figures are the pipeline's steady state, not its first seconds (connections opening,
	// statements planned for the first time, the broker's consumers starting to deliver).
	if cfg.warmup > 0 {
		warm := cfg
		warm.orders = cfg.warmup
		started := time.Now()
		if err := s.placeOrders(stagehand.WithTenant(bg.ctx, tenant), runID+"w", warm, nil); err != nil {
			return bg.cause(err)
		}
		if err := waitUntilHandled(bg.ctx, st, int64(warm.orders*messagesPerOrder), board, cfg.timeout,
			nil); err != nil {
			return bg.cause(fmt.Errorf("warm-up: %w", err))
		}
		fmt.Fprintf(out, "warm-up: %d orders placed and handled in %s (not in the figures below)\n", warm.orders,
			time.Since(started).Round(time.Millisecond))
	}
	st.restart(runID)
	before, err := s.measure(ctx)
	if err != nil {
		return err
	}

	// 5. The checkout: -orders orders, -concurrency at a time. Each places an Order and pays it (two aggregates,
	// two saves), and each save stages the messages of its events with its repository's strategy.
	fmt.Fprintf(out, "placing %d orders, %d at a time (run %s, tenant %s)...\n", cfg.orders, cfg.concurrency,
		runID, tenant)
	started := time.Now()
	placing := newBar(out, cfg.orders, "placing orders   ", "orders")
	err = s.placeOrders(stagehand.WithTenant(bg.ctx, tenant), runID, cfg, placing)
	placing.finish()
	if err != nil {
		return bg.cause(err)
	}
	placedIn := time.Since(started)

	// 6. Wait until every message of the run is handled and the projection has caught up.
	lastOrder := time.Now()
	expected := int64(cfg.orders * messagesPerOrder)
	handling := newBar(out, int(expected), "handling messages", "")
	err = waitUntilHandled(bg.ctx, st, expected, board, cfg.timeout, handling)
	handling.finish()
	if err != nil {
		return bg.cause(err)
	}
	fmt.Fprintf(out, "placed %d orders in %s (%.0f orders/s); every message handled %s after the last order\n",
		cfg.orders, placedIn.Round(time.Millisecond), float64(cfg.orders)/placedIn.Seconds(),
		time.Since(lastOrder).Round(time.Millisecond))

	// 7. The summary, from the counters and from the database.
	after, err := s.measure(ctx)
	if err != nil {
		return err
	}
	if err := s.printSummary(ctx, out, runID, cfg, st.snapshot(), before, after, board, tbl); err != nil {
		return err
	}
	if cfg.console != "" {
		fmt.Fprintln(out, "the console keeps serving (the relay, consumers and projection keep running); "+
			"press Ctrl-C to stop")
		<-ctx.Done()
	}
	return nil
}

// connect opens the pool, sized for the checkouts plus the consumers, the relay and the workers.
func connect(ctx context.Context, url string, concurrency int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		pc.MaxConns = int32(concurrency + 32)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// waitUntilHandled waits until every message of the run was handled, every copy the broker delivered was
// answered, and the projection has caught up with the log; or until timeout.
func waitUntilHandled(ctx context.Context, st *stats, expected int64, board *projection.Projection,
	timeout time.Duration, progress *bar) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		handled, suppressed, deadLettered, published := st.progress()
		progress.set(handled)
		if deadLettered > 0 {
			return fmt.Errorf("the inbox dead-lettered %d messages, so not all %d can be handled; run with -v to "+
				"see the handlers' errors", deadLettered, expected)
		}
		lag := int64(-1) // not measured until the messages are handled
		if handled >= expected && handled+suppressed >= published {
			var err error
			if lag, err = projectionLag(ctx, board); err != nil {
				return err
			}
			if lag == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			snap := st.snapshot()
			return fmt.Errorf("not done %s after the last order: %d of %d messages handled, %d published "+
				"(%d unique), %d duplicates suppressed, %d failed deliveries retried, projection %s lag %d "+
				"events (-1: not measured); run with -v to see why", timeout, snap.handledTotal, expected,
				snap.publishedTotal, snap.publishedUnique, snap.suppressed, snap.failed, board.Name(), lag)
		case <-tick.C:
		}
	}
}

// projectionLag is how many log positions the projection still has to pass (0: caught up).
func projectionLag(ctx context.Context, board *projection.Projection) (int64, error) {
	statuses, err := board.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("projection status: %w", err)
	}
	var lag int64
	for _, s := range statuses {
		lag += s.Lag
	}
	return lag, nil
}
