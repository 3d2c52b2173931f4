package outbox

import (
	"testing"
	"time"
)

// The wait before a retry doubles from RetryDelay per failed attempt and saturates at MaxRetryDelay, whatever the
// attempt count; jitter adds at most its fraction and never passes the cap.
func TestInboxRetryWaitDoublesAndSaturates(t *testing.T) {
	t.Parallel()
	in := &Inbox{retryDelay: time.Second, maxRetryDelay: 30 * time.Second, jitter: 0.2}
	for _, c := range []struct {
		attempts int
		floor    time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 16 * time.Second},
		{6, 30 * time.Second}, {1000, 30 * time.Second}, {int(^uint(0) >> 1), 30 * time.Second}} {
		for range 20 {
			d := in.retryWait(c.attempts)
			if d < c.floor || d > min(c.floor+c.floor/5, in.maxRetryDelay) {
				t.Fatalf("attempt %d: wait %s, want %s to %s", c.attempts, d, c.floor,
					min(c.floor+c.floor/5, in.maxRetryDelay))
			}
		}
	}
}
