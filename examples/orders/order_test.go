package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/stagehandtest"
)

// Per-key order at the handler, with the example's broker configuration: messages of 50 keys staged in order,
// published through the relay (with duplicates), consumed by a group with several subscribers in the process and
// failures injected (nacks, so redeliveries), behind the inbox. For every key, the handler's first successful
// handlings come in staging order.
func TestPerKeyOrderAtTheHandler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.DiscardHandler)
	wlog := watermill.NewSlogLogger(logger)
	pool, schema := stagehandtest.Migrated(t)
	ns, err := startNATS(t.TempDir(), logger)
	require.NoError(t, err)
	defer ns.stop()
	const topic, group = "ordertest", "ordered"
	require.NoError(t, provisionBroker(ctx, ns.URL(), []subscription{{topic, group}}))
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	defer func() { _ = ob.Close() }()

	const keys, perKey = 50, 6
	var msgs []outbox.Message
	for i := range perKey {
		for k := range keys {
			msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("k%d-%d", k, i), Topic: topic,
				PartitionKey: fmt.Sprintf("k%d", k), Payload: []byte(strconv.Itoa(i)),
				Metadata: map[string]string{"key": fmt.Sprintf("k%d", k)}})
		}
	}
	_, err = ob.Stage(ctx, msgs...)
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		handled = map[string][]int{}
		total   int
		done    = make(chan struct{})
	)
	in, err := ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 100, RetryDelay: time.Millisecond})
	require.NoError(t, err)
	h := in.Handler("ordered", func(_ context.Context, _ pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
		if rand.Float64() < 0.15 {
			return errors.New("injected failure: nack")
		}
		time.Sleep(time.Duration(rand.Int64N(int64(2 * time.Millisecond))))
		seq, _ := strconv.Atoi(string(msg.Payload))
		key := msg.Metadata.Get("key")
		// The inbox runs the handler only for a message not handled before: a duplicate never gets here.
		mu.Lock()
		handled[key] = append(handled[key], seq)
		total++
		if total == keys*perKey {
			close(done)
		}
		mu.Unlock()
		return nil
	})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	require.NoError(t, err)
	sub, err := newSubscriber(ns.URL(), group, wlog)
	require.NoError(t, err)
	addPartitionedHandlers(router, "ordered", topic, sub, h)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer func() { _ = router.Close() }()

	pub, err := newPublisher(ns.URL(), wlog)
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	relay, err := ob.NewRelay(&outbox.RelayConfig{BatchSize: 100, PollingInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	defer func() { _ = relay.Close() }()
	res, err := relay.Drain(ctx, &countingPublisher{next: partitionedPublisher{pub}, duplicateRate: 0.1,
		stats: newStats("order-test")})
	require.NoError(t, err)
	require.Equal(t, keys*perKey, res.Published)

	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("handled %d of %d messages", total, keys*perKey)
	}
	mu.Lock()
	defer mu.Unlock()
	violations := 0
	for key, seqs := range handled {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				violations++
				t.Logf("key %s handled out of order: %v", key, seqs)
				break
			}
		}
	}
	require.Zero(t, violations, "keys handled out of staging order")
}
