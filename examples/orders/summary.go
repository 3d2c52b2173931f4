package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// dbCounts is what the database holds, measured before and after the run; the summary prints the differences.
type dbCounts struct {
	head         int64 // last position of the global log
	staged       int64 // outbox messages staged and not cleaned up: pending, scheduled, dead-lettered or sent
	inboxHandled int64 // (message, handler) pairs the inbox remembers as handled
}

func (s *shop) measure(ctx context.Context) (dbCounts, error) {
	head, err := s.store.HeadPosition(ctx)
	if err != nil {
		return dbCounts{}, fmt.Errorf("log head: %w", err)
	}
	ob, err := s.outbox.AllTenants().Stats(ctx)
	if err != nil {
		return dbCounts{}, fmt.Errorf("outbox statistics: %w", err)
	}
	in, err := s.outbox.AllTenants().InboxStats(ctx)
	if err != nil {
		return dbCounts{}, fmt.Errorf("inbox statistics: %w", err)
	}
	return dbCounts{head: head, staged: ob.Pending + ob.Scheduled + ob.DeadLettered + ob.Sent,
		inboxHandled: in.Handled}, nil
}

// eventsOfRun counts the events of this run's streams in the global log after position from, by type.
func (s *shop) eventsOfRun(ctx context.Context, from int64, runID string) (map[string]int64, int64, error) {
	byType := map[string]int64{}
	var total int64
	for after := from; ; {
		page, err := s.store.ReadLog(ctx, eventstore.LogQuery{After: after, Tenants: []string{tenant}})
		if err != nil {
			return nil, 0, fmt.Errorf("read the log: %w", err)
		}
		for _, r := range page.Records {
			if strings.Contains(r.StreamID, "order-"+runID+"-") {
				byType[r.Type]++
				total++
			}
		}
		if page.Last == after {
			return byType, total, nil
		}
		after = page.Last
	}
}

// effects are what the consumers and the projection wrote for this run's orders.
type effects struct {
	invoices, invoicedOrders       int64 // rows, distinct orders
	notifications, notifiedMessage int64 // rows, distinct messages
	boardOrders, boardPaid         int64
	boardShipped                   int64
}

func (s *shop) effectsOfRun(ctx context.Context, tbl tables, runID string) (effects, error) {
	var e effects
	like := "order-" + runID + "-%"
	pool := s.store.Pool()
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM `+tbl.invoices+
		` WHERE order_id LIKE $1`, like).Scan(&e.invoices, &e.invoicedOrders); err != nil {
		return e, fmt.Errorf("count invoices: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+tbl.notifications+
		` WHERE order_id LIKE $1`, like).Scan(&e.notifications, &e.notifiedMessage); err != nil {
		return e, fmt.Errorf("count notifications: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(paid_at), count(shipped_at) FROM `+tbl.orderBoard+
		` WHERE order_id LIKE $1`, like).Scan(&e.boardOrders, &e.boardPaid, &e.boardShipped); err != nil {
		return e, fmt.Errorf("count the order board: %w", err)
	}
	return e, nil
}

// printSummary prints what the run did. Every line starts with a fixed label, so it is easy to read and to test.
func (s *shop) printSummary(ctx context.Context, out io.Writer, runID string, cfg config, snap snapshot,
	before, after dbCounts, board *projection.Projection, tbl tables) error {
	events, eventTotal, err := s.eventsOfRun(ctx, before.head, runID)
	if err != nil {
		return err
	}
	eff, err := s.effectsOfRun(ctx, tbl, runID)
	if err != nil {
		return err
	}
	lag, err := projectionLag(ctx, board)
	if err != nil {
		return err
	}
	shipments := events["shop.order.shipped"]
	twice := (eff.invoices - eff.invoicedOrders) + (eff.notifications - eff.notifiedMessage)

	fmt.Fprintf(out, "\nsummary of run %s (%d orders):\n", runID, cfg.orders)
	fmt.Fprintf(out, "  events appended:        %d (order placed %d, payment authorized %d, payment captured %d, "+
		"order shipped %d)\n", eventTotal, events["shop.order.placed"], events["shop.payment.authorized"],
		events["shop.payment.captured"], shipments)
	fmt.Fprintf(out, "  messages staged:        %d (in the outbox, by the repositories and the billing consumer)\n",
		after.staged-before.staged)
	fmt.Fprintf(out, "  messages published:     %d (%d unique, %d published twice on purpose: -duplicates %g)\n",
		snap.publishedTotal, snap.publishedUnique, snap.duplicatesSent, cfg.duplicates)
	fmt.Fprintf(out, "  messages handled:       %d unique (billing %d, warehouse %d, notifier %d); "+
		"inbox entries +%d\n", snap.handledTotal, snap.handled["billing"], snap.handled["warehouse"],
		snap.handled["notifier"], after.inboxHandled-before.inboxHandled)
	fmt.Fprintf(out, "  duplicates suppressed:  %d (by the inbox)\n", snap.suppressed)
	fmt.Fprintf(out, "  failed deliveries:      %d retried, %d dead-lettered\n", snap.failed, snap.deadLettered)
	fmt.Fprintf(out, "  effects applied:        %d (invoices %d, shipments %d, notifications %d); applied twice: %d\n",
		eff.invoices+shipments+eff.notifications, eff.invoices, shipments, eff.notifications, twice)
	if snap.otherRuns > 0 {
		fmt.Fprintf(out, "  other runs' messages:   %d (left in the database or the broker by an earlier run)\n",
			snap.otherRuns)
	}

	var all []time.Duration
	for _, ds := range snap.latency {
		all = append(all, ds...)
	}
	p50, p99 := percentiles(all)
	fmt.Fprintf(out, "  append->handled:        p50 %s, p99 %s (%d messages, from occurred-at to the consumer's "+
		"commit)\n", ms(p50), ms(p99), len(all))
	for _, path := range []struct{ typ, how string }{
		{MsgOrderPlaced, "orders repository, " + s.strategyOf("orders").String()},
		{MsgPaymentCaptured, "payments repository, " + s.strategyOf("payments").String()},
		{MsgInvoiceIssued, "staged by billing in its inbox transaction"},
		{MsgOrderShipped, "shipping repository, " + s.strategyOf("shipping").String()},
	} {
		p50, p99 := percentiles(snap.latency[path.typ])
		fmt.Fprintf(out, "    %-24s p50 %8s  p99 %8s  %s\n", path.typ, ms(p50), ms(p99), path.how)
	}
	fmt.Fprintf(out, "  projection lag:         %d events (%s: %d orders, %d paid, %d shipped)\n", lag, ProjectionName,
		eff.boardOrders, eff.boardPaid, eff.boardShipped)
	var strategies []string
	for _, r := range s.staged {
		strategies = append(strategies, fmt.Sprintf("%s=%s (requested %s)", r.name, r.stager.Strategy(),
			r.stager.Requested()))
	}
	fmt.Fprintf(out, "  strategies:             %s\n", strings.Join(strategies, ", "))
	return nil
}

// strategyOf returns the resolved strategy of the named repository.
func (s *shop) strategyOf(name string) staging.Strategy {
	i := slices.IndexFunc(s.staged, func(r stagedRepository) bool { return r.name == name })
	return s.staged[i].stager.Strategy()
}
