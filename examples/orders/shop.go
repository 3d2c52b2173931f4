package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/staging"
)

// shop holds the repositories. Each has its own stager, and so its own staging strategy:
//
//   - orders, used by the checkout to place orders: the -strategy flag, default auto, which resolves to
//     transactional because the event store and the outbox share one database;
//   - payments, used by the checkout to pay: eventually-consistent, so a Reconciler must run;
//   - shipping, used by the warehouse inside its inbox transaction (UpdateTx): deferred, so a DeferredStager must
//     run. (Under SaveTx only transactional could stage in the caller's transaction; the others leave it to their
//     worker, since the repository never sees the commit.)
type shop struct {
	orders   *aggregate.Repository[*Order]
	payments *aggregate.Repository[*Payment]
	shipping *aggregate.Repository[*Order]
	staged   []stagedRepository
	store    *eventstore.PostgresStore
	outbox   *outbox.Outbox
}

// stagedRepository is a repository's stager with the background worker its resolved strategy needs: a Reconciler
// under eventually-consistent, a DeferredStager under deferred, none under transactional.
type stagedRepository struct {
	name   string
	stager *staging.Stager
	worker *staging.Worker
}

func newShop(store *eventstore.PostgresStore, ob *outbox.Outbox, reg *aggregate.Registry, m mappings, cfg config,
	logger *slog.Logger) (*shop, error) {
	s := &shop{store: store, outbox: ob}
	stager := func(name string, strategy staging.Strategy, mapping *staging.Mapping) (*staging.Stager, error) {
		st, err := staging.New(store, &staging.Config{Strategy: strategy, Outbox: ob, Mapping: mapping,
			ReconcilerName: name, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("%s stager: %w", name, err)
		}
		wc := &staging.WorkerConfig{Name: name, Schema: cfg.schema, Logger: logger}
		var w *staging.Worker
		switch st.Strategy() {
		case staging.EventuallyConsistent:
			w, err = staging.NewReconciler(store, ob, mapping, wc)
		case staging.Deferred:
			w, err = staging.NewDeferredStager(store, ob, mapping, wc)
		}
		if err != nil {
			return nil, fmt.Errorf("%s worker: %w", name, err)
		}
		s.staged = append(s.staged, stagedRepository{name: name, stager: st, worker: w})
		return st, nil
	}
	ordersStager, err := stager("orders", cfg.strategy, m.orders)
	if err != nil {
		return nil, err
	}
	paymentsStager, err := stager("payments", staging.EventuallyConsistent, m.payments)
	if err != nil {
		return nil, err
	}
	shippingStager, err := stager("shipping", staging.Deferred, m.shipping)
	if err != nil {
		return nil, err
	}
	if s.orders, err = aggregate.NewRepository[*Order](store, reg,
		&aggregate.RepositoryConfig{Stager: ordersStager, Logger: logger}); err != nil {
		return nil, fmt.Errorf("orders repository: %w", err)
	}
	if s.payments, err = aggregate.NewRepository[*Payment](store, reg,
		&aggregate.RepositoryConfig{Stager: paymentsStager, Logger: logger}); err != nil {
		return nil, fmt.Errorf("payments repository: %w", err)
	}
	if s.shipping, err = aggregate.NewRepository[*Order](store, reg,
		&aggregate.RepositoryConfig{Stager: shippingStager, Logger: logger}); err != nil {
		return nil, fmt.Errorf("shipping repository: %w", err)
	}
	return s, nil
}

func (s *shop) printStrategies(out io.Writer) {
	fmt.Fprintln(out, "staging strategies (repository: requested -> resolved):")
	for _, r := range s.staged {
		worker := ""
		if r.worker != nil {
			worker = fmt.Sprintf(", worker %q running", r.worker.Name())
		}
		fmt.Fprintf(out, "  %-9s %s -> %s%s\n", r.name, r.stager.Requested(), r.stager.Strategy(), worker)
	}
}

// placeOrders runs cfg.orders checkouts, cfg.concurrency at a time, at most cfg.rate a second.
func (s *shop) placeOrders(ctx context.Context, runID string, cfg config, progress *bar) error {
	g, ctx := errgroup.WithContext(ctx)
	next := make(chan int)
	g.Go(func() error {
		defer close(next)
		var pace <-chan time.Time
		if cfg.rate > 0 {
			t := time.NewTicker(time.Second / time.Duration(cfg.rate))
			defer t.Stop()
			pace = t.C
		}
		for i := 1; i <= cfg.orders; i++ {
			if pace != nil {
				select {
				case <-pace:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	var placed atomic.Int64
	for range cfg.concurrency {
		g.Go(func() error {
			for i := range next {
				if err := s.checkout(ctx, orderID(runID, i), i); err != nil {
					return err
				}
				progress.set(placed.Add(1))
			}
			return nil
		})
	}
	return g.Wait()
}

// checkout is one customer's purchase: the order is placed, then paid in full. The two saves are two aggregates,
// and so two transactions, each staging its messages with its repository's strategy.
func (s *shop) checkout(ctx context.Context, orderID string, n int) error {
	ctx = stagehand.WithCorrelationID(ctx, "checkout-"+orderID) // on every event and message that follows
	order, err := s.orders.Create(ctx, orderID, func(o *Order) error {
		return o.Place(fmt.Sprintf("customer-%03d", n%97), linesFor(n))
	})
	if err != nil {
		return fmt.Errorf("place %s: %w", orderID, err)
	}
	if _, err := s.payments.Create(ctx, "payment-"+orderID, func(p *Payment) error {
		if err := p.Authorize(orderID, order.Total); err != nil {
			return err
		}
		return p.Capture(order.Total)
	}); err != nil {
		return fmt.Errorf("pay %s: %w", orderID, err)
	}
	return nil
}

// orderID names order n of a run: "order-<run>-000042".
func orderID(runID string, n int) string { return fmt.Sprintf("order-%s-%06d", runID, n) }

// linesFor makes one to three lines of a small catalogue for order n.
func linesFor(n int) []Line {
	catalogue := []Line{{"SKU-MUG", 0, 1200}, {"SKU-TEE", 0, 2500}, {"SKU-CAP", 0, 1800}, {"SKU-PIN", 0, 300}}
	lines := make([]Line, 1+n%3)
	for i := range lines {
		lines[i] = catalogue[(n+i)%len(catalogue)]
		lines[i].Quantity = int64(1 + (n+i)%4)
	}
	return lines
}
