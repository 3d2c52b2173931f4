package aggregate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/outbox"
)

// 16 inbox handlers credit one account concurrently through UpdateTx, in the inbox's transaction: every credit is
// applied exactly once (a redelivery of each message changes nothing), no message is dead-lettered or counted as
// failing for a conflict. With UpdateTx's own retries, conflicts are absorbed inside the transaction; without them
// (UpdateRetries -1) they escape to the inbox, which reruns the handler as contention without counting an attempt
// (MaxAttempts 1 would dead-letter on the first counted failure).
func TestConcurrentInboxHandlersUpdateOneAggregate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		retries int
	}{{"UpdateTx retries", 0}, {"inbox reruns", -1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := postgresStore(t)
			r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: c.retries, SnapshotEvery: 5})
			if c.retries == 0 {
				r = repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 100, SnapshotEvery: 5})
			}
			openAccount(t, r, "acct", 0)
			o, err := outbox.New(store.Pool(), &outbox.Config{Schema: store.Schema()})
			require.NoError(t, err)
			t.Cleanup(func() { _ = o.Close() })
			in, err := o.NewInbox(&outbox.InboxConfig{MaxAttempts: 1, ContentionRetries: 1000})
			require.NoError(t, err)
			h := in.Handler("credit", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
				msg *message.Message) error {
				var amount int64
				if _, err := fmt.Sscan(string(msg.Payload), &amount); err != nil {
					return outbox.Permanent(err)
				}
				_, err := r.UpdateTx(ctx, tx, "acct", func(a *Account) error { return a.Deposit(amount) })
				return err
			})

			const handlers = 16
			var wg sync.WaitGroup
			for round := range 2 { // the second round redelivers every message
				for i := range handlers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						msg := message.NewMessage(fmt.Sprintf("credit-%d", i), fmt.Appendf(nil, "%d", i+1))
						if err := h(msg); err != nil {
							t.Errorf("round %d, handler %d: %v", round, i, err)
						}
					}()
				}
				wg.Wait()
			}
			got, err := r.Load(ctx, "acct")
			require.NoError(t, err)
			require.Equal(t, int64(handlers*(handlers+1)/2), got.Balance, "every credit applied once")
			require.Equal(t, int64(handlers+1), got.Version())
			st, err := o.AllTenants().InboxStats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.DeadLettered, "nothing dead-lettered")
			require.Zero(t, st.Failing, "no attempt counted for a conflict")
			require.Equal(t, int64(handlers), st.Handled)
		})
	}
}

// UpdateTx retries a conflict under a savepoint: the caller's earlier writes on the transaction survive the
// retry, the retry sees the concurrent writer's committed change, and an error from fn rolls back only its attempt.
func TestUpdateTxRetriesUnderASavepoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)
	openAccount(t, r, "a", 0)
	side := pgx.Identifier{store.Schema(), "side"}.Sanitize()
	_, err := store.Pool().Exec(ctx, `CREATE TABLE `+side+` (note text)`)
	require.NoError(t, err)

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+side+` VALUES ('before')`)
	require.NoError(t, err)
	calls := 0
	got, err := r.UpdateTx(ctx, tx, "a", func(a *Account) error {
		calls++
		if calls == 1 { // a concurrent writer commits first
			_, err := r.Update(ctx, "a", func(a *Account) error { return a.Deposit(100) })
			require.NoError(t, err)
		}
		return a.Deposit(1)
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "retried once after the conflict")
	require.Equal(t, int64(101), got.Balance, "the retry saw the concurrent deposit")

	_, err = r.UpdateTx(ctx, tx, "a", func(a *Account) error {
		require.NoError(t, a.Deposit(5))
		return a.Withdraw(1000) // fails: the attempt is rolled back
	})
	require.ErrorIs(t, err, ErrInsufficientFunds)
	require.NoError(t, tx.Commit(ctx))

	final, err := r.Load(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(101), final.Balance)
	require.Equal(t, int64(3), final.Version())
	var notes int
	require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+side).Scan(&notes))
	require.Equal(t, 1, notes, "the caller's write before UpdateTx survived its retry")
}
