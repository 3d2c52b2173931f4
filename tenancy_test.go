package stagehand_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// The tenancy domain: an account, snapshotted every two events.
type tenancyAccount struct {
	aggregate.Root
	Owner   string `json:"owner"`
	Balance int64  `json:"balance"`
}

type accountOpened struct{ Owner string }
type accountDeposited struct{ Amount int64 }

func (a *tenancyAccount) Apply(e any) {
	switch e := e.(type) {
	case accountOpened:
		a.Owner = e.Owner
	case accountDeposited:
		a.Balance += e.Amount
	}
}

func (a *tenancyAccount) MarshalSnapshot() ([]byte, error) { return json.Marshal(a) }
func (a *tenancyAccount) UnmarshalSnapshot(b []byte) error { return json.Unmarshal(b, a) }

// tenancyWorld is one schema written by three tenants through the public API.
type tenancyWorld struct {
	pool   *pgxpool.Pool
	schema string
	store  *eventstore.PostgresStore
	ob     *outbox.Outbox
	repo   *aggregate.Repository[*tenancyAccount]
	inbox  *outbox.Inbox
	broker *tenancyBroker
}

// tenancyBroker records what the relay publishes and rejects the messages whose ID starts with "poison".
type tenancyBroker struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (b *tenancyBroker) Publish(_ string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		if len(m.UUID) >= 6 && m.UUID[:6] == "poison" {
			return errors.New("rejected by the destination")
		}
		c := message.NewMessage(m.UUID, m.Payload) // detached from the relay's delivery context
		c.Metadata = maps.Clone(m.Metadata)
		b.msgs = append(b.msgs, c)
	}
	return nil
}

func (b *tenancyBroker) Close() error { return nil }

func (b *tenancyBroker) published() []*message.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs)
}

const (
	tenantA = "acme"
	tenantB = "globex"
)

// tenants are the writers: two named tenants and the reserved "no tenant" (a context without a tenant).
var tenants = []string{tenantA, tenantB, stagehand.NoTenant}

func ctxFor(tenant string) context.Context {
	if tenant == stagehand.NoTenant {
		return context.Background() // no tenant in scope: the reserved value must be stored
	}
	return stagehand.WithTenant(context.Background(), tenant)
}

// amount gives each tenant distinct figures, so a read that returned another tenant's rows would show.
func amount(tenant string) int64 {
	return map[string]int64{tenantA: 10, tenantB: 200, stagehand.NoTenant: 3000}[tenant]
}

func newTenancyWorld(t *testing.T) *tenancyWorld {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterAggregate(reg, "bank.account", func(id string) *tenancyAccount {
		return &tenancyAccount{Root: aggregate.NewRoot(id)}
	}))
	require.NoError(t, aggregate.RegisterEvent[accountOpened](reg, "bank.account.opened"))
	require.NoError(t, aggregate.RegisterEvent[accountDeposited](reg, "bank.account.deposited"))
	m := staging.NewMapping(reg)
	require.NoError(t, staging.Map(m, "deposits", func(_ eventstore.Record, e accountDeposited) ([]staging.Message,
		error) {
		return []staging.Message{{Topic: "deposits", Type: "bank.deposit", Payload: e, Unordered: true}}, nil
	}))
	st, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob, Mapping: m})
	require.NoError(t, err)
	repo, err := aggregate.NewRepository[*tenancyAccount](store, reg, &aggregate.RepositoryConfig{Stager: st,
		SnapshotEvery: 2})
	require.NoError(t, err)
	inbox, err := ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	return &tenancyWorld{pool: pool, schema: schema, store: store, ob: ob, repo: repo, inbox: inbox,
		broker: &tenancyBroker{}}
}

