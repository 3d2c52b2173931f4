package eventstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

func appendTenant(t *testing.T, s *eventstore.PostgresStore, tenant, stream string, n int) []eventstore.Record {
	t.Helper()
	req := eventstore.AppendRequest{Tenant: tenant, StreamID: stream, StreamType: "account",
		Expected: eventstore.AnyVersion}
	for i := range n {
		req.Events = append(req.Events, eventstore.EventData{Type: "deposited",
			Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	res, err := s.Append(context.Background(), req)
	require.NoError(t, err)
	return res.Records
}

// ReadStreamPage reads a stream a page at a time, in version order, and tells a missing stream from one that ends
// before the page.
func TestReadStreamPage(t *testing.T) {
	t.Parallel()
	s := newPostgres(t)
	ctx := context.Background()
	appendTenant(t, s, "acme", "acc-1", 7)
	appendTenant(t, s, "globex", "acc-1", 2)
	page, err := s.ReadStreamPage(ctx, "acme", "acc-1", 3, 3)
	require.NoError(t, err)
	require.Len(t, page, 3)
	require.Equal(t, []int64{3, 4, 5}, []int64{page[0].Version, page[1].Version, page[2].Version})
	require.Equal(t, "acme", page[0].Tenant)
	page, err = s.ReadStreamPage(ctx, "acme", "acc-1", 7, 0)
	require.NoError(t, err)
	require.Len(t, page, 1)
	page, err = s.ReadStreamPage(ctx, "acme", "acc-1", 8, 10)
	require.NoError(t, err)
	require.Empty(t, page, "a stream that ends before the page")
	_, err = s.ReadStreamPage(ctx, "initech", "acc-1", 1, 10)
	require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
	all, err := s.ReadStream(ctx, "acme", "acc-1", 1)
	require.NoError(t, err)
	require.Len(t, all, 7, "ReadStream still reads every event")
}

// RecordedAt gives the recording time of each position asked for that holds an event; CountLog counts a range of
// the log with ReadLog's filters.
func TestRecordedAtAndCountLog(t *testing.T) {
	t.Parallel()
	s := newPostgres(t)
	ctx := context.Background()
	a := appendTenant(t, s, "acme", "acc-1", 3)
	g := appendTenant(t, s, "globex", "acc-9", 2)
	at, err := s.RecordedAt(ctx, []int64{a[0].Position, g[1].Position, g[1].Position + 100})
	require.NoError(t, err)
	require.Len(t, at, 2)
	require.True(t, at[a[0].Position].Equal(a[0].RecordedAt))
	require.True(t, at[g[1].Position].Equal(g[1].RecordedAt))
	empty, err := s.RecordedAt(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, empty)

	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	n, err := s.CountLog(ctx, eventstore.LogQuery{}, head)
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	n, err = s.CountLog(ctx, eventstore.LogQuery{After: a[1].Position, Tenants: []string{"acme"}}, head)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "after the second acme event, one acme event")
	n, err = s.CountLog(ctx, eventstore.LogQuery{Tenants: []string{"globex"}}, g[0].Position)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "through bounds the range")
	_, err = s.CountLog(ctx, eventstore.LogQuery{Tenants: []string{"bad\x00"}}, head)
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)

	// A blank tenant is NoTenant, as in an append.
	appendTenant(t, s, "", "acc-0", 2)
	head, err = s.HeadPosition(ctx)
	require.NoError(t, err)
	for _, blank := range []string{"", "  "} {
		n, err = s.CountLog(ctx, eventstore.LogQuery{Tenants: []string{blank}}, head)
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "tenant %q", blank)
	}
}
