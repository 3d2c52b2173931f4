package conf_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/conf"
)

// Zero fields take their defaults; the first broken rule is the ConfigError, naming its field, and later rules do
// not replace it.
func TestCheckAppliesDefaultsAndKeepsTheFirstBrokenRule(t *testing.T) {
	t.Parallel()
	var n, nn int
	var d, nd time.Duration
	var f float64
	var s string
	c := conf.Check{Package: "p", Component: "c"}
	c.Int("N", &n, 7, 1, 10)
	c.NonNegativeInt("NN", &nn, 3)
	c.Duration("D", &d, time.Second, time.Millisecond)
	c.NonNegativeDuration("ND", &nd, time.Minute)
	c.Fraction("F", &f, 0.2)
	c.Text("S", &s, "def", nil)
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 7 || nn != 3 || d != time.Second || nd != time.Minute || f != 0.2 || s != "def" {
		t.Fatalf("defaults not applied: %v %v %v %v %v %q", n, nn, d, nd, f, s)
	}

	cases := []struct {
		check  func(*conf.Check)
		field  string
		reason string
	}{
		{func(c *conf.Check) { v := 11; c.Int("N", &v, 7, 1, 10) }, "N", "must be between 1 and 10"},
		{func(c *conf.Check) { v := -1; c.Int("N", &v, 7, 1, 0) }, "N", "must be at least 1"},
		{func(c *conf.Check) { v := -1; c.NonNegativeInt("N", &v, 3) }, "N", "must not be negative"},
		{func(c *conf.Check) { v := time.Microsecond; c.Duration("D", &v, time.Second, time.Millisecond) }, "D",
			"must be at least 1ms"},
		{func(c *conf.Check) { v := -time.Second; c.Duration("D", &v, time.Second, 0) }, "D", "must be positive"},
		{func(c *conf.Check) { v := -time.Second; c.NonNegativeDuration("D", &v, time.Second) }, "D",
			"must not be negative"},
		{func(c *conf.Check) { c.AtLeast("Max", time.Second, "Min", time.Minute) }, "Max", "must be at least Min"},
		{func(c *conf.Check) { c.AtMost("Max", time.Hour+1, time.Hour) }, "Max", "must be at most 1h0m0s"},
		{func(c *conf.Check) { v := math.NaN(); c.Fraction("F", &v, 0.2) }, "F", "must be between 0 and 1"},
		{func(c *conf.Check) { v := 1.5; c.Fraction("F", &v, 0.2) }, "F", "must be between 0 and 1"},
		{func(c *conf.Check) { v := "  "; c.Text("S", &v, "x", nil) }, "S", "must not be blank"},
		{func(c *conf.Check) {
			v := "bad"
			c.Text("S", &v, "", func(string) string { return "is bad" })
		}, "S", "is bad"},
	}
	for _, tc := range cases {
		c := conf.Check{Package: "p", Component: "c"}
		tc.check(&c)
		later := -5
		c.NonNegativeInt("Later", &later, 1) // a later broken rule does not replace the first
		err := c.Err()
		var ce *stagehand.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, stagehand.ErrInvalidConfig) {
			t.Fatalf("%s: %v is not a ConfigError", tc.field, err)
		}
		if ce.Package != "p" || ce.Component != "c" || ce.Field != tc.field || ce.Reason != tc.reason {
			t.Fatalf("got %+v, want field %s reason %q", ce, tc.field, tc.reason)
		}
	}
}
