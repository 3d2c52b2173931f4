package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Broker is where the relay publishes and the handlers subscribe: Watermill's gochannel here, Kafka, NATS or AMQP
// in production.
type Broker interface {
	message.Publisher
	message.Subscriber
}

// Library is the service: loans saved with their messages, a relay publishing them, inbox handlers consuming them,
// and a read model of the open loans.
type Library struct {
	schema  string
	logger  *slog.Logger
	broker  Broker
	store   *eventstore.PostgresStore
	outbox  *outbox.Outbox
	loans   *aggregate.Repository[*Loan]
	members *aggregate.Repository[*Member]
	relay   *outbox.Relay
	inbox   *outbox.Inbox
	view    *projection.Projection

	memberHandlers, reminderHandlers *outbox.Handlers
}

// Open wires the service on pool, whose search_path is schema (stagehand's tables and the read model live there):
// nothing starts until Run. A nil logger logs nothing.
func Open(pool *pgxpool.Pool, schema string, broker Broker, logger *slog.Logger) (*Library, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg, err := newRegistry()
	if err != nil {
		return nil, err
	}
	mapping, err := newMapping(reg)
	if err != nil {
		return nil, err
	}
	l := &Library{schema: schema, logger: logger, broker: broker}
	if l.store, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema}); err != nil {
		return nil, err
	}
	if l.outbox, err = outbox.New(pool, &outbox.Config{Schema: schema, Logger: logger}); err != nil {
		return nil, err
	}
	// Transactional: a loan's events and its messages commit together, or neither does.
	stager, err := staging.New(l.store, &staging.Config{Outbox: l.outbox, Mapping: mapping,
		Strategy: staging.Transactional})
	if err != nil {
		return nil, err
	}
	repoCfg := &aggregate.RepositoryConfig{Stager: stager}
	if l.loans, err = aggregate.NewRepository[*Loan](l.store, reg, repoCfg); err != nil {
		return nil, err
	}
	if l.members, err = aggregate.NewRepository[*Member](l.store, reg, repoCfg); err != nil {
		return nil, err
	}
	if l.relay, err = l.outbox.NewRelay(nil); err != nil {
		return nil, err
	}
	if l.inbox, err = l.outbox.NewInbox(nil); err != nil {
		return nil, err
	}
	if l.view, err = projection.New(pool, l.store, l.openLoansView(reg), &projection.Config{
		Name: "open_loans", Schema: schema, Logger: logger}); err != nil {
		return nil, err
	}
	// Every message type the mapping stages has a handler here: checked now rather than found as dead letters.
	l.memberHandlers, l.reminderHandlers = l.newMemberHandlers(), l.newReminderHandlers()
	if err := staging.CheckHandled(mapping, l.memberHandlers, l.reminderHandlers); err != nil {
		return nil, err
	}
	return l, nil
}

// PoolSize is the connections the service's pool must hold (stagehand.PoolSize): one relay subscription, one
// projection, inbox handler runs up to the relay's MaxDegreeOfParallelism (4: gochannel hands the handlers what the
// relay publishes, one message per publish), and up to four Lend or Return calls at once.
func PoolSize() int {
	return stagehand.PoolSize(stagehand.PoolUse{RelaySubscriptions: 1, Followers: 1, InboxHandlers: 4, Other: 4})
}

// Lend opens a loan of book to member, due at due, and returns its ID.
func (l *Library) Lend(ctx context.Context, member, book string, due time.Time) (string, error) {
	id := "loan-" + uuid.NewString()
	_, err := l.loans.Create(ctx, id, func(loan *Loan) error { return loan.Open(member, book, due) })
	return id, err
}

// Return closes a loan.
func (l *Library) Return(ctx context.Context, loan string) error {
	_, err := l.loans.Update(ctx, loan, func(loan *Loan) error { return loan.Return() })
	return err
}

