package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

// A delivery that fails before it reaches the inbox record (here: its transaction is read-only, as on a database
// that restarted into recovery) counts an attempt only for a message not yet handled. A duplicate of a handled
// message is acknowledged: no attempt row is left behind and it is never dead-lettered, however often it fails.
func TestInboxFailedDuplicateOfAHandledMessageCountsNothing(t *testing.T) {
	t.Parallel()
	e := setupInbox(t, nil, nil)
	ctx := context.Background()
	require.NoError(t, e.inbox.Handler("payments", e.payHandler(0))(message.NewMessage("m-handled", []byte("o-1"))))

	broken, err := e.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1,
		TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}})
	require.NoError(t, err)
	h := broken.Handler("payments", e.payHandler(0))

	// The handled message: acknowledged, nothing counted, nothing dead-lettered.
	for range 3 {
		require.NoError(t, h(message.NewMessage("m-handled", []byte("o-1"))))
	}
	// A message never handled: the same failure counts, and with MaxAttempts 1 dead-letters it.
	require.NoError(t, h(message.NewMessage("m-new", []byte("o-2"))))

	st, err := e.ob.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.InboxStats{Handled: 1, DeadLettered: 1}, withoutAge(st))
	dead, err := e.ob.AllTenants().InboxDeadLetters(ctx, outbox.InboxListOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "m-new", dead[0].MessageID)
	require.Equal(t, int64(1), e.calls.Load(), "only the first delivery ran the handler to its commit")
}