// populate has every tenant write a row into every table: events and a snapshot of account "acc-1" (the same
// stream ID for every tenant), two published deposit messages (the sent ledger), a dead letter, a pending message,
// an inbox entry, an inbox dead letter, and a reply staged by the inbox handler.
func (w *tenancyWorld) populate(t *testing.T) {
	t.Helper()
	for _, tenant := range tenants {
		ctx := ctxFor(tenant)
		_, err := w.repo.Create(ctx, "acc-1", func(a *tenancyAccount) error {
			aggregate.Raise(a, accountOpened{Owner: "owner-" + tenant})
			aggregate.Raise(a, accountDeposited{Amount: amount(tenant)})
			return nil
		})
		require.NoError(t, err)
		_, err = w.repo.Update(ctx, "acc-1", func(a *tenancyAccount) error {
			aggregate.Raise(a, accountDeposited{Amount: amount(tenant)})
			return nil
		})
		require.NoError(t, err)
		_, err = w.ob.Stage(ctx, outbox.Message{ID: "poison-" + tenant, Topic: "deposits", Payload: []byte("x")})
		require.NoError(t, err)
	}
	relay, err := w.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	res, err := relay.Drain(context.Background(), w.broker)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 6, Failed: 3, DeadLettered: 3}, res)

	// The consumer side: every published message goes through the inbox; the handler sees the message's tenant
	// in its context and stages a reply there. One more message per tenant fails for good (inbox dead letter).
	handler := w.inbox.Handler("ledger", func(ctx context.Context, _ pgx.Tx, out *outbox.Publisher,
		msg *message.Message) error {
		if msg.Metadata.Get("fail") != "" {
			return outbox.Permanent(errors.New("cannot book " + msg.UUID))
		}
		if got, want := stagehand.TenantFrom(ctx), msg.Metadata.Get(stagehand.HeaderTenantID); got != want {
			return fmt.Errorf("handler context has tenant %q, the message %q", got, want)
		}
		return out.Publish("replies", message.NewMessage("reply-"+msg.UUID, []byte("ok")))
	})
	for _, m := range w.broker.published() {
		require.NoError(t, handler(m))
	}
	for _, tenant := range tenants {
		bad := message.NewMessage("bad-"+tenant, []byte("?"))
		bad.Metadata.Set("fail", "yes")
		if tenant != stagehand.NoTenant {
			bad.Metadata.Set(stagehand.HeaderTenantID, tenant) // no header: the reserved value
		}
		require.NoError(t, handler(bad), "a permanent failure is dead-lettered and acknowledged")
	}
}

