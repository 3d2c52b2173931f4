package aggregate_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand/aggregate"
)

// Account is the test aggregate: a bank account whose balance may not go negative.
type Account struct {
	aggregate.Root
	Owner   string
	Balance int64
	applied int // how many events Apply saw, to tell a snapshot load from a full replay
}

type Opened struct{ Owner string }
type Deposited struct{ Amount int64 }
type Withdrawn struct{ Amount int64 }

var ErrInsufficientFunds = errors.New("insufficient funds")

func NewAccount(id string) *Account { return &Account{Root: aggregate.NewRoot(id)} }

func (a *Account) Open(owner string) error {
	if a.Version() > 0 {
		return errors.New("already open")
	}
	aggregate.Raise(a, Opened{Owner: owner})
	return nil
}

func (a *Account) Deposit(n int64) error {
	if n <= 0 {
		return fmt.Errorf("deposit must be positive, got %d", n)
	}
	aggregate.Raise(a, Deposited{Amount: n})
	return nil
}

func (a *Account) Withdraw(n int64) error {
	if n > a.Balance {
		return fmt.Errorf("withdraw %d from %d: %w", n, a.Balance, ErrInsufficientFunds)
	}
	aggregate.Raise(a, Withdrawn{Amount: n})
	return nil
}

func (a *Account) Apply(event any) {
	a.applied++
	switch e := event.(type) {
	case Opened:
		a.Owner = e.Owner
	case Deposited:
		a.Balance += e.Amount
	case Withdrawn:
		a.Balance -= e.Amount
	}
}

type accountState struct {
	Owner   string
	Balance int64
}

func (a *Account) MarshalSnapshot() ([]byte, error) {
	return json.Marshal(accountState{a.Owner, a.Balance})
}

func (a *Account) UnmarshalSnapshot(data []byte) error {
	var s accountState
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	a.Owner, a.Balance = s.Owner, s.Balance
	return nil
}

func newRegistry() *aggregate.Registry {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "bank.account", NewAccount)
	_ = aggregate.RegisterEvent[Opened](reg, "bank.account.opened")
	_ = aggregate.RegisterEvent[Deposited](reg, "bank.account.deposited")
	_ = aggregate.RegisterEvent[Withdrawn](reg, "bank.account.withdrawn")
	return reg
}
