package staging

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Order is the test aggregate: every placement raises two events, OrderPlaced and OrderConfirmed, so a save stages
// several messages and has a middle to crash in.
type Order struct {
	aggregate.Root
	Total  int64
	Placed bool
}

type OrderPlaced struct{ Total int64 }
type OrderConfirmed struct{ By string }
type OrderNoted struct{ Note string } // mapped to nothing

func NewOrder(id string) *Order { return &Order{Root: aggregate.NewRoot(id)} }

func (o *Order) Place(total int64) {
	aggregate.Raise(o, OrderPlaced{Total: total})
	aggregate.Raise(o, OrderConfirmed{By: "system"})
}

func (o *Order) Apply(e any) {
	switch e := e.(type) {
	case OrderPlaced:
		o.Total += e.Total
		o.Placed = true
	}
}

func registry() *aggregate.Registry {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "shop.order", NewOrder)
	_ = aggregate.RegisterEvent[OrderPlaced](reg, "shop.order.placed")
	_ = aggregate.RegisterEvent[OrderConfirmed](reg, "shop.order.confirmed")
	_ = aggregate.RegisterEvent[OrderNoted](reg, "shop.order.noted")
	return reg
}

// mapping maps each OrderPlaced to two messages (orders + billing) and each OrderConfirmed to one.
func mapping(reg *aggregate.Registry) *Mapping {
	m := NewMapping(reg)
	_ = Map(m, "placed-to-orders", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.placed", Payload: map[string]any{"total": e.Total}}}, nil
	})
	_ = Map(m, "placed-to-billing", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "billing", Type: "billing.charge", Payload: e}}, nil
	})
	_ = m.MapRaw("confirmed-forward", "shop.order.confirmed", func(src eventstore.Record) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.confirmed", Payload: src.Payload}}, nil
	})
	return m
}

type env struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	store  *eventstore.PostgresStore
	outbox *outbox.Outbox
	reg    *aggregate.Registry
	m      *Mapping
}

func setup(t testing.TB) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return setupOn(t, pool, schema)
}

func setupOn(t testing.TB, pool *pgxpool.Pool, schema string) *env {
	t.Helper()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	reg := registry()
	return &env{t: t, pool: pool, schema: schema, store: store, outbox: ob, reg: reg, m: mapping(reg)}
}

func (e *env) repo(store eventstore.Store, cfg *Config) (*aggregate.Repository[*Order], *Stager) {
	e.t.Helper()
	c := Config{Mapping: e.m}
	if cfg != nil {
		c = *cfg
		if c.Mapping == nil {
			c.Mapping = e.m
		}
	}
	st, err := New(store, &c)
	require.NoError(e.t, err)
	r, err := aggregate.NewRepository[*Order](store, e.reg, &aggregate.RepositoryConfig{Stager: st})
	require.NoError(e.t, err)
	return r, st
}

// stagedIDs returns every message ID the outbox knows (pending, sent or dead-lettered), with how many rows each
// has across those tables.
func (e *env) stagedIDs() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id FROM `+pgtest.Q(e.schema, "outbox")+
		` UNION ALL SELECT message_id FROM `+pgtest.Q(e.schema, "outbox_sent")+
		` UNION ALL SELECT message_id FROM `+pgtest.Q(e.schema, "outbox_dead_letters"))
	require.NoError(e.t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		require.NoError(e.t, rows.Scan(&id))
		out[id]++
	}
	require.NoError(e.t, rows.Err())
	return out
}

// expectedIDs derives, from every committed event in the log, the message IDs the mapping must have staged.
func (e *env) expectedIDs(store eventstore.Store) map[string]bool {
	e.t.Helper()
	out := map[string]bool{}
	var after int64
	for {
		page, err := store.ReadLog(context.Background(), eventstore.LogQuery{After: after})
		require.NoError(e.t, err)
		for _, rec := range page.Records {
			msgs, err := e.m.messages(rec, nil)
			require.NoError(e.t, err)
			for _, m := range msgs {
				out[m.ID] = true
			}
		}
		if page.Last == after {
			return out
		}
		after = page.Last
	}
}

// requireExactlyOnce checks that every committed event's messages are staged exactly once and that nothing else
// is staged.
func (e *env) requireExactlyOnce(store eventstore.Store) {
	e.t.Helper()
	staged := e.stagedIDs()
	expected := e.expectedIDs(store)
	require.NotEmpty(e.t, expected)
	var missing, extra, dup []string
	for id := range expected {
		switch staged[id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			dup = append(dup, id)
		}
	}
	for id := range staged {
		if !expected[id] {
			extra = append(extra, id)
		}
	}
	sort.Strings(missing)
	require.Empty(e.t, missing, "messages of committed events that were never staged")
	require.Empty(e.t, dup, "messages staged more than once")
	require.Empty(e.t, extra, "messages staged for events that never committed")
}

// runUntilCaughtUp runs a worker until it has passed the head of the log, then stops it.
func runUntilCaughtUp(t testing.TB, w *Worker, store eventstore.Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	head, err := store.HeadPosition(context.Background())
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		w.Wake()
		lag, err := w.Lag(context.Background())
		return err == nil && lag.Position >= head
	}, "%s did not catch up with position %d", w.Name(), head)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		require.NoError(t, err)
	}
}

func orderID(i int) string { return fmt.Sprintf("order-%03d", i) }
