package aggregatetest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/aggregate/aggregatetest"
)

type counter struct {
	aggregate.Root
	n int
}

type incremented struct{ By int }

var errTooMuch = errors.New("too much")

func (c *counter) Apply(e any) {
	if i, ok := e.(incremented); ok {
		c.n += i.By
	}
}

func (c *counter) Add(by int) error {
	if c.n+by > 10 {
		return errTooMuch
	}
	aggregate.Raise(c, incremented{By: by})
	return nil
}

func newCounter() *counter { return &counter{Root: aggregate.NewRoot("c")} }

func newReg() *aggregate.Registry {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "counter", func(id string) *counter {
		return &counter{Root: aggregate.NewRoot(id)}
	})
	_ = aggregate.RegisterEvent[incremented](reg, "counter.incremented")
	return reg
}

// fakeT records failures instead of stopping, so the helpers' own failures can be checked.
type fakeT struct{ failures []string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}

func TestThenPassesOnTheRightEvents(t *testing.T) {
	r := aggregatetest.Given(newReg(), newCounter(), incremented{By: 3}).
		When(func(c *counter) error { return c.Add(2) }).
		Then(t, incremented{By: 2})
	require.Equal(t, 5, r.State().n)
	aggregatetest.Given(newReg(), newCounter(), incremented{By: 9}).
		When(func(c *counter) error { return c.Add(5) }).
		ThenError(t, errTooMuch)
}

func TestHelpersCatchWrongOutcomes(t *testing.T) {
	cases := map[string]func(ft *fakeT){
		"wrong event": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { return c.Add(2) }).
				Then(ft, incremented{By: 3})
		},
		"missing event": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { return nil }).
				Then(ft, incremented{By: 1})
		},
		"extra event": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { _ = c.Add(1); return c.Add(1) }).
				Then(ft, incremented{By: 1})
		},
		"unexpected error": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter(), incremented{By: 10}).
				When(func(c *counter) error { return c.Add(1) }).Then(ft, incremented{By: 1})
		},
		"expected error missing": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { return c.Add(1) }).
				ThenError(ft, errTooMuch)
		},
		"other error": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { return errors.New("x") }).
				ThenError(ft, errTooMuch)
		},
		"error with events": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { _ = c.Add(1); return errTooMuch }).
				ThenError(ft, errTooMuch)
		},
		"nothing expected": func(ft *fakeT) {
			aggregatetest.Given(newReg(), newCounter()).When(func(c *counter) error { return c.Add(1) }).ThenNothing(ft)
		},
	}
	for name, run := range cases {
		ft := &fakeT{}
		run(ft)
		require.Len(t, ft.failures, 1, "case %q must fail exactly once", name)
		require.True(t, strings.HasPrefix(ft.failures[0], "aggregatetest:"), ft.failures[0])
	}
}

func TestGivenHistoryIsNotAChange(t *testing.T) {
	c := newCounter()
	aggregatetest.Given(newReg(), c, incremented{By: 1}, incremented{By: 2}).
		When(func(c *counter) error { return nil }).ThenNothing(t)
	require.Equal(t, int64(2), c.StoredVersion())
	require.Empty(t, c.Changes())
}

// Events whose trip through the registry changes them, as a save and a load would.
type (
	unregistered struct{ By int }
	secretive    struct {
		By     int
		reason string // unexported: encoding/json never stores it
	}
	stamped  struct{ At time.Time }
	loosely  struct{ Attrs map[string]any }
	anyKeyed struct{ Attrs map[any]string }
	listed   struct {
		Tags []string `json:",omitempty"`
	}
	nested struct{ Lines []line }
	line   struct{ Qty int64 }
)

// lossyCounter raises whatever event its test gives it, and applies nothing.
type lossyCounter struct{ aggregate.Root }

func (*lossyCounter) Apply(any) {}

func lossyReg() *aggregate.Registry {
	reg := newReg()
	_ = aggregate.RegisterEvent[secretive](reg, "lossy.secretive")
	_ = aggregate.RegisterEvent[stamped](reg, "lossy.stamped")
	_ = aggregate.RegisterEvent[loosely](reg, "lossy.loosely")
	_ = aggregate.RegisterEvent[anyKeyed](reg, "lossy.any-keyed")
	_ = aggregate.RegisterEvent[listed](reg, "lossy.listed")
	_ = aggregate.RegisterEvent[nested](reg, "lossy.nested")
	return reg
}

