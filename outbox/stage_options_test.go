package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// stageBatch stages msgs with opts in one batch on the pool (one implicit transaction) and returns the count.
func (e *env) stageBatch(opts *outbox.StageOptions, msgs ...outbox.Message) (int, error) {
	b := &pgx.Batch{}
	staged, err := e.ob.QueueStage(context.Background(), b, opts, msgs...)
	if err != nil {
		return 0, err
	}
	if err := e.pool.SendBatch(context.Background(), b).Close(); err != nil {
		return 0, err
	}
	return staged.Count(), nil
}

func positioned(id string, pos int64, key string) outbox.Message {
	return outbox.Message{ID: id, Topic: "t", Payload: []byte("x"), SourcePosition: pos, PartitionKey: key}
}

func TestStageAfterWatermarkLeavesOutWhatItPassed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	after := &outbox.StageOptions{Watermark: "owner", EndsTransaction: true}

	// Not registered yet: nothing is left out.
	n, err := e.stageBatch(after, positioned("early", 5, "k"))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, e.pool, "owner", 10))
	n, err = e.stageBatch(after, positioned("at", 10, "k"))
	require.NoError(t, err)
	require.Zero(t, n, "a message at the watermark is the owner's")
	n, err = e.stageBatch(after, positioned("past", 11, "k"))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// Several messages, keyed and not, one without a source position (never left out).
	n, err = e.stageBatch(after, positioned("m9", 9, "a"), positioned("m10", 10, ""), positioned("m11", 11, "a"),
		positioned("m12", 12, ""), positioned("none", 0, "b"))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for id, want := range map[string]int64{"early": 1, "at": 0, "past": 1, "m9": 0, "m10": 0, "m11": 1, "m12": 1,
		"none": 1} {
		require.Equal(t, want, e.count("outbox", "message_id = '"+id+"'"), id)
	}
	// Another watermark's position does not matter.
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, e.pool, "other", 1000))
	n, err = e.stageBatch(after, positioned("m13", 13, "a"))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// The options that cannot go with it are refused before anything is queued.
	for _, bad := range []*outbox.StageOptions{{Watermark: "owner", NewIDs: true},
		{Watermark: "owner", Source: &eventstore.AppendedPositions{LastEventID: "x"}}} {
		b := &pgx.Batch{}
		_, err := e.ob.QueueStage(ctx, b, bad, positioned("refused", 20, "k"))
		var ce *outbox.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "Watermark", ce.Field)
		require.Zero(t, b.Len())
	}
}

// The watermark's row stays locked until the staging transaction ends: its owner cannot advance past messages
// staged there before they commit (and so cannot let cleanup forget anything about them).
func TestStageAfterWatermarkHoldsTheWatermarkUntilTheCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	require.NoError(t, e.ob.RegisterWatermarkTx(ctx, e.pool, "owner", 10))
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	_, err = e.ob.QueueStage(ctx, b, &outbox.StageOptions{Watermark: "owner"}, positioned("held", 11, "k"))
	require.NoError(t, err)
	require.NoError(t, tx.SendBatch(ctx, b).Close())

	advance := func() error {
		return pgx.BeginFunc(ctx, e.pool, func(o pgx.Tx) error {
			if _, err := o.Exec(ctx, "SET LOCAL lock_timeout = '200ms'"); err != nil {
				return err
			}
			_, err := e.ob.AdvanceWatermarkTx(ctx, o, "owner", 20)
			return err
		})
	}
	err = advance()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the owner's advance must wait for the staging: %v", err)
	require.Equal(t, "55P03", pgErr.Code) // lock_not_available
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, advance())
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'held'"))
}

// AsyncCommit turns synchronous_commit off for the staging transaction alone.
func TestAsyncCommitAppliesToTheStagingTransactionOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The session's own value (test clusters turn it off server-wide), which the transaction must not change.
	_, err = conn.Exec(ctx, "SET synchronous_commit = on")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "RESET synchronous_commit") }()
	for _, async := range []bool{false, true} {
		b := &pgx.Batch{}
		_, err := e.ob.QueueStage(ctx, b, &outbox.StageOptions{AsyncCommit: async, EndsTransaction: true},
			positioned("async-"+time.Now().Format("150405.000000000"), 1, "k"))
		require.NoError(t, err)
		var inTx string
		b.Queue("SELECT current_setting('synchronous_commit')").QueryRow(func(row pgx.Row) error {
			return row.Scan(&inTx)
		})
		require.NoError(t, conn.SendBatch(ctx, b).Close())
		want := "on"
		if async {
			want = "off"
		}
		require.Equal(t, want, inTx, "AsyncCommit %v", async)
		var after string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&after))
		require.Equal(t, "on", after, "the setting ends with the transaction")
	}
}
