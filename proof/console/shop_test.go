package console_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

// The scenario the browser tests look at: a shop whose orders are event-sourced and staged (Transactional) into the
// outbox, a relay publishing to an in-process broker that rejects card-declined orders while the payment gateway is
// down, a "billing" inbox consumer that dead-letters invoices with a negative amount, and an "order-board"
// projection that parks events it cannot apply. Everything runs through the library's public API, as a service
// would.

type Order struct {
	aggregate.Root
	Item  string
	Notes []string
}

type OrderPlaced struct {
	Item  string `json:"item"`
	Note  string `json:"note,omitempty"`
	Cents int64  `json:"cents"`
}

type OrderNoteAdded struct {
	Note string `json:"note"`
}

func NewOrder(id string) *Order { return &Order{Root: aggregate.NewRoot(id)} }

func (o *Order) Apply(e any) {
	switch e := e.(type) {
	case OrderPlaced:
		o.Item = e.Item
	case OrderNoteAdded:
		o.Notes = append(o.Notes, e.Note)
	}
}

const (
	acme     = "acme-shop"
	globex   = "globex"
	topic    = "shop.orders"
	declined = "card declined"
)

// gateway is the broker the relay publishes to: an in-process Pub/Sub that rejects the orders whose note says the
// card was declined while down is set.
type gateway struct {
	*gochannel.GoChannel
	down atomic.Bool
}

func (g *gateway) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if g.down.Load() && strings.Contains(string(m.Payload), declined) {
			return fmt.Errorf("payment gateway: %s for order %s (HTTP 402)", declined,
				m.Metadata.Get(stagehand.HeaderAggregateID))
		}
	}
	return g.GoChannel.Publish(topic, msgs...)
}

// boardHandler keeps the order board: one row per order event, in the projection's transaction. It fails on
// events whose note says "hostile", and takes its time while slow is set.
type boardHandler struct {
	table string
	slow  atomic.Bool
}

func (b *boardHandler) Handle(ctx context.Context, tx pgx.Tx, e projection.Event) error {
	if strings.Contains(string(e.Payload), "hostile") {
		return errors.New("the board cannot show a hostile order: " + string(e.Payload))
	}
	if b.slow.Load() {
		time.Sleep(60 * time.Millisecond)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (position, stream_id) VALUES ($1, $2)`, e.Position, e.StreamID)
	return err
}

func (b *boardHandler) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM `+b.table)
	return err
}

type shop struct {
	t        *testing.T
	pool     *pgxpool.Pool
	schema   string
	store    *eventstore.PostgresStore
	ob       *outbox.Outbox
	repo     *aggregate.Repository[*Order]
	gateway  *gateway
	board    *boardHandler
	invoices string
}

// openShop migrates a schema, wires the shop and starts its relay, consumer and projection (stopped when the test
// ends).
func openShop(t *testing.T) *shop {
	t.Helper()
	ctx := context.Background()
	pool, schema := stagehandtest.Migrated(t)
	s := &shop{t: t, pool: pool, schema: schema}
	q := func(table string) string { return pgx.Identifier{schema, table}.Sanitize() }
	s.invoices = q("invoices")
	s.board = &boardHandler{table: q("order_board")}
	for _, ddl := range []string{
		`CREATE TABLE ` + s.invoices + ` (message_id text PRIMARY KEY, item text NOT NULL, cents bigint NOT NULL)`,
		`CREATE TABLE ` + s.board.table + ` (position bigint PRIMARY KEY, stream_id text NOT NULL)`,
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	var err error
	s.store, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.store.Close)
	s.ob, err = outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.ob.Close() })

	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterAggregate(reg, "shop.order", NewOrder))
	require.NoError(t, aggregate.RegisterEvent[OrderPlaced](reg, "shop.order.placed"))
	require.NoError(t, aggregate.RegisterEvent[OrderNoteAdded](reg, "shop.order.note-added"))
	m := staging.NewMapping(reg)
	require.NoError(t, staging.Map(m, "orders", func(_ eventstore.Record, e OrderPlaced) ([]staging.Message, error) {
		return []staging.Message{{Topic: topic, Type: "shop.v1.OrderPlaced", Payload: e}}, nil
	}))
	require.NoError(t, staging.Map(m, "notes", func(_ eventstore.Record, e OrderNoteAdded) ([]staging.Message, error) {
		return []staging.Message{{Topic: topic, Type: "shop.v1.OrderNoteAdded", Payload: e}}, nil
	}))
	stager, err := staging.New(s.store, &staging.Config{Outbox: s.ob, Mapping: m})
	require.NoError(t, err)
	s.repo, err = aggregate.NewRepository[*Order](s.store, reg, &aggregate.RepositoryConfig{Stager: stager})
	require.NoError(t, err)

	logger := watermill.NopLogger{}
	s.gateway = &gateway{GoChannel: gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024,
		Persistent: true}, logger)}
	s.gateway.down.Store(true)
	relay, err := s.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0), PollingInterval: 50 * time.Millisecond,
		RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond, ProcessorID: "shop-relay"})
	require.NoError(t, err)
	in, err := s.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	handlers := outbox.NewHandlers(nil, false)
	outbox.Handle(handlers, "shop.v1.OrderPlaced", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message, e OrderPlaced) error {
		if e.Cents < 0 {
			return outbox.Permanent(fmt.Errorf("invoice amount is negative: %d cents", e.Cents))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+s.invoices+` VALUES ($1, $2, $3)`, msg.UUID, e.Item, e.Cents)
		return err
	})
	outbox.Handle(handlers, "shop.v1.OrderNoteAdded", func(context.Context, pgx.Tx, *outbox.Publisher,
		*message.Message, OrderNoteAdded) error {
		return nil
	})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	relay.AddToRouter(router, s.gateway, nil)
	router.AddConsumerHandler("billing", topic, s.gateway, in.Handler("billing", handlers.Func()))
	board, err := projection.New(pool, s.store, s.board, &projection.Config{Name: "order-board", Schema: schema,
		OnFailure: projection.Park, MaxAttempts: 1, PollInterval: 50 * time.Millisecond, BatchSize: 4, PagesPerTx: 1})
	require.NoError(t, err)

	runCtx, cancel := context.WithCancel(ctx)
	routed, projected := make(chan error, 1), make(chan error, 1)
	go func() { routed <- router.Run(runCtx) }()
	go func() { projected <- board.Run(runCtx) }()
	<-router.Running()
	t.Cleanup(func() {
		cancel()
		_ = router.Close()
		require.NoError(t, <-routed)
		require.NoError(t, <-projected)
		_ = relay.Close()
		_ = s.gateway.GoChannel.Close()
	})
	return s
}

