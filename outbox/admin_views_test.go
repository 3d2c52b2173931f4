package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// testClock is a clock a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// rejectWith rejects every message with an error naming it: "rejected <ID> by <topic> (code 50%_x)".
func rejectWith(m *message.Message) error {
	return fmt.Errorf("rejected %s (code 50%%_x)", m.UUID)
}

func deadKeys(dls []outbox.DeadLetter) []string {
	var out []string
	for _, d := range dls {
		out = append(out, d.Tenant+"/"+d.ID+"@"+d.Topic)
	}
	return out
}

// The dead-letter filters select by topic, type, IDs, error text (a plain substring: pattern characters are
// literal, case ignored) and time of death, in both orders, page by keyset without skipping or repeating a row,
// cut payloads when asked, and select exactly what CountDeadLetters counts and RedriveMatching / DiscardMatching
// move; a tenant's scope never reaches another tenant's dead letters.
func TestDeadLetterFiltersCountAndMatchingMoves(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	relay := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) })
	b := newBroker()
	b.setFail(rejectWith)

	// Two rounds of dead letters an hour apart: round 1 at 03:00, round 2 at 04:00.
	stage := func(round int) {
		var ms []outbox.Message
		for _, tenant := range []string{"acme", "globex"} {
			for i := range 3 {
				ms = append(ms, outbox.Message{ID: fmt.Sprintf("r%d-%s-%d", round, tenant, i), Tenant: tenant,
					Topic: []string{"orders", "billing", "orders"}[i], Type: []string{"A", "B", "C"}[i],
					Payload: []byte(strings.Repeat("p", 100+i))})
			}
		}
		_, err := e.ob.Stage(ctx, ms...)
		require.NoError(t, err)
		res, err := relay.Drain(ctx, b)
		require.NoError(t, err)
		require.Equal(t, 6, res.DeadLettered)
	}
	stage(1)
	round2 := clock.Add(time.Hour)
	stage(2)

	all := e.ob.AllTenants()
	list := func(a *outbox.Admin, o outbox.ListOptions) []string {
		t.Helper()
		dls, err := a.DeadLetters(ctx, o)
		require.NoError(t, err)
		n, err := a.CountDeadLetters(ctx, o)
		require.NoError(t, err)
		if o.Limit == 0 {
			require.EqualValues(t, len(dls), n, "CountDeadLetters counts what the listing selects")
		}
		return deadKeys(dls)
	}
	require.Len(t, list(all, outbox.ListOptions{}), 12)
	require.Equal(t, []string{"acme/r1-acme-1@billing", "acme/r2-acme-1@billing", "globex/r1-globex-1@billing",
		"globex/r2-globex-1@billing"}, sorted(list(all, outbox.ListOptions{Topic: "billing"})))
	require.Equal(t, []string{"acme/r1-acme-2@orders", "acme/r2-acme-2@orders"},
		sorted(list(e.ob.Tenant("acme"), outbox.ListOptions{Type: "C"})))
	require.Equal(t, []string{"globex/r2-globex-0@orders"}, list(all, outbox.ListOptions{ErrorContains: "R2-GLOBEX-0"}),
		"error text ignores case")
	require.Len(t, list(all, outbox.ListOptions{ErrorContains: "50%_x"}), 12, "pattern characters are literal")
	require.Empty(t, list(all, outbox.ListOptions{ErrorContains: "50%x"}), "% matches only itself")
	require.Empty(t, list(all, outbox.ListOptions{ErrorContains: "5_%"}), "_ matches only itself")
	require.Len(t, list(all, outbox.ListOptions{DeadAfter: round2.Add(-time.Minute)}), 6)
	require.Len(t, list(all, outbox.ListOptions{DeadBefore: round2.Add(-time.Minute)}), 6)
	require.Equal(t, []string{"acme/r2-acme-0@orders", "acme/r2-acme-2@orders"},
		sorted(list(all, outbox.ListOptions{IDs: []string{"r2-acme-0", "r2-acme-2", "nope"}})))
	require.Empty(t, list(all, outbox.ListOptions{IDs: []string{}}), "an empty, non-nil IDs selects none")

	// Paging in both orders: every row once, in time order.
	for _, newest := range []bool{false, true} {
		var seen []outbox.DeadLetter
		var after *outbox.DeadLetter
		for {
			page, err := all.DeadLetters(ctx, outbox.ListOptions{Limit: 5, NewestFirst: newest, After: after,
				PayloadLimit: 10})
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, d := range page {
				require.Len(t, d.Payload, 10, "payloads cut at PayloadLimit")
				require.GreaterOrEqual(t, d.PayloadSize, 100, "PayloadSize is the whole size")
			}
			seen = append(seen, page...)
			after = &page[len(page)-1]
		}
		require.Len(t, seen, 12, "newest first: %v", newest)
		require.ElementsMatch(t, list(all, outbox.ListOptions{}), deadKeys(seen))
		for i := 1; i < len(seen); i++ {
			if newest {
				require.False(t, seen[i].DeadAt.After(seen[i-1].DeadAt))
			} else {
				require.False(t, seen[i].DeadAt.Before(seen[i-1].DeadAt))
			}
		}
	}
	whole, err := all.DeadLetters(ctx, outbox.ListOptions{Limit: 1})
	require.NoError(t, err)
	require.Len(t, whole[0].Payload, whole[0].PayloadSize, "no PayloadLimit: the whole payload")

	// A tenant's matching redrive moves its own dead letters of the filter, and nothing of another tenant's.
	acme := e.ob.Tenant("acme")
	n, err := acme.RedriveMatching(ctx, outbox.ListOptions{Topic: "orders", DeadAfter: round2.Add(-time.Minute)})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.EqualValues(t, 2, e.count("outbox", "tenant_id = 'acme' AND message_id LIKE 'r2-acme-%'"))
	require.Len(t, list(all, outbox.ListOptions{}), 10)
	require.Len(t, list(e.ob.Tenant("globex"), outbox.ListOptions{}), 6, "globex untouched")

	// Estate-wide matching discard: every billing dead letter, kept in the ledger as discarded.
	n, err = all.DiscardMatching(ctx, outbox.ListOptions{Topic: "billing"})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.EqualValues(t, 4, e.count("outbox_sent", "outcome = 'discarded'"))
	require.Len(t, list(all, outbox.ListOptions{}), 6)

	// A dead letter newer than the call is not moved: the move is bounded by its start.
	n, err = all.DiscardMatching(ctx, outbox.ListOptions{DeadBefore: clock.Now().Add(-2 * time.Hour)})
	require.NoError(t, err)
	require.Zero(t, n)

	// A scope with an invalid tenant fails before reaching the database.
	_, err = e.ob.Tenant("bad\x00tenant").CountDeadLetters(ctx, outbox.ListOptions{})
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// A matching discard releases the keys its dead letters held: the messages waiting behind them go out in order.
func TestDiscardMatchingReleasesHeldKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, msgs("poison", 3, func(int) string { return "k" })...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(rejectPrefix("poison-00000"))
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 1, res.DeadLettered)

	held, err := e.ob.AllTenants().HeldKeys(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, held, 1)
	require.Equal(t, "k", held[0].Key)
	require.Equal(t, "poison-00000", held[0].MessageID)
	require.EqualValues(t, 2, held[0].Waiting, "two messages wait behind the dead letter")
	require.Contains(t, held[0].LastError, errRejected.Error())

	n, err := e.ob.AllTenants().DiscardMatching(ctx, outbox.ListOptions{ErrorContains: "rejected"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	res, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published, "the key's waiting messages went out")
	held, err = e.ob.AllTenants().HeldKeys(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, held)
}

