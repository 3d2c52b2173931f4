package projection_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// ListParkedPage pages through parked events in ID order, by projection, tenant and ID, without skipping or
// repeating one.
func TestListParkedPage(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	for i := range 9 {
		pgtest.Exec(t, pool, `INSERT INTO `+pgtest.Q(schema, "projection_parked")+` (projection, checkpoint, position,
				tenant_id, stream_id, stream_type, version, event_id, event_type, attempts, last_error)
			VALUES ($1, $1, $2, $3, 's', 'account', 1, gen_random_uuid(), 'opened', 5, 'boom')`,
			[]string{"balances", "ledger", "balances"}[i%3], i+1, []string{"acme", "globex"}[i%2])
	}
	var seen []int64
	q := projection.ParkedQuery{Limit: 4}
	for {
		page, err := projection.ListParkedPage(ctx, pool, schema, q)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, p := range page {
			seen = append(seen, p.Position)
		}
		q.AfterID = page[len(page)-1].ID
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, seen)

	page, err := projection.ListParkedPage(ctx, pool, schema, projection.ParkedQuery{Owner: "balances",
		Tenants: []string{"acme"}})
	require.NoError(t, err)
	var got []string
	for _, p := range page {
		got = append(got, fmt.Sprintf("%s/%s/%d", p.Owner, p.Tenant, p.Position))
	}
	require.Equal(t, []string{"balances/acme/1", "balances/acme/3", "balances/acme/7", "balances/acme/9"}, got)
	one, err := projection.ListParkedPage(ctx, pool, schema, projection.ParkedQuery{IDs: []int64{page[1].ID}})
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, page[1], one[0])
	none, err := projection.ListParkedPage(ctx, pool, schema, projection.ParkedQuery{IDs: []int64{}})
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = projection.ListParkedPage(ctx, pool, schema, projection.ParkedQuery{Tenants: []string{"a\x00"}})
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)

	// A blank tenant is NoTenant, as everywhere a tenant is taken.
	pgtest.Exec(t, pool, `INSERT INTO `+pgtest.Q(schema, "projection_parked")+` (projection, checkpoint, position,
			tenant_id, stream_id, stream_type, version, event_id, event_type, attempts, last_error)
		VALUES ('balances', 'balances', 10, $1, 's', 'account', 1, gen_random_uuid(), 'opened', 5, 'boom')`,
		stagehand.NoTenant)
	for _, blank := range []string{"", " "} {
		page, err := projection.ListParkedPage(ctx, pool, schema, projection.ParkedQuery{Tenants: []string{blank}})
		require.NoError(t, err)
		require.Len(t, page, 1, "tenant %q", blank)
		require.Equal(t, int64(10), page[0].Position)
	}
}
