package shred_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/shred"
	"github.com/stagehand-es/stagehand/staging"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The domain of the PostgreSQL tests: a customer whose name and email are personal data, and whose plan is not.

type CustomerRegistered struct {
	CustomerID string `json:"customer_id"`
	Name       string `json:"name" stagehand:"pii,subject=CustomerID"`
	Email      string `json:"email" stagehand:"pii,subject=CustomerID"`
	Plan       string `json:"plan"`
}

type EmailChanged struct {
	CustomerID string `json:"customer_id"`
	Email      string `json:"email" stagehand:"pii,subject=CustomerID"`
	Reason     string `json:"reason"`
}

// CustomerMessage is the integration message staged from both events.
type CustomerMessage struct {
	CustomerID string `json:"customer_id"`
	Email      string `json:"email" stagehand:"pii,subject=CustomerID"`
	Note       string `json:"note,omitempty"` // in clear
}

type Customer struct {
	aggregate.Root
	codec             *shred.Codec
	Name, Email, Plan string
}

func (c *Customer) Apply(e any) {
	switch e := e.(type) {
	case CustomerRegistered:
		c.Name, c.Email, c.Plan = e.Name, e.Email, e.Plan
	case EmailChanged:
		c.Email = e.Email
	}
}

// customerSnapshot is the snapshot's encoding: personal fields tagged as in events, encoded with the codec.
type customerSnapshot struct {
	ID    string `json:"id"`
	Name  string `json:"name" stagehand:"pii,subject=ID"`
	Email string `json:"email" stagehand:"pii,subject=ID"`
	Plan  string `json:"plan"`
}

func (c *Customer) MarshalSnapshot() ([]byte, error) {
	return c.codec.Marshal(customerSnapshot{ID: c.ID(), Name: c.Name, Email: c.Email, Plan: c.Plan})
}

func (c *Customer) UnmarshalSnapshot(data []byte) error {
	var s customerSnapshot
	if err := c.codec.Unmarshal(data, &s); err != nil {
		return err
	}
	c.Name, c.Email, c.Plan = s.Name, s.Email, s.Plan
	return nil
}

// world is a migrated schema with a Postgres key store, a codec, a registry, an event store, an outbox, a
// Transactional stager and a customer repository snapshotting every 2 events.
type world struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	keys   *shred.PostgresKeyStore
	codec  *shred.Codec
	reg    *aggregate.Registry
	store  *eventstore.PostgresStore
	ob     *outbox.Outbox
	repo   *aggregate.Repository[*Customer]
}

func setup(t testing.TB, codecCfg *shred.CodecConfig) *world {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return worldOn(t, pool, schema, codecCfg, true, 2)
}

// worldOn builds the world on schema; encrypt false uses plain JSON (the same events in clear); snapshotEvery 0
// takes no snapshots.
func worldOn(t testing.TB, pool *pgxpool.Pool, schema string, codecCfg *shred.CodecConfig, encrypt bool,
	snapshotEvery int) *world {
	t.Helper()
	w := &world{t: t, pool: pool, schema: schema}
	var err error
	w.keys, err = shred.NewPostgresKeyStore(pool, &shred.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	w.codec, err = shred.NewCodec(w.keys, codecCfg)
	require.NoError(t, err)
	var codec aggregate.Codec = w.codec
	if !encrypt {
		codec = aggregate.JSONCodec{}
	}
	w.reg = aggregate.NewRegistry(&aggregate.RegistryConfig{Codec: codec})
	require.NoError(t, aggregate.RegisterEvent[CustomerRegistered](w.reg, "customer.registered"))
	require.NoError(t, aggregate.RegisterEvent[EmailChanged](w.reg, "customer.email-changed"))
	require.NoError(t, aggregate.RegisterAggregate(w.reg, "customer", func(id string) *Customer {
		return &Customer{Root: aggregate.NewRoot(id), codec: w.codec}
	}))
	mapping := staging.NewMapping(w.reg)
	require.NoError(t, staging.Map(mapping, "customer-registered", func(_ eventstore.Record, e CustomerRegistered) (
		[]staging.Message, error) {
		return []staging.Message{{Topic: "customers", Payload: CustomerMessage{CustomerID: e.CustomerID,
			Email: e.Email, Note: e.Plan}}}, nil
	}))
	require.NoError(t, staging.Map(mapping, "customer-email-changed", func(_ eventstore.Record, e EmailChanged) (
		[]staging.Message, error) {
		return []staging.Message{{Topic: "customers", Payload: CustomerMessage{CustomerID: e.CustomerID,
			Email: e.Email, Note: e.Reason}}}, nil
	}))
	w.store, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(w.store.Close)
	w.ob, err = outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.ob.Close() })
	stager, err := staging.New(w.store, &staging.Config{Strategy: staging.Transactional, Outbox: w.ob,
		Mapping: mapping})
	require.NoError(t, err)
	w.repo, err = aggregate.NewRepository[*Customer](w.store, w.reg, &aggregate.RepositoryConfig{Stager: stager,
		SnapshotEvery: snapshotEvery})
	require.NoError(t, err)
	return w
}

