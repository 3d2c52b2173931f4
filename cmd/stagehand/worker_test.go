package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/staging"
)

// 'worker status' reads every staging worker's status from the database (no worker is built), and 'worker
// parked / replay / discard' act on the events a worker parked.
func TestWorkerStatusAndParked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO `+pgtest.Q(e.schema, "checkpoints")+` (name, kind, reset_group, position,
		state, last_error, failing_position, attempts) VALUES ('stager:orders', 'stager', 'stager:orders', 7,
		'failed', 'cannot map 13', 8, 5)`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO `+pgtest.Q(e.schema, "staging_parked")+` (worker, position, tenant_id,
		stream_id, stream_type, version, event_id, event_type, attempts, last_error) VALUES ('stager:orders', 3,
		'acme', 'o-1', 'shop.order', 1, gen_random_uuid(), 'shop.order.placed', 5, 'cannot map 13')`)
	require.NoError(t, err)

	var st struct {
		Workers []workerStatusJSON `json:"workers"`
	}
	e.json(&st, "worker", "status")
	require.Len(t, st.Workers, 1)
	require.Equal(t, "stager:orders", st.Workers[0].Name)
	require.Equal(t, "failed", st.Workers[0].State)
	require.Equal(t, int64(8), st.Workers[0].FailingPosition)
	require.Equal(t, 1, st.Workers[0].Parked)
	require.Contains(t, e.ok("worker", "status"), "cannot map 13")

	parked, err := staging.ListParked(ctx, e.pool, e.schema, "")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Regexp(t, fmt.Sprintf(`%d\s+stager:orders\s+3\s+shop.order/o-1@1`, parked[0].ID), e.ok("worker", "parked"))
	require.Contains(t, e.ok("worker", "replay", "stager:orders"), "Replay requested for 1 parked event(s)")
	parked, err = staging.ListParked(ctx, e.pool, e.schema, "stager:orders")
	require.NoError(t, err)
	require.True(t, parked[0].ReplayRequested)
	require.Contains(t, e.ok("worker", "discard", fmt.Sprint(parked[0].ID)), "Discarded 1 parked event")
	e.fails(exitFailure, "parked event not found", "worker", "discard", fmt.Sprint(parked[0].ID))
}
