package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Contract 1/5: staging is part of the caller's transaction: a rollback leaves no row, a commit exactly its rows.
func TestStageTxCommitsOrRollsBackWithTheBusinessTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	pgtest.Exec(t, e.pool, "CREATE TABLE "+pgtest.Q(e.schema, "orders")+" (id text PRIMARY KEY)")

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+pgtest.Q(e.schema, "orders")+" VALUES ('o1')")
	require.NoError(t, err)
	n, err := e.ob.StageTx(ctx, tx, msgs("orders", 3, nil)...)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, e.count("outbox"), "a rolled-back transaction must leave no outbox row")
	require.Zero(t, e.count("orders"))

	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+pgtest.Q(e.schema, "orders")+" VALUES ('o2')")
	require.NoError(t, err)
	batch := msgs("orders", 2, nil)
	n, err = e.ob.StageTx(ctx, tx, batch...)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Zero(t, pgtest.Count(t, e.pool, "SELECT count(*) FROM "+pgtest.Q(e.schema, "outbox")),
		"rows must not be visible before the commit")
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 2, e.count("outbox"))
	require.EqualValues(t, 2, e.count("outbox", "message_id IN ('orders-00000', 'orders-00001')"))
}

func TestStagingAnIDTwiceInsertsOneRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := outbox.Message{ID: "01HZY3K5V7", Topic: "t", Payload: []byte("x")}
	n, err := e.ob.Stage(ctx, m, m)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = e.ob.Stage(ctx, m)
	require.NoError(t, err)
	require.Zero(t, n)
	require.EqualValues(t, 1, e.count("outbox"))

	// Once sent (moved to the ledger), staging it again still inserts nothing.
	r := e.relay(nil)
	res, err := r.Drain(ctx, newBroker())
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	require.Zero(t, e.count("outbox"))
	n, err = e.ob.Stage(ctx, m)
	require.NoError(t, err)
	require.Zero(t, n, "a sent message's ID must stay known")
	require.Zero(t, e.count("outbox"))
}

func TestStageValidatesMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, outbox.Message{Topic: "t"})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "a"})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	pub := e.ob.Publisher(ctx, e.pool)
	msg := message.NewMessage("b", nil)
	msg.Metadata.Set(outbox.HeaderScheduledAt, "tomorrow")
	require.ErrorIs(t, pub.Publish("t", msg), outbox.ErrInvalidMessage)
	require.Zero(t, e.count("outbox"))
}

// The writer fills tenant, correlation and causation from the context when the message does not carry them.
func TestStageTakesTenantAndIDsFromContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := stagehand.WithTenant(context.Background(), "acme")
	ctx = stagehand.WithCorrelationID(ctx, "corr-1")
	ctx = stagehand.WithCausationID(ctx, "cause-1")
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "m1", Topic: "t"},
		outbox.Message{ID: "m2", Topic: "t", Tenant: "other", CorrelationID: "c2", CausationID: "k2"})
	require.NoError(t, err)
	_, err = e.ob.Stage(context.Background(), outbox.Message{ID: "m3", Topic: "t"})
	require.NoError(t, err)
	var tenant, corr, cause string
	q := "SELECT tenant_id, correlation_id, causation_id FROM " + pgtest.Q(e.schema, "outbox") + " WHERE message_id = $1"
	require.NoError(t, e.pool.QueryRow(ctx, q, "m1").Scan(&tenant, &corr, &cause))
	require.Equal(t, []string{"acme", "corr-1", "cause-1"}, []string{tenant, corr, cause})
	require.NoError(t, e.pool.QueryRow(ctx, q, "m2").Scan(&tenant, &corr, &cause))
	require.Equal(t, []string{"other", "c2", "k2"}, []string{tenant, corr, cause})
	require.NoError(t, e.pool.QueryRow(ctx, q, "m3").Scan(&tenant, &corr, &cause))
	require.Equal(t, []string{stagehand.NoTenant, "", ""}, []string{tenant, corr, cause})
}

