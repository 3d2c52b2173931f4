package logfollow

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A handler's retry delay doubles up to MaxRetryDelay and stays there, whatever the settings: with an hour's
// RetryDelay the old shift by up to 30 wrapped past 2^63 ns into a small positive delay.
func TestRetryDelaySaturates(t *testing.T) {
	t.Parallel()
	c, err := (&Config{Name: "p", RetryDelay: time.Hour, MaxRetryDelay: math.MaxInt64}).withDefaults()
	require.NoError(t, err)
	prev := time.Duration(0)
	for attempts := 1; attempts <= 100; attempts++ {
		d := c.retryDelay(attempts)
		require.GreaterOrEqual(t, d, prev, "attempt %d", attempts)
		require.LessOrEqual(t, d, c.MaxRetryDelay)
		prev = d
	}
	require.Equal(t, time.Duration(math.MaxInt64), c.retryDelay(100))
	d, err := (&Config{Name: "p"}).withDefaults()
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, d.retryDelay(1))
	require.Equal(t, 400*time.Millisecond, d.retryDelay(3))
	require.Equal(t, 30*time.Second, d.retryDelay(math.MaxInt))
}
