package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// attemptErr is the broker's error for attempt n: the same fault, with other numbers each time.
func attemptErr(n int) error { return fmt.Errorf("timeout after %dms on order %d", 7*n+3, 100+n) }

// Every failed attempt is recorded with its error; the history keeps the last ten across a redrive, numbered on,
// each with the attempt's number in its round.
func TestFailureHistoryKeepsTheLastTenAcrossRedrives(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "m-1", Topic: "orders", Payload: []byte("{}"), Tenant: "acme"})
	require.NoError(t, err)
	b := newBroker()
	attempt := 0
	b.setFail(func(*message.Message) error {
		attempt++
		return attemptErr(attempt)
	})
	relay := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(11) })
	for range 12 {
		_, err := relay.Drain(ctx, b)
		require.NoError(t, err)
		clock.Add(time.Hour)
	}
	require.Equal(t, 12, attempt)
	admin := e.ob.AllTenants()
	dl, err := admin.DeadLetter(ctx, "m-1")
	require.NoError(t, err)
	require.Equal(t, "error", dl.ErrorType)
	require.Equal(t, "error: timeout after <duration> on order <n>", dl.ErrorSignature)
	require.Equal(t, attemptErr(12).Error(), dl.LastError)

	res, err := admin.Find(ctx, outbox.FindQuery{Text: "m-1", By: outbox.FindByID})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	m := res.Messages[0]
	require.Equal(t, outbox.StateDeadLettered, m.State)
	require.Equal(t, 12, m.Attempts)
	require.Equal(t, dl.ErrorSignature, m.ErrorSignature)
	require.Len(t, m.Failures, 10, "the last ten of twelve")
	for i, f := range m.Failures {
		require.Equal(t, 12-i, f.N, "newest first")
		require.Equal(t, 12-i, f.Attempt)
		require.Equal(t, attemptErr(12-i).Error(), f.Error, "each attempt's own error, not only the last")
		require.Equal(t, dl.ErrorSignature, f.Signature)
	}
	require.EqualValues(t, 10, e.count("message_failures"), "the older entries are deleted, not only hidden")

	// Redriven, it fails twice more: the history numbers on, the attempts start a new round.
	n, err := admin.Redrive(ctx, "m-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for range 2 {
		_, err := relay.Drain(ctx, b)
		require.NoError(t, err)
		clock.Add(time.Hour)
	}
	res, err = admin.Find(ctx, outbox.FindQuery{Text: "m-1"})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	m = res.Messages[0]
	require.Equal(t, outbox.StatePending, m.State, "due again: the test clock moved past its backoff")
	require.Equal(t, 2, m.Attempts)
	require.Len(t, m.Failures, 10)
	require.Equal(t, []int{14, 13, 12}, []int{m.Failures[0].N, m.Failures[1].N, m.Failures[2].N})
	require.Equal(t, []int{2, 1, 12}, []int{m.Failures[0].Attempt, m.Failures[1].Attempt, m.Failures[2].Attempt})
	require.Equal(t, attemptErr(14).Error(), m.Failures[0].Error)

	// A long error is cut in the history.
	b.setFail(func(*message.Message) error { return errors.New(strings.Repeat("x", 5000)) })
	_, err = relay.Drain(ctx, b)
	require.NoError(t, err)
	res, err = admin.Find(ctx, outbox.FindQuery{Text: "m-1"})
	require.NoError(t, err)
	require.Len(t, res.Messages[0].Failures[0].Error, 1000)
}

