package aggregate_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

type OpenedV3 struct {
	Owner, Currency string
	Branch          string
}

// upcastRegistry registers "acct.opened" at version 3 with the upcasters given.
func upcastRegistry(t *testing.T, register func(reg *aggregate.Registry)) *aggregate.Registry {
	t.Helper()
	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterAggregate(reg, "acct",
		func(id string) *upcastAccount { return &upcastAccount{Root: aggregate.NewRoot(id)} }))
	require.NoError(t, aggregate.RegisterEvent[OpenedV3](reg, "acct.opened", aggregate.Version(3)))
	register(reg)
	return reg
}

func v1to2(o OpenedV1) (OpenedV2, error) { return OpenedV2{Owner: o.Name, Currency: "EUR"}, nil }
func v2to3(o OpenedV2) (OpenedV3, error) {
	return OpenedV3{Owner: o.Owner, Currency: o.Currency, Branch: "main"}, nil
}

// A registry whose upcaster chain has a gap is refused when the repository is built, naming the event type and
// the missing version, rather than when an old event is first loaded.
func TestUpcasterChainGapIsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	store := eventstore.NewMemory(nil)

	// v1 -> v2 registered, v2 -> v3 missing: version 2 has no upcaster, and the chain from v1 ends at OpenedV2.
	gap := upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 1, v1to2))
	})
	require.NoError(t, gap.Err(), "each registration on its own is valid")
	_, err := aggregate.NewRepository[*upcastAccount](store, gap, nil)
	require.ErrorIs(t, err, aggregate.ErrRegistration)
	require.ErrorContains(t, err, `the upcaster chain of event "acct.opened" has a gap: it is at version 3, so `+
		`every older version needs an upcaster, and version 2 has none`)
	require.ErrorContains(t, err, `the upcaster chain of event "acct.opened" version 1 ends at aggregate_test.OpenedV2`)

	// v2 -> v3 registered, v1 -> v2 missing: version 1 has none.
	gap = upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 2, v2to3))
	})
	_, err = aggregate.NewRepository[*upcastAccount](store, gap, nil)
	require.ErrorIs(t, err, aggregate.ErrRegistration)
	require.ErrorContains(t, err, `version 1 has none`)
	require.NotContains(t, err.Error(), "version 2 has none")

	// The whole chain (registered in any order) is accepted, and a version 1 event loads as version 3.
	whole := upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 2, v2to3))
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 1, v1to2))
	})
	require.NoError(t, whole.Validate())
	ev, err := whole.Decode(eventstore.Record{Type: "acct.opened", TypeVersion: 1, Payload: []byte(`{"Name":"ann"}`)})
	require.NoError(t, err)
	require.Equal(t, OpenedV3{Owner: "ann", Currency: "EUR", Branch: "main"}, ev)
	_, err = aggregate.NewRepository[*upcastAccount](store, whole, nil)
	require.NoError(t, err)
}

type renamedV2 struct{ Name, Note string }

// A renamed event's old name needs upcasters for every version up to its highest one; a chain that loops is
// refused too.
func TestUpcasterChainsOfOldNamesAndLoops(t *testing.T) {
	t.Parallel()
	gap := upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.created", 2, func(o renamedV2) (OpenedV3, error) {
			return OpenedV3{Owner: o.Name}, nil
		}))
	})
	err := gap.Validate()
	require.ErrorIs(t, err, aggregate.ErrRegistration)
	require.ErrorContains(t, err, `event "acct.created" has a gap: its upcasters go up to version 2, so every `+
		`older version needs an upcaster, and version 1 has none`)

	loop := upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 1, func(o OpenedV1) (OpenedV2, error) {
			return OpenedV2{}, nil
		}))
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 2, func(o OpenedV2) (OpenedV1, error) {
			return OpenedV1{}, nil
		}))
	})
	err = loop.Validate()
	require.ErrorIs(t, err, aggregate.ErrRegistration)
	require.ErrorContains(t, err, "loops back")

	// An upcaster returning an interface decides at run time: not refused.
	dynamic := upcastRegistry(t, func(reg *aggregate.Registry) {
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 1, func(o OpenedV1) (any, error) {
			return OpenedV2{Owner: o.Name}, nil
		}))
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 2, v2to3))
	})
	require.NoError(t, dynamic.Validate())
}
