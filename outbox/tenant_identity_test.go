package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func sameMsg(tenant, id string) outbox.Message {
	return outbox.Message{ID: id, Topic: "orders", Tenant: tenant, Payload: []byte(tenant)}
}

// A message is (tenant, ID, topic): the same ID staged by two tenants is two messages, each deduplicated within its
// tenant, each published, each in the sent ledger.
func TestTenantMessageIdentityStaging(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	n, err := e.ob.Stage(ctx, sameMsg(acme, "same"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = e.ob.Stage(ctx, sameMsg(globex, "same"), sameMsg(globex, "same"), sameMsg(initech, "same"))
	require.NoError(t, err)
	require.Equal(t, 2, n, "globex's and initech's: not acme's, and globex's once")
	n, err = e.ob.Stage(ctx, sameMsg(acme, "same"))
	require.NoError(t, err)
	require.Zero(t, n, "acme's is pending")

	b := newBroker()
	res, err := e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	var got []string
	for _, p := range b.snapshot() {
		require.Equal(t, "same", p.id)
		got = append(got, p.meta.Get(stagehand.HeaderTenantID))
	}
	require.ElementsMatch(t, []string{acme, globex, initech}, got)
	require.EqualValues(t, 3, e.count("outbox_sent", "message_id = 'same'"))

	// Sent: re-staging is deduplicated per tenant; a fourth tenant's "same" is new.
	n, err = e.ob.Stage(ctx, sameMsg(acme, "same"), sameMsg(globex, "same"), sameMsg("hooli", "same"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'same' AND tenant_id = 'hooli'"))
}

// Dead letters are per (tenant, ID, topic): a tenant's scope redrives and discards its own, the estate-wide scope
// every tenant's with the ID, and listing pages through rows that differ only by tenant.
func TestTenantMessageIdentityDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, sameMsg(acme, "same"), sameMsg(globex, "same"), sameMsg(initech, "same"),
		sameMsg(acme, "other"))
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(*message.Message) error { return errRejected })
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 4, res.DeadLettered)
	// The same instant for every dead letter: paging must still tell them apart by tenant.
	pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "outbox_dead_letters")+` SET dead_at = now()`)

	var paged []string
	opts := outbox.ListOptions{Limit: 1, ID: "same"}
	for {
		page, err := e.ob.AllTenants().DeadLetters(ctx, opts)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page[0].Tenant)
		opts.After = &page[0]
	}
	require.ElementsMatch(t, []string{acme, globex, initech}, paged)

	dl, err := e.ob.Tenant(globex).DeadLetter(ctx, "same")
	require.NoError(t, err)
	require.Equal(t, globex, dl.Tenant)
	require.Equal(t, []byte(globex), dl.Payload)

	n, err := e.ob.Tenant(acme).Redrive(ctx, "same")
	require.NoError(t, err)
	require.Equal(t, 1, n, "acme's only")
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'same'"))
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'same' AND tenant_id = 'acme'"))

	n, err = e.ob.AllTenants().Discard(ctx, "same")
	require.NoError(t, err)
	require.Equal(t, 2, n, "globex's and initech's")
	require.EqualValues(t, 2, e.count("outbox_sent", "message_id = 'same' AND outcome = 'discarded'"))
	n, err = e.ob.Stage(ctx, sameMsg(globex, "same"), sameMsg(initech, "same"))
	require.NoError(t, err)
	require.Zero(t, n, "discarded IDs stay in each tenant's ledger")
}

// The inbox key is (tenant, message ID, handler): another tenant's message with the same ID is handled, not
// skipped; failed attempts and dead letters are counted per tenant.
func TestTenantMessageIdentityInbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 2, RetryDelay: time.Millisecond})
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		handled = map[string]int{}
	)
	h := in.Handler("ledger", func(ctx context.Context, _ pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
		if msg.Metadata.Get("fail") != "" {
			return errors.New("not yet")
		}
		mu.Lock()
		handled[stagehand.TenantFrom(ctx)]++
		mu.Unlock()
		return nil
	})
	msgFor := func(tenant, id string) *message.Message {
		m := message.NewMessage(id, []byte(tenant))
		if tenant != stagehand.NoTenant {
			m.Metadata.Set(stagehand.HeaderTenantID, tenant)
		}
		return m
	}
	for range 2 { // the second round is redelivery: skipped
		for _, tenant := range []string{acme, globex, stagehand.NoTenant} {
			require.NoError(t, h(msgFor(tenant, "same")))
		}
	}
	require.Equal(t, map[string]int{acme: 1, globex: 1, stagehand.NoTenant: 1}, handled)

	// One failure each: with attempts counted per tenant, neither reaches MaxAttempts.
	for _, tenant := range []string{acme, globex} {
		m := msgFor(tenant, "flaky")
		m.Metadata.Set("fail", "yes")
		requireRetried(t, h(m), m, tenant)
	}
	st, err := e.ob.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Failing)
	require.Zero(t, st.DeadLettered)
	for _, tenant := range []string{acme, globex} { // the second failure dead-letters each
		m := msgFor(tenant, "flaky")
		m.Metadata.Set("fail", "yes")
		requireSettled(t, h(m), m, tenant)
	}
	pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "inbox_dead_letters")+` SET dead_at = now()`)
	var paged []string
	opts := outbox.InboxListOptions{Limit: 1}
	for {
		page, err := e.ob.AllTenants().InboxDeadLetters(ctx, opts)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page[0].Tenant)
		opts.After = &page[0]
	}
	require.ElementsMatch(t, []string{acme, globex}, paged)
	n, err := e.ob.Tenant(acme).DiscardInboxMatching(ctx, outbox.InboxListOptions{Handler: "ledger", ID: "flaky"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = e.ob.Tenant(globex).InboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DeadLettered, "globex's untouched by acme's discard")
}
