package main

import (
	"errors"
	"time"

	"github.com/stagehand-es/stagehand/aggregate"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/staging"
)

// Integration messages: the public contract other services consume, kept apart from the domain events so either
// can change without the other.
const (
	TopicLoans     = "library.loans"
	TopicReminders = "library.reminders"

	TypeLoanOpened   = "library.v1.LoanOpened"
	TypeLoanReturned = "library.v1.LoanReturned"
	TypeLoanDue      = "library.v1.LoanDue"
)

type (
	LoanOpenedV1 struct {
		Loan   string    `json:"loan"`
		Member string    `json:"member"`
		Book   string    `json:"book"`
		Due    time.Time `json:"due"`
	}
	LoanReturnedV1 struct {
		Loan   string `json:"loan"`
		Member string `json:"member"`
	}
	LoanDueV1 struct {
		Loan   string `json:"loan"`
		Member string `json:"member"`
	}
)

// newMapping derives the messages of each loan event. A LoanOpened stages two: the news now, and a reminder
// scheduled for the due date (the relay publishes it when it falls due). Each mapping declares the message types it
// produces, so Open can check that a handler exists for each.
func newMapping(reg *aggregate.Registry) (*staging.Mapping, error) {
	m := staging.NewMapping(reg)
	err := errors.Join(
		staging.Map(m, "loan-opened", func(src eventstore.Record, e LoanOpened) ([]staging.Message, error) {
			return []staging.Message{
				{Topic: TopicLoans, Type: TypeLoanOpened,
					Payload: LoanOpenedV1{Loan: src.StreamID, Member: e.Member, Book: e.Book, Due: e.Due}},
				{Topic: TopicReminders, Type: TypeLoanDue, ScheduledAt: e.Due,
					Payload: LoanDueV1{Loan: src.StreamID, Member: e.Member}},
			}, nil
		}, staging.MessageTypes(TypeLoanOpened, TypeLoanDue)),
		staging.Map(m, "loan-returned", func(src eventstore.Record, e LoanReturned) ([]staging.Message, error) {
			return []staging.Message{{Topic: TopicLoans, Type: TypeLoanReturned,
				Payload: LoanReturnedV1{Loan: src.StreamID, Member: e.Member}}}, nil
		}, staging.MessageTypes(TypeLoanReturned)),
	)
	return m, err
}
