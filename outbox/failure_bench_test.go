package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stagehand-es/stagehand/outbox"
)

// BenchmarkRejectedAttempts measures a relay's rejected deliveries: each iteration stages 1,000 messages and drains
// them through a broker that rejects every one, so each is backed off and its attempt recorded (the outbox row's
// count and error, and its entry in the failure history). It reports the time per rejected attempt:
//
//	go test ./outbox -run '^$' -bench RejectedAttempts -benchtime 10x
func BenchmarkRejectedAttempts(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	broker := newBroker()
	broker.setFail(func(m *message.Message) error { return fmt.Errorf("timeout after 31ms on order %s", m.UUID) })
	relay := e.relay(func(c *outbox.RelayConfig) {
		c.MaxRetryCount = outbox.Retries(1000)
		c.RetryDelay, c.MaxRetryDelay = time.Hour, time.Hour
	})
	const n = 1000
	attempts := 0
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		batch := msgs(fmt.Sprintf("b%d", i), n, nil)
		_, err := e.ob.Stage(ctx, batch...)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := relay.Drain(ctx, broker)
		if err != nil {
			b.Fatal(err)
		}
		attempts += res.Failed
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(attempts), "ns/attempt")
}