// The inbox dead-letter filters select by handler, IDs, topic, type, error text and time of death, count what
// they list, and a matching discard or redrive acts on exactly that selection.
func TestInboxDeadLetterFiltersCountAndMatchingActions(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	failWith := func(text string) outbox.HandlerFunc {
		return func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error { return errors.New(text) }
	}
	deliver := func(handler, text, id, typ string) {
		m := message.NewMessage(id, []byte("payload of "+id))
		m.Metadata.Set(stagehand.HeaderTenantID, "acme")
		m.Metadata.Set(stagehand.HeaderMessageType, typ)
		require.NoError(t, in.Handler(handler, failWith(text))(m))
	}
	deliver("ledger", "ledger is down", "m1", "credit")
	deliver("ledger", "Ledger is DOWN", "m2", "debit")
	later := clock.Add(time.Hour)
	deliver("audit", "audit quota exceeded", "m1", "credit")
	deliver("audit", "audit quota exceeded", "m3", "credit")
	// A dead letter recorded with the topic it was consumed from (a router's subscription records it).
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(schema, "inbox_dead_letters")+` SET topic = 'bank' WHERE message_id = 'm3'`)

	all := e.ob.AllTenants()
	list := func(o outbox.InboxListOptions) []string {
		t.Helper()
		dls, err := all.InboxDeadLetters(ctx, o)
		require.NoError(t, err)
		n, err := all.CountInboxDeadLetters(ctx, o)
		require.NoError(t, err)
		if o.After == nil {
			require.EqualValues(t, len(dls), n, "CountInboxDeadLetters counts what the listing selects")
		}
		var out []string
		for _, d := range dls {
			out = append(out, d.Handler+"/"+d.MessageID)
		}
		return out
	}
	require.Equal(t, []string{"ledger/m1", "ledger/m2"}, list(outbox.InboxListOptions{ErrorContains: "ledger is down"}))
	require.Equal(t, []string{"audit/m3", "audit/m1"}, list(outbox.InboxListOptions{Handler: "audit",
		NewestFirst: true}))
	require.Equal(t, []string{"ledger/m2"}, list(outbox.InboxListOptions{Type: "debit"}))
	require.Equal(t, []string{"audit/m3"}, list(outbox.InboxListOptions{Topic: "bank"}))
	require.Equal(t, []string{"audit/m1", "audit/m3"}, list(outbox.InboxListOptions{DeadAfter: later.Add(-time.Second)}))
	require.Equal(t, []string{"ledger/m1", "audit/m1"}, list(outbox.InboxListOptions{IDs: []string{"m1"}}))
	page, err := all.InboxDeadLetters(ctx, outbox.InboxListOptions{PayloadLimit: 4, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, "payl", string(page[0].Payload))
	require.Equal(t, len("payload of m1"), page[0].PayloadSize)
	require.Equal(t, []string{"ledger/m2", "audit/m1", "audit/m3"}, list(outbox.InboxListOptions{After: &page[0]}),
		"the next page continues after the last row")

	// Redrive by a match: the ledger's two, copies staged in the outbox; the audit's stay.
	n, err := all.RedriveInboxMatching(ctx, outbox.InboxListOptions{RedriveTopic: "bank",
		ErrorContains: "ledger is down"})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.EqualValues(t, 2, e.count("outbox"))
	require.Equal(t, []string{"audit/m1", "audit/m3"}, list(outbox.InboxListOptions{}))
	// An ID and IDs without it select nothing.
	n, err = all.RedriveInboxMatching(ctx, outbox.InboxListOptions{ID: "m1", IDs: []string{"m3"}})
	require.NoError(t, err)
	require.Zero(t, n)

	n, err = e.ob.Tenant("globex").DiscardInboxMatching(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Zero(t, n, "another tenant's scope touches nothing")
	n, err = all.DiscardInboxMatching(ctx, outbox.InboxListOptions{Topic: "bank"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"audit/m1"}, list(outbox.InboxListOptions{}))
}

// The pending views: groups by topic, tenant and key with their figures; scheduled messages soonest first, paged;
// a key's messages in order; the relays holding rows.
func TestPendingViews(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	var ms []outbox.Message
	for i := range 5 {
		ms = append(ms, outbox.Message{ID: fmt.Sprintf("k1-%d", i), Topic: "orders", Tenant: "acme",
			PartitionKey: "k1", Payload: []byte("x")})
	}
	ms = append(ms,
		outbox.Message{ID: "k2-0", Topic: "billing", Tenant: "acme", PartitionKey: "k2", Payload: []byte("xy")},
		outbox.Message{ID: "free", Topic: "billing", Tenant: "globex", Payload: []byte("x")})
	for i := range 3 {
		ms = append(ms, outbox.Message{ID: fmt.Sprintf("later-%d", i), Topic: "reminders", Tenant: "globex",
			Payload: []byte("x"), ScheduledAt: clock.Now().Add(time.Duration(3-i) * time.Hour)})
	}
	_, err := e.ob.Stage(ctx, ms...)
	require.NoError(t, err)

	all := e.ob.AllTenants()
	groups := func(a *outbox.Admin, by outbox.GroupBy) []outbox.PendingGroup {
		t.Helper()
		g, err := a.PendingGroups(ctx, by, 0)
		require.NoError(t, err)
		for i := range g {
			g[i].OldestDueAt = time.Time{}
		}
		return g
	}
	require.Equal(t, []outbox.PendingGroup{{Topic: "orders", Pending: 5, Parked: 4},
		{Topic: "reminders", Pending: 3, Scheduled: 3}, {Topic: "billing", Pending: 2}}, groups(all, outbox.ByTopic))
	require.Equal(t, []outbox.PendingGroup{{Tenant: "acme", Pending: 6, Parked: 4},
		{Tenant: "globex", Pending: 4, Scheduled: 3}}, groups(all, outbox.ByTenant))
	require.Equal(t, []outbox.PendingGroup{{Tenant: "acme", Key: "k1", Pending: 5, Parked: 4},
		{Tenant: "globex", Pending: 4, Scheduled: 3}, {Tenant: "acme", Key: "k2", Pending: 1}},
		groups(all, outbox.ByKey))
	require.Equal(t, []outbox.PendingGroup{{Tenant: "globex", Pending: 4, Scheduled: 3}},
		groups(e.ob.Tenant("globex"), outbox.ByTenant), "a tenant's scope sees its own")
	g, err := all.PendingGroups(ctx, outbox.ByTopic, 1)
	require.NoError(t, err)
	require.Len(t, g, 1)
	require.Equal(t, clock.Now(), g[0].OldestDueAt)

	// Scheduled messages, soonest first, two per page.
	var got []string
	var after *outbox.PendingMessage
	for {
		page, err := all.ScheduledMessages(ctx, 2, after)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			got = append(got, m.ID)
			require.Equal(t, m.ScheduledAt, m.NextAttemptAt)
		}
		after = &page[len(page)-1]
	}
	require.Equal(t, []string{"later-2", "later-1", "later-0"}, got)
	sched, err := e.ob.Tenant("acme").ScheduledMessages(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, sched)

	// A key's messages in order: the head due, the others parked.
	key, err := all.KeyMessages(ctx, "acme", "k1", 3, 0)
	require.NoError(t, err)
	require.Len(t, key, 3)
	require.Equal(t, []string{"k1-0", "k1-1", "k1-2"}, []string{key[0].ID, key[1].ID, key[2].ID})
	require.False(t, key[0].Parked)
	require.True(t, key[1].Parked)
	rest, err := all.KeyMessages(ctx, "acme", "k1", 10, key[2].Sequence)
	require.NoError(t, err)
	require.Equal(t, []string{"k1-3", "k1-4"}, []string{rest[0].ID, rest[1].ID})
	none, err := e.ob.Tenant("globex").KeyMessages(ctx, "acme", "k1", 10, 0)
	require.NoError(t, err)
	require.Empty(t, none, "another tenant's key is empty in a tenant's scope")
	_, err = all.KeyMessages(ctx, "bad\xfftenant", "k1", 10, 0)
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)

	// Rows a relay holds, by owner.
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(schema, "outbox")+` SET lease_owner = 'relay-a',
		lease_expires_at = $1 WHERE message_id IN ('k1-0', 'k2-0')`, clock.Now().Add(time.Minute))
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(schema, "outbox")+` SET lease_owner = 'relay-b',
		lease_expires_at = $1 WHERE message_id = 'free'`, clock.Now().Add(-time.Minute))
	claims, err := all.InFlight(ctx)
	require.NoError(t, err)
	require.Len(t, claims, 1, "an expired lease holds nothing")
	require.Equal(t, "relay-a", claims[0].Owner)
	require.EqualValues(t, 2, claims[0].Rows)
	claims, err = e.ob.Tenant("globex").InFlight(ctx)
	require.NoError(t, err)
	require.Empty(t, claims)
}

