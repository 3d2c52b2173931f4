package logfollow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/heartbeat"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// A running follower beats under its kind, name and lease owner, active or standby, with the events it applied;
// when Run returns, its row says it stopped.
func TestFollowersBeatWhileTheyRun(t *testing.T) {
	t.Parallel()
	x := setup(t)
	x.appendN(t, x.store, "a", "e", 7)
	active := x.newFollower(t, x.store, x.record("one"), logfollow.Config{Kind: "projection", Name: "board",
		Owner: "host-a/1/x"})
	stopActive := start(t, active)
	pgtest.Eventually(t, 10*time.Second, func() bool { return x.applied(t) == 7 }, "catch-up")
	standby := x.newFollower(t, x.store, x.record("two"), logfollow.Config{Kind: "projection", Name: "board",
		Owner: "host-b/2/y"})
	stopStandby := start(t, standby)
	list := func() []heartbeat.Process {
		ps, err := heartbeat.List(context.Background(), x.pool, x.schema)
		require.NoError(t, err)
		return ps
	}
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(list()) == 2 }, "both beat")
	require.NoError(t, stopActive())
	require.NoError(t, stopStandby())
	ps := list()
	require.Equal(t, "projection", ps[0].Kind)
	require.Equal(t, "board", ps[0].Name)
	require.Equal(t, "host-a/1/x", ps[0].Instance)
	require.False(t, ps[0].StoppedAt.IsZero(), "stopped")
	require.Equal(t, "host-b/2/y", ps[1].Instance, "the standby beats too")
	require.Zero(t, ps[1].Activity, "the standby applied nothing")
	require.EqualValues(t, 7, ps[0].Activity, "the last beat, written as it stopped, has every event it applied")
	require.False(t, ps[0].LastActivityAt.IsZero())
}
