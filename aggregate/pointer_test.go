package aggregate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

// Registering a pointer event type is refused, naming the value type to register instead.
func TestPointerEventTypeIsRefusedAtRegistration(t *testing.T) {
	t.Parallel()
	reg := aggregate.NewRegistry(nil)
	err := aggregate.RegisterEvent[*Deposited](reg, "bank.account.deposited")
	require.ErrorIs(t, err, aggregate.ErrRegistration)
	require.ErrorContains(t, err, "*aggregate_test.Deposited")
	require.ErrorContains(t, err, "RegisterEvent[aggregate_test.Deposited]")
	require.ErrorIs(t, reg.Err(), aggregate.ErrRegistration, "remembered, so repositories refuse the registry")
}

// The footgun: Account.Apply handles Deposited values, and a command raises &Deposited{}. Apply ignores it, so the
// in-memory balance misses the deposit; saving it would store an event that a later Load applies. Every save path
// refuses it, naming the type, before anything is written; Update does not retry it.
func TestPointerEventIsRefusedBeforeAnythingIsWritten(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		requirePointerError := func(t *testing.T, err error) {
			t.Helper()
			require.ErrorIs(t, err, aggregate.ErrPointerEvent)
			require.ErrorContains(t, err, "*aggregate_test.Deposited")
			require.ErrorContains(t, err, "raise aggregate_test.Deposited values")
			require.ErrorContains(t, err, `bank.account "a"`)
		}

		a := r.New("a")
		require.NoError(t, a.Open("ann"))
		aggregate.Raise(a, &Deposited{Amount: 50})
		requirePointerError(t, r.Save(ctx, a))
		require.ErrorContains(t, r.Save(ctx, a), "change 2 of 2")
		_, err := r.Load(ctx, "a")
		require.ErrorIs(t, err, aggregate.ErrNotFound, "nothing was written")

		_, err = r.Create(ctx, "a", func(a *Account) error {
			aggregate.Raise(a, &Opened{Owner: "ann"})
			return nil
		})
		require.ErrorIs(t, err, aggregate.ErrPointerEvent)
		_, err = r.Create(ctx, "a", func(a *Account) error { return a.Open("ann") })
		require.NoError(t, err)

		calls := 0
		_, err = r.Update(ctx, "a", func(a *Account) error {
			calls++
			aggregate.Raise(a, &Deposited{Amount: 50})
			return nil
		})
		requirePointerError(t, err)
		require.Equal(t, 1, calls, "not a conflict: no retry")
		_, err = r.Upsert(ctx, "a", func(a *Account) error {
			aggregate.Raise(a, (*Deposited)(nil))
			return nil
		})
		require.ErrorIs(t, err, aggregate.ErrPointerEvent, "a nil pointer is refused too, without a panic")
		got, err := r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, int64(1), got.Version(), "only the value-raised Opened was stored")
		require.Zero(t, got.Balance)
	})
}

func TestPointerEventIsRefusedBySaveTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)
	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = r.CreateTx(ctx, tx, "a", func(a *Account) error {
		aggregate.Raise(a, &Opened{Owner: "ann"})
		return nil
	})
	require.ErrorIs(t, err, aggregate.ErrPointerEvent)
	_, err = r.CreateTx(ctx, tx, "a", func(a *Account) error { return a.Open("ann") })
	require.NoError(t, err, "nothing was written and the transaction is usable")
	_, err = r.UpdateTx(ctx, tx, "a", func(a *Account) error {
		aggregate.Raise(a, &Deposited{Amount: 1})
		return nil
	})
	require.ErrorIs(t, err, aggregate.ErrPointerEvent)
	require.NoError(t, tx.Commit(ctx))
	got, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(1), got.Version())
}

// Encoding a nil event pointer is an error, not a panic.
func TestEncodeOfANilEventPointerIsAnError(t *testing.T) {
	t.Parallel()
	_, _, _, err := newRegistry().Encode((*Deposited)(nil))
	require.ErrorContains(t, err, "nil *aggregate_test.Deposited")
	_, _, _, err = newRegistry().Encode(nil)
	require.ErrorIs(t, err, aggregate.ErrUnregisteredEvent)
}
