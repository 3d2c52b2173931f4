package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/projection"
)

// tables are the example's own tables, quoted and qualified with the schema: the consumers' effects (invoices,
// notifications) and the projection's read model (order_board).
type tables struct {
	invoices, notifications, orderBoard string
}

func newTables(schema string) tables {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return tables{invoices: q("invoices"), notifications: q("notifications"), orderBoard: q("order_board")}
}

// create creates the tables if they do not exist. stagehand.Migrate creates stagehand's tables; an application's
// own tables are its business (a migration tool in a real service).
//
// Neither invoices nor notifications has a unique key on the order or the message: a message handled twice would
// leave a second row, which the summary would show. The inbox is what prevents it.
func (t tables) create(ctx context.Context, pool *pgxpool.Pool) error {
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS ` + t.invoices + ` (
			invoice_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			order_id   text NOT NULL,
			customer   text NOT NULL,
			amount     bigint NOT NULL,
			issued_at  timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE IF NOT EXISTS ` + t.notifications + ` (
			notification_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			order_id   text NOT NULL,
			kind       text NOT NULL,
			message_id text NOT NULL,
			sent_at    timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE IF NOT EXISTS ` + t.orderBoard + ` (
			order_id   text PRIMARY KEY,
			customer   text NOT NULL,
			total      bigint NOT NULL,
			placed_at  timestamptz NOT NULL,
			paid       bigint,
			paid_at    timestamptz,
			shipped_at timestamptz)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
	}
	return nil
}

// ProjectionName names the projection's checkpoint and lease: one process at a time applies it.
const ProjectionName = "order-board"

// newOrderBoard is the projection that keeps order_board, one row per order with where it stands, from the events
// of both aggregates. Each handler writes through the projection's transaction, which also advances its
// checkpoint: every event is applied exactly once.
func newOrderBoard(pool *pgxpool.Pool, store eventstore.Store, reg *aggregate.Registry, t tables, schema string,
	logger *slog.Logger) (*projection.Projection, error) {
	mux := projection.NewMux(reg)
	placed := projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+t.orderBoard+` (order_id, customer, total, placed_at)
			VALUES ($1, $2, $3, $4)`, e.StreamID, d.Customer, d.Total, e.OccurredAt)
		return err
	})
	paid := projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d PaymentCaptured) error {
		tag, err := tx.Exec(ctx, `UPDATE `+t.orderBoard+` SET paid = $2, paid_at = $3 WHERE order_id = $1`,
			d.OrderID, d.Amount, e.OccurredAt)
		if err == nil && tag.RowsAffected() == 0 {
			err = fmt.Errorf("payment %s for unknown order %s", e.StreamID, d.OrderID)
		}
		return err
	})
	shipped := projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d OrderShipped) error {
		tag, err := tx.Exec(ctx, `UPDATE `+t.orderBoard+` SET shipped_at = $2 WHERE order_id = $1`,
			e.StreamID, e.OccurredAt)
		if err == nil && tag.RowsAffected() == 0 {
			err = fmt.Errorf("shipment of unknown order %s", e.StreamID)
		}
		return err
	})
	if err := errors.Join(placed, paid, shipped); err != nil {
		return nil, fmt.Errorf("projection: %w", err)
	}
	mux.OnReset(func(ctx context.Context, tx pgx.Tx) error { // a rebuild starts from an empty board
		_, err := tx.Exec(ctx, `TRUNCATE `+t.orderBoard)
		return err
	})
	p, err := projection.New(pool, store, mux, &projection.Config{
		Name:        ProjectionName,
		Schema:      schema,
		StreamTypes: []string{OrderType, PaymentType},
		EventTypes:  []string{"shop.order.placed", "shop.payment.captured", "shop.order.shipped"},
		Logger:      logger,
	})
	if err != nil {
		return nil, fmt.Errorf("projection: %w", err)
	}
	return p, nil
}
