package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

func TestOutboxMaintenance(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var out maintenanceJSON
	e.json(&out, "outbox", "maintenance")
	require.False(t, out.Ran)
	require.Contains(t, e.ok("outbox", "maintenance"), "no maintenance pass has run yet")

	// A ledger entry ten days old: the default retention (7 days) removes it.
	old := e.outbox(func() time.Time { return time.Now().Add(-10 * 24 * time.Hour) })
	_, err := old.Stage(context.Background(), outbox.Message{ID: "old", Topic: "t"})
	require.NoError(t, err)
	require.Equal(t, 1, drain(t, old, &broker{}).Published)

	e.json(&out, "outbox", "maintenance", "--run")
	require.True(t, out.Ran)
	require.EqualValues(t, 1, out.SentRemoved)
	require.False(t, out.Overdue)
	require.Empty(t, out.LastError)
	require.NotNil(t, out.FinishedAt)
	require.WithinDuration(t, time.Now(), *out.StartedAt, time.Minute)

	text := e.ok("outbox", "maintenance")
	require.Contains(t, text, "Latest maintenance pass")
	require.Contains(t, text, "sent-ledger entries removed")
	require.Regexp(t, `state\s+ok`, text)
}
