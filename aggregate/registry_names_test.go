package aggregate_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

type namedEvent struct{}

type namedAggregate struct{ aggregate.Root }

func (*namedAggregate) Apply(any) {}

// An event or aggregate type name the event store would refuse on every append (a control character, invalid
// UTF-8, more than eventstore.MaxTypeLen bytes) is refused where it is registered, not at the first save.
func TestRegistrationRefusesTypeNamesTheStoreRefuses(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"a\x00b", "tab\tname", "bad\xff", strings.Repeat("n", eventstore.MaxTypeLen+1)} {
		reg := aggregate.NewRegistry(nil)
		require.ErrorIs(t, aggregate.RegisterEvent[namedEvent](reg, bad), aggregate.ErrRegistration, "%q", bad)
		reg = aggregate.NewRegistry(nil)
		require.ErrorIs(t, aggregate.RegisterAggregate(reg, bad,
			func(id string) *namedAggregate { return &namedAggregate{Root: aggregate.NewRoot(id)} }),
			aggregate.ErrRegistration, "%q", bad)
	}
	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterEvent[namedEvent](reg, strings.Repeat("n", eventstore.MaxTypeLen)))
	require.NoError(t, aggregate.RegisterAggregate(reg, "bank.account €",
		func(id string) *namedAggregate { return &namedAggregate{Root: aggregate.NewRoot(id)} }))
}
