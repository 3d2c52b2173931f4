package aggregatetest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

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

// fakeT records failures instead of stopping, so the helpers' own failures can be checked.
type fakeT struct{ failures []string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}

func TestThenPassesOnTheRightEvents(t *testing.T) {
	r := aggregatetest.Given(newCounter(), incremented{By: 3}).
		When(func(c *counter) error { return c.Add(2) }).
		Then(t, incremented{By: 2})
	require.Equal(t, 5, r.State().n)
	aggregatetest.Given(newCounter(), incremented{By: 9}).
		When(func(c *counter) error { return c.Add(5) }).
		ThenError(t, errTooMuch)
}

func TestHelpersCatchWrongOutcomes(t *testing.T) {
	cases := map[string]func(ft *fakeT){
		"wrong event": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { return c.Add(2) }).
				Then(ft, incremented{By: 3})
		},
		"missing event": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { return nil }).
				Then(ft, incremented{By: 1})
		},
		"extra event": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { _ = c.Add(1); return c.Add(1) }).
				Then(ft, incremented{By: 1})
		},
		"unexpected error": func(ft *fakeT) {
			aggregatetest.Given(newCounter(), incremented{By: 10}).
				When(func(c *counter) error { return c.Add(1) }).Then(ft, incremented{By: 1})
		},
		"expected error missing": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { return c.Add(1) }).
				ThenError(ft, errTooMuch)
		},
		"other error": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { return errors.New("x") }).
				ThenError(ft, errTooMuch)
		},
		"error with events": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { _ = c.Add(1); return errTooMuch }).
				ThenError(ft, errTooMuch)
		},
		"nothing expected": func(ft *fakeT) {
			aggregatetest.Given(newCounter()).When(func(c *counter) error { return c.Add(1) }).ThenNothing(ft)
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
	aggregatetest.Given(c, incremented{By: 1}, incremented{By: 2}).
		When(func(c *counter) error { return nil }).ThenNothing(t)
	require.Equal(t, int64(2), c.StoredVersion())
	require.Empty(t, c.Changes())
}