// Dead letters group by the signature of their last error; a group is listed, counted, redriven and discarded
// through ListOptions.Signature, in the scope. The inbox's do the same.
func TestDeadLetterGroupsAndGroupActions(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	stage := func(tenant, id string) {
		_, err := e.ob.Stage(ctx, outbox.Message{ID: id, Topic: "orders", Payload: []byte("{}"), Tenant: tenant})
		require.NoError(t, err)
	}
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if strings.HasPrefix(m.UUID, "t-") {
			return fmt.Errorf("timeout after %dms on order %s", len(m.UUID)*13, m.UUID)
		}
		return fmt.Errorf(`dial tcp 10.0.0.%d:5432: connection refused by "db-%s"`, len(m.UUID), m.UUID)
	})
	relay := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) })
	drain := func() {
		t.Helper()
		_, err := relay.Drain(ctx, b)
		require.NoError(t, err)
	}
	stage("acme", "t-1")
	stage("acme", "c-1")
	drain()
	first := clock.Now()
	clock.Add(time.Minute)
	stage("acme", "t-22")
	stage("globex", "t-333")
	stage("acme", "c-22")
	drain()
	last := clock.Now()

	timeout := "error: timeout after <duration> on order t-<n>"
	refused := `error: dial tcp <n>:<n>: connection refused by "?"`
	all := e.ob.AllTenants()
	groups, err := all.DeadLetterGroups(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, groups, 2)
	require.Equal(t, outbox.DeadLetterGroup{Signature: timeout, ErrorType: "error", Count: 3, FirstDeadAt: first,
		LastDeadAt: last, SampleError: groups[0].SampleError}, groups[0], "the largest group first")
	require.Contains(t, []string{"timeout after 52ms on order t-22", "timeout after 65ms on order t-333"},
		groups[0].SampleError, "the newest one's error")
	require.Equal(t, refused, groups[1].Signature)
	require.EqualValues(t, 2, groups[1].Count)

	// A tenant's scope groups its own; a filter narrows the groups.
	globex, err := e.ob.Tenant("globex").DeadLetterGroups(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, globex, 1)
	require.EqualValues(t, 1, globex[0].Count)
	narrowed, err := all.DeadLetterGroups(ctx, outbox.ListOptions{DeadAfter: first})
	require.NoError(t, err)
	require.Len(t, narrowed, 2)
	require.EqualValues(t, 2, narrowed[0].Count)
	limited, err := all.DeadLetterGroups(ctx, outbox.ListOptions{Limit: 1})
	require.NoError(t, err)
	require.Len(t, limited, 1)

	n, err := all.CountDeadLetters(ctx, outbox.ListOptions{Signature: timeout})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	moved, err := e.ob.Tenant("acme").RedriveMatching(ctx, outbox.ListOptions{Signature: timeout})
	require.NoError(t, err)
	require.Equal(t, 2, moved, "acme's two of the group")
	moved, err = all.RedriveMatching(ctx, outbox.ListOptions{Signature: timeout})
	require.NoError(t, err)
	require.Equal(t, 1, moved, "and globex's")
	require.EqualValues(t, 3, e.count("outbox"))
	moved, err = all.DiscardMatching(ctx, outbox.ListOptions{Signature: refused})
	require.NoError(t, err)
	require.Equal(t, 2, moved)
	groups, err = all.DeadLetterGroups(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, groups)

	// A dead letter written without a signature (by an older release) groups under "unknown" and can be acted on.
	clock.Add(time.Hour)
	drain() // the redriven three die again
	pgtest.Exec(t, pool, `ALTER TABLE `+pgtest.Q(schema, "outbox_dead_letters")+` ALTER COLUMN error_type
		SET DEFAULT 'unknown'`)
	pgtest.Exec(t, pool, `UPDATE `+pgtest.Q(schema, "outbox_dead_letters")+` SET error_type = DEFAULT,
		error_signature = DEFAULT WHERE message_id = 't-1'`)
	groups, err = all.DeadLetterGroups(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, groups, 2)
	require.Equal(t, "unknown: recorded without a signature", groups[1].Signature)
	require.Equal(t, "unknown", groups[1].ErrorType)

	// The inbox: the same verbs, by signature.
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	for i, id := range []string{"i-1", "i-2", "i-3"} {
		text := fmt.Sprintf("ledger row %d is locked", i*11)
		if id == "i-3" {
			text = "invoice amount is negative: -500 cents"
		}
		msg := message.NewMessage(id, []byte("{}"))
		msg.Metadata.Set(stagehand.HeaderTenantID, "acme")
		require.NoError(t, in.Handler("billing", func(context.Context, pgx.Tx, *outbox.Publisher,
			*message.Message) error {
			return errors.New(text)
		})(msg))
	}
	ig, err := all.InboxDeadLetterGroups(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, ig, 2)
	require.Equal(t, "error: ledger row <n> is locked", ig[0].Signature)
	require.EqualValues(t, 2, ig[0].Count)
	idl, err := all.InboxDeadLetter(ctx, "billing", "i-3")
	require.NoError(t, err)
	require.Equal(t, "error: invoice amount is negative: -<n> cents", idl.ErrorSignature)
	n, err = all.CountInboxDeadLetters(ctx, outbox.InboxListOptions{Signature: ig[0].Signature})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	moved, err = all.RedriveInboxMatching(ctx, outbox.InboxListOptions{Signature: ig[0].Signature,
		RedriveTopic: "ledger"})
	require.NoError(t, err)
	require.Equal(t, 2, moved)
	moved, err = all.DiscardInboxMatching(ctx, outbox.InboxListOptions{Signature: ig[1].Signature})
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	ig, err = all.InboxDeadLetterGroups(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Empty(t, ig)
}

