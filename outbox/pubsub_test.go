package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Watermill's universal Pub/Sub suite against the outbox Publisher (a pool-bound writer: each Publish is a
// transaction) and the Relay as Subscriber.
//
// Features, stated honestly:
//   - Persistent: true. Rows live in PostgreSQL; a new relay delivers what an earlier one left.
//   - ExactlyOnceDelivery: false. At-least-once: a lapsed lease or a crash publishes again.
//   - ConsumerGroups: false. The outbox is one queue: every relay competes for the same rows and each row is
//     published once (then moved out); there is no second group that would see it again. Skips TestConsumerGroups.
//   - NewSubscriberReceivesOldMessages: false, for the same reason. Skips TestNewSubscriberReceivesOldMessages.
//   - GuaranteedOrder: only for messages that share a partition key. The "unordered" run stages without keys and
//     declares false (skipping TestPublishSubscribeInOrder and TestNoAck, which require it); the "keyed" run gives
//     every message of a topic the topic as its partition key and declares true, with 10 concurrent relays on the
//     topic (GuaranteedOrderWithSingleSubscriber false).
//   - RestartServiceCommand: none: the suite shares one PostgreSQL with the rest of the package's tests, which a
//     restart would break. Skips TestReconnect; TestRelayRecoversFromDatabaseRestart covers a restart instead.
//   - ContextPreserved: false: a relayed message's context is the subscription's, cancelled after Ack.
func TestPubSub(t *testing.T) {
	if testing.Short() {
		t.Skip("the universal suite does not run in short mode")
	}
	for _, keyed := range []bool{false, true} {
		name := "unordered"
		if keyed {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.Migrated(t)
			cfg := &outbox.Config{}
			if keyed {
				cfg.PartitionKey = func(topic string, _ *message.Message) string { return topic }
			}
			e := setupOn(t, pool, schema, cfg)
			constructor := func(t *testing.T) (message.Publisher, message.Subscriber) {
				r, err := e.ob.NewRelay(&outbox.RelayConfig{
					BatchSize:       100,
					PollingInterval: 100 * time.Millisecond,
					MaxRetryCount:   outbox.Retries(1000),
					RetryDelay:      time.Millisecond,
					MaxRetryDelay:   5 * time.Millisecond,
					ClaimDuration:   5 * time.Second,
					AckDeadline:     10 * time.Second,
				})
				require.NoError(t, err)
				return e.ob.Publisher(context.Background(), pool), r
			}
			tests.TestPubSub(t, tests.Features{
				ConsumerGroups:                   false,
				ExactlyOnceDelivery:              false,
				GuaranteedOrder:                  keyed,
				Persistent:                       true,
				NewSubscriberReceivesOldMessages: false,
			}, constructor, func(t *testing.T, _ string) (message.Publisher, message.Subscriber) {
				return constructor(t)
			})
		})
	}
}
