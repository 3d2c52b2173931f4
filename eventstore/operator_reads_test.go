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

// CountLog counts what ReadLog returns over the same range, whatever the streams' lifecycles: an archived stream's
// events count, a deleted stream's tombstones do not, nor do lifecycle markers, except a deletion's marker for a
// query with Deletions set. RecordedAt finds archived and deleted streams' positions too.
func TestCountLogCountsWhatReadLogReturns(t *testing.T) {
	t.Parallel()
	s := newPostgres(t)
	ctx := context.Background()
	archived := appendTenant(t, s, "acme", "archived", 3)
	deleted := appendTenant(t, s, "acme", "deleted", 2)
	appendTenant(t, s, "globex", "kept", 2)
	_, err := s.ArchiveStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "archived"})
	require.NoError(t, err)
	_, err = s.DeleteStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "deleted", Reason: "erasure"})
	require.NoError(t, err)
	appendTenant(t, s, "acme", "later", 1)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)

	// read counts what ReadLog returns for q up to through, page by page.
	read := func(q eventstore.LogQuery, through int64) int64 {
		q.Limit = 2
		var n int64
		for q.After < through {
			page, err := s.ReadLog(ctx, q)
			require.NoError(t, err)
			for _, r := range page.Records {
				if r.Position <= through {
					n++
				}
			}
			if page.Last == q.After {
				break
			}
			q.After = page.Last
		}
		return n
	}
	queries := []eventstore.LogQuery{
		{},
		{Deletions: true},
		{Tenants: []string{"acme"}},
		{Tenants: []string{"acme"}, Deletions: true},
		{Tenants: []string{"globex"}, Deletions: true},
		{EventTypes: []string{"deposited"}, Deletions: true},
		{StreamTypes: []string{"loan"}, Deletions: true},
		{After: archived[1].Position},
	}
	for _, q := range queries {
		for _, through := range []int64{deleted[1].Position, head} {
			want := read(q, through)
			got, err := s.CountLog(ctx, q, through)
			require.NoError(t, err)
			require.Equal(t, want, got, "query %+v through %d", q, through)
		}
	}
	// What that compared: the archived events count, the deletion's marker only when asked for.
	n, err := s.CountLog(ctx, eventstore.LogQuery{}, head)
	require.NoError(t, err)
	require.EqualValues(t, 3+2+1, n, "three archived events, two kept, one later")
	n, err = s.CountLog(ctx, eventstore.LogQuery{Deletions: true}, head)
	require.NoError(t, err)
	require.EqualValues(t, 3+2+1+1, n, "and the deletion's marker")

	at, err := s.RecordedAt(ctx, []int64{archived[0].Position, deleted[0].Position})
	require.NoError(t, err)
	require.True(t, at[archived[0].Position].Equal(archived[0].RecordedAt), "an archived event's recording time")
	require.True(t, at[deleted[0].Position].Equal(deleted[0].RecordedAt), "a tombstone's recording time")
}
