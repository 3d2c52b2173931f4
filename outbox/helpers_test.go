package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		runCrashChild() // the relay process TestRelayKilledMidBatchLosesNothing kills
		return
	}
	pgtest.Main(m)
}

type env struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	ob     *outbox.Outbox
}

func setup(t testing.TB) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return setupOn(t, pool, schema, nil)
}

func setupOn(t testing.TB, pool *pgxpool.Pool, schema string, cfg *outbox.Config) *env {
	t.Helper()
	var c outbox.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	ob, err := outbox.New(pool, &c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	return &env{t: t, pool: pool, schema: schema, ob: ob}
}

func (e *env) count(table string, where ...string) int64 {
	q := "SELECT count(*) FROM " + pgtest.Q(e.schema, table)
	if len(where) > 0 {
		q += " WHERE " + where[0]
	}
	return pgtest.Count(e.t, e.pool, q)
}

// relay returns a relay with fast test settings, closed when the test ends.
func (e *env) relay(mod func(*outbox.RelayConfig)) *outbox.Relay {
	e.t.Helper()
	cfg := &outbox.RelayConfig{
		BatchSize:       100,
		PollingInterval: 50 * time.Millisecond,
		RetryDelay:      50 * time.Millisecond,
		MaxRetryDelay:   200 * time.Millisecond,
		ClaimDuration:   5 * time.Second,
		AckDeadline:     5 * time.Second,
		BrokerBackoff:   50 * time.Millisecond,
	}
	if mod != nil {
		mod(cfg)
	}
	r, err := e.ob.NewRelay(cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = r.Close() })
	return r
}

func msgs(topic string, n int, key func(i int) string) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = outbox.Message{ID: fmt.Sprintf("%s-%05d", topic, i), Topic: topic, Payload: []byte(fmt.Sprint(i))}
		if key != nil {
			out[i].PartitionKey = key(i)
		}
	}
	return out
}

// published is one publication seen by the recording broker.
type published struct {
	topic string
	id    string
	key   string
	meta  message.Metadata
	at    time.Time
}

// broker is a recording Watermill publisher standing in for a real broker: it records every accepted publication
// in order, and rejects those fail says to reject.
type broker struct {
	mu       sync.Mutex
	log      []published
	attempts map[string][]time.Time
	fail     func(msg *message.Message) error
	inflight int
	peak     int
	hold     time.Duration
}

func newBroker() *broker { return &broker{attempts: map[string][]time.Time{}} }

func (b *broker) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		b.mu.Lock()
		b.attempts[m.UUID] = append(b.attempts[m.UUID], time.Now())
		fail := b.fail
		b.inflight++
		b.peak = max(b.peak, b.inflight)
		hold := b.hold
		b.mu.Unlock()
		if hold > 0 {
			time.Sleep(hold)
		}
		var err error
		if fail != nil {
			err = fail(m)
		}
		b.mu.Lock()
		b.inflight--
		if err == nil {
			b.log = append(b.log, published{topic: topic, id: m.UUID, key: m.Metadata.Get(outbox.HeaderPartitionKey),
				meta: m.Metadata, at: time.Now()})
		}
		b.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *broker) Close() error { return nil }

func (b *broker) attemptsOf(id string) []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.attempts[id]...)
}

func (b *broker) peakInFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

func (b *broker) setFail(f func(msg *message.Message) error) {
	b.mu.Lock()
	b.fail = f
	b.mu.Unlock()
}

func (b *broker) snapshot() []published {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]published(nil), b.log...)
}

// distinct is the number of distinct message IDs published.
func (b *broker) distinct() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[string]struct{}{}
	for _, p := range b.log {
		seen[p.id] = struct{}{}
	}
	return len(seen)
}

// firstOrder returns, per key, the message IDs in the order of their first publication.
func firstOrder(log []published) map[string][]string {
	seen := map[string]struct{}{}
	out := map[string][]string{}
	for _, p := range log {
		if _, ok := seen[p.id]; ok {
			continue
		}
		seen[p.id] = struct{}{}
		out[p.key] = append(out[p.key], p.id)
	}
	return out
}

// runRouter runs a router relaying r to pub until the test ends.
func runRouter(t testing.TB, r *outbox.Relay, pub message.Publisher, cfg *outbox.RouterConfig) *message.Router {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	r.AddToRouter(router, pub, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = router.Close()
		<-done
	})
	return router
}

var errRejected = errors.New("destination rejected the message")

func (e *env) noop() outbox.HandlerFunc {
	return func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error { return nil }
}

// nacked reports whether msg was nacked: an inbox handler nacks a message it will retry (after its backoff) and
// returns nil, so the router neither logs the failure again nor acknowledges the message.
func nacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

// requireRetried asserts that an inbox handler's delivery of msg failed and was nacked for a redelivery.
func requireRetried(t testing.TB, err error, msg *message.Message, msgAndArgs ...any) {
	t.Helper()
	require.NoError(t, err, msgAndArgs...)
	require.True(t, nacked(msg), msgAndArgs...)
}

// requireSettled asserts that an inbox handler's delivery of msg is to be acknowledged (handled, skipped or
// dead-lettered): nil, and not nacked.
func requireSettled(t testing.TB, err error, msg *message.Message, msgAndArgs ...any) {
	t.Helper()
	require.NoError(t, err, msgAndArgs...)
	require.False(t, nacked(msg), msgAndArgs...)
}
