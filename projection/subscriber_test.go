package projection_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

func TestTopics(t *testing.T) {
	t.Parallel()
	for topic, want := range map[string]projection.Filter{
		"":                           {},
		"*":                          {},
		"events:a,b":                 {EventTypes: []string{"a", "b"}},
		"streams:s; events:e":        {EventTypes: []string{"e"}, StreamTypes: []string{"s"}},
		"tenants:t1,t2;streams:x,y ": {StreamTypes: []string{"x", "y"}, Tenants: []string{"t1", "t2"}},
	} {
		got, err := projection.ParseTopic(topic)
		require.NoError(t, err, topic)
		require.Equal(t, want, got, topic)
		again, err := projection.ParseTopic(projection.Topic(got))
		require.NoError(t, err)
		require.Equal(t, got, again, "Topic and ParseTopic round-trip")
	}
	for _, bad := range []string{"events", "events:", "kinds:a", "events:a;;"} {
		_, err := projection.ParseTopic(bad)
		require.ErrorIs(t, err, projection.ErrInvalidConfig, bad)
	}
}

// routed runs a Watermill router whose handler reads topic through a Subscriber of group and records the
// positions it sees; the handler fails once on the message at failOnce (a Nack: it must come again, in order).
func routed(t *testing.T, w world, group, topic string, failOnce int64) (seen func() []int64, stop func()) {
	sub, err := projection.NewSubscriber(w.pool, w.store, &projection.SubscriberConfig{ConsumerGroup: group,
		Schema: w.schema, BatchSize: 5, NackResendDelay: time.Millisecond, LeaseTTL: time.Second,
		LeaseAcquireInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []int64
	failed := false
	router.AddConsumerHandler("h", topic, sub, func(msg *message.Message) error {
		pos, err := strconv.ParseInt(msg.Metadata.Get(projection.HeaderPosition), 10, 64)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if pos == failOnce && !failed {
			failed = true
			return errors.New("nack me")
		}
		if msg.Metadata.Get(stagehand.HeaderAggregateType) != "account" || msg.UUID == "" {
			return errors.New("bad metadata")
		}
		got = append(got, pos)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = router.Run(ctx)
	}()
	<-router.Running()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			cancel()
			<-done
			require.NoError(t, sub.Close())
		})
	}
	t.Cleanup(stop)
	return func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), got...)
	}, stop
}

func TestSubscriberDeliversInOrderAndResumesFromItsConsumerGroup(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.seed(t, w.store, 3, 3) // positions 1..12
	_, err := w.store.Append(context.Background(), eventstore.AppendRequest{StreamID: "x", StreamType: "other",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}})
	require.NoError(t, err) // position 13, filtered out by the topic

	seen, stop := routed(t, w, "g", "streams:account", 7)
	want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(seen()) >= 12 }, "delivery")
	require.Equal(t, want, seen(), "in log order, the nacked message again in its place")
	// Wait for the checkpoint to pass everything before stopping (delivery is at-least-once).
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return w.count(t, `SELECT position FROM `+pgtest.Q(w.schema, "checkpoints")+` WHERE name = 'g'`) == 13
	}, "checkpoint")
	stop()

	w.appendEvents(t, w.store, "a0", eventstore.AnyVersion, Deposited{Amount: 1}) // position 14
	seen2, _ := routed(t, w, "g", "streams:account", 0)
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(seen2()) >= 1 }, "resume")
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, []int64{14}, seen2(), "the consumer group resumes after its checkpoint")

	// Another consumer group starts from the beginning.
	seen3, _ := routed(t, w, "other-group", "streams:account", 0)
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(seen3()) >= 13 }, "new group")
	require.Equal(t, append(want, 14), seen3())
}

func TestSubscriberOneTopicPerGroupAndClose(t *testing.T) {
	t.Parallel()
	w := setup(t)
	sub, err := projection.NewSubscriber(w.pool, w.store, &projection.SubscriberConfig{ConsumerGroup: "g",
		Schema: w.schema})
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), "*")
	require.NoError(t, err)
	_, err = sub.Subscribe(context.Background(), "events:x")
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	_, open := <-ch
	require.False(t, open, "Close closes the subscription channels")
	_, err = sub.Subscribe(context.Background(), "*")
	require.Error(t, err)
	_, err = projection.NewSubscriber(w.pool, w.store, &projection.SubscriberConfig{})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "ConsumerGroup")
}
