// Command bank is stagehand's first example: bank accounts as event-sourced aggregates on PostgreSQL.
//
// It opens accounts, deposits, and then lets many goroutines withdraw from one account at once: optimistic
// concurrency and the repository's Update retries keep the invariant (no overdraft) without any lock, and the global
// log shows every event exactly once, in order.
//
//	go run ./examples/bank                      # starts a throwaway PostgreSQL
//	go run ./examples/bank -database-url "$URL" # or uses yours (tables go in schema "bank_example")
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/stagehandtest"
)

type config struct {
	databaseURL string
	schema      string
	withdrawers int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default: $DATABASE_URL, else a throwaway cluster)")
	flag.StringVar(&cfg.schema, "schema", "bank_example", "schema for the example's tables")
	flag.IntVar(&cfg.withdrawers, "withdrawers", 20, "goroutines withdrawing from one account at once")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bank:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, cfg config) error {
	url := cfg.databaseURL
	if url == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (set DATABASE_URL or -database-url to use yours)...")
		srv, err := stagehandtest.Start(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()

	// 1. Schema: one explicit call creates every stagehand table.
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: cfg.schema}); err != nil {
		return err
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.schema})
	if err != nil {
		return err
	}
	defer store.Close()
	repo, err := aggregate.NewRepository[*Account](store, newRegistry(), &aggregate.RepositoryConfig{
		UpdateRetries: cfg.withdrawers, // enough for every contender to get its turn
	})
	if err != nil {
		return err
	}
	start, err := store.HeadPosition(ctx)
	if err != nil {
		return err
	}

	// 2. Open two accounts and deposit. The tenant and correlation ID travel in the context onto every event.
	ctx = stagehand.WithTenant(ctx, "acme-bank")
	ctx = stagehand.WithCorrelationID(ctx, "bank-example")
	for _, acct := range []struct {
		id, owner string
		amount    int64
	}{{"acct-ann", "ann", 100}, {"acct-bob", "bob", 250}} {
		if _, err := repo.Create(ctx, acct.id, func(a *Account) error {
			if err := a.OpenFor(acct.owner); err != nil {
				return err
			}
			return a.Deposit(acct.amount)
		}); err != nil && !errors.Is(err, aggregate.ErrAlreadyExists) { // a rerun finds them created
			return err
		}
		fmt.Fprintf(out, "opened %s for %s with %d\n", acct.id, acct.owner, acct.amount)
	}

	// 3. Many concurrent withdrawals of 10 from ann's 100: exactly 10 can succeed.
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, cfg.withdrawers)
	for range cfg.withdrawers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := repo.Update(ctx, "acct-ann", func(a *Account) error { return a.Withdraw(10) })
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, ErrInsufficientFunds):
				refused.Add(1)
			default:
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return fmt.Errorf("withdrawal: %w", err)
	}
	ann, err := repo.Load(ctx, "acct-ann")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d concurrent withdrawals of 10: %d succeeded, %d refused (insufficient funds)\n",
		cfg.withdrawers, ok.Load(), refused.Load())
	fmt.Fprintf(out, "acct-ann: balance %d at version %d\n", ann.Balance, ann.Version())
	if ann.Balance < 0 {
		return fmt.Errorf("invariant broken: balance %d", ann.Balance)
	}

	// 4. The global log: every event of this run, once, in order.
	var n int
	after := start
	for {
		page, err := store.ReadLog(ctx, eventstore.LogQuery{After: after, Tenants: []string{"acme-bank"}})
		if err != nil {
			return err
		}
		for _, r := range page.Records {
			n++
			if n <= 5 {
				fmt.Fprintf(out, "  log #%d %s v%d %s %s\n", r.Position, r.StreamID, r.Version, r.Type, r.Payload)
			}
		}
		if page.Last == after {
			break
		}
		after = page.Last
	}
	fmt.Fprintf(out, "global log: %d events appended in this run\n", n)
	return nil
}