// Find looks a message up by its ID, correlation ID, stream and key, wherever it is, in the scope, with the inbox
// handlers' records and failures.
func TestFindByEachKindOfLookup(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	clock := newTestClock()
	e := setupOn(t, pool, schema, &outbox.Config{Clock: clock.Now})
	ctx := context.Background()
	msg := func(id, tenant, key string, pos int64) outbox.Message {
		return outbox.Message{ID: id, Topic: "orders", Type: "order.placed", Payload: []byte("{}"), Tenant: tenant,
			CorrelationID: "corr-1", PartitionKey: key, SourcePosition: pos,
			Metadata: map[string]string{stagehand.HeaderAggregateID: "order-1"}}
	}
	// m-sent goes out and is handled; m-dead is rejected for good; m-pending stays (the broker is down for it);
	// m-later is scheduled; globex's m-other shares the correlation ID and stream.
	_, err := e.ob.Stage(ctx, msg("m-sent", "acme", "order-1", 11), msg("m-dead", "acme", "order-dead", 12))
	require.NoError(t, err)
	b := newBroker()
	b.setFail(rejectPrefix("m-dead"))
	_, err = e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	later := msg("m-later", "acme", "", 0)
	later.ScheduledAt = clock.Now().Add(time.Hour)
	_, err = e.ob.Stage(ctx, msg("m-pending", "acme", "order-1", 13), later, msg("m-other", "globex", "order-1", 14))
	require.NoError(t, err)

	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 3, RetryDelay: time.Millisecond})
	require.NoError(t, err)
	delivered := func(id string) *message.Message {
		m := message.NewMessage(id, []byte("{}"))
		m.Metadata.Set(stagehand.HeaderTenantID, "acme")
		m.Metadata.Set(stagehand.HeaderCorrelationID, "corr-1")
		return m
	}
	require.NoError(t, in.Handler("billing", e.noop())(delivered("m-sent")))
	flaky := in.Handler("audit", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return errors.New("audit store unavailable (attempt 1)")
	})
	again := delivered("m-sent")
	requireRetried(t, flaky(again), again)
	// A message this database never staged, dead-lettered by its handler: known only to the inbox.
	foreign := delivered("m-foreign")
	foreign.Metadata.Set(stagehand.HeaderAggregateID, "order-1")
	require.NoError(t, in.Handler("billing", func(context.Context, pgx.Tx, *outbox.Publisher,
		*message.Message) error {
		return outbox.Permanent(errors.New("unknown order"))
	})(foreign))

	all, acme := e.ob.AllTenants(), e.ob.Tenant("acme")
	found := func(a *outbox.Admin, q outbox.FindQuery) map[string]outbox.FoundMessage {
		t.Helper()
		res, err := a.Find(ctx, q)
		require.NoError(t, err)
		require.False(t, res.ScanBounded)
		out := map[string]outbox.FoundMessage{}
		for _, m := range res.Messages {
			out[m.Tenant+"/"+m.ID] = m
		}
		return out
	}
	states := func(ms map[string]outbox.FoundMessage) map[string]string {
		out := map[string]string{}
		for k, m := range ms {
			out[k] = m.State
		}
		return out
	}

	// By ID: the sent message, its handlers (handled by billing, failing in audit with its history).
	byID := found(all, outbox.FindQuery{Text: "m-sent", By: outbox.FindByID})
	require.Len(t, byID, 1)
	sent := byID["acme/m-sent"]
	require.Equal(t, outbox.StateSent, sent.State)
	require.EqualValues(t, 11, sent.SourcePosition)
	require.Len(t, sent.Handlers, 2)
	require.Equal(t, "audit", sent.Handlers[0].Handler)
	require.Equal(t, outbox.OutcomeFailing, sent.Handlers[0].Outcome)
	require.Equal(t, 1, sent.Handlers[0].Attempts)
	require.Len(t, sent.Handlers[0].Failures, 1)
	require.Equal(t, "error: audit store unavailable (attempt <n>)", sent.Handlers[0].Failures[0].Signature)
	require.Equal(t, "billing", sent.Handlers[1].Handler)
	require.Equal(t, outbox.OutcomeHandled, sent.Handlers[1].Outcome)

	// By correlation ID: every message still in the outbox or its dead letters, and the inbox's dead letter; the
	// sent ledger keeps no correlation ID.
	require.Equal(t, map[string]string{"acme/m-dead": outbox.StateDeadLettered, "acme/m-pending": outbox.StatePending,
		"acme/m-later": outbox.StateScheduled, "globex/m-other": outbox.StatePending,
		"acme/m-foreign": outbox.StateReceived},
		states(found(all, outbox.FindQuery{Text: "corr-1", By: outbox.FindByCorrelation})))
	require.NotContains(t, found(acme, outbox.FindQuery{Text: "corr-1", By: outbox.FindByCorrelation}),
		"globex/m-other", "a tenant's scope finds its own")

	// By stream: the same, and with the stream's event positions, the sent message too.
	byStream := found(all, outbox.FindQuery{Text: "order-1", By: outbox.FindByStream})
	require.Contains(t, byStream, "acme/m-foreign")
	require.NotContains(t, byStream, "acme/m-sent")
	withPositions := found(all, outbox.FindQuery{Text: "order-1", By: outbox.FindByStream, Positions: []int64{11}})
	require.Equal(t, outbox.StateSent, withPositions["acme/m-sent"].State)
	foreignFound := byStream["acme/m-foreign"]
	require.Len(t, foreignFound.Handlers, 1)
	require.Equal(t, outbox.OutcomeDeadLettered, foreignFound.Handlers[0].Outcome)
	require.Equal(t, "error: unknown order", foreignFound.Handlers[0].ErrorSignature)

	// By key: the key's messages in the outbox and the dead letters.
	require.Equal(t, map[string]string{"acme/m-pending": outbox.StatePending, "globex/m-other": outbox.StatePending},
		states(found(all, outbox.FindQuery{Text: "order-1", By: outbox.FindByKey})))
	dead := found(all, outbox.FindQuery{Text: "order-dead", By: outbox.FindByKey})["acme/m-dead"]
	require.Equal(t, outbox.StateDeadLettered, dead.State)
	require.Equal(t, errRejected.Error(), dead.LastError)
	require.Len(t, dead.Failures, 1)
	require.Equal(t, "corr-1", dead.CorrelationID)
	require.Equal(t, "order-1", dead.StreamID)

	// Any: the text as each kind.
	require.Len(t, found(all, outbox.FindQuery{Text: "order-1"}), 5, "by stream and by key")
	require.Len(t, found(all, outbox.FindQuery{Text: "m-later"}), 1)
	require.Empty(t, found(all, outbox.FindQuery{Text: "nothing-like-it"}))

	// A limit counts messages, and says when it cut.
	res, err := all.Find(ctx, outbox.FindQuery{Text: "corr-1", Limit: 2})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2)
	require.True(t, res.Truncated)

	for _, q := range []outbox.FindQuery{{}, {Text: "   "}, {Text: strings.Repeat("x", 1025)},
		{Text: "x", By: outbox.FindByKey + 1}, {Text: "x", Limit: 501}} {
		_, err := all.Find(ctx, q)
		require.ErrorIs(t, err, outbox.ErrInvalidQuery, "%+v", q)
	}
}

