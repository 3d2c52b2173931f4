package main

import (
	"fmt"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/staging"
)

// Integration messages: the contract other services consume, versioned apart from the domain events so the domain
// can change without breaking consumers.

// Topics at the broker; each is one JetStream stream.
const (
	TopicOrders    = "shop-orders"
	TopicPayments  = "shop-payments"
	TopicInvoices  = "shop-invoices"
	TopicShipments = "shop-shipments"
)

// subscriptions are which consumer group reads which topic (see consumers.go).
var subscriptions = []subscription{
	{TopicOrders, "billing"},
	{TopicPayments, "warehouse"},
	{TopicInvoices, "notifier"},
	{TopicShipments, "notifier"},
}

// Stable message type names: consumers route on them (outbox.Handlers), never on Go type names.
const (
	MsgOrderPlaced     = "shop.v1.OrderPlaced"
	MsgPaymentCaptured = "shop.v1.PaymentCaptured"
	MsgInvoiceIssued   = "shop.v1.InvoiceIssued"
	MsgOrderShipped    = "shop.v1.OrderShipped"
)

// HeaderOrderID carries the order a message is about, on every message (for tracing, and for this example's
// counters, which count only the orders of their own run).
const HeaderOrderID = "order-id"

type (
	OrderPlacedMessage struct {
		OrderID  string `json:"order_id"`
		Customer string `json:"customer"`
		Total    int64  `json:"total"`
	}
	PaymentCapturedMessage struct {
		PaymentID string `json:"payment_id"`
		OrderID   string `json:"order_id"`
		Amount    int64  `json:"amount"`
	}
	InvoiceIssuedMessage struct {
		InvoiceID int64  `json:"invoice_id"`
		OrderID   string `json:"order_id"`
		Customer  string `json:"customer"`
		Amount    int64  `json:"amount"`
	}
	OrderShippedMessage struct {
		OrderID string `json:"order_id"`
		Carrier string `json:"carrier"`
	}
)

// mappings derive the integration messages from the domain events: one Mapping per repository, so the worker of
// each strategy (a Reconciler, a DeferredStager) reads only the events of its own repository. The mapping names
// ("orders.placed.v1", ...) are part of every derived message ID: never rename one that has staged messages.
type mappings struct {
	orders, payments, shipping *staging.Mapping
}

func newMappings(reg *aggregate.Registry) (mappings, error) {
	m := mappings{
		orders:   staging.NewMapping(reg),
		payments: staging.NewMapping(reg),
		shipping: staging.NewMapping(reg),
	}
	// The partition key defaults to the aggregate ID: messages of one order reach the broker in order.
	_ = staging.Map(m.orders, "orders.placed.v1", func(src eventstore.Record, e OrderPlaced) ([]staging.Message, error) {
		return []staging.Message{{
			Topic:   TopicOrders,
			Type:    MsgOrderPlaced,
			Payload: OrderPlacedMessage{OrderID: src.StreamID, Customer: e.Customer, Total: e.Total},
			Headers: map[string]string{HeaderOrderID: src.StreamID},
		}}, nil
	})
	_ = staging.Map(m.payments, "payments.captured.v1", func(src eventstore.Record, e PaymentCaptured) (
		[]staging.Message, error) {
		return []staging.Message{{
			Topic:   TopicPayments,
			Type:    MsgPaymentCaptured,
			Payload: PaymentCapturedMessage{PaymentID: src.StreamID, OrderID: e.OrderID, Amount: e.Amount},
			Headers: map[string]string{HeaderOrderID: e.OrderID},
		}}, nil
	})
	_ = staging.Map(m.shipping, "shipping.shipped.v1", func(src eventstore.Record, e OrderShipped) (
		[]staging.Message, error) {
		return []staging.Message{{
			Topic:   TopicShipments,
			Type:    MsgOrderShipped,
			Payload: OrderShippedMessage{OrderID: src.StreamID, Carrier: e.Carrier},
			Headers: map[string]string{HeaderOrderID: src.StreamID},
		}}, nil
	})
	for _, mp := range []*staging.Mapping{m.orders, m.payments, m.shipping} {
		if err := mp.Err(); err != nil {
			return mappings{}, fmt.Errorf("mappings: %w", err)
		}
	}
	return m, nil
}
