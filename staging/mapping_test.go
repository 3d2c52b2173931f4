package staging

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

func TestMessageIDsAreDeterministicAndDistinct(t *testing.T) {
	t.Parallel()
	a := MessageID("acme", "order-1", 3, "placed-to-orders", 0)
	require.Equal(t, a, MessageID("acme", "order-1", 3, "placed-to-orders", 0))
	parsed, err := uuid.Parse(a)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(5), parsed.Version())
	others := []string{
		MessageID("globex", "order-1", 3, "placed-to-orders", 0),
		MessageID("acme", "order-2", 3, "placed-to-orders", 0),
		MessageID("acme", "order-1", 4, "placed-to-orders", 0),
		MessageID("acme", "order-1", 3, "placed-to-billing", 0),
		MessageID("acme", "order-1", 3, "placed-to-orders", 1),
		// Field boundaries cannot be shifted to forge another tuple's ID.
		MessageID("acme", "order-13", 3, "placed-to-orders", 0),
		MessageID("acme", "order-1", 33, "placed-to-orders", 0),
	}
	seen := map[string]bool{a: true}
	for _, id := range others {
		require.False(t, seen[id], "ID collision")
		seen[id] = true
	}
	require.Equal(t, MessageID("", "s", 1, "m", 0), MessageID(stagehand.NoTenant, "s", 1, "m", 0))
}

func record(typ string, payload string) eventstore.Record {
	return eventstore.Record{
		Position: 42, Tenant: "acme", StreamID: "order-1", StreamType: "shop.order", Version: 7,
		EventID: uuid.MustParse("0192f0c1-0000-7000-8000-000000000001"), Type: typ, TypeVersion: 1,
		Payload: []byte(payload), Metadata: eventstore.Metadata{stagehand.HeaderCorrelationID: "corr-1"},
		OccurredAt: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
	}
}

func TestMappingDerivesOutboxMessages(t *testing.T) {
	t.Parallel()
	m := mapping(registry())
	rec := record("shop.order.placed", `{"Total":12}`)
	msgs, err := m.messages(rec, nil) // decoded through the registry
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	byTopic := map[string]int{}
	for i, msg := range msgs {
		byTopic[msg.Topic] = i
		require.Equal(t, "acme", msg.Tenant)
		require.Equal(t, "order-1", msg.PartitionKey, "the partition key defaults to the aggregate ID")
		require.Equal(t, int64(42), msg.SourcePosition)
		require.Equal(t, "corr-1", msg.CorrelationID)
		require.Equal(t, rec.EventID.String(), msg.CausationID, "the event caused the message")
		require.Equal(t, "order-1", msg.Metadata[stagehand.HeaderAggregateID])
		require.Equal(t, "shop.order", msg.Metadata[stagehand.HeaderAggregateType])
		require.Equal(t, "shop.order.placed", msg.Metadata[stagehand.HeaderEventType])
	}
	orders := msgs[byTopic["orders"]]
	require.Equal(t, "order.placed", orders.Type)
	require.JSONEq(t, `{"total":12}`, string(orders.Payload))
	require.Equal(t, MessageID("acme", "order-1", 7, "placed-to-orders", 0), orders.ID)
	billing := msgs[byTopic["billing"]]
	require.JSONEq(t, `{"Total":12}`, string(billing.Payload))

	// The decoded value handed in by a save is used as is.
	again, err := m.messages(rec, OrderPlaced{Total: 12})
	require.NoError(t, err)
	require.Equal(t, msgs, again)

	raw, err := m.messages(record("shop.order.confirmed", `{"By":"x"}`), nil)
	require.NoError(t, err)
	require.Len(t, raw, 1)
	require.JSONEq(t, `{"By":"x"}`, string(raw[0].Payload))

	none, err := m.messages(record("shop.order.noted", `{}`), nil)
	require.NoError(t, err)
	require.Empty(t, none, "events that map to nothing stage nothing")
}

func TestMappingOptionsAndErrors(t *testing.T) {
	t.Parallel()
	reg := registry()
	m := NewMapping(reg)
	at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, Map(m, "opts", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{
			{Topic: "t", Unordered: true, Headers: map[string]string{"h": "v"}, ScheduledAt: at,
				Payload: json.RawMessage(`{"raw":true}`)},
			{Topic: "t", PartitionKey: "customer-9"},
		}, nil
	}))
	msgs, err := m.messages(record("shop.order.placed", `{"Total":1}`), nil)
	require.NoError(t, err)
	require.Empty(t, msgs[0].PartitionKey)
	require.Equal(t, "v", msgs[0].Metadata["h"])
	require.Equal(t, at, msgs[0].ScheduledAt)
	require.Equal(t, `{"raw":true}`, string(msgs[0].Payload))
	require.Equal(t, "shop.order.placed", msgs[1].Type, "the type defaults to the event type")
	require.Equal(t, "customer-9", msgs[1].PartitionKey)
	require.NotEqual(t, msgs[0].ID, msgs[1].ID)

	require.ErrorIs(t, Map(m, "opts", func(eventstore.Record, OrderPlaced) ([]Message, error) { return nil, nil }),
		ErrInvalidConfig, "mapping names are unique")
	type unregistered struct{}
	require.ErrorIs(t, Map(m, "u", func(eventstore.Record, unregistered) ([]Message, error) { return nil, nil }),
		ErrInvalidConfig)
	require.ErrorIs(t, m.MapRaw("", "x", func(eventstore.Record) ([]Message, error) { return nil, nil }),
		ErrInvalidConfig)
	require.Error(t, m.Err(), "registration errors are remembered")
	_, err = New(eventstoreMemory(), &Config{Mapping: m})
	require.ErrorIs(t, err, ErrInvalidConfig, "a mapping with errors is refused at construction")

	bad := NewMapping(reg)
	require.NoError(t, bad.MapRaw("no-topic", "shop.order.noted", func(eventstore.Record) ([]Message, error) {
		return []Message{{Payload: "x"}}, nil
	}))
	require.NoError(t, bad.MapRaw("panics", "shop.order.confirmed", func(eventstore.Record) ([]Message, error) {
		panic("boom")
	}))
	_, err = bad.messages(record("shop.order.noted", `{}`), nil)
	require.ErrorIs(t, err, ErrInvalidMessage)
	require.ErrorContains(t, err, `"no-topic"`)
	_, err = bad.messages(record("shop.order.confirmed", `{}`), nil)
	require.ErrorContains(t, err, "panicked")

	_, err = m.messages(record("shop.order.placed", `{"Total":"x"}`), nil)
	require.Error(t, err, "an undecodable event is an error, not a skipped message")
}

func eventstoreMemory() eventstore.Store { return eventstore.NewMemory(nil) }
