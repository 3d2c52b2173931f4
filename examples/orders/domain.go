package main

import (
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand/aggregate"
)

// The domain: two event-sourced aggregates. Command methods check the invariants and Raise events; Apply only
// changes state, and replays history on Load.

// Order is a customer's order. It is placed once with at least one line, and shipped at most once, only against a
// payment of its full total.
type Order struct {
	aggregate.Root
	Customer string
	Total    int64 // cents
	Placed   bool
	Shipped  bool
}

// Line is one product of an order.
type Line struct {
	SKU      string
	Quantity int64
	Price    int64 // cents per unit
}

// Payment is the card payment of one order. It is authorized once for a positive amount, and captured at most
// once, for no more than was authorized.
type Payment struct {
	aggregate.Root
	OrderID    string
	Authorized int64
	Captured   int64
}

// Domain events, stored under the stable names registered in newRegistry (never Go type names).
type (
	OrderPlaced struct {
		Customer string
		Lines    []Line
		Total    int64
	}
	OrderShipped struct {
		PaymentID string
		Carrier   string
	}
	PaymentAuthorized struct {
		OrderID string
		Amount  int64
	}
	PaymentCaptured struct {
		OrderID string
		Amount  int64
	}
)

// Errors of the invariants.
var (
	ErrAlreadyPlaced     = errors.New("order already placed")
	ErrEmptyOrder        = errors.New("an order needs at least one line")
	ErrInvalidLine       = errors.New("a line needs a SKU, a positive quantity and a positive price")
	ErrNotPlaced         = errors.New("order not placed")
	ErrAlreadyShipped    = errors.New("order already shipped")
	ErrNotPaidInFull     = errors.New("payment does not cover the order")
	ErrAlreadyAuthorized = errors.New("payment already authorized")
	ErrInvalidAmount     = errors.New("amount must be positive")
	ErrNotAuthorized     = errors.New("payment not authorized")
	ErrAlreadyCaptured   = errors.New("payment already captured")
	ErrOverCapture       = errors.New("capture exceeds the authorized amount")
)

// NewOrder and NewPayment are the constructors the registry uses.
func NewOrder(id string) *Order     { return &Order{Root: aggregate.NewRoot(id)} }
func NewPayment(id string) *Payment { return &Payment{Root: aggregate.NewRoot(id)} }

// Place places the order for customer.
func (o *Order) Place(customer string, lines []Line) error {
	if o.Placed {
		return ErrAlreadyPlaced
	}
	if len(lines) == 0 {
		return ErrEmptyOrder
	}
	var total int64
	for _, l := range lines {
		if l.SKU == "" || l.Quantity <= 0 || l.Price <= 0 {
			return fmt.Errorf("%w: %+v", ErrInvalidLine, l)
		}
		total += l.Quantity * l.Price
	}
	aggregate.Raise(o, OrderPlaced{Customer: customer, Lines: lines, Total: total})
	return nil
}

// Ship ships the order against a captured payment of paid cents.
func (o *Order) Ship(paymentID string, paid int64, carrier string) error {
	switch {
	case !o.Placed:
		return ErrNotPlaced
	case o.Shipped:
		return ErrAlreadyShipped
	case paid != o.Total:
		return fmt.Errorf("%w: paid %d of %d", ErrNotPaidInFull, paid, o.Total)
	}
	aggregate.Raise(o, OrderShipped{PaymentID: paymentID, Carrier: carrier})
	return nil
}

// Apply implements aggregate.Aggregate.
func (o *Order) Apply(event any) {
	switch e := event.(type) {
	case OrderPlaced:
		o.Customer, o.Total, o.Placed = e.Customer, e.Total, true
	case OrderShipped:
		o.Shipped = true
	}
}

// Authorize reserves amount on the customer's card for order.
func (p *Payment) Authorize(orderID string, amount int64) error {
	switch {
	case p.Authorized > 0:
		return ErrAlreadyAuthorized
	case amount <= 0:
		return ErrInvalidAmount
	}
	aggregate.Raise(p, PaymentAuthorized{OrderID: orderID, Amount: amount})
	return nil
}

// Capture takes amount of the authorized sum.
func (p *Payment) Capture(amount int64) error {
	switch {
	case p.Authorized == 0:
		return ErrNotAuthorized
	case p.Captured > 0:
		return ErrAlreadyCaptured
	case amount <= 0:
		return ErrInvalidAmount
	case amount > p.Authorized:
		return fmt.Errorf("%w: %d > %d", ErrOverCapture, amount, p.Authorized)
	}
	aggregate.Raise(p, PaymentCaptured{OrderID: p.OrderID, Amount: amount})
	return nil
}

// Apply implements aggregate.Aggregate.
func (p *Payment) Apply(event any) {
	switch e := event.(type) {
	case PaymentAuthorized:
		p.OrderID, p.Authorized = e.OrderID, e.Amount
	case PaymentCaptured:
		p.Captured = e.Amount
	}
}

// Stable names of the aggregate types (the stream types) and of the events.
const (
	OrderType   = "shop.order"
	PaymentType = "shop.payment"
)

func newRegistry() (*aggregate.Registry, error) {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, OrderType, NewOrder)
	_ = aggregate.RegisterAggregate(reg, PaymentType, NewPayment)
	_ = aggregate.RegisterEvent[OrderPlaced](reg, "shop.order.placed")
	_ = aggregate.RegisterEvent[OrderShipped](reg, "shop.order.shipped")
	_ = aggregate.RegisterEvent[PaymentAuthorized](reg, "shop.payment.authorized")
	_ = aggregate.RegisterEvent[PaymentCaptured](reg, "shop.payment.captured")
	if err := reg.Err(); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return reg, nil
}
