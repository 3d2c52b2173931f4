package staging

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// declaredMapping is mapping() with every mapping declaring its message types.
func declaredMapping(t *testing.T) *Mapping {
	t.Helper()
	m := NewMapping(registry())
	require.NoError(t, Map(m, "placed-to-orders", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.placed", Payload: e}}, nil
	}, MessageTypes("order.placed")))
	require.NoError(t, Map(m, "placed-to-billing", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "billing", Type: "billing.charge", Payload: e}}, nil
	}, MessageTypes("billing.charge", "billing.charge")))
	require.NoError(t, m.MapRaw("confirmed-forward", "shop.order.confirmed", func(src eventstore.Record) (
		[]Message, error) {
		return []Message{{Topic: "orders", Payload: src.Payload}}, nil // Type defaults to the event's
	}, MessageTypes("shop.order.confirmed")))
	return m
}

func handlers(types ...string) *outbox.Handlers {
	hs := outbox.NewHandlers(nil, false)
	for _, typ := range types {
		outbox.Handle(hs, typ, func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message, struct{}) error {
			return nil
		})
	}
	return hs
}

// CheckHandled fails, listing them, when a mapped type has no handler, reports types handled but not mapped
// without failing for them, and passes once every mapped type is handled by one of the handlers.
func TestCheckHandledComparesMappedAndHandledTypes(t *testing.T) {
	t.Parallel()
	m := declaredMapping(t)
	require.NoError(t, m.Err())
	require.Equal(t, []string{"billing.charge", "order.placed", "shop.order.confirmed"}, m.MessageTypes())

	orders := handlers("shop.order.confirmed", "order.placed", "order.cancelled")
	require.Equal(t, []string{"order.cancelled", "order.placed", "shop.order.confirmed"}, orders.Types())
	err := CheckHandled(m, orders)
	require.ErrorIs(t, err, ErrUnhandledMessageType)
	var ue *UnhandledError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, []string{"billing.charge"}, ue.Unhandled)
	require.Equal(t, []string{"order.cancelled"}, ue.Unmapped)
	require.Empty(t, ue.Undeclared)
	require.ErrorContains(t, err, "message types mapped but not handled: billing.charge")

	require.NoError(t, CheckHandled(m, orders, handlers("billing.charge")),
		"every mapped type handled; a type handled but not mapped alone does not fail")

	require.NoError(t, Map(m, "placed-to-audit", func(src eventstore.Record, e OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "audit", Type: "audit.placed", Payload: e}}, nil
	}))
	err = CheckHandled(m, orders, handlers("billing.charge"))
	require.ErrorAs(t, err, &ue)
	require.Equal(t, []string{"placed-to-audit"}, ue.Undeclared, "an undeclared mapping cannot be vouched for")
	require.Empty(t, ue.Unhandled)
	require.ErrorContains(t, err, "placed-to-audit")

	require.ErrorIs(t, CheckHandled(nil, orders), ErrInvalidConfig)
	require.ErrorIs(t, CheckHandled(m, orders, nil), ErrInvalidConfig)
}

// A declared mapping that produces a message of a type it does not declare fails its staging, so the
// declaration CheckHandled trusts cannot drift from what the mapping does.
func TestDeclaredMessageTypesAreEnforced(t *testing.T) {
	t.Parallel()
	m := declaredMapping(t)
	msgs, err := m.messages(record("shop.order.confirmed", `{"By":"x"}`), nil)
	require.NoError(t, err, "the defaulted type is the event's, which the mapping declares")
	require.Equal(t, "shop.order.confirmed", msgs[0].Type)

	drift := NewMapping(registry())
	require.NoError(t, Map(drift, "placed-to-orders", func(src eventstore.Record, e OrderPlaced) ([]Message,
		error) {
		return []Message{{Topic: "orders", Type: "order.placed.v2", Payload: e}}, nil
	}, MessageTypes("order.placed")))
	_, err = drift.messages(record("shop.order.placed", `{"Total":1}`), nil)
	require.ErrorIs(t, err, ErrInvalidMessage)
	require.ErrorContains(t, err, `"order.placed.v2"`)
	require.ErrorContains(t, err, `placed-to-orders`)
	require.ErrorContains(t, err, `["order.placed"]`)

	undeclared := mapping(registry())
	_, err = undeclared.messages(record("shop.order.placed", `{"Total":1}`), nil)
	require.NoError(t, err, "a mapping without the option may produce any type")
}

func TestMessageTypesOptionIsValidated(t *testing.T) {
	t.Parallel()
	fn := func(eventstore.Record, OrderPlaced) ([]Message, error) { return nil, nil }
	for name, opt := range map[string]MapOption{"no types": MessageTypes(), "empty type": MessageTypes("x", " "),
		"nil option": nil} {
		m := NewMapping(registry())
		err := Map(m, "placed", fn, opt)
		require.ErrorIs(t, err, ErrInvalidConfig, name)
		require.ErrorContains(t, err, `mapping "placed"`, name)
		require.Error(t, m.Err(), "remembered: %s", name)
		err = m.MapRaw("raw", "shop.order.placed", func(eventstore.Record) ([]Message, error) { return nil, nil },
			opt)
		require.ErrorIs(t, err, ErrInvalidConfig, name)
	}
	require.NoError(t, CheckHandled(NewMapping(registry())), "an empty mapping is checked, and passes")
}
