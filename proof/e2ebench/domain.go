package e2ebench

import (
	"encoding/json"
	"fmt"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/staging"
)

// The domain of the benchmark: an order placed once. Every append is a new aggregate with one event, so a save
// never conflicts and each message has its own partition key (the order ID), as when customers place orders.

// Stable names of the benchmark's aggregate, event, mapping, message type and topics.
const (
	OrderType   = "e2e.order"
	PlacedType  = "e2e.order.placed"
	MappingName = "e2e.placed.v1"
	MessageType = "e2e.v1.OrderPlaced"
	// TopicStagehand is where the stagehand relay publishes; TopicForwarder is where Watermill's forwarder does.
	TopicStagehand = "e2e-stagehand"
	TopicForwarder = "e2e-forwarder"
	// envelopeTopic is the watermill-sql topic (table) the forwarder's envelopes are staged in.
	envelopeTopic = "e2e_forwarder_envelopes"
)

// Order is the aggregate both paths append.
type Order struct {
	aggregate.Root
	Placed bool
}

// Placed is an order's one event. Phase and SentAt travel to the consumer in the message: SentAt is when the
// append was due (the scheduled time of a paced producer), so the latency a consumer computes includes any wait of
// the producer itself.
type Placed struct {
	Phase  int   `json:"phase"`
	SentAt int64 `json:"sent_at"` // Unix nanoseconds
	Amount int64 `json:"amount"`
}

// NewOrder is the registered constructor.
func NewOrder(id string) *Order { return &Order{Root: aggregate.NewRoot(id)} }

// Apply implements aggregate.Aggregate.
func (o *Order) Apply(event any) {
	if _, ok := event.(Placed); ok {
		o.Placed = true
	}
}

// Payload is the integration message both paths deliver, byte for byte the same shape.
type Payload struct {
	OrderID string `json:"order_id"`
	Phase   int    `json:"phase"`
	SentAt  int64  `json:"sent_at"`
	Amount  int64  `json:"amount"`
}

func newRegistry() (*aggregate.Registry, error) {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, OrderType, NewOrder)
	_ = aggregate.RegisterEvent[Placed](reg, PlacedType)
	if err := reg.Err(); err != nil {
		return nil, fmt.Errorf("e2ebench: registry: %w", err)
	}
	return reg, nil
}

// newMapping derives the stagehand path's message from each Placed event; the partition key is the order ID (the
// staging default).
func newMapping(reg *aggregate.Registry) (*staging.Mapping, error) {
	m := staging.NewMapping(reg)
	_ = staging.Map(m, MappingName, func(src eventstore.Record, e Placed) ([]staging.Message, error) {
		payload, err := json.Marshal(Payload{OrderID: src.StreamID, Phase: e.Phase, SentAt: e.SentAt,
			Amount: e.Amount})
		if err != nil {
			return nil, fmt.Errorf("encode placed message: %w", err)
		}
		return []staging.Message{{Topic: TopicStagehand, Type: MessageType, Payload: payload}}, nil
	})
	if err := m.Err(); err != nil {
		return nil, fmt.Errorf("e2ebench: mapping: %w", err)
	}
	return m, nil
}
