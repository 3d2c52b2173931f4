package outbox_test

import (
	"context"
	"strings"
	"sync/atomic"
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

// A received message whose tenant or ID the inbox could never record is quarantined among the handler's dead
// letters and acknowledged, before the handler runs: under NoTenant for a tenant PostgreSQL cannot hold, under an ID
// derived from its own when that ID cannot be stored, with what it carried kept storable in headers. A redelivery
// lands on the same dead letter. (Refused with an error, it was redelivered forever, holding its subscription.)
func TestInboxQuarantinesHostileTenantsAndIDs(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	ctx := context.Background()
	var ran atomic.Int32
	h := e.inbox.Handler("h", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		ran.Add(1)
		return nil
	})
	m := message.NewMessage("m1", []byte(`{"a":1}`))
	m.Metadata.Set(stagehand.HeaderTenantID, "a\x00b")
	m.Metadata.Set("note", "bad\xffutf8")
	require.NoError(t, h(m))
	require.NoError(t, h(m), "redelivered")
	long := message.NewMessage(strings.Repeat("x", outbox.MaxMessageIDLen+1), nil)
	long.Metadata.Set(stagehand.HeaderTenantID, "acme")
	require.NoError(t, h(long))
	nul := message.NewMessage("m\x00", nil)
	require.NoError(t, h(nul))
	require.NoError(t, h(nul), "redelivered")
	require.Zero(t, ran.Load(), "the handler never sees them")

	dead, err := e.ob.AllTenants().InboxDeadLetters(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 3, "one dead letter per message, redeliveries included")
	byTenant := map[string][]outbox.InboxDeadLetter{}
	for _, d := range dead {
		require.Equal(t, "h", d.Handler)
		byTenant[d.Tenant] = append(byTenant[d.Tenant], d)
	}
	require.Len(t, byTenant[stagehand.NoTenant], 2)
	require.Len(t, byTenant["acme"], 1)
	require.True(t, strings.HasPrefix(byTenant["acme"][0].MessageID, "quarantined-"))
	require.Zero(t, e.count("inbox", "outcome = 'handled'"))
	require.EqualValues(t, 3, e.count("inbox_dead_letters", "metadata ? 'stagehand-quarantined-reason'"))
	require.EqualValues(t, 1, e.count("inbox_dead_letters",
		"metadata ->> 'stagehand-quarantined-tenant' = 'a\uFFFDb' AND message_id = 'm1'"))

	// The handler's own name is the program's fault: refused with an error, nothing recorded.
	bad := e.inbox.Handler("h\x00", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return nil
	})
	err = bad(message.NewMessage("m2", nil))
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.NotContains(t, err.Error(), "SQLSTATE")
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
