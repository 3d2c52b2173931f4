package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/backoff"
)

func TestExponentialSaturatesAtTheLimit(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Minute, backoff.Exponential(time.Minute, time.Hour, 0))
	require.Equal(t, 8*time.Minute, backoff.Exponential(time.Minute, time.Hour, 3))
	require.Equal(t, time.Hour, backoff.Exponential(time.Minute, time.Hour, 6))
	// The extremes: the largest limit and a number of doublings far past 63 never wrap around.
	for _, n := range []int{30, 62, 63, 64, 100, math.MaxInt} {
		d := backoff.Exponential(time.Minute, backoff.Max, n)
		require.Positive(t, d, "n=%d", n)
		require.GreaterOrEqual(t, d, backoff.Exponential(time.Minute, backoff.Max, 30), "n=%d", n)
	}
	require.Equal(t, backoff.Max, backoff.Exponential(time.Minute, backoff.Max, 100))
	require.Equal(t, backoff.Max, backoff.Exponential(backoff.Max, backoff.Max, 5))
	require.Equal(t, time.Duration(1)<<62, backoff.Exponential(1, math.MaxInt64-1, 62))
	require.Equal(t, time.Hour, backoff.Exponential(2*time.Hour, time.Hour, 1), "a base above the limit is capped")
	require.Zero(t, backoff.Exponential(0, time.Hour, 5))
	require.Zero(t, backoff.Exponential(-time.Second, time.Hour, 5))
	require.Equal(t, backoff.Max, backoff.Double(backoff.Max/2+1, backoff.Max))
}

func TestAddMulFractionSaturate(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3*time.Second, backoff.Add(time.Second, 2*time.Second))
	require.Equal(t, backoff.Max, backoff.Add(backoff.Max, 1))
	require.Equal(t, backoff.Max, backoff.Add(backoff.Max/2+1, backoff.Max/2+1))
	require.Equal(t, 6*time.Second, backoff.Mul(2*time.Second, 3))
	require.Equal(t, backoff.Max, backoff.Mul(time.Hour, math.MaxInt))
	require.Zero(t, backoff.Mul(time.Hour, -1))
	require.Equal(t, time.Second/5, backoff.Fraction(time.Second, 0.2))
	require.Equal(t, backoff.Max, backoff.Fraction(backoff.Max, 1))
	require.LessOrEqual(t, backoff.Fraction(backoff.Max, 0.9999999999999999), backoff.Max)
	require.Positive(t, backoff.Fraction(backoff.Max, 0.9999999999999999))
	require.Zero(t, backoff.Fraction(time.Second, math.NaN()))
	require.Zero(t, backoff.Fraction(time.Second, -1))
}

func TestJitteredStaysBetweenFloorAndLimit(t *testing.T) {
	t.Parallel()
	spread := false
	for range 200 {
		d := backoff.Jittered(time.Second, time.Hour, 0.5)
		require.GreaterOrEqual(t, d, time.Second)
		require.LessOrEqual(t, d, 1500*time.Millisecond)
		spread = spread || d != time.Second
	}
	require.True(t, spread, "a jitter adds something at random")
	for range 50 {
		require.Equal(t, time.Hour, backoff.Jittered(time.Hour, time.Hour, 1), "capped at the limit")
		require.Equal(t, backoff.Max, backoff.Jittered(backoff.Max, backoff.Max, 1), "no overflow")
		require.Equal(t, time.Second, backoff.Jittered(time.Second, time.Second/2, 1), "never below the floor")
	}
}
