package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/outbox"
)

// The consumers: three services' handlers, each behind the inbox, so each message changes their state at most
// once however often the broker delivers it. Everything a handler writes goes through tx, the inbox's
// transaction; messages it produces are staged with out in that same transaction (never returned to the router,
// which would publish them after the commit, where a failure would be lost).

// billing issues an invoice for each order placed, and announces it: the follow-up message is staged in the
// outbox in the inbox transaction, and the relay publishes it like any other.
func billing(t tables) *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false) // JSON payloads; a type nobody handles is dead-lettered
	outbox.Handle(hs, MsgOrderPlaced, func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message, m OrderPlacedMessage) error {
		var invoiceID int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+t.invoices+` (order_id, customer, amount) VALUES ($1, $2, $3)
			RETURNING invoice_id`, m.OrderID, m.Customer, m.Total).Scan(&invoiceID); err != nil {
			return fmt.Errorf("billing: invoice %s: %w", m.OrderID, err)
		}
		payload, err := json.Marshal(InvoiceIssuedMessage{InvoiceID: invoiceID, OrderID: m.OrderID,
			Customer: m.Customer, Amount: m.Total})
		if err != nil {
			return outbox.Permanent(fmt.Errorf("billing: encode invoice: %w", err))
		}
		followUp := message.NewMessage(watermill.NewUUID(), payload)
		followUp.Metadata.Set(stagehand.HeaderMessageType, MsgInvoiceIssued)
		followUp.Metadata.Set(outbox.HeaderPartitionKey, m.OrderID) // in order with the order's other messages
		followUp.Metadata.Set(HeaderOrderID, m.OrderID)
		followUp.Metadata.Set(stagehand.HeaderOccurredAt, time.Now().UTC().Format(time.RFC3339Nano))
		return out.Publish(TopicInvoices, followUp) // staged in tx: commits with the invoice, or not at all
	})
	return hs
}

// warehouse ships each order once its payment is captured. It changes the Order aggregate inside the inbox
// transaction with UpdateTx (load, decide and save on tx, a concurrent change of the order retried under a
// savepoint), through the shipping repository, whose strategy is Deferred: the event commits with the inbox entry,
// and the Deferred stager, following the log, stages its OrderShipped message.
func warehouse(shipping *aggregate.Repository[*Order]) *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false)
	outbox.Handle(hs, MsgPaymentCaptured, func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message, m PaymentCapturedMessage) error {
		// ctx carries the message's tenant.
		_, err := shipping.UpdateTx(ctx, tx, m.OrderID, func(order *Order) error {
			if err := order.Ship(m.PaymentID, m.Amount, carrierFor(m.OrderID)); err != nil {
				// An invariant refused: retrying cannot change that, so the inbox dead-letters it at once.
				return outbox.Permanent(fmt.Errorf("warehouse: ship %s: %w", m.OrderID, err))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("warehouse: %s: %w", m.OrderID, err)
		}
		return nil
	})
	return hs
}

// notifier tells the customer about invoices and shipments (here: a row per notification sent).
func notifier(t tables) *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false)
	notify := func(ctx context.Context, tx pgx.Tx, orderID, kind, messageID string) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+t.notifications+` (order_id, kind, message_id) VALUES ($1, $2, $3)`,
			orderID, kind, messageID)
		if err != nil {
			return fmt.Errorf("notifier: %s %s: %w", kind, orderID, err)
		}
		return nil
	}
	outbox.Handle(hs, MsgInvoiceIssued, func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message, m InvoiceIssuedMessage) error {
		return notify(ctx, tx, m.OrderID, "invoice", msg.UUID)
	})
	outbox.Handle(hs, MsgOrderShipped, func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message, m OrderShippedMessage) error {
		return notify(ctx, tx, m.OrderID, "shipment", msg.UUID)
	})
	return hs
}

func carrierFor(orderID string) string {
	carriers := []string{"post", "courier", "freight"}
	return carriers[int(orderID[len(orderID)-1])%len(carriers)] // by the last digit
}