// A Watermill publisher bound to a pgx.Tx stages into that transaction.
func TestPublisherBoundToTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		pub := e.ob.Publisher(ctx, tx)
		msg := message.NewMessage("w1", []byte("hello"))
		msg.Metadata.Set(stagehand.HeaderAggregateID, "order-7")
		msg.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderPlaced")
		msg.Metadata.Set("custom", "v")
		require.NoError(t, pub.Publish("orders", msg))
		return errors.New("roll back")
	})
	require.Error(t, err)
	require.Zero(t, e.count("outbox"))

	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		pub := e.ob.Publisher(ctx, tx)
		msg := message.NewMessage("w1", []byte("hello"))
		msg.Metadata.Set(stagehand.HeaderAggregateID, "order-7")
		msg.Metadata.Set(stagehand.HeaderMessageType, "orders.OrderPlaced")
		msg.Metadata.Set("custom", "v")
		return pub.Publish("orders", msg)
	}))
	var key, typ, custom string
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT partition_key, message_type, metadata->>'custom' FROM "+
		pgtest.Q(e.schema, "outbox")+" WHERE message_id = 'w1'").Scan(&key, &typ, &custom))
	require.Equal(t, "order-7", key, "the partition key defaults to the aggregate ID")
	require.Equal(t, "orders.OrderPlaced", typ)
	require.Equal(t, "v", custom)

	// Delivered with UUID = message ID, the payload and metadata, plus the standard headers.
	r := e.relay(nil)
	b := newBroker()
	_, err = r.Drain(ctx, b)
	require.NoError(t, err)
	log := b.snapshot()
	require.Len(t, log, 1)
	require.Equal(t, "w1", log[0].id)
	require.Equal(t, "orders", log[0].topic)
	require.Equal(t, "v", log[0].meta.Get("custom"))
	require.Equal(t, "orders.OrderPlaced", log[0].meta.Get(stagehand.HeaderMessageType))
	require.Equal(t, stagehand.NoTenant, log[0].meta.Get(stagehand.HeaderTenantID))
	require.Equal(t, "order-7", log[0].meta.Get(outbox.HeaderPartitionKey))
}

// Contract 6: the per-key sequence follows staging-commit order even when two transactions stage the same key
// concurrently: the one that commits later gets the higher number, whoever staged first.
func TestSequenceFollowsStagingCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	t1, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	_, err = e.ob.StageTx(ctx, t1, outbox.Message{ID: "first-staged", Topic: "t", PartitionKey: "k"})
	require.NoError(t, err)

	staged := make(chan error, 1)
	go func() {
		_, err := e.ob.Stage(ctx, outbox.Message{ID: "second-staged", Topic: "t", PartitionKey: "k"},
			outbox.Message{ID: "other-key", Topic: "t", PartitionKey: "j"})
		staged <- err
	}()
	select {
	case err := <-staged:
		t.Fatalf("a concurrent stager of the same key must wait for the first to end, got %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, t1.Commit(ctx))
	require.NoError(t, <-staged)
	var first, second int64
	q := "SELECT seq FROM " + pgtest.Q(e.schema, "outbox") + " WHERE message_id = $1"
	require.NoError(t, e.pool.QueryRow(ctx, q, "first-staged").Scan(&first))
	require.NoError(t, e.pool.QueryRow(ctx, q, "second-staged").Scan(&second))
	require.Less(t, first, second)

	// The other order: the second stager commits first and so takes the lower number.
	t2, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t2.Rollback(ctx) }()
	_, err = e.ob.StageTx(ctx, t2, outbox.Message{ID: "commits-first", Topic: "t", PartitionKey: "k2"})
	require.NoError(t, err)
	require.NoError(t, t2.Commit(ctx))
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "commits-second", Topic: "t", PartitionKey: "k2"})
	require.NoError(t, err)
	require.NoError(t, e.pool.QueryRow(ctx, q, "commits-first").Scan(&first))
	require.NoError(t, e.pool.QueryRow(ctx, q, "commits-second").Scan(&second))
	require.Less(t, first, second)
}