// Every raised or given event that does not survive the registry's round trip fails the test, with a message
// that names the event's type and what differs; an event that survives it passes.
func TestEventsMustSurviveTheRegistry(t *testing.T) {
	raise := func(e any) func(*lossyCounter) error {
		return func(c *lossyCounter) error { aggregate.Raise(c, e); return nil }
	}
	newLossy := func() *lossyCounter { return &lossyCounter{Root: aggregate.NewRoot("l")} }
	local := time.Now() // carries a monotonic clock reading
	cases := []struct {
		name  string
		event any
		want  []string // substrings of the failure
	}{
		{"unregistered", unregistered{By: 1}, []string{"aggregatetest_test.unregistered", "not registered"}},
		{"pointer", &incremented{By: 1}, []string{"*aggregatetest_test.incremented is a pointer",
			"raise and give aggregatetest_test.incremented values"}},
		{"unexported field", secretive{By: 1, reason: "why"}, []string{"aggregatetest_test.secretive",
			`secretive.reason is "why"`, "unexported"}},
		{"monotonic time", stamped{At: local}, []string{"aggregatetest_test.stamped", "stamped.At",
			"monotonic", "t.Round(0)"}},
		{"time in a named zone", stamped{At: local.Round(0).In(time.FixedZone("X", 3600))}, []string{
			"stamped.At", "the same instant in another location", "t.UTC()"}},
		{"int64 in an interface", loosely{Attrs: map[string]any{"n": int64(1<<53 + 1)}}, []string{
			"aggregatetest_test.loosely", `loosely.Attrs["n"] is int64 9007199254740993`, "loads as float64",
			"2^53"}},
		{"map with interface keys", anyKeyed{Attrs: map[any]string{1: "x"}}, []string{
			"aggregatetest_test.anyKeyed cannot be stored", "unsupported type"}},
		{"empty slice under omitempty", listed{Tags: []string{}}, []string{"listed.Tags is empty ([]string), " +
			"loads as nil"}},
		{"nil", nil, []string{"a nil event"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ft := &fakeT{}
			aggregatetest.Given(lossyReg(), newLossy()).When(raise(c.event)).Then(ft, c.event)
			require.Len(t, ft.failures, 1, "a raised %s event must fail the test", c.name)
			require.Contains(t, ft.failures[0], "raised event 0: ")
			t.Log(ft.failures[0])
			for _, w := range c.want {
				require.Contains(t, ft.failures[0], w)
			}

			ft = &fakeT{}
			aggregatetest.Given(lossyReg(), newLossy(), c.event).When(raise(incremented{By: 1})).
				Then(ft, incremented{By: 1})
			require.Len(t, ft.failures, 1, "a given %s event must fail the test", c.name)
			require.Contains(t, ft.failures[0], "given event 0: ")

			ft = &fakeT{}
			aggregatetest.Given(lossyReg(), newLossy(), c.event).
				When(func(*lossyCounter) error { return errTooMuch }).ThenError(ft, errTooMuch)
			require.Len(t, ft.failures, 1, "ThenError checks the history too")
		})
	}

	t.Run("events that survive pass", func(t *testing.T) {
		for _, e := range []any{secretive{By: 1}, stamped{At: local.Round(0).UTC()}, listed{Tags: []string{"a"}},
			listed{}, loosely{Attrs: map[string]any{"n": 1.5, "s": "x", "l": []any{"a", true}}},
			nested{Lines: []line{{Qty: 1 << 62}}}} {
			aggregatetest.Given(lossyReg(), newLossy(), e).When(raise(e)).Then(t, e)
		}
	})

	t.Run("nested difference is located", func(t *testing.T) {
		reg := aggregate.NewRegistry(&aggregate.RegistryConfig{Codec: droppingCodec{}})
		_ = aggregate.RegisterEvent[nested](reg, "lossy.nested")
		ft := &fakeT{}
		e := nested{Lines: []line{{Qty: 1}, {Qty: 2}}}
		aggregatetest.Given(reg, newLossy()).When(raise(e)).Then(ft, e)
		require.Len(t, ft.failures, 1)
		require.Contains(t, ft.failures[0], "nested.Lines[1].Qty is 2, loads as 0")
	})

	t.Run("nil registry", func(t *testing.T) {
		ft := &fakeT{}
		aggregatetest.Given(nil, newCounter()).When(func(c *counter) error { return c.Add(1) }).
			Then(ft, incremented{By: 1})
		require.Len(t, ft.failures, 1)
		require.Contains(t, ft.failures[0], "Given needs the registry")
	})
}

// droppingCodec is JSON that loses the second line's quantity on the way back.
type droppingCodec struct{ aggregate.JSONCodec }

func (c droppingCodec) Unmarshal(data []byte, v any) error {
	if err := c.JSONCodec.Unmarshal(data, v); err != nil {
		return err
	}
	if n, ok := v.(*nested); ok && len(n.Lines) > 1 {
		n.Lines[1].Qty = 0
	}
	return nil
}