func (w *world) register(id, name, email, plan string) {
	w.t.Helper()
	_, err := w.repo.Create(context.Background(), id, func(c *Customer) error {
		aggregate.Raise(c, CustomerRegistered{CustomerID: id, Name: name, Email: email, Plan: plan})
		return nil
	})
	require.NoError(w.t, err)
}

func (w *world) changeEmail(id, email, reason string) {
	w.t.Helper()
	_, err := w.repo.Update(context.Background(), id, func(c *Customer) error {
		aggregate.Raise(c, EmailChanged{CustomerID: id, Email: email, Reason: reason})
		return nil
	})
	require.NoError(w.t, err)
}

func (w *world) load(id string) *Customer {
	w.t.Helper()
	c, err := w.repo.Load(context.Background(), id)
	require.NoError(w.t, err)
	return c
}

// tablesHolding returns every table of the schema (all of them, whatever package owns it) with the number of
// rows that hold s: in the row's text (every column, jsonb included) or in the bytes of a bytea column (payloads),
// whose text form is hex.
func (w *world) tablesHolding(s string) map[string]int64 {
	w.t.Helper()
	ctx := context.Background()
	rows, err := w.pool.Query(ctx, `SELECT t.table_name, coalesce(array_agg(c.column_name::text)
			FILTER (WHERE c.data_type = 'bytea'), '{}')
		FROM information_schema.tables t
		LEFT JOIN information_schema.columns c ON c.table_schema = t.table_schema AND c.table_name = t.table_name
		WHERE t.table_schema = $1 AND t.table_type = 'BASE TABLE' GROUP BY 1 ORDER BY 1`, w.schema)
	require.NoError(w.t, err)
	type table struct {
		name  string
		bytea []string
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var t table
		return t, r.Scan(&t.name, &t.bytea)
	})
	require.NoError(w.t, err)
	require.Greater(w.t, len(tables), 20, "the schema's tables")
	out := map[string]int64{}
	for _, table := range tables {
		where := `r::text LIKE '%' || $1 || '%'`
		for _, col := range table.bytea {
			where += ` OR position(convert_to($1, 'UTF8') IN r.` + pgx.Identifier{col}.Sanitize() + `) > 0`
		}
		var n int64
		require.NoError(w.t, w.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgtest.Q(w.schema, table.name)+
			` AS r WHERE `+where, s).Scan(&n))
		if n > 0 {
			out[table.name] = n
		}
	}
	return out
}

func (w *world) rows(table string) int64 {
	return pgtest.Count(w.t, w.pool, `SELECT count(*) FROM `+pgtest.Q(w.schema, table))
}

func marker(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// broker records what it is given, or rejects everything.
type broker struct {
	reject bool
	mu     sync.Mutex
	sent   []*message.Message
}

func (b *broker) Publish(_ string, msgs ...*message.Message) error {
	if b.reject {
		return errors.New("rejected")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sent = append(b.sent, msgs...)
	return nil
}

func (b *broker) Close() error { return nil }

func (w *world) drain(b *broker) outbox.DrainResult {
	w.t.Helper()
	r, err := w.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0), PollingInterval: 50 *
		time.Millisecond, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond})
	require.NoError(w.t, err)
	defer func() { _ = r.Close() }()
	res, err := r.Drain(context.Background(), b)
	require.NoError(w.t, err)
	return res
}
