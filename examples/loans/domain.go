package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/stagehand-es/stagehand/aggregate"
)

// ErrLoanLimit refuses a fourth book to a member who has three on loan.
var ErrLoanLimit = errors.New("loans: a member borrows at most 3 books at once")

// A Loan is one book lent to one member until it comes back.
type Loan struct {
	aggregate.Root
	Member, Book string
	Due          time.Time
	Returned     bool
}

// Domain events: what happened to a loan. They are stored, replayed on load, and never change meaning.
type (
	LoanOpened struct {
		Member string    `json:"member"`
		Book   string    `json:"book"`
		Due    time.Time `json:"due"`
	}
	LoanReturned struct {
		Member string `json:"member"`
	}
)

func NewLoan(id string) *Loan { return &Loan{Root: aggregate.NewRoot(id)} }

// Open lends book to member until due.
func (l *Loan) Open(member, book string, due time.Time) error {
	if l.Member != "" {
		return fmt.Errorf("loans: loan %s is already open", l.ID())
	}
	aggregate.Raise(l, LoanOpened{Member: member, Book: book, Due: due.UTC()})
	return nil
}

// Return closes the loan; returning it twice changes nothing.
func (l *Loan) Return() error {
	if !l.Returned {
		aggregate.Raise(l, LoanReturned{Member: l.Member})
	}
	return nil
}

func (l *Loan) Apply(e any) {
	switch e := e.(type) {
	case LoanOpened:
		l.Member, l.Book, l.Due = e.Member, e.Book, e.Due
	case LoanReturned:
		l.Returned = true
	}
}

// A Member is created by the first loan it takes (the members handler below), and counts what it has on loan.
type Member struct {
	aggregate.Root
	OnLoan []string // loan IDs
}

type (
	BookBorrowed struct {
		Loan string `json:"loan"`
	}
	BookGivenBack struct {
		Loan string `json:"loan"`
	}
)

func NewMember(id string) *Member { return &Member{Root: aggregate.NewRoot(id)} }

// Borrow records a loan; a loan already recorded changes nothing (a message handled twice, say).
func (m *Member) Borrow(loan string) error {
	for _, l := range m.OnLoan {
		if l == loan {
			return nil
		}
	}
	if len(m.OnLoan) >= 3 {
		return ErrLoanLimit
	}
	aggregate.Raise(m, BookBorrowed{Loan: loan})
	return nil
}

// GiveBack records a returned loan.
func (m *Member) GiveBack(loan string) error {
	for _, l := range m.OnLoan {
		if l == loan {
			aggregate.Raise(m, BookGivenBack{Loan: loan})
			return nil
		}
	}
	return nil
}

func (m *Member) Apply(e any) {
	switch e := e.(type) {
	case BookBorrowed:
		m.OnLoan = append(m.OnLoan, e.Loan)
	case BookGivenBack:
		for i, l := range m.OnLoan {
			if l == e.Loan {
				m.OnLoan = append(m.OnLoan[:i], m.OnLoan[i+1:]...)
				break
			}
		}
	}
}

// newRegistry names every aggregate and event: stored names, never Go type names.
func newRegistry() (*aggregate.Registry, error) {
	reg := aggregate.NewRegistry(nil)
	err := errors.Join(
		aggregate.RegisterAggregate(reg, "library.loan", NewLoan),
		aggregate.RegisterEvent[LoanOpened](reg, "library.loan.opened"),
		aggregate.RegisterEvent[LoanReturned](reg, "library.loan.returned"),
		aggregate.RegisterAggregate(reg, "library.member", NewMember),
		aggregate.RegisterEvent[BookBorrowed](reg, "library.member.borrowed"),
		aggregate.RegisterEvent[BookGivenBack](reg, "library.member.given-back"),
	)
	return reg, err
}
