package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// openOrDeposit is a create-or-update command: it opens a new account for owner, then deposits n.
func openOrDeposit(owner string, n int64) func(a *Account) error {
	return func(a *Account) error {
		if a.Version() == 0 {
			if err := a.Open(owner); err != nil {
				return err
			}
		}
		return a.Deposit(n)
	}
}

// requireAlreadyExists checks that err reports an existing aggregate, as such, with what identifies it, and still
// matches the concurrency-conflict sentinel.
func requireAlreadyExists(t *testing.T, err error, id, tenant string, version int64) {
	t.Helper()
	require.ErrorIs(t, err, aggregate.ErrAlreadyExists)
	require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict, "an existing stream is a failed version check")
	var ae *aggregate.AlreadyExistsError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "bank.account", ae.Type)
	require.Equal(t, id, ae.ID)
	require.Equal(t, tenant, ae.Tenant)
	require.Equal(t, version, ae.Version)
	var ce *eventstore.ConflictError
	require.ErrorAs(t, err, &ce, "the store's conflict stays reachable")
	require.Contains(t, err.Error(), fmt.Sprintf("bank.account %q", id))
	require.Contains(t, err.Error(), "already exists")
	require.NotContains(t, err.Error(), "no stream", "not reported as a version conflict")
}

// Create, and Save of an aggregate from New, on an existing stream report "already exists"; a conflict of an
// aggregate that was loaded is still a plain conflict.
func TestCreateOfAnExistingAggregateReportsAlreadyExists(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := stagehand.WithTenant(context.Background(), "acme")
		r := repo(t, store, nil)
		_, err := r.Create(ctx, "a", openOrDeposit("ann", 5))
		require.NoError(t, err)

		_, err = r.Create(ctx, "a", openOrDeposit("bob", 1))
		requireAlreadyExists(t, err, "a", "acme", 2)

		fresh := r.New("a")
		require.NoError(t, fresh.Open("bob"))
		requireAlreadyExists(t, r.Save(ctx, fresh), "a", "acme", 2)

		got, err := r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, "ann", got.Owner, "nothing of the refused creates was stored")
		require.Equal(t, int64(2), got.Version())

		stale, err := r.Load(ctx, "a")
		require.NoError(t, err)
		_, err = r.Update(ctx, "a", func(a *Account) error { return a.Deposit(1) })
		require.NoError(t, err)
		require.NoError(t, stale.Deposit(1))
		err = r.Save(ctx, stale)
		require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict)
		require.NotErrorIs(t, err, aggregate.ErrAlreadyExists, "a loaded aggregate that lost is a conflict")

		_, err = r.Create(ctx, "b", func(*Account) error { return ErrInsufficientFunds })
		require.ErrorIs(t, err, ErrInsufficientFunds, "an error from fn is returned as is")
		_, err = r.Load(ctx, "b")
		require.ErrorIs(t, err, aggregate.ErrNotFound)
	})
}

// Update of an aggregate that does not exist returns ErrNotFound without calling fn; Upsert creates it, and
// updates it once it exists.
func TestUpdateOfAMissingAggregateAndUpsert(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		_, err := r.Update(ctx, "a", func(*Account) error {
			t.Error("fn called for a missing aggregate")
			return nil
		})
		require.ErrorIs(t, err, aggregate.ErrNotFound)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)

		var sawVersion []int64
		for i, n := range []int64{10, 5} {
			a, err := r.Upsert(ctx, "a", func(a *Account) error {
				sawVersion = append(sawVersion, a.Version())
				return openOrDeposit("ann", n)(a)
			})
			require.NoError(t, err, "upsert %d", i)
			require.Zero(t, len(a.Changes()))
		}
		require.Equal(t, []int64{0, 2}, sawVersion, "new, then the stored aggregate")
		got, err := r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, "ann", got.Owner)
		require.Equal(t, int64(15), got.Balance)
		require.Equal(t, int64(3), got.Version())

		_, err = r.Upsert(ctx, "quiet", func(*Account) error { return nil })
		require.NoError(t, err, "raising nothing for a new aggregate stores nothing")
		_, err = r.Load(ctx, "quiet")
		require.ErrorIs(t, err, aggregate.ErrNotFound)
		_, err = r.Upsert(ctx, "refused", func(*Account) error { return ErrInsufficientFunds })
		require.ErrorIs(t, err, ErrInsufficientFunds)
	})
}

