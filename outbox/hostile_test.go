package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

// A tenant, ID, topic or metadata value PostgreSQL cannot store (NUL, invalid UTF-8), or one past the documented
// lengths, fails Stage with ErrInvalidMessage naming the field (ErrInvalidTenant for tenants), never with SQLSTATE
// 22021 or 54000, and stages nothing.
func TestStageRefusesHostileNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	cases := []struct {
		name, want string
		m          outbox.Message
	}{
		{"tenant NUL", "NUL", outbox.Message{ID: "a", Topic: "t", Tenant: "x\x00"}},
		{"tenant 1MB", "longer than 255", outbox.Message{ID: "a", Topic: "t", Tenant: strings.Repeat("x", 1<<20)}},
		{"ID NUL", "ID has a NUL", outbox.Message{ID: "a\x00", Topic: "t"}},
		{"ID long", "ID is 513 bytes", outbox.Message{ID: strings.Repeat("i", 513), Topic: "t"}},
		{"topic UTF-8", "Topic has invalid UTF-8", outbox.Message{ID: "a", Topic: "t\xff"}},
		{"key long", "PartitionKey", outbox.Message{ID: "a", Topic: "t", PartitionKey: strings.Repeat("k", 513)}},
		{"metadata", "metadata value", outbox.Message{ID: "a", Topic: "t", Metadata: map[string]string{"k": "\x00"}}},
	}
	for _, c := range cases {
		_, err := e.ob.Stage(ctx, c.m)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, c.name)
		require.ErrorContains(t, err, c.want, c.name)
		require.NotContains(t, err.Error(), "SQLSTATE", c.name)
	}
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "a", Topic: "t", Tenant: "x\x00"})
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
	require.Zero(t, e.count("outbox"))
}

// The inbox refuses a received message whose tenant or ID it could never record, as a permanent failure naming
// the message, before any SQL (no raw SQLSTATE on every redelivery).
func TestInboxRefusesHostileTenants(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	h := e.inbox.Handler("h", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error { return nil })
	m := message.NewMessage("m1", nil)
	m.Metadata.Set(stagehand.HeaderTenantID, "a\x00b")
	err := h(m)
	require.ErrorIs(t, err, outbox.ErrPermanent)
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
	require.ErrorContains(t, err, `"m1"`)
	require.NotContains(t, err.Error(), "SQLSTATE")
	m = message.NewMessage("m\x00", nil)
	err = h(m)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.NotContains(t, err.Error(), "SQLSTATE")
	require.Zero(t, e.count("inbox"))
}

// An admin scope is a filter a tenant value enters through: a tenant PostgreSQL cannot hold (a NUL byte) or one
// longer than the accepted length fails every operation of the scope with ErrInvalidTenant, before any statement.
func TestAdminScopeRefusesHostileTenants(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for _, tenant := range []string{"a\x00b", strings.Repeat("t", 1<<20), "bad\xffutf8"} {
		a := e.ob.Tenant(tenant)
		_, err := a.Stats(ctx)
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.DeadLetters(ctx, outbox.ListOptions{})
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.Redrive(ctx, "m")
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.CleanupSent(ctx, time.Hour, 10)
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.InboxStats(ctx)
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.DiscardInbox(ctx, "m")
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.RedriveInbox(ctx, "m")
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.DeadLetterGroups(ctx, outbox.ListOptions{})
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
		_, err = a.Find(ctx, outbox.FindQuery{Text: "m"})
		require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
	}
	_, err := e.ob.Tenant("acme").Stats(ctx)
	require.NoError(t, err)
}
