package aggregate_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

// A repository over the in-memory store: open an account, deposit, and see a concurrent writer rejected.
func Example() {
	ctx := stagehand.WithTenant(context.Background(), "acme")
	reg := newRegistry() // RegisterAggregate + RegisterEvent with stable names
	repo, err := aggregate.NewRepository[*Account](eventstore.NewMemory(nil), reg, nil)
	if err != nil {
		panic(err)
	}

	acct := repo.New("acct-1")
	_ = acct.Open("ann")
	_ = acct.Deposit(100)
	if err := repo.Save(ctx, acct); err != nil {
		panic(err)
	}

	a, _ := repo.Load(ctx, "acct-1")
	b, _ := repo.Load(ctx, "acct-1")
	_ = a.Withdraw(70)
	_ = b.Withdraw(70)
	fmt.Println("first save:", repo.Save(ctx, a))
	err = repo.Save(ctx, b)
	fmt.Println("second save conflicts:", errors.Is(err, eventstore.ErrConcurrencyConflict))

	// Update reloads and retries on conflicts; the invariant holds on the fresh state.
	_, err = repo.Update(ctx, "acct-1", func(a *Account) error { return a.Withdraw(70) })
	fmt.Println("overdraft refused:", errors.Is(err, ErrInsufficientFunds))

	final, _ := repo.Load(ctx, "acct-1")
	fmt.Println("balance:", final.Balance, "version:", final.Version())
	// Output:
	// first save: <nil>
	// second save conflicts: true
	// overdraft refused: true
	// balance: 30 version: 3
}