// Two writers create the same aggregate: the one that loses the race reloads, finds the winner's aggregate and
// applies its change to it.
func TestUpsertLoserAppliesItsChangeToTheWinner(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		calls := 0
		a, err := r.Upsert(ctx, "a", func(a *Account) error {
			calls++
			if calls == 1 { // the winner creates it between this attempt's load and its save
				require.Zero(t, a.Version())
				_, err := r.Create(ctx, "a", openOrDeposit("winner", 100))
				require.NoError(t, err)
			}
			return openOrDeposit("loser", 1)(a)
		})
		require.NoError(t, err)
		require.Equal(t, 2, calls, "one retry after finding the stream created")
		require.Equal(t, "winner", a.Owner)
		require.Equal(t, int64(101), a.Balance)
		require.Equal(t, int64(3), a.StoredVersion())

		// With no retries the loser's conflict is returned, reported as "already exists".
		strict := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: -1})
		_, err = strict.Upsert(ctx, "b", func(a *Account) error {
			if a.Version() == 0 {
				_, err := r.Create(ctx, "b", openOrDeposit("winner", 100))
				require.NoError(t, err)
			}
			return openOrDeposit("loser", 1)(a)
		})
		requireAlreadyExists(t, err, "b", stagehand.NoTenant, 2)
	})
}

// CreateTx creates on the caller's transaction: it commits or rolls back with it, and an existing stream is
// reported as "already exists" with the transaction still usable.
func TestCreateTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	_, err = r.CreateTx(ctx, tx, "a", openOrDeposit("ann", 1))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = r.Load(ctx, "a")
	require.ErrorIs(t, err, aggregate.ErrNotFound, "rolled back with the caller's transaction")

	tx, err = store.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	a, err := r.CreateTx(ctx, tx, "a", openOrDeposit("ann", 1))
	require.NoError(t, err)
	require.Equal(t, int64(2), a.StoredVersion())
	_, err = r.CreateTx(ctx, tx, "a", openOrDeposit("bob", 1))
	requireAlreadyExists(t, err, "a", stagehand.NoTenant, 2)
	_, err = r.CreateTx(ctx, tx, "b", func(*Account) error { return ErrInsufficientFunds })
	require.ErrorIs(t, err, ErrInsufficientFunds)
	_, err = r.UpdateTx(ctx, tx, "a", func(a *Account) error { return a.Deposit(1) })
	require.NoError(t, err, "the transaction is usable after the refused create")
	require.NoError(t, tx.Commit(ctx))
	got, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "ann", got.Owner)
	require.Equal(t, int64(2), got.Balance)

	mem := repo(t, eventstore.NewMemory(nil), nil)
	_, err = mem.CreateTx(ctx, nil, "m", openOrDeposit("x", 1))
	require.ErrorIs(t, err, aggregate.ErrNotTransactional)
	_, err = mem.UpsertTx(ctx, nil, "m", openOrDeposit("x", 1))
	require.Error(t, err)
}

// UpdateTx of a missing aggregate returns ErrNotFound and leaves the transaction usable; UpsertTx creates it on
// the transaction, and updates it once it exists.
func TestUpdateTxOfAMissingAggregateAndUpsertTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)
	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = r.UpdateTx(ctx, tx, "a", func(*Account) error {
		t.Error("fn called for a missing aggregate")
		return nil
	})
	require.ErrorIs(t, err, aggregate.ErrNotFound)
	_, err = r.UpsertTx(ctx, tx, "a", openOrDeposit("ann", 10))
	require.NoError(t, err, "the transaction is usable after ErrNotFound")
	a, err := r.UpsertTx(ctx, tx, "a", openOrDeposit("bob", 5))
	require.NoError(t, err)
	require.Equal(t, "ann", a.Owner, "the second upsert saw the first on the same transaction")
	require.NoError(t, tx.Commit(ctx))
	got, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(15), got.Balance)
	require.Equal(t, int64(3), got.Version())
}

