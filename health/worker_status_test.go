package health_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/staging"
)

// Workers watched through their read-only status (staging.ListWorkerStatus, no worker built): a failed worker is
// Unhealthy naming its error, one retrying an event or holding parked events is Degraded.
func TestWorkerStatusFailuresAndParkedEvents(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var sts []staging.WorkerStatus
	c := newChecker(t, health.Config{Clock: clk.Now,
		WorkerStatus: func(context.Context) ([]staging.WorkerStatus, error) { return sts, nil }})
	ctx := context.Background()

	sts = []staging.WorkerStatus{{Name: "stager:a", State: staging.WorkerRunning, Position: 5, Head: 5}}
	require.Equal(t, health.Healthy, c.Check(ctx).Status)

	sts = []staging.WorkerStatus{{Name: "stager:a", State: staging.WorkerFailed, Position: 5, Head: 9, Lag: 4,
		FailingPosition: 6, Attempts: 5, LastError: "cannot map 13"}}
	r := c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status)
	require.Contains(t, r.Reasons[0], "worker:stager:a: failed: cannot map 13")
	require.Equal(t, int64(6), component(t, r, "worker:stager:a").Follower.FailingPosition)

	sts = []staging.WorkerStatus{{Name: "reconciler:b", State: staging.WorkerRunning, Position: 9, Head: 9,
		Parked: 2}}
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status)
	require.Contains(t, r.Reasons[0], "2 parked events")
}
