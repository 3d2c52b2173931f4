package faultsuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/outbox"
)

// The consumers: one handler behind the inbox, in this process, subscribed to every partition topic of the broker
// (one router handler per partition, one message at a time each). For every message it writes one row to the
// effects table in the inbox's transaction. The table has no unique key on the message, so a message whose effects
// were applied twice shows as two rows: that is what the run counts as a duplicate effect, and it must be 0. Each
// row also takes the next number of a sequence, so the order in which a key's effects were applied (its order at
// the handler) can be read back.

const inboxHandlerName = "faults-effects"

// errRedeliver is returned, at random, after the inbox committed, so the broker delivers the message again.
var errRedeliver = errors.New("faultsuite: acknowledgement dropped on purpose after the inbox committed")

type consumerCounts struct {
	deliveries  atomic.Int64 // every call of the handler
	handled     atomic.Int64 // the inbox ran the handler and committed
	suppressed  atomic.Int64 // the inbox found the message handled already and skipped it
	failed      atomic.Int64 // the handler or the inbox failed: nacked, delivered again
	redelivered atomic.Int64 // acknowledgements dropped on purpose
	inFlight    atomic.Int64 // handler calls in progress
}

type consumers struct {
	router *message.Router
	sub    message.Subscriber
	counts consumerCounts
	done   chan struct{}
	runErr error
}

type ranKey struct{}

// startConsumers starts the consumer router and returns once it runs. Its failure is reported on done/runErr.
func startConsumers(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, effects string, brk broker,
	cfg Config, logger *slog.Logger) (*consumers, error) {
	inbox, err := ob.NewInbox(&outbox.InboxConfig{
		// Failures counted while PostgreSQL restarts or the broker is away are not the message's fault; a
		// restart can fail a delivery a few times. Far more than that is needed to dead-letter it.
		MaxAttempts: 20,
		// Retries wait (doubling) so a restart has time to end, but briefly: the suite measures recovery.
		RetryDelay:    50 * time.Millisecond,
		MaxRetryDelay: time.Second,
		Logger:        logger,
	})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: inbox: %w", err)
	}
	wlog := watermill.NewSlogLogger(logger)
	sub, err := brk.subscriber(logger)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("faultsuite: consumer router: %w", err)
	}
	c := &consumers{router: router, sub: sub, done: make(chan struct{})}
	insert := `INSERT INTO ` + effects + ` (message_id, partition_key, version) VALUES ($1, $2, $3)`
	handle := inbox.Handler(inboxHandlerName, func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		if ran, ok := ctx.Value(ranKey{}).(*atomic.Bool); ok {
			ran.Store(true)
		}
		var m TickedMessage
		if err := json.Unmarshal(msg.Payload, &m); err != nil {
			return outbox.Permanent(fmt.Errorf("decode %s: %w", msg.UUID, err))
		}
		if _, err := tx.Exec(ctx, insert, msg.UUID, m.Key, m.Version); err != nil {
			return fmt.Errorf("effect of %s: %w", msg.UUID, err)
		}
		return nil
	})
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(cfg.Seed, 2))
	consume := func(msg *message.Message) error {
		c.counts.deliveries.Add(1)
		c.counts.inFlight.Add(1)
		defer c.counts.inFlight.Add(-1)
		ran := &atomic.Bool{}
		msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
		err := handle(msg)
		switch {
		case err != nil:
			c.counts.failed.Add(1)
			return err
		case isNacked(msg): // the inbox nacked it after a failed attempt: redelivered
			c.counts.failed.Add(1)
			return nil
		case !ran.Load():
			c.counts.suppressed.Add(1)
		default:
			// The handler ran and the inbox returned nil: committed, or dead-lettered (the inbox acknowledges
			// those); the inbox statistics tell them apart at the end.
			c.counts.handled.Add(1)
		}
		rngMu.Lock()
		drop := rng.Float64() < cfg.RedeliverRate
		rngMu.Unlock()
		if drop {
			c.counts.redelivered.Add(1)
			return errRedeliver
		}
		return nil
	}
	for p, topic := range partitionTopics(cfg.Partitions) {
		router.AddConsumerHandler(fmt.Sprintf("faults-consumer-p%02d", p), topic, sub, consume)
	}
	go func() {
		defer close(c.done)
		c.runErr = router.Run(ctx)
	}()
	select {
	case <-router.Running():
		return c, nil
	case <-c.done:
		_ = router.Close()
		_ = sub.Close()
		return nil, fmt.Errorf("faultsuite: consumer router: %w", c.runErr)
	case <-time.After(30 * time.Second):
		c.stop()
		return nil, errors.New("faultsuite: the consumer router did not start within 30s")
	}
}

// stop closes the router (waiting for the handlers in flight) and the subscriber.
func (c *consumers) stop() {
	_ = c.router.Close()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
	}
	_ = c.sub.Close()
}

// isNacked reports whether msg was nacked (the inbox nacks a message it retries, and returns nil).
func isNacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}
