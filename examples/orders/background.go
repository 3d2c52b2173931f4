package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
)

// background runs what works while the checkout places orders: the staging workers, the relay, the consumers and
// the projection. Its ctx ends when any of them fails (or the caller's ends); stop stops them all.
type background struct {
	ctx     context.Context
	cancel  context.CancelFunc
	group   *errgroup.Group
	relay   *outbox.Relay
	routers []*message.Router
	closers []io.Closer
}

func startBackground(ctx context.Context, s *shop, board *projection.Projection, tbl tables, natsURL string,
	st *stats, cfg config, logger *slog.Logger) (_ *background, err error) {
	ctx, cancel := context.WithCancel(ctx)
	group, gctx := errgroup.WithContext(ctx)
	bg := &background{ctx: gctx, cancel: cancel, group: group}
	defer func() {
		if err != nil { // stop whatever was started
			err = bg.cause(err)
			_ = bg.stop()
		}
	}()
	wlog := watermill.NewSlogLogger(logger)

	// The staging workers each strategy needs, and the projection. Each is one active instance per name across
	// processes (a lease): run them in every process, the others wait as standbys.
	for _, r := range s.staged {
		if r.worker != nil {
			group.Go(func() error { return r.worker.Run(gctx) })
		}
	}
	group.Go(func() error { return board.Run(gctx) })

	// The consumers: each service's handlers behind the inbox, on its own durable JetStream consumer.
	inbox, err := s.outbox.NewInbox(nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	consumers, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, fmt.Errorf("consumer router: %w", err)
	}
	bg.routers = append(bg.routers, consumers)
	subscribers := map[string]message.Subscriber{}
	for _, name := range []string{"billing", "warehouse", "notifier"} {
		sub, err := newSubscriber(natsURL, name, wlog)
		if err != nil {
			return nil, err
		}
		bg.closers = append(bg.closers, sub)
		subscribers[name] = sub
	}
	notifierHandlers := notifier(tbl).Func()
	// One router handler per partition of each topic (partitions.go); the inbox knows each service by one name.
	addPartitionedHandlers(consumers, "billing", TopicOrders, subscribers["billing"],
		st.consumer(inbox, "billing", billing(tbl).Func(), nil))
	// The warehouse appends events in the inbox transaction, which the event store cannot see commit: it
	// announces them, so the Deferred stager and the projection need not wait for their next poll.
	addPartitionedHandlers(consumers, "warehouse", TopicPayments, subscribers["warehouse"],
		st.consumer(inbox, "warehouse", warehouse(s.shipping).Func(), s.store.Notify))
	addPartitionedHandlers(consumers, "notifier-invoices", TopicInvoices, subscribers["notifier"],
		st.consumer(inbox, "notifier", notifierHandlers, nil))
	addPartitionedHandlers(consumers, "notifier-shipments", TopicShipments, subscribers["notifier"],
		st.consumer(inbox, "notifier", notifierHandlers, nil))
	if err := bg.runRouter(consumers); err != nil {
		return nil, err
	}

	// The relay: a router handler that claims what the outbox holds and publishes it to NATS JetStream. Run it in
	// every process; the relays share the work through leases and keep each key's order.
	pub, err := newPublisher(natsURL, wlog)
	if err != nil {
		return nil, err
	}
	bg.closers = append(bg.closers, pub)
	relayCfg := outbox.HighThroughput() // batches of 1000, 100ms polls, 8 deliveries in flight
	relayCfg.ProcessorID = "orders-example"
	relayCfg.IsBrokerUnavailable = natsUnavailable
	claiming := make(chan struct{}) // closed at the relay's first claim: from then on it is running
	var firstClaim sync.Once
	relayCfg.Hooks.Claimed = func(context.Context, int, time.Duration, error) {
		firstClaim.Do(func() { close(claiming) })
	}
	if bg.relay, err = s.outbox.NewRelay(relayCfg); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	relayRouter, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, fmt.Errorf("relay router: %w", err)
	}
	bg.routers = append([]*message.Router{relayRouter}, bg.routers...) // closed first: stop publishing first
	bg.relay.AddToRouter(relayRouter, &countingPublisher{next: partitionedPublisher{pub},
		duplicateRate: cfg.duplicates, stats: st}, nil)
	if err := bg.runRouter(relayRouter); err != nil {
		return nil, err
	}
	select { // the clock of the run starts once the relay is claiming
	case <-claiming:
	case <-bg.ctx.Done():
		return nil, context.Cause(bg.ctx)
	}
	return bg, nil
}

// runRouter runs r in the background and returns once its handlers have subscribed.
func (b *background) runRouter(r *message.Router) error {
	b.group.Go(func() error { return r.Run(b.ctx) })
	select {
	case <-r.Running():
		return nil
	case <-b.ctx.Done():
		return context.Cause(b.ctx)
	}
}

// cause explains err, from work that ran under b.ctx: the failure of a background component, when one ended it.
func (b *background) cause(err error) error {
	cause := context.Cause(b.ctx)
	if cause == nil || errors.Is(cause, context.Canceled) || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%w)", cause, err)
}

// stop stops everything and waits for it: it cancels the background context, closes the routers (the relay's
// first, so nothing more is published), waits for every goroutine, then closes the relay and the NATS connections.
// It returns the first failure of a component, if one failed.
func (b *background) stop() error {
	b.cancel()
	for _, r := range b.routers {
		_ = r.Close()
	}
	err := b.group.Wait()
	if b.relay != nil {
		_ = b.relay.Close()
	}
	for _, c := range b.closers {
		_ = c.Close()
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
