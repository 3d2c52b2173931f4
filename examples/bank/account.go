package main

import (
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand/aggregate"
)

// Account is a bank account whose balance never goes below zero.
type Account struct {
	aggregate.Root
	Owner   string
	Balance int64
	Open    bool
}

// Events, stored under the stable names registered in newRegistry.
type (
	Opened    struct{ Owner string }
	Deposited struct{ Amount int64 }
	Withdrawn struct{ Amount int64 }
)

// ErrInsufficientFunds is the invariant: a withdrawal may not overdraw the account.
var ErrInsufficientFunds = errors.New("insufficient funds")

// NewAccount is the constructor the registry uses.
func NewAccount(id string) *Account { return &Account{Root: aggregate.NewRoot(id)} }

// OpenFor opens the account.
func (a *Account) OpenFor(owner string) error {
	if a.Open {
		return errors.New("account already open")
	}
	aggregate.Raise(a, Opened{Owner: owner})
	return nil
}

// Deposit adds money.
func (a *Account) Deposit(amount int64) error {
	if !a.Open || amount <= 0 {
		return fmt.Errorf("cannot deposit %d", amount)
	}
	aggregate.Raise(a, Deposited{Amount: amount})
	return nil
}

// Withdraw takes money out if the balance allows it.
func (a *Account) Withdraw(amount int64) error {
	if amount > a.Balance {
		return fmt.Errorf("withdraw %d with balance %d: %w", amount, a.Balance, ErrInsufficientFunds)
	}
	aggregate.Raise(a, Withdrawn{Amount: amount})
	return nil
}

// Apply changes state from an event; the same method replays history on load.
func (a *Account) Apply(event any) {
	switch e := event.(type) {
	case Opened:
		a.Owner, a.Open = e.Owner, true
	case Deposited:
		a.Balance += e.Amount
	case Withdrawn:
		a.Balance -= e.Amount
	}
}

func newRegistry() *aggregate.Registry {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "bank.account", NewAccount)
	_ = aggregate.RegisterEvent[Opened](reg, "bank.account.opened")
	_ = aggregate.RegisterEvent[Deposited](reg, "bank.account.deposited")
	_ = aggregate.RegisterEvent[Withdrawn](reg, "bank.account.withdrawn")
	return reg // registration errors surface in NewRepository
}