// Run runs the relay, the handlers and the projection until ctx ends, then stops them in order.
func (l *Library) Run(ctx context.Context) error {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NewSlogLogger(l.logger))
	if err != nil {
		return err
	}
	l.relay.AddToRouter(router, l.broker, nil)
	router.AddConsumerHandler("members", TopicLoans, l.broker,
		l.inbox.Handler("members", l.memberHandlers.Func()))
	router.AddConsumerHandler("reminders", TopicReminders, l.broker,
		l.inbox.Handler("reminders", l.reminderHandlers.Func()))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); defer cancel(); errs <- router.Run(ctx) }()
	go func() { defer wg.Done(); defer cancel(); errs <- l.view.Run(ctx) }()
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// Close releases what Open made, after Run has returned. The pool is the caller's: close it after this.
func (l *Library) Close() {
	_ = l.relay.Close()
	_ = l.outbox.Close()
	l.store.Close()
}

// newMemberHandlers keep each member's loans: the first loan creates the member.
func (l *Library) newMemberHandlers() *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false)
	outbox.Handle(hs, TypeLoanOpened, func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		_ *message.Message, m LoanOpenedV1) error {
		// The member's first loan creates it: UpsertTx loads it through tx, or starts from NewMember.
		_, err := l.members.UpsertTx(ctx, tx, m.Member, func(mem *Member) error { return mem.Borrow(m.Loan) })
		return err
	})
	outbox.Handle(hs, TypeLoanReturned, func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		_ *message.Message, m LoanReturnedV1) error {
		_, err := l.members.UpdateTx(ctx, tx, m.Member, func(mem *Member) error { return mem.GiveBack(m.Loan) })
		return err
	})
	return hs
}

// newReminderHandlers write a reminder for a loan that is due and still open.
func (l *Library) newReminderHandlers() *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false)
	outbox.Handle(hs, TypeLoanDue, func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		_ *message.Message, m LoanDueV1) error {
		loan, err := l.loans.LoadTx(ctx, tx, m.Loan)
		if err != nil || loan.Returned {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO reminders (loan_id, member_id) VALUES ($1, $2)`, m.Loan, m.Member)
		return err
	})
	return hs
}

// openLoansView is the read model: one row per open loan.
func (l *Library) openLoansView(reg *aggregate.Registry) *projection.Mux {
	mux := projection.NewMux(reg)
	projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d LoanOpened) error {
		_, err := tx.Exec(ctx, `INSERT INTO open_loans (loan_id, member_id, book, due) VALUES ($1, $2, $3, $4)`,
			e.StreamID, d.Member, d.Book, d.Due)
		return err
	})
	projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, _ LoanReturned) error {
		_, err := tx.Exec(ctx, `DELETE FROM open_loans WHERE loan_id = $1`, e.StreamID)
		return err
	})
	mux.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE open_loans`)
		return err
	})
	return mux
}

// createReadModel creates the service's own tables (a migration of yours, beside stagehand.Migrate).
func createReadModel(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS open_loans (loan_id text PRIMARY KEY, member_id text NOT NULL,
			book text NOT NULL, due timestamptz NOT NULL);
		CREATE TABLE IF NOT EXISTS reminders (loan_id text PRIMARY KEY, member_id text NOT NULL)`)
	if err != nil {
		return fmt.Errorf("read model: %w", err)
	}
	return nil
}

// OpenLoan is a row of the read model.
type OpenLoan struct {
	Loan, Member, Book string
	Due                time.Time
}

// OpenLoans reads the read model.
func (l *Library) OpenLoans(ctx context.Context) ([]OpenLoan, error) {
	rows, err := l.store.Pool().Query(ctx, `SELECT loan_id, member_id, book, due FROM open_loans ORDER BY member_id, book`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenLoan, error) {
		var o OpenLoan
		err := r.Scan(&o.Loan, &o.Member, &o.Book, &o.Due)
		return o, err
	})
}

// Reminded lists the members reminded of a loan.
func (l *Library) Reminded(ctx context.Context) ([]string, error) {
	rows, err := l.store.Pool().Query(ctx, `SELECT member_id FROM reminders ORDER BY member_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// settled reports whether the read model holds open loans and the reminders table reminders rows.
func (l *Library) settled(ctx context.Context, open, reminders int) (bool, error) {
	var o, r int
	err := l.store.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM open_loans), (SELECT count(*) FROM reminders)`).
		Scan(&o, &r)
	return o == open && r == reminders, err
}
