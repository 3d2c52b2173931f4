package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

// deadLetters stages messages with the given IDs and tenants (one topic each, plus "twice" on two topics) and
// dead-letters them all.
func deadLetters(t *testing.T, e *env, byTenant map[string][]string) {
	t.Helper()
	ctx := context.Background()
	var ms []outbox.Message
	for tenant, ids := range byTenant {
		for _, id := range ids {
			ms = append(ms, outbox.Message{ID: id, Topic: "t", Tenant: tenant, Payload: []byte("x")})
		}
	}
	ms = append(ms, outbox.Message{ID: "twice", Topic: "t", Tenant: "acme", Payload: []byte("x")},
		outbox.Message{ID: "twice", Topic: "u", Tenant: "acme", Payload: []byte("x")})
	_, err := e.ob.Stage(ctx, ms...)
	require.NoError(t, err)
	b := newBroker()
	b.setFail(func(*message.Message) error { return errRejected })
	res, err := e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, len(ms), res.DeadLettered)
}

// zeroTime asks LastPublished about the whole ledger.
var zeroTime time.Time

func deadIDs(t *testing.T, a *outbox.Admin) []string {
	t.Helper()
	dls, err := a.DeadLetters(context.Background(), outbox.ListOptions{})
	require.NoError(t, err)
	var ids []string
	for _, dl := range dls {
		ids = append(ids, dl.ID+"@"+dl.Topic)
	}
	return ids
}

// Redrive and Discard act on the IDs the scope knows and name the others in an *UnknownIDsError that matches
// ErrNotFound; another tenant's dead letter is unknown to a tenant's scope and stays untouched.
func TestRedriveAndDiscardReportUnknownIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	deadLetters(t, e, map[string][]string{"acme": {"a1", "a2"}, "globex": {"g1", "g2"}})
	acme := e.ob.Tenant("acme")

	n, err := acme.Redrive(ctx, "a1", "g1", "nope", "a1")
	require.Equal(t, 1, n, "the known ID is redriven")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	var unknown *outbox.UnknownIDsError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, &outbox.UnknownIDsError{Op: "redrive", IDs: []string{"g1", "nope"}, Requested: 3}, unknown)
	require.EqualError(t, err, "outbox: redrive: 2 of 3 message IDs have no dead letter in this scope: g1, nope")
	require.ElementsMatch(t, []string{"a2@t", "twice@t", "twice@u"}, deadIDs(t, acme))
	require.ElementsMatch(t, []string{"g1@t", "g2@t"}, deadIDs(t, e.ob.Tenant("globex")),
		"another tenant's dead letter is not touched")
	require.EqualValues(t, 1, e.count("outbox", "message_id = 'a1'"), "a1 is back in the outbox")

	// A message dead-lettered on two topics is moved on both: two dead letters for one ID.
	n, err = acme.Discard(ctx, "twice")
	require.NoError(t, err, "every ID known: no error")
	require.Equal(t, 2, n)

	n, err = acme.Discard(ctx, "a1", "a2")
	require.Equal(t, 1, n)
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []string{"a1"}, unknown.IDs, "a redriven message is no longer a dead letter")
	require.Equal(t, "discard", unknown.Op)

	// The estate-wide scope knows every tenant's dead letters.
	n, err = e.ob.AllTenants().Discard(ctx, "g1", "g2", "zzz")
	require.Equal(t, 2, n)
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []string{"zzz"}, unknown.IDs)
	require.Empty(t, deadIDs(t, e.ob.AllTenants()))

	// Nothing known at all: nothing moved, every ID reported. No IDs: nothing to report.
	n, err = acme.Redrive(ctx, "x", "y")
	require.Zero(t, n)
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []string{"x", "y"}, unknown.IDs)
	n, err = acme.Redrive(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// Any other failure is not an UnknownIDsError.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = acme.Redrive(cctx, "a1")
	require.Error(t, err)
	require.False(t, errors.As(err, &unknown))
	require.False(t, errors.Is(err, outbox.ErrNotFound))
}

// LastPublished reads the newest publication of the scope after an instant from the sent ledger; discarded dead
// letters do not count.
func TestLastPublished(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	zero, err := e.ob.AllTenants().LastPublished(ctx, zeroTime)
	require.NoError(t, err)
	require.True(t, zero.IsZero(), "nothing published yet")

	_, err = e.ob.Stage(ctx, outbox.Message{ID: "m1", Topic: "t", Tenant: "acme", Payload: []byte("x")})
	require.NoError(t, err)
	b := newBroker()
	_, err = e.relay(nil).Drain(ctx, b)
	require.NoError(t, err)
	last, err := e.ob.AllTenants().LastPublished(ctx, zeroTime)
	require.NoError(t, err)
	require.False(t, last.IsZero())
	acme, err := e.ob.Tenant("acme").LastPublished(ctx, zeroTime)
	require.NoError(t, err)
	require.Equal(t, last, acme)
	other, err := e.ob.Tenant("globex").LastPublished(ctx, zeroTime)
	require.NoError(t, err)
	require.True(t, other.IsZero(), "another tenant's publication is not globex's")
	after, err := e.ob.AllTenants().LastPublished(ctx, last)
	require.NoError(t, err)
	require.True(t, after.IsZero(), "nothing newer than the last answer")

	deadLetters(t, e, map[string][]string{"acme": {"d1"}})
	_, err = e.ob.AllTenants().Discard(ctx, "d1", "twice")
	require.NoError(t, err)
	again, err := e.ob.AllTenants().LastPublished(ctx, last)
	require.NoError(t, err)
	require.True(t, again.IsZero(), "a discard is not a publication")
}