// place saves a new order of a tenant, and notes on it.
func (s *shop) place(tenant, id string, e OrderPlaced, notes ...string) {
	s.t.Helper()
	ctx := stagehand.WithTenant(context.Background(), tenant)
	o := NewOrder(id)
	aggregate.Raise(o, e)
	for _, n := range notes {
		aggregate.Raise(o, OrderNoteAdded{Note: n})
	}
	require.NoError(s.t, s.repo.Save(ctx, o))
}

// seed places the scenario's orders and waits until the pipeline has settled: every message published or
// dead-lettered, every publication handled or dead-lettered by billing, the board caught up.
func (s *shop) seed() {
	s.t.Helper()
	items := []string{"espresso machine", "grinder", "kettle", "mugs (6)", "milk jug", "scale", "filters", "beans 1kg"}
	for i := 1; i <= 24; i++ {
		e := OrderPlaced{Item: items[i%len(items)], Cents: int64(1500 + 250*i)}
		var notes []string
		switch i {
		case 7:
			e.Note = declined + ` <script>alert("x")</script>`
			notes = []string{"customer called: ship to the office"}
		case 13:
			e.Note = "hostile <img src=x onerror=alert(1)> \u202egnp.exe"
		}
		s.place(acme, fmt.Sprintf("order-%d", i), e, notes...)
	}
	for i := 1; i <= 5; i++ {
		e := OrderPlaced{Item: items[i], Cents: int64(900 * i)}
		if i == 3 {
			e.Cents = -500
		}
		s.place(globex, fmt.Sprintf("g-order-%d", i), e)
	}
	s.settle(1, 1)
}

// settle waits until the outbox holds only what dead letters hold, billing has handled or dead-lettered every
// publication, and the board has caught up.
func (s *shop) settle(outboxDead, inboxDead int64) {
	s.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := s.ob.AllTenants().Stats(ctx)
		require.NoError(s.t, err)
		in, err := s.ob.AllTenants().InboxStats(ctx)
		require.NoError(s.t, err)
		sts, err := projection.ListStatus(ctx, s.pool, s.store, s.schema)
		require.NoError(s.t, err)
		caughtUp := len(sts) == 1 && sts[0].Lag == 0 && !sts[0].Rebuilding
		if st.Pending == st.HeldByDeadLetter && st.DeadLettered == outboxDead && in.DeadLettered == inboxDead &&
			in.Handled+in.DeadLettered == st.Sent && caughtUp {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the shop did not settle: %+v, inbox %+v, projections %+v", st, in, sts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// trickle places an order every interval until ctx ends, so the charts have something to draw.
func (s *shop) trickle(ctx context.Context, interval time.Duration) {
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		n++
		o := NewOrder(fmt.Sprintf("walk-in-%d", n))
		aggregate.Raise(o, OrderPlaced{Item: "beans 250g", Cents: 1200})
		_ = s.repo.Save(stagehand.WithTenant(ctx, acme), o)
	}
}