// RelayLeases lists the leases of leader-elected relays, read as leaderships, partitions and membership slots, and
// none of the log followers' or the maintainer's.
func TestRelayLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, name := range []string{"orders-relay", "parts/0", "parts/1", "parts/members/0", "logfollow:projection",
		outbox.MaintenanceLease} {
		pgtest.Exec(t, e.pool, `INSERT INTO `+pgtest.Q(e.schema, "leases")+` (name, owner, token, expires_at)
			VALUES ($1, 'relay-x', 3, now() + interval '1 minute')`, name)
	}
	leases, err := e.ob.RelayLeases(context.Background())
	require.NoError(t, err)
	var got []string
	for _, l := range leases {
		require.True(t, l.Held)
		require.EqualValues(t, 3, l.Token)
		got = append(got, fmt.Sprintf("%s:%d:%v", l.Election, l.Partition, l.Member))
	}
	require.Equal(t, []string{"orders-relay:-1:false", "parts:0:false", "parts:1:false", "parts:-1:true"}, got)
}

// Activity counts what happened in a window, by the writers' clocks, whatever became of the messages since; the
// recent deliveries carry each step's time; StagedFrom tells what became of each event's messages, with the inbox
// handlers that handled them.
func TestActivityDeliveriesAndStagedFrom(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	start := clock.Now()
	stage := func(id string, pos int64) outbox.Message {
		return outbox.Message{ID: id, Topic: "orders", Tenant: "acme", Payload: []byte("x"), SourcePosition: pos}
	}
	_, err := e.ob.Stage(ctx, stage("sent-1", 10), stage("sent-2", 11), stage("dead-1", 11))
	require.NoError(t, err)
	clock.Add(time.Second)
	b := newBroker()
	b.setFail(rejectPrefix("dead-"))
	_, err = e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	_, err = e.ob.Stage(ctx, stage("wait-1", 12))
	require.NoError(t, err)
	clock.Add(time.Second)
	in, err := e.ob.NewInbox(nil)
	require.NoError(t, err)
	handled := message.NewMessage("sent-1", []byte("x"))
	handled.Metadata.Set(stagehand.HeaderTenantID, "acme")
	require.NoError(t, in.Handler("billing", e.noop())(handled))
	end := clock.Add(time.Second)

	act, err := e.ob.AllTenants().Activity(ctx, start.Add(-time.Millisecond), end)
	require.NoError(t, err)
	require.Equal(t, outbox.Activity{From: start.Add(-time.Millisecond), To: end, Staged: 4, Published: 2,
		DeadLettered: 1, Handled: 1, Pending: 1, OldestPendingAt: start.Add(time.Second)}, act)
	act, err = e.ob.AllTenants().Activity(ctx, start.Add(time.Millisecond), end)
	require.NoError(t, err)
	require.EqualValues(t, 1, act.Staged, "the first three were staged before the window")
	require.EqualValues(t, 2, act.Published)
	act, err = e.ob.Tenant("globex").Activity(ctx, start.Add(-time.Millisecond), end)
	require.NoError(t, err)
	require.Equal(t, outbox.Activity{From: start.Add(-time.Millisecond), To: end}, act)

	pubs, err := e.ob.AllTenants().RecentlyPublished(ctx, start, 10)
	require.NoError(t, err)
	require.Len(t, pubs, 2)
	for _, p := range pubs {
		require.Equal(t, start, p.StagedAt)
		require.Equal(t, start.Add(time.Second), p.PublishedAt)
	}
	hs, err := e.ob.AllTenants().RecentlyHandled(ctx, start, 10)
	require.NoError(t, err)
	require.Equal(t, []outbox.Passage{{MessageID: "sent-1", Tenant: "acme", Topic: "orders", Handler: "billing",
		SourcePosition: 10, StagedAt: start, PublishedAt: start.Add(time.Second),
		HandledAt: start.Add(2 * time.Second)}}, hs)

	staged, err := e.ob.AllTenants().StagedFrom(ctx, []int64{10, 11, 12})
	require.NoError(t, err)
	var got []string
	for _, m := range staged {
		got = append(got, fmt.Sprintf("%d %s %s %d", m.SourcePosition, m.ID, m.State, len(m.Handled)))
	}
	require.Equal(t, []string{"10 sent-1 sent 1", "11 dead-1 dead-lettered 0", "11 sent-2 sent 0",
		"12 wait-1 pending 0"}, got)
	require.Equal(t, "billing", staged[0].Handled[0].Handler)
	require.Equal(t, "handled", staged[0].Handled[0].Outcome)
	none, err := e.ob.Tenant("globex").StagedFrom(ctx, []int64{10, 11, 12})
	require.NoError(t, err)
	require.Empty(t, none)
}

