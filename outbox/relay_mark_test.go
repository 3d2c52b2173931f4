package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A mark whose rows are partly in the ledger already (a re-staging that raced their first mark) fails on the
// ledger's key and is run again with the insert that skips them: every row leaves the outbox, the ledger keeps
// one entry per message (the earlier one untouched), and the promotions carried by the mark still happen.
func TestMarkOfMessagesAlreadyInTheLedger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	key := func(i int) string {
		if i < 3 {
			return "k"
		}
		return ""
	}
	staged := msgs("ledger", 5, key) // ledger-00000..02 on key k, 03 and 04 unordered
	_, err := e.ob.Stage(ctx, staged...)
	require.NoError(t, err)
	earlier := time.Now().Add(-time.Minute).Truncate(time.Second) // recent: the drain's cleanup keeps it
	pgtest.Exec(t, e.pool, `INSERT INTO `+pgtest.Q(e.schema, "outbox_sent")+` (message_id, tenant_id, topic,
		message_type, source_position, attempts, created_at, sent_at)
		SELECT message_id, tenant_id, topic, message_type, source_position, 1, created_at, $1
		FROM `+pgtest.Q(e.schema, "outbox")+` WHERE message_id IN ('ledger-00000', 'ledger-00004')`, earlier)

	// One row per claim and one worker: the key's first message ends its run, so its mark promotes the next.
	r := e.relay(func(c *outbox.RelayConfig) { c.BatchSize, c.MaxDegreeOfParallelism = 1, 1 })
	b := newBroker()
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 5, res.Published)
	require.Zero(t, e.count("outbox"), "every row left the outbox")
	require.EqualValues(t, 5, e.count("outbox_sent"), "one ledger entry per message")
	require.EqualValues(t, 2, e.count("outbox_sent", "sent_at = '"+earlier.Format(time.RFC3339)+"'"),
		"the entries already there are kept as they were")
	var order []string
	for _, p := range b.log {
		if p.key == "k" {
			order = append(order, p.id)
		}
	}
	require.Equal(t, []string{"ledger-00000", "ledger-00001", "ledger-00002"}, order)

	res, err = r.Drain(ctx, b)
	require.NoError(t, err)
	require.Zero(t, res.Published, "nothing is published again")
}
