package outbox

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The relay's retry delays saturate at MaxRetryDelay, never wrap: with RetryDelay 1m and MaxRetryDelay at the
// largest time.Duration, the doubling passes 2^63 ns around the 27th retry, and every later delay must stay at (or
// near) the cap instead of turning negative (an immediate retry) or tiny.
func TestBackoffSaturatesAtTheExtremes(t *testing.T) {
	t.Parallel()
	s, err := (&RelayConfig{RetryDelay: time.Minute, MaxRetryDelay: math.MaxInt64, Jitter: 1}).settings(nil)
	require.NoError(t, err)
	prev := time.Duration(0)
	for attempt := 1; attempt <= 200; attempt++ {
		floor := s.backoffFloor(attempt)
		require.Positive(t, floor, "attempt %d", attempt)
		require.GreaterOrEqual(t, floor, prev, "attempt %d: the floor never shrinks", attempt)
		prev = floor
		for range 20 {
			d := s.backoff(attempt)
			require.GreaterOrEqual(t, d, floor, "attempt %d", attempt)
			require.LessOrEqual(t, d, s.MaxRetryDelay, "attempt %d", attempt)
		}
	}
	require.Equal(t, time.Duration(math.MaxInt64), s.backoffFloor(200))
	require.Equal(t, time.Duration(math.MaxInt64), s.backoffFloor(math.MaxInt))

	// The broker backoff doubles the same way.
	b, err := (&RelayConfig{BrokerBackoff: time.Second, MaxBrokerBackoff: math.MaxInt64}).settings(nil)
	require.NoError(t, err)
	pause := b.BrokerBackoff
	for range 100 {
		next := b.nextBrokerBackoff(pause)
		require.GreaterOrEqual(t, next, pause)
		pause = next
	}
	require.Equal(t, time.Duration(math.MaxInt64), pause)
}
