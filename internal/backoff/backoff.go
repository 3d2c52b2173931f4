// Package backoff holds the saturating duration arithmetic every retry delay in stagehand is computed with: a
// delay doubles up to a cap and sums of delays stop at the largest time.Duration, so no setting (however large)
// can wrap a delay around to a negative or tiny value.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Max is the largest delay: about 292 years.
const Max = time.Duration(math.MaxInt64)

// Exponential is base doubled n times (n <= 0: base itself), capped by limit, computed without overflow. A base or
// limit that is not positive gives 0 and limit respectively.
func Exponential(base, limit time.Duration, n int) time.Duration {
	if base <= 0 || limit <= 0 {
		return max(0, min(base, limit))
	}
	d := min(base, limit)
	for i := 0; i < n && d < limit; i++ {
		if d > limit/2 {
			return limit
		}
		d *= 2
	}
	return d
}

// Double is d doubled, capped by limit, without overflow (the step of a backoff that doubles while a condition
// lasts).
func Double(d, limit time.Duration) time.Duration { return Exponential(d, limit, 1) }

// Add is a+b for non-negative durations, saturated at Max.
func Add(a, b time.Duration) time.Duration {
	if a < 0 || b < 0 {
		return max(0, a+b)
	}
	if a > Max-b {
		return Max
	}
	return a + b
}

// Mul is d*n for non-negative d and n, saturated at Max.
func Mul(d time.Duration, n int) time.Duration {
	if d <= 0 || n <= 0 {
		return 0
	}
	if int64(d) > math.MaxInt64/int64(n) {
		return Max
	}
	return d * time.Duration(n)
}

// Fraction is f of d (f between 0 and 1, d non-negative), rounded down, never more than d. A NaN or out-of-range
// f is clamped into [0, 1].
func Fraction(d time.Duration, f float64) time.Duration {
	if d <= 0 || !(f > 0) {
		return 0
	}
	if f >= 1 {
		return d
	}
	// float64(d) can round up past math.MaxInt64, whose conversion back is undefined: clamp before converting.
	x := float64(d) * f
	if x >= float64(d) || x >= math.MaxInt64 {
		return d
	}
	return time.Duration(x)
}

// Jittered is floor plus a random fraction of it, up to jitter (0 to 1), capped by limit but never below floor: the
// delay of a retry whose deterministic part is floor, spread so that retries of many messages do not fall due
// together.
func Jittered(floor, limit time.Duration, jitter float64) time.Duration {
	extra := Fraction(floor, rand.Float64()*jitter)
	return max(floor, min(Add(floor, extra), limit))
}

// Sleep waits for d, or until ctx ends, and reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