// An inbox dead letter's failures are its history too, and a redriven inbox dead letter, handled at last, shows
// as handled with the failures that came before.
func TestFindShowsInboxHistoryAfterARedrive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 2, RetryDelay: time.Millisecond})
	require.NoError(t, err)
	fails := true
	h := in.Handler("ledger", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		if fails {
			return errors.New("ledger is down")
		}
		return nil
	})
	m := message.NewMessage("m-1", []byte("{}"))
	m.Metadata.Set(stagehand.HeaderTenantID, "acme")
	requireRetried(t, h(m), m)
	m = m.Copy()
	require.NoError(t, h(m))
	admin := e.ob.Tenant("acme")
	res, err := admin.Find(ctx, outbox.FindQuery{Text: "m-1"})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	rec := res.Messages[0].Handlers[0]
	require.Equal(t, outbox.OutcomeDeadLettered, rec.Outcome)
	require.Equal(t, 2, rec.Attempts)
	require.Len(t, rec.Failures, 2)

	// The topic it was consumed from (a router's subscription records it; this test calls the handler itself).
	pgtest.Exec(t, e.pool, `UPDATE `+pgtest.Q(e.schema, "inbox_dead_letters")+` SET topic = 'ledger'`)
	n, err := admin.RedriveInbox(ctx, "m-1", "m-unknown")
	var unknown *outbox.UnknownIDsError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []string{"m-unknown"}, unknown.IDs)
	require.Equal(t, 1, n, "the known one is redriven all the same")
	fails = false
	copies := &capture{}
	_, err = e.relay(nil).Drain(ctx, copies)
	require.NoError(t, err)
	redriven := copies.take()
	require.Len(t, redriven, 1)
	for _, c := range redriven {
		c.SetContext(ctx) // the relay's delivery context ended with its drain
		require.NoError(t, h(c))
	}
	res, err = admin.Find(ctx, outbox.FindQuery{Text: "m-1", By: outbox.FindByID})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	require.Equal(t, outbox.StateReceived, res.Messages[0].State, "the copy went out under another ID")
	rec = res.Messages[0].Handlers[0]
	require.Equal(t, outbox.OutcomeHandled, rec.Outcome)
	require.Len(t, rec.Failures, 2, "the failures before the redrive stay in the history")
}