// Tenant isolation across every table: each tenant's reads and admin calls see and touch only its own rows, the
// estate-wide calls see them all, and the reserved "no tenant" value round-trips through events, outbox and inbox.
func TestTenantIsolationAcrossEveryTable(t *testing.T) {
	t.Parallel()
	w := newTenancyWorld(t)
	w.populate(t)
	bg := context.Background()

	// Events and snapshots: the same stream ID is three streams.
	for _, tenant := range tenants {
		ctx := ctxFor(tenant)
		acc, err := w.repo.Load(ctx, "acc-1")
		require.NoError(t, err)
		require.Equal(t, "owner-"+tenant, acc.Owner, tenant)
		require.Equal(t, 2*amount(tenant), acc.Balance, tenant)
		recs, err := w.store.ReadStream(bg, tenant, "acc-1", 1)
		require.NoError(t, err)
		require.Len(t, recs, 3, tenant)
		for _, r := range recs {
			require.Equal(t, tenant, r.Tenant)
		}
		snap, err := w.store.LoadSnapshot(bg, tenant, "acc-1")
		require.NoError(t, err)
		require.Equal(t, tenant, snap.Tenant)
		require.Contains(t, string(snap.Payload), "owner-"+tenant)
		info, err := w.store.Stream(bg, tenant, "acc-1")
		require.NoError(t, err)
		require.EqualValues(t, 3, info.Version, "each tenant's stream has its own versions")
		page, err := w.store.ReadLog(bg, eventstore.LogQuery{Tenants: []string{tenant}})
		require.NoError(t, err)
		require.Len(t, page.Records, 3)
		for _, r := range page.Records {
			require.Equal(t, tenant, r.Tenant)
		}
	}
	_, err := w.repo.Load(stagehand.WithTenant(bg, "initech"), "acc-1")
	require.ErrorIs(t, err, eventstore.ErrStreamNotFound, "a tenant without the stream does not see another's")
	_, err = w.store.LoadSnapshot(bg, "initech", "acc-1")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)
	all, err := w.store.ReadLog(bg, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, all.Records, 9, "the unfiltered log is estate-wide")

	// The messages carried their tenant to the broker, the untenanted ones the reserved value.
	for _, m := range w.broker.published() {
		require.Contains(t, tenants, m.Metadata.Get(stagehand.HeaderTenantID))
	}

	// Outbox statistics, per tenant and estate-wide.
	for _, tenant := range tenants {
		st, err := w.ob.Tenant(tenant).Stats(bg)
		require.NoError(t, err)
		require.Equal(t, outbox.Stats{Pending: 2, DeadLettered: 1, Sent: 2}, trimStats(st), tenant)
	}
	st, err := w.ob.AllTenants().Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 6, DeadLettered: 3, Sent: 6}, trimStats(st))
	none, err := w.ob.Tenant("").Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 2, DeadLettered: 1, Sent: 2}, trimStats(none),
		`Tenant("") is the reserved "no tenant" scope`)
	other, err := w.ob.Tenant("initech").Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, trimStats(other))

	// Pending rows: the inbox replies, staged in the handler's transaction, carry the consumed message's tenant.
	for _, tenant := range tenants {
		require.EqualValues(t, 2, pgtest.Count(t, w.pool, `SELECT count(*) FROM `+pgtest.Q(w.schema, "outbox")+
			` WHERE tenant_id = $1 AND message_id LIKE 'reply-%'`, tenant), tenant)
	}

	// Dead letters: list and show see only the scope's.
	for _, tenant := range tenants {
		a := w.ob.Tenant(tenant)
		dls, err := a.DeadLetters(bg, outbox.ListOptions{})
		require.NoError(t, err)
		require.Len(t, dls, 1, tenant)
		require.Equal(t, "poison-"+tenant, dls[0].ID)
		require.Equal(t, tenant, dls[0].Tenant)
		for _, o := range tenants {
			_, err := a.DeadLetter(bg, "poison-"+o)
			if o == tenant {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, outbox.ErrNotFound, "%s sees %s's dead letter", tenant, o)
			}
		}
	}
	dls, err := w.ob.AllTenants().DeadLetters(bg, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, dls, 3)

	// Redrive and discard of another tenant's dead letter: reported unknown, nothing touched.
	a := w.ob.Tenant(tenantA)
	n, err := a.Redrive(bg, "poison-"+tenantB, "poison-"+stagehand.NoTenant)
	require.Zero(t, n)
	var unknown *outbox.UnknownIDsError
	require.ErrorAs(t, err, &unknown)
	require.Len(t, unknown.IDs, 2)
	n, err = a.Discard(bg, "poison-"+tenantB)
	require.Zero(t, n)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	dls, err = w.ob.AllTenants().DeadLetters(bg, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, dls, 3, "no dead letter moved")
	// A's own: redriven and discarded in A's scope only.
	n, err = a.Redrive(bg, "poison-"+tenantA)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = a.Discard(bg, "poison-"+tenantA) // already redriven: unknown now
	require.Zero(t, n)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	n, err = w.ob.Tenant("").Discard(bg, "poison-"+stagehand.NoTenant)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	b, err := w.ob.Tenant(tenantB).Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 2, DeadLettered: 1, Sent: 2}, trimStats(b), "B untouched")

	// The sent ledger: LastPublished and cleanup confined to the scope.
	for _, tenant := range tenants {
		last, err := w.ob.Tenant(tenant).LastPublished(bg, time.Time{})
		require.NoError(t, err)
		require.False(t, last.IsZero(), tenant)
	}
	deleted, err := a.CleanupSent(bg, 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, deleted, "A's two publications")
	b, err = w.ob.Tenant(tenantB).Stats(bg)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Sent, "B's ledger untouched by A's cleanup")
	deleted, err = w.ob.AllTenants().CleanupSent(bg, 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 5, deleted, "estate-wide: B's two, the untenanted two and its discarded dead letter")

	// Inbox: statistics, dead letters, discard and cleanup per tenant.
	for _, tenant := range tenants {
		ist, err := w.ob.Tenant(tenant).InboxStats(bg)
		require.NoError(t, err)
		require.EqualValues(t, 2, ist.Handled, tenant)
		require.EqualValues(t, 1, ist.DeadLettered, tenant)
		idls, err := w.ob.Tenant(tenant).InboxDeadLetters(bg, outbox.InboxListOptions{})
		require.NoError(t, err)
		require.Len(t, idls, 1, tenant)
		require.Equal(t, "bad-"+tenant, idls[0].MessageID)
		require.Equal(t, tenant, idls[0].Tenant, "the inbox stores the reserved value for a message without tenant")
	}
	ist, err := w.ob.AllTenants().InboxStats(bg)
	require.NoError(t, err)
	require.EqualValues(t, 6, ist.Handled)
	require.EqualValues(t, 3, ist.DeadLettered)
	_, err = a.DiscardInbox(bg, "bad-"+tenantB)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	discarded, err := a.DiscardInboxMatching(bg, outbox.InboxListOptions{Handler: "ledger", ID: "bad-" + tenantA})
	require.NoError(t, err)
	require.Equal(t, 1, discarded)
	idls, err := w.ob.AllTenants().InboxDeadLetters(bg, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, idls, 2, "only A's inbox dead letter is gone")
	cleaned, err := a.CleanupInbox(bg, time.Nanosecond, 1)
	require.NoError(t, err)
	require.EqualValues(t, 3, cleaned, "A's two handled entries and its dead-lettered one")
	ist, err = w.ob.Tenant(tenantB).InboxStats(bg)
	require.NoError(t, err)
	require.EqualValues(t, 2, ist.Handled, "B's inbox untouched by A's cleanup")
	cleaned, err = w.ob.AllTenants().CleanupInbox(bg, time.Nanosecond, 1)
	require.NoError(t, err)
	require.EqualValues(t, 4, cleaned, "estate-wide: B's and the untenanted handled entries; the entries of the two inbox dead letters still open stay")
}

