package eventstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// A stream archived (or deleted) on a table that is then converted to partitions still refuses appends: the
// conversion closes its copied head, which is what refuses them on a partitioned table.
func TestStreamsClosedBeforeAConversionStayClosed(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	for _, id := range []string{"archived", "deleted", "open"} {
		_, err := s.Append(ctx, eventstore.AppendRequest{Tenant: "acme", StreamID: id, StreamType: "t",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}})
		require.NoError(t, err)
	}
	_, err = s.ArchiveStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "archived"})
	require.NoError(t, err)
	_, err = s.DeleteStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "deleted", Reason: "erasure"})
	require.NoError(t, err)

	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema})
	require.NoError(t, err)
	_, err = parts.Convert(ctx)
	require.NoError(t, err)
	after, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(after.Close)
	require.True(t, after.Partitioned(ctx))

	for _, c := range []struct {
		id   string
		want error
	}{{"archived", eventstore.ErrStreamArchived}, {"deleted", eventstore.ErrStreamDeleted}} {
		for _, expected := range []eventstore.ExpectedVersion{eventstore.AnyVersion, eventstore.StreamExists} {
			_, err := after.Append(ctx, eventstore.AppendRequest{Tenant: "acme", StreamID: c.id, StreamType: "t",
				Expected: expected, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}})
			require.ErrorIs(t, err, c.want, "%s, expected %v", c.id, expected)
		}
	}
	_, err = after.Append(ctx, eventstore.AppendRequest{Tenant: "acme", StreamID: "open", StreamType: "t",
		Expected: eventstore.AnyVersion, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}})
	require.NoError(t, err)
}
