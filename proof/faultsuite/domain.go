package faultsuite

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/staging"
)

// The domain of the run: one small event-sourced aggregate per partition key. A Counter's stream is its key, so its
// messages are ordered by the outbox with the aggregate ID as partition key (the staging default), and the n-th event
// of a stream is Ticked{N: n}: whatever a producer has to retry, the events it saves are the same.

// Stable names of the run's aggregate, event, mapping and message type.
const (
	CounterType    = "faults.counter"
	TickedType     = "faults.counter.ticked"
	MappingName    = "faults.ticked.v1"
	MessageType    = "faults.v1.Ticked"
	HeaderVersion  = "fault-version" // the stream version a message was derived from, on every message
	payloadVersion = 1
)

// Counter is the aggregate the producers save.
type Counter struct {
	aggregate.Root
	Ticks int64
}

// Ticked is the n-th event of a counter.
type Ticked struct {
	N int64 `json:"n"`
}

// NewCounter is the registered constructor.
func NewCounter(id string) *Counter { return &Counter{Root: aggregate.NewRoot(id)} }

// TickTo raises the events that bring the counter to target ticks (none when it is there already).
func (c *Counter) TickTo(target int64) {
	for n := c.Ticks + 1; n <= target; n++ {
		aggregate.Raise(c, Ticked{N: n})
	}
}

// Apply implements aggregate.Aggregate.
func (c *Counter) Apply(event any) {
	if e, ok := event.(Ticked); ok {
		c.Ticks = e.N
	}
}

// TickedMessage is the integration message derived from each Ticked event.
type TickedMessage struct {
	Key     string `json:"key"`
	N       int64  `json:"n"`
	Version int64  `json:"version"`
	Schema  int    `json:"schema"`
}

func newRegistry() (*aggregate.Registry, error) {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, CounterType, NewCounter)
	_ = aggregate.RegisterEvent[Ticked](reg, TickedType)
	if err := reg.Err(); err != nil {
		return nil, fmt.Errorf("faultsuite: registry: %w", err)
	}
	return reg, nil
}

// newMapping derives one message per event, keyed by the aggregate ID (the default partition key), on the key's
// partition topic (of partitions), carrying the stream version in a header so order can be checked at the broker
// without decoding payloads.
func newMapping(reg *aggregate.Registry, partitions int) (*staging.Mapping, error) {
	m := staging.NewMapping(reg)
	_ = staging.Map(m, MappingName, func(src eventstore.Record, e Ticked) ([]staging.Message, error) {
		payload, err := json.Marshal(TickedMessage{Key: src.StreamID, N: e.N, Version: src.Version,
			Schema: payloadVersion})
		if err != nil {
			return nil, fmt.Errorf("encode ticked message: %w", err)
		}
		return []staging.Message{{
			Topic:   topicOf(src.StreamID, partitions),
			Type:    MessageType,
			Payload: payload,
			Headers: map[string]string{HeaderVersion: strconv.FormatInt(src.Version, 10)},
		}}, nil
	})
	if err := m.Err(); err != nil {
		return nil, fmt.Errorf("faultsuite: mapping: %w", err)
	}
	return m, nil
}

// expectedMessageID is the ID of the message staged for the event at version of key: the staging package's
// deterministic ID, so the expected set of messages follows from the committed events alone.
func expectedMessageID(tenant, key string, version int64) string {
	return staging.MessageID(tenant, key, version, MappingName, 0)
}
