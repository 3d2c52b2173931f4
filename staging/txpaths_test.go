package staging

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A repository's Tx methods (LoadTx, SaveTx, UpdateTx), through a Stager of every strategy, and an inbox handler
// using them, run on the caller's transaction alone: no pool connection is acquired while it is held (see
// pgtest.OneConnection), for aggregates that exist and that do not, conflicts included; the saves that own their
// transaction (Save, Update) hold one connection at a time, and the inbox records a failure only once its
// handler's transaction has ended.
func TestTxPathsUseOnlyTheCallersConnection(t *testing.T) {
	t.Parallel()
	for _, strategy := range []Strategy{Transactional, EventuallyConsistent, Deferred} {
		t.Run(strategy.String(), func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.GuardedMigrated(t, 4)
			e := setupOn(t, pool, schema)
			repo, _ := e.repo(e.store, &Config{Strategy: strategy, Outbox: e.outbox})
			place := func(o *Order) error {
				o.Place(3)
				return nil
			}
			bg := context.Background()

			ctx := pgtest.OneConnection(bg, "repository Tx methods")
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = repo.LoadTx(ctx, tx, "missing")
			require.ErrorIs(t, err, aggregate.ErrNotFound)
			_, err = repo.UpdateTx(ctx, tx, "missing", place)
			require.ErrorIs(t, err, aggregate.ErrNotFound)
			o := NewOrder("o-1")
			o.Place(5)
			require.NoError(t, repo.SaveTx(ctx, tx, o))
			_, err = repo.UpdateTx(ctx, tx, "o-1", place)
			require.NoError(t, err)
			again := NewOrder("o-1")
			again.Place(1)
			require.ErrorIs(t, repo.SaveTx(ctx, tx, again), eventstore.ErrConcurrencyConflict)
			got, err := repo.LoadTx(ctx, tx, "o-1")
			require.NoError(t, err, "the transaction is usable after the conflict")
			require.Equal(t, int64(8), got.Total)
			require.NoError(t, tx.Commit(ctx))

			// Saves that own their transaction: a conflict's version is read once it has ended.
			ctx = pgtest.OneConnection(bg, "Save and Update")
			stale := NewOrder("o-1")
			stale.Place(1)
			require.ErrorIs(t, repo.Save(ctx, stale), eventstore.ErrConcurrencyConflict)
			_, err = repo.Update(ctx, "o-1", place)
			require.NoError(t, err)

			in, err := e.outbox.NewInbox(&outbox.InboxConfig{MaxAttempts: 2})
			require.NoError(t, err)
			h := in.Handler("members", func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
				msg *message.Message) error {
				id := string(msg.Payload)
				if _, err := repo.LoadTx(ctx, tx, "member-"+id); !errors.Is(err, aggregate.ErrNotFound) {
					return fmt.Errorf("load a member that does not exist: %v", err)
				}
				if _, err := repo.UpdateTx(ctx, tx, "o-1", place); err != nil {
					return err
				}
				n := NewOrder("made-" + id)
				n.Place(1)
				if err := repo.SaveTx(ctx, tx, n); err != nil {
					return err
				}
				if id == "fails" {
					return outbox.Permanent(errors.New("refused"))
				}
				return out.Publish("replies", message.NewMessage("reply-"+id, []byte(`{}`)))
			})
			for _, id := range []string{"a", "b", "fails"} {
				msg := message.NewMessage("msg-"+id, []byte(id))
				msg.SetContext(pgtest.OneConnection(bg, "inbox handler "+id))
				require.NoError(t, h(msg), id)
			}
			st, err := e.outbox.AllTenants().InboxStats(bg)
			require.NoError(t, err)
			require.Equal(t, int64(2), st.Handled)
			require.Equal(t, int64(1), st.DeadLettered, "the failure recorded after the handler's rollback")
		})
	}
}

// On a pool of one connection, LoadTx and UpdateTx of an aggregate that does not exist answer ErrNotFound at once,
// from a store that has read nothing of the events table yet: nothing waits for a second connection (which would
// wait until the context's deadline).
func TestMissingAggregateOnAOneConnectionPool(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t)
	pool := pgtest.GuardedPool(t, 1)
	for _, update := range []bool{false, true} {
		e := setupOn(t, pool, schema)
		repo, err := aggregate.NewRepository[*Order](e.store, e.reg, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if update {
				_, err := repo.UpdateTx(ctx, tx, "nobody", func(*Order) error { return nil })
				return err
			}
			_, err := repo.LoadTx(ctx, tx, "nobody")
			return err
		})
		cancel()
		require.ErrorIs(t, err, aggregate.ErrNotFound, "update %v", update)
		require.Less(t, time.Since(start), 2*time.Second)
	}
}
