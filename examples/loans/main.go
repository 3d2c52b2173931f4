// Command loans is a small library-loans service, the one docs/getting-started.md builds: loans as event-sourced
// aggregates, their messages staged in the same transaction, a relay publishing them to a broker (Watermill's
// gochannel), inbox handlers that keep each member's loans and send reminders when a loan falls due (a scheduled
// message), and a read model of the open loans.
//
//	go run ./examples/loans                      # starts a throwaway PostgreSQL
//	go run ./examples/loans -database-url "$URL" # or uses yours (tables go in schema "loans_example")
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/stagehandtest"
)

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default: $DATABASE_URL, else a throwaway cluster)")
	schema := flag.String("schema", "loans_example", "schema for the service's tables")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *url, *schema); err != nil {
		fmt.Fprintln(os.Stderr, "loans:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, url, schema string) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if url == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (set DATABASE_URL or -database-url to use yours)...")
		srv, err := stagehandtest.Start(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
	}
	pool, err := openPool(ctx, url, schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		return err
	}
	if err := createReadModel(ctx, pool); err != nil {
		return err
	}

	lib, err := Open(pool, schema, newBroker(logger), logger)
	if err != nil {
		return err
	}
	defer lib.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lib.Run(runCtx) }()

	err = demo(ctx, out, lib)
	stop() // the documented order: stop Run, wait for it, then Close the service, then the pool (deferred above)
	if err := errors.Join(err, <-done); err != nil {
		return err
	}
	fmt.Fprintln(out, "stopped cleanly")
	return nil
}

// demo lends three books, returns one before it is due, and waits for the read model and the reminders.
func demo(ctx context.Context, out io.Writer, lib *Library) error {
	if _, err := lib.Lend(ctx, "ann", "Dune", time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := lib.Lend(ctx, "ann", "Emma", time.Now().Add(14*24*time.Hour)); err != nil {
		return err
	}
	bob, err := lib.Lend(ctx, "bob", "Ulysses", time.Now().Add(time.Second))
	if err != nil {
		return err
	}
	if err := lib.Return(ctx, bob); err != nil { // back before it was due: no reminder
		return err
	}
	fmt.Fprintln(out, "lent 3 books, 1 returned; waiting for the reminder due in 1 s...")
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) { return lib.settled(ctx, 2, 1) }); err != nil {
		return err
	}
	open, err := lib.OpenLoans(ctx)
	if err != nil {
		return err
	}
	for _, o := range open {
		fmt.Fprintf(out, "  open: %s has %s, due %s\n", o.Member, o.Book, o.Due.Format(time.DateTime))
	}
	reminded, err := lib.Reminded(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "reminded: %v\n", reminded)
	return nil
}

// newBroker is Watermill's in-process gochannel, set up for the relay and inbox handlers:
//   - Persistent: a message published before its handler subscribes waits for it instead of being dropped (the
//     relay has marked it sent by then);
//   - BlockPublishUntilSubscriberAck: the relay's publish returns once the handler has acknowledged the message, so
//     the messages of one key reach the handler in order. Without it gochannel hands each message to its
//     subscriber from a goroutine of its own, and a loan's LoanReturned can be handled before its LoanOpened.
func newBroker(logger *slog.Logger) *gochannel.GoChannel {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true},
		watermill.NewSlogLogger(logger))
}

// openPool opens a pool the size the service needs, whose connections use schema first, so the service's
// unqualified table names are its schema's.
func openPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = int32(PoolSize())
	return pgxpool.NewWithConfig(ctx, cfg)
}

func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
