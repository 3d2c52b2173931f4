package faultsuite

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// TestRelayPausesWhileTheBrokerCannotTakeMessages checks, per broker, that a relay whose broker cannot take
// messages pauses instead of using up the messages' attempts (contract 5): with a 3-node NATS JetStream cluster
// that has lost two nodes (the stream, R3, has no quorum and so no leader: publishes find no one to answer them),
// and with a RabbitMQ node killed. While that lasts, every delivery is classified as "unreachable", none is
// rejected, no message is dead-lettered and every pending row still has 0 attempts. Once the nodes are back, every
// message is published, each on its first counted attempt.
func TestRelayPausesWhileTheBrokerCannotTakeMessages(t *testing.T) {
	pgtest.CheckLeaks(t)
	for _, kind := range []string{BrokerNATSCluster, BrokerRabbitMQ} {
		t.Run(kind, func(t *testing.T) { testRelayPauses(t, kind) })
	}
}

func testRelayPauses(t *testing.T, kind string) {
	const messages, schema = 40, "pause"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("STAGEHAND_FAULTS_VERBOSE") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	defer func() { _ = srv.Stop() }()
	pool, err := connect(ctx, srv.URL())
	require.NoError(t, err)
	defer pool.Close()
	_, err = stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema})
	require.NoError(t, err)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	defer ob.Close()

	cfg := Config{Broker: kind, Partitions: 2, ChildCommand: []string{os.Args[0], "-test.run=^$"}}
	brk, err := startBroker(ctx, cfg, logger)
	require.NoError(t, err)
	defer func() { _ = brk.stop() }()
	require.NoError(t, brk.provision(ctx))

	// The broker stops taking messages before the relay starts: every delivery of the window meets it.
	var restore func() error
	switch b := brk.(type) {
	case *natsBroker:
		leader, err := b.streamLeader(ctx)
		require.NoError(t, err)
		var down []*natsNodeProcess // the leader and one more: the survivor alone is no quorum
		for _, n := range b.nodes {
			if n.node.Name == leader {
				down = append(down, n)
			}
		}
		for _, n := range b.nodes {
			if n.node.Name != leader && len(down) < 2 {
				down = append(down, n)
			}
		}
		for _, n := range down {
			n.kill()
		}
		require.Len(t, down, 2)
		restore = func() error {
			for _, n := range down {
				if err := n.start(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	case *rabbitBroker:
		require.NoError(t, b.node.Kill())
		restore = func() error { return b.node.Restart(ctx) }
	}

	msgs := make([]outbox.Message, messages)
	for i := range msgs {
		key := fmt.Sprintf("key-%d", i%4)
		msgs[i] = outbox.Message{ID: watermill.NewUUID(), Topic: topicOf(key, cfg.Partitions), PartitionKey: key,
			Payload: []byte(`{}`), Metadata: map[string]string{HeaderVersion: "1"}}
	}
	n, err := ob.Stage(ctx, msgs...)
	require.NoError(t, err)
	require.Equal(t, messages, n)

	var published, rejected, unreachable, deadLettered atomic.Int64
	hooks := outbox.Hooks{
		Delivered: func(_ context.Context, _ outbox.Delivery, o outbox.Outcome, _ error, _ time.Duration) {
			switch o {
			case outbox.Published:
				published.Add(1)
			case outbox.Rejected:
				rejected.Add(1)
			case outbox.Unreachable:
				unreachable.Add(1)
			}
		},
		DeadLettered: func(context.Context, outbox.Delivery, error) { deadLettered.Add(1) },
	}
	pub, unavailable, err := newPublisherFor(kind, brk.url(), "pause relay", logger)
	require.NoError(t, err)
	defer pub.Close()
	rc := relaySettings("pause", 2, unavailable, logger, hooks) // 3 attempts: a rejected message would soon be dead
	relay, err := ob.NewRelay(rc)
	require.NoError(t, err)
	defer relay.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	relay.AddToRouter(router, pub, nil)
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()

	// The window: 8 s with the broker unable to take anything.
	window := time.Now().Add(8 * time.Second)
	for time.Now().Before(window) {
		require.Zero(t, published.Load(), "published while the broker could not take messages")
		time.Sleep(100 * time.Millisecond)
	}
	require.Positive(t, unreachable.Load(), "the relay found the broker unreachable")
	require.Zero(t, rejected.Load(), "no delivery was counted as a rejected attempt")
	require.Zero(t, deadLettered.Load())
	st, err := ob.AllTenants().Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(messages), st.Pending)
	require.Zero(t, st.DeadLettered)
	// A cross-check in the table itself: every pending row still has 0 attempts.
	attempts := func(table string) (rows, most int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(max(attempts), 0) FROM `+
			pgx.Identifier{schema, table}.Sanitize()).Scan(&rows, &most))
		return rows, most
	}
	rows, most := attempts("outbox")
	require.Equal(t, int64(messages), rows)
	require.Zero(t, most, "a pending row has attempts counted against it")
	t.Logf("%s: while the broker could not take messages (8 s): %d deliveries unreachable, 0 rejected, 0 dead "+
		"letters, max attempts 0 over %d pending rows", kind, unreachable.Load(), rows)

	// The broker comes back: everything goes out, none of it on a counted attempt.
	back := time.Now()
	require.NoError(t, restore())
	require.Eventually(t, func() bool {
		st, err := ob.AllTenants().Stats(ctx)
		return err == nil && st.Pending == 0
	}, 2*time.Minute, 100*time.Millisecond, "every message published once the broker is back")
	t.Logf("%s: all %d messages published %.1fs after the broker was restarted", kind, messages,
		time.Since(back).Seconds())
	require.Zero(t, rejected.Load())
	require.Zero(t, deadLettered.Load())
	rows, most = attempts("outbox_sent") // the ledger records the attempt that published: 1 is the first
	require.Equal(t, int64(messages), rows)
	require.Equal(t, int64(1), most, "every message was published on its first attempt")
	// Every message is at the broker. The copy is read up to the count the broker reports when the read starts. Once,
	// in CI on a loaded machine, one confirmed message was missing from that read (not reproduced in a dozen
	// isolated runs since), so a read that misses messages logs them and is repeated after 2 s: a count reported
	// before the broker had enqueued a message then passes, logged, and a message the broker does not have still
	// fails the test.
	missing := func() []string {
		seen := map[string]bool{}
		require.NoError(t, brk.readStored(ctx, func(c storedCopy) error { seen[c.id] = true; return nil }))
		var out []string
		for _, m := range msgs {
			if !seen[m.ID] {
				out = append(out, m.ID)
			}
		}
		return out
	}
	if first := missing(); len(first) > 0 {
		t.Logf("%s: %d of %d messages missing from the broker's copy at the first read: %v; reading again in 2 s",
			kind, len(first), messages, first)
		time.Sleep(2 * time.Second)
		require.Empty(t, missing(), "messages the broker confirmed but does not have")
	}
}