// Backlog is Stats without the count of the sent ledger; LastPublished from the zero time finds the newest
// publication however old it is, looking back in widening windows.
func TestBacklogAndLastPublished(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	all := e.ob.AllTenants()
	last, err := all.LastPublished(ctx, time.Time{})
	require.NoError(t, err)
	require.True(t, last.IsZero(), "nothing published yet")

	_, err = e.ob.Stage(ctx, msgs("old", 3, nil)...)
	require.NoError(t, err)
	_, err = e.relay(nil).Drain(ctx, newBroker())
	require.NoError(t, err)
	published := clock.Now()
	clock.Add(10 * 24 * time.Hour) // older than every window but the last
	last, err = all.LastPublished(ctx, time.Time{})
	require.NoError(t, err)
	require.Equal(t, published, last)

	_, err = e.ob.Stage(ctx, msgs("new", 2, func(int) string { return "k" })...)
	require.NoError(t, err)
	st, err := all.Stats(ctx)
	require.NoError(t, err)
	bl, err := all.Backlog(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Sent)
	st.Sent = 0
	require.Equal(t, st, bl)
	require.EqualValues(t, 2, bl.Pending)
	require.EqualValues(t, 1, bl.WaitingBehindPending)
	clock.Add(30 * time.Second)
	_, err = e.relay(nil).Drain(ctx, newBroker())
	require.NoError(t, err)
	last, err = all.LastPublished(ctx, time.Time{})
	require.NoError(t, err)
	require.Equal(t, clock.Now(), last, "found in the last minute's window")
}
