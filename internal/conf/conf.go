// Package conf is the one way stagehand's configurations apply their defaults and check their rules: each
// package's withDefaults runs a Check over its fields in order, a zero field takes the named Default… constant, and
// the first field that breaks its rule becomes the *stagehand.ConfigError the constructor returns.
package conf

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand"
)

// Check applies defaults and collects the first broken rule of one configuration.
type Check struct {
	// Package and Component fill the ConfigError.
	Package, Component string
	err                *stagehand.ConfigError
}

// Fail records that field breaks the rule reason (the first failure is kept).
func (c *Check) Fail(field, reason string) {
	if c.err == nil {
		c.err = &stagehand.ConfigError{Package: c.Package, Component: c.Component, Field: field, Reason: reason}
	}
}

// FailErr records that field was refused by err (kept as the ConfigError's Err).
func (c *Check) FailErr(field string, err error) {
	if c.err == nil {
		c.err = &stagehand.ConfigError{Package: c.Package, Component: c.Component, Field: field, Reason: err.Error(),
			Err: err}
	}
}

// Err returns the first broken rule as a *stagehand.ConfigError, or nil.
func (c *Check) Err() error {
	if c.err == nil {
		return nil
	}
	return c.err
}

// Int gives a zero *v the default def and checks lo <= *v, and *v <= hi unless hi is 0.
func (c *Check) Int(field string, v *int, def, lo, hi int) {
	if *v == 0 {
		*v = def
	}
	if *v < lo || (hi != 0 && *v > hi) {
		c.Fail(field, between(fmt.Sprint(lo), fmt.Sprint(hi), hi != 0))
	}
}

// NonNegativeInt gives a zero *v the default def and refuses a negative one.
func (c *Check) NonNegativeInt(field string, v *int, def int) {
	if *v < 0 {
		c.Fail(field, "must not be negative")
	} else if *v == 0 {
		*v = def
	}
}

// Duration gives a zero *v the default def and checks *v >= lo (lo of 1ns or less reads "must be positive").
func (c *Check) Duration(field string, v *time.Duration, def, lo time.Duration) {
	if *v == 0 {
		*v = def
	}
	if *v < lo || *v <= 0 {
		if lo <= time.Nanosecond {
			c.Fail(field, "must be positive")
		} else {
			c.Fail(field, "must be at least "+lo.String())
		}
	}
}

// NonNegativeDuration gives a zero *v the default def and refuses a negative one.
func (c *Check) NonNegativeDuration(field string, v *time.Duration, def time.Duration) {
	if *v < 0 {
		c.Fail(field, "must not be negative")
	} else if *v == 0 {
		*v = def
	}
}

// AtLeast checks that the duration field v is not below the field named other, of value floor.
func (c *Check) AtLeast(field string, v time.Duration, other string, floor time.Duration) {
	if v < floor {
		c.Fail(field, "must be at least "+other)
	}
}

// AtMost checks that the duration field v is not above ceiling.
func (c *Check) AtMost(field string, v, ceiling time.Duration) {
	if v > ceiling {
		c.Fail(field, "must be at most "+ceiling.String())
	}
}

// Fraction gives a zero *v the default def and checks 0 <= *v <= 1.
func (c *Check) Fraction(field string, v *float64, def float64) {
	if *v == 0 {
		*v = def
	}
	if math.IsNaN(*v) || *v < 0 || *v > 1 {
		c.Fail(field, "must be between 0 and 1")
	}
}

// Text gives an empty *v the default def and refuses a blank (whitespace) one, then checks it with valid (a
// function returning the reason it is refused, or "") when valid is not nil.
func (c *Check) Text(field string, v *string, def string, valid func(string) string) {
	if *v == "" {
		*v = def
	}
	if strings.TrimSpace(*v) == "" {
		c.Fail(field, "must not be blank")
		return
	}
	if valid != nil {
		if reason := valid(*v); reason != "" {
			c.Fail(field, reason)
		}
	}
}

func between(lo, hi string, bounded bool) string {
	if bounded {
		return "must be between " + lo + " and " + hi
	}
	return "must be at least " + lo
}