// Two transactions upsert the same new aggregate. The second has loaded (nothing) before the first commits; its
// append then finds the stream. Under READ COMMITTED UpsertTx retries under its savepoint and applies its change
// to the winner's aggregate. Under REPEATABLE READ and SERIALIZABLE it cannot see the winner: it returns a
// concurrency conflict at once with the transaction usable, and a new transaction updates the winner's aggregate.
func TestUpsertTxRace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level pgx.TxIsoLevel
		fixed bool
	}{{pgx.ReadCommitted, false}, {pgx.RepeatableRead, true}, {pgx.Serializable, true}} {
		t.Run(string(c.level), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := postgresStore(t)
			r := repo(t, store, nil)
			side := pgx.Identifier{store.Schema(), "side"}.Sanitize()
			_, err := store.Pool().Exec(ctx, `CREATE TABLE `+side+` (note text)`)
			require.NoError(t, err)

			winner, err := store.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = winner.Rollback(ctx) }()
			_, err = r.UpsertTx(ctx, winner, "a", openOrDeposit("winner", 100))
			require.NoError(t, err)

			loser, err := store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: c.level})
			require.NoError(t, err)
			defer func() { _ = loser.Rollback(ctx) }()
			_, err = loser.Exec(ctx, `INSERT INTO `+side+` VALUES ('before')`)
			require.NoError(t, err)
			loaded := make(chan struct{})
			type outcome struct {
				a     *Account
				err   error
				calls int
			}
			done := make(chan outcome, 1)
			go func() {
				calls := 0
				a, err := r.UpsertTx(ctx, loser, "a", func(a *Account) error {
					calls++
					if calls == 1 {
						if a.Version() != 0 {
							t.Errorf("the loser's first attempt saw version %d, want a new aggregate", a.Version())
						}
						close(loaded)
					}
					return openOrDeposit("loser", 1)(a)
				})
				done <- outcome{a, err, calls}
			}()
			<-loaded
			require.NoError(t, winner.Commit(ctx))
			out := <-done

			if !c.fixed {
				require.NoError(t, out.err)
				require.Equal(t, 2, out.calls, "retried under the savepoint")
				require.Equal(t, "winner", out.a.Owner)
				require.Equal(t, int64(101), out.a.Balance)
			} else {
				require.ErrorIs(t, out.err, eventstore.ErrConcurrencyConflict)
				if c.level == pgx.RepeatableRead { // the unique index reports the stream; SERIALIZABLE may say 40001
					require.ErrorIs(t, out.err, aggregate.ErrAlreadyExists)
				}
				require.Equal(t, 1, out.calls, "no retry inside a fixed snapshot")
				t.Logf("%s returns: %v", c.level, out.err)
				_, err = loser.Exec(ctx, `INSERT INTO `+side+` VALUES ('after')`)
				require.NoError(t, err, "the transaction is usable")
				require.NoError(t, loser.Rollback(ctx))
				again, err := store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: c.level})
				require.NoError(t, err)
				defer func() { _ = again.Rollback(ctx) }()
				_, err = again.Exec(ctx, `INSERT INTO `+side+` VALUES ('before')`)
				require.NoError(t, err)
				loser = again
				out.a, err = r.UpsertTx(ctx, again, "a", openOrDeposit("loser", 1))
				require.NoError(t, err, "a new transaction finds the winner's aggregate")
			}
			require.NoError(t, loser.Commit(ctx))
			got, err := r.Load(ctx, "a")
			require.NoError(t, err)
			require.Equal(t, "winner", got.Owner)
			require.Equal(t, int64(101), got.Balance)
			require.Equal(t, int64(3), got.Version())
			var notes int
			require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+side).Scan(&notes))
			require.Equal(t, 1, notes, "the caller's write before UpsertTx survived")
		})
	}
}

// 16 inbox handlers each create-or-credit one account that does not exist yet, with UpsertTx on the inbox's
// transaction: exactly one creates it, every credit lands once, nothing is dead-lettered or counted as failing.
func TestConcurrentInboxHandlersUpsertOneAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 100})
	o, err := outbox.New(store.Pool(), &outbox.Config{Schema: store.Schema()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	in, err := o.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	var mu sync.Mutex
	creators := 0
	h := in.Handler("credit", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
		var amount int64
		if _, err := fmt.Sscan(string(msg.Payload), &amount); err != nil {
			return outbox.Permanent(err)
		}
		a, err := r.UpsertTx(ctx, tx, "acct", openOrDeposit("ann", amount))
		if err == nil && a.StoredVersion() == 2 {
			mu.Lock()
			creators++
			mu.Unlock()
		}
		return err
	})
	const handlers = 16
	var wg sync.WaitGroup
	for i := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := message.NewMessage(fmt.Sprintf("credit-%d", i), fmt.Appendf(nil, "%d", i+1))
			if err := h(msg); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("handler %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	got, err := r.Load(ctx, "acct")
	require.NoError(t, err)
	require.Equal(t, "ann", got.Owner)
	require.Equal(t, int64(handlers*(handlers+1)/2), got.Balance, "every credit applied once")
	require.Equal(t, int64(handlers+1), got.Version(), "opened once")
	require.Equal(t, 1, creators, "exactly one handler created it")
	st, err := o.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.DeadLettered)
	require.Zero(t, st.Failing)
	require.Equal(t, int64(handlers), st.Handled)
}