// Stream IDs are only unique within a tenant, and they are the default partition keys: two tenants ordering
// messages on the same key are two independent keys. A dead letter of one tenant's key holds that tenant's later
// messages only; the other tenant's flow, and its admin scope neither sees nor can move the dead letter.
func TestTenantSameKeyWithDeadLetter(t *testing.T) {
	t.Parallel()
	w := newTenancyWorld(t)
	bg := context.Background()
	for _, tenant := range []string{tenantA, tenantB} {
		var ms []outbox.Message
		for i := 1; i <= 2; i++ {
			id := fmt.Sprintf("%s-%d", tenant, i)
			if tenant == tenantA && i == 1 {
				id = "poison-" + id
			}
			ms = append(ms, outbox.Message{ID: id, Topic: "accounts", PartitionKey: "acc-1", Payload: []byte(id)})
		}
		n, err := w.ob.Stage(ctxFor(tenant), ms...)
		require.NoError(t, err)
		require.Equal(t, 2, n)
	}
	relay, err := w.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	res, err := relay.Drain(bg, w.broker)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 2, Failed: 1, DeadLettered: 1}, res)
	var ids []string
	for _, m := range w.broker.published() {
		ids = append(ids, m.UUID)
		require.Equal(t, tenantB, m.Metadata.Get(stagehand.HeaderTenantID))
	}
	require.Equal(t, []string{tenantB + "-1", tenantB + "-2"}, ids, "B's key flows, in order")

	b := w.ob.Tenant(tenantB)
	st, err := b.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Sent: 2}, trimStats(st), "nothing of B pending or parked")
	st, err = w.ob.Tenant(tenantA).Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 1, Parked: 1, HeldByDeadLetter: 1, DeadLettered: 1}, trimStats(st),
		"A's second message waits behind A's dead letter")
	dls, err := b.DeadLetters(bg, outbox.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, dls)
	_, err = b.Redrive(bg, "poison-"+tenantA+"-1")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = b.Discard(bg, "poison-"+tenantA+"-1")
	require.ErrorIs(t, err, outbox.ErrNotFound)

	// A later message of B on the key is not held either; discarding A's dead letter releases A's key.
	_, err = w.ob.Stage(ctxFor(tenantB), outbox.Message{ID: tenantB + "-3", Topic: "accounts", PartitionKey: "acc-1"})
	require.NoError(t, err)
	n, err := w.ob.Tenant(tenantA).Discard(bg, "poison-"+tenantA+"-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	res, err = relay.Drain(bg, w.broker)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 2}, res)
	st, err = w.ob.AllTenants().Stats(bg)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Sent: 5}, trimStats(st), "four published and one discarded")
}

