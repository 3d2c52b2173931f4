package main

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

// handle passes messages through an inbox-wrapped handler of o, recording them in the inbox.
func handle(t *testing.T, o *outbox.Outbox, tenant string, ids ...string) {
	t.Helper()
	in, err := o.NewInbox(nil)
	require.NoError(t, err)
	h := in.Handler("billing", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return nil
	})
	for _, id := range ids {
		msg := message.NewMessage(id, []byte(`{}`))
		msg.Metadata.Set(stagehand.HeaderTenantID, tenant)
		require.NoError(t, h(msg))
	}
}

type inboxStatsOut struct {
	Scope          string  `json:"scope"`
	Tenant         string  `json:"tenant"`
	Handled        int64   `json:"handled"`
	OldestEntryAge float64 `json:"oldest_entry_age_seconds"`
	Failing        int64   `json:"failing"`
	DeadLettered   int64   `json:"dead_lettered"`
}

// inbox stats counts what an inbox-wrapped handler recorded; inbox cleanup deletes entries older than the age
// (warning when that is shorter than the default retention), confined with --tenant.
func TestInboxStatsAndCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	old := e.outbox(func() time.Time { return time.Now().Add(-10 * 24 * time.Hour) })
	handle(t, old, "acme", "m1", "m2")
	handle(t, old, "globex", "m3")
	handle(t, e.outbox(func() time.Time { return time.Now().Add(-2 * time.Hour) }), "acme", "m4")

	var st inboxStatsOut
	e.json(&st, "inbox", "stats")
	require.Equal(t, "all-tenants", st.Scope)
	require.Equal(t, int64(4), st.Handled)
	require.Greater(t, st.OldestEntryAge, float64(9*24*3600), "the oldest entry is ten days old")
	e.json(&st, "inbox", "stats", "--tenant", "globex")
	require.Equal(t, inboxStatsOut{Scope: "tenant", Tenant: "globex", Handled: 1,
		OldestEntryAge: st.OldestEntryAge}, st)
	human := e.ok("inbox", "stats")
	require.Regexp(t, `handled\s+4\n`, human)
	require.Contains(t, human, "all tenants (estate-wide)")

	var out struct {
		Tenant  string `json:"tenant"`
		Deleted int64  `json:"deleted"`
	}
	e.json(&out, "inbox", "cleanup", "--older-than", "7d", "--tenant", "acme")
	require.Equal(t, "acme", out.Tenant)
	require.Equal(t, int64(2), out.Deleted, "acme's two old entries")
	e.json(&st, "inbox", "stats")
	require.Equal(t, int64(2), st.Handled)

	r := e.run("inbox", "cleanup", "--older-than", "1h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "Deleted 2 inbox entries older than 1h")
	require.Contains(t, r.stderr, "warning: --older-than 1h is shorter than the default inbox retention")
	e.json(&st, "inbox", "stats")
	require.Zero(t, st.Handled)
}
