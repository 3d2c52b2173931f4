package staging

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// ListParkedPage pages through parked events in ID order, by worker, tenant and ID, without skipping or
// repeating one.
func TestListParkedPage(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	for i := range 7 {
		pgtest.Exec(t, pool, `INSERT INTO `+pgtest.Q(schema, "staging_parked")+` (worker, position, tenant_id,
				stream_id, stream_type, version, event_id, event_type, attempts, last_error)
			VALUES ($1, $2, $3, 's', 'order', 1, gen_random_uuid(), 'placed', 5, 'boom')`,
			[]string{"stager:orders", "reconciler:payments"}[i%2], i+1, []string{"acme", "globex", "acme"}[i%3])
	}
	var seen []int64
	q := ParkedQuery{Limit: 3}
	for {
		page, err := ListParkedPage(ctx, pool, schema, q)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, p := range page {
			seen = append(seen, p.Position)
		}
		q.AfterID = page[len(page)-1].ID
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, seen)
	page, err := ListParkedPage(ctx, pool, schema, ParkedQuery{Owner: "stager:orders",
		Tenants: []string{"acme"}})
	require.NoError(t, err)
	var got []string
	for _, p := range page {
		got = append(got, fmt.Sprintf("%s/%s/%d", p.Owner, p.Tenant, p.Position))
	}
	require.Equal(t, []string{"stager:orders/acme/1", "stager:orders/acme/3", "stager:orders/acme/7"}, got)
	one, err := ListParkedPage(ctx, pool, schema, ParkedQuery{IDs: []int64{page[2].ID}})
	require.NoError(t, err)
	require.Equal(t, []ParkedEvent{page[2]}, one)
	_, err = ListParkedPage(ctx, pool, schema, ParkedQuery{Tenants: []string{"\xff"}})
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
}