// Message IDs are only unique within a tenant: the same ID staged by two tenants is two messages. Both are staged,
// both published, and both handled by the inbox (neither skipped as the other's duplicate); a redelivery of either
// is still skipped.
func TestTenantSameMessageID(t *testing.T) {
	t.Parallel()
	w := newTenancyWorld(t)
	bg := context.Background()
	for _, tenant := range tenants {
		n, err := w.ob.Stage(ctxFor(tenant), outbox.Message{ID: "same", Topic: "orders", Payload: []byte(tenant)})
		require.NoError(t, err)
		require.Equal(t, 1, n, tenant)
	}
	relay, err := w.ob.NewRelay(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	res, err := relay.Drain(bg, w.broker)
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 3}, res)
	published := w.broker.published()
	require.Len(t, published, 3)

	var mu sync.Mutex
	handled := map[string]string{} // tenant -> payload
	handler := w.inbox.Handler("orders", func(ctx context.Context, _ pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[stagehand.TenantFrom(ctx)] += string(msg.Payload)
		return nil
	})
	for range 2 {
		for _, m := range published {
			require.Equal(t, "same", m.UUID)
			require.NoError(t, handler(m))
		}
	}
	require.Equal(t, map[string]string{tenantA: tenantA, tenantB: tenantB, stagehand.NoTenant: stagehand.NoTenant},
		handled, "each tenant's message handled once")
	for _, tenant := range tenants {
		st, err := w.ob.Tenant(tenant).Stats(bg)
		require.NoError(t, err)
		require.Equal(t, outbox.Stats{Sent: 1}, trimStats(st), tenant)
		ist, err := w.ob.Tenant(tenant).InboxStats(bg)
		require.NoError(t, err)
		require.EqualValues(t, 1, ist.Handled, tenant)
	}
}

// A projection confined to one tenant (Config.Tenants) applies and parks only that tenant's events; its
// checkpoint and parked events say nothing of the other tenants.
func TestTenantScopedProjection(t *testing.T) {
	t.Parallel()
	w := newTenancyWorld(t)
	bg := context.Background()
	for _, tenant := range tenants {
		_, err := w.repo.Create(ctxFor(tenant), "acc-1", func(a *tenancyAccount) error {
			aggregate.Raise(a, accountOpened{Owner: "owner-" + tenant})
			aggregate.Raise(a, accountDeposited{Amount: amount(tenant)})
			return nil
		})
		require.NoError(t, err)
	}
	var mu sync.Mutex
	seen := map[string]bool{} // tenant/stream/version handled (a failed batch is applied again, one by one)
	h := projection.HandlerFunc(func(_ context.Context, _ pgx.Tx, e projection.Event) error {
		mu.Lock()
		defer mu.Unlock()
		seen[fmt.Sprintf("%s/%s/%d", e.Tenant, e.StreamID, e.Version)] = true
		if e.Type == "bank.account.deposited" {
			return errors.New("cannot apply a deposit")
		}
		return nil
	})
	p, err := projection.New(w.pool, w.store, h, &projection.Config{Name: "acme-accounts", Schema: w.schema,
		Tenants: []string{tenantA}, OnFailure: projection.Park, MaxAttempts: 1, PollInterval: 20 * time.Millisecond,
		LeaseTTL: 5 * time.Second, LeaseAcquireInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	head, err := w.store.HeadPosition(bg)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		st, err := p.Status(bg)
		require.NoError(t, err)
		return len(st) == 1 && st[0].Position == head
	}, "the projection did not pass the head")
	mu.Lock() // copied under the lock, asserted after it
	got := maps.Clone(seen)
	mu.Unlock()
	require.Equal(t, map[string]bool{tenantA + "/acc-1/1": true, tenantA + "/acc-1/2": true}, got,
		"only A's events reach A's projection")
	parked, err := p.Parked(bg)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, tenantA, parked[0].Tenant)
	require.Equal(t, "acc-1", parked[0].StreamID)
}

// trimStats keeps the counts of a Stats (the ages depend on timing).
func trimStats(s outbox.Stats) outbox.Stats {
	s.OldestPendingAge = 0
	return s
}
