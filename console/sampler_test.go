package console

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Run samples every SampleInterval only while someone looks (a request in the last two minutes), and every
// IdleSampleInterval otherwise: the clock the console reads decides, the ticker only wakes it.
func TestRunSamplesWhileWatchedAndSlowlyOtherwise(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := &testClock{now: time.Now()}
	c, err := New(&Config{Pool: pool, Schema: schema, Clock: clock.Now, SampleInterval: time.Second,
		IdleSampleInterval: time.Hour})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	taken := func() int {
		c.samples.mu.Lock()
		defer c.samples.mu.Unlock()
		return c.samples.count
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	// Nobody looks: the first sample, then none while the console's clock stays within the idle interval.
	require.Eventually(t, func() bool { return taken() == 1 }, 20*time.Second, 50*time.Millisecond)
	for range 5 {
		clock.Add(time.Second)
		time.Sleep(500 * time.Millisecond)
	}
	require.Equal(t, 1, taken(), "no sample while nobody looks")

	// Someone looks: a sample every tick (the clock moves, so each has a window to count).
	c.samples.viewed()
	require.Eventually(t, func() bool {
		clock.Add(100 * time.Millisecond)
		return taken() >= 3
	}, 20*time.Second, 50*time.Millisecond)

	// They leave (the clock moves past two minutes): sampling stops again...
	clock.Add(3 * time.Minute)
	time.Sleep(1500 * time.Millisecond) // a sample already under way ends
	n := taken()
	time.Sleep(2500 * time.Millisecond)
	require.Equal(t, n, taken(), "no sample after the viewer left")

	// ...until the idle interval has passed.
	clock.Add(time.Hour)
	require.Eventually(t, func() bool { return taken() == n+1 }, 20*time.Second, 50*time.Millisecond)
}
