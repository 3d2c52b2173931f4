package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// A relay without leader election (no lease, and no row in flight between batches) and an inbox handler show up,
// with their heartbeats and last publication or handling, on the overview and the outbox page; a relay that
// stopped shows as stopped.
func TestRelaysAndInboxHandlersShowUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	ctx := context.Background()
	relay, err := w.ob.NewRelay(&outbox.RelayConfig{PollingInterval: 20 * time.Millisecond,
		MaxDegreeOfParallelism: 1})
	require.NoError(t, err)
	ch, err := relay.SubscribeTopics(ctx)
	require.NoError(t, err)
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for m := range ch {
			m.Ack()
		}
	}()
	_, err = w.ob.Stage(ctx, outbox.Message{ID: "m-1", Topic: "orders", Payload: []byte("{}")})
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return w.count(`SELECT count(*) FROM {s}.outbox_sent`) == 1
	}, "published")

	inbox, err := w.ob.NewInbox(nil)
	require.NoError(t, err)
	handle := inbox.Handler("billing", func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return nil
	})
	require.NoError(t, handle(message.NewMessage("in-1", []byte("{}"))))

	// The relay beats every 5 seconds; its first beat carries no publication yet.
	pgtest.Eventually(t, 15*time.Second, func() bool {
		return w.count(`SELECT count(*) FROM {s}.heartbeats WHERE kind = 'relay' AND activity = 1`) == 1
	}, "the relay's beat with its publication")
	page := w.page("/")
	require.Contains(t, page, `id="processes"`)
	for _, want := range []string{">relay<", ">inbox<", ">billing<", ">alive<"} {
		require.Contains(t, page, want)
	}
	require.Regexp(t, `<td>published [^<]+ ago</td>`, page, "the relay's last publication")
	require.Regexp(t, `<td>handled [^<]+ ago</td>`, page, "the handler's last message")
	out := w.page("/outbox")
	require.NotContains(t, out, "no relay beats")
	require.Contains(t, out, "alive, beat ")
	require.Regexp(t, `last published [^<]+ ago \(1 since start\)`, out)

	require.NoError(t, relay.Close())
	<-acked
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.heartbeats WHERE kind = 'relay'
		AND stopped_at IS NOT NULL`))
	require.Contains(t, w.page("/outbox"), "stopped, beat ")

	// An inbox handler beats only when a message comes: one whose beat is old is idle, a relay's is gone.
	pgtest.Exec(t, w.pool, `UPDATE `+pgx.Identifier{w.schema}.Sanitize()+`.heartbeats
		SET heartbeat_at = heartbeat_at - interval '1 hour', stopped_at = NULL`)
	page = w.page("/")
	require.Regexp(t, `(?s)>billing<.*?>idle<`, page)
	require.Regexp(t, `(?s)>relay<.*?>gone<`, page)
}
