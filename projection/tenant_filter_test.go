package projection_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// A blank tenant in a projection's Tenants ("" or whitespace) is stagehand.NoTenant, as in every other tenant
// input: the projection sees the events appended without a tenant (and no other tenant's), instead of reading
// nothing while its checkpoint reaches the head.
func TestProjectionBlankTenantFilterReadsNoTenantEvents(t *testing.T) {
	t.Parallel()
	for _, blank := range []string{"", " "} {
		w := setup(t)
		w.open(t, w.store, "none-1")
		_, err := w.store.Append(context.Background(), func() eventstore.AppendRequest {
			r := w.request(t, "acme-1", eventstore.NoStream, Opened{Owner: "o"})
			r.Tenant = "acme"
			return r
		}())
		require.NoError(t, err)
		w.open(t, w.store, "none-2")

		var mu sync.Mutex
		var seen []string
		h := projection.HandlerFunc(func(_ context.Context, _ pgx.Tx, e projection.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, e.Tenant+"/"+e.StreamID)
			return nil
		})
		p := w.newProjection(t, h, projection.Config{Tenants: []string{blank}, PollInterval: 10 * time.Millisecond})
		start(t, p)
		pgtest.Eventually(t, 10*time.Second, caughtUp(t, w, p), "projection with Tenants [%q] caught up", blank)
		mu.Lock()
		require.Equal(t, []string{stagehand.NoTenant + "/none-1", stagehand.NoTenant + "/none-2"}, seen,
			"Tenants [%q]", blank)
		mu.Unlock()
	}
}

// Topic and ParseTopic read a blank tenant as NoTenant too.
func TestTopicBlankTenantIsNoTenant(t *testing.T) {
	t.Parallel()
	require.Equal(t, "tenants:"+stagehand.NoTenant+",acme",
		projection.Topic(projection.Filter{Tenants: []string{"", "acme"}}))
	f, err := projection.ParseTopic("tenants:%20,acme")
	require.NoError(t, err)
	require.Equal(t, []string{stagehand.NoTenant, "acme"}, f.Tenants)
}

// PartitionOf reads a blank tenant as NoTenant, the tenant the stream's events carry, and never divides by a
// partition count below one.
func TestPartitionOfBlankTenantAndSmallCounts(t *testing.T) {
	t.Parallel()
	for i := range 50 {
		id := fmt.Sprintf("s-%d", i)
		want := projection.PartitionOf(stagehand.NoTenant, id, 7)
		require.Equal(t, want, projection.PartitionOf("", id, 7), id)
		require.Equal(t, want, projection.PartitionOf("  ", id, 7), id)
	}
	for _, n := range []int{1, 0, -3} {
		require.Zero(t, projection.PartitionOf("acme", "s", n))
	}
}
