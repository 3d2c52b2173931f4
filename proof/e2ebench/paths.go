package e2ebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/outbox"
)

// A path is one way from an append to a handled message: save appends one order (and stages its message), and
// the path's consumer records every message it handles in rec.
type path struct {
	name string
	save func(ctx context.Context, id string, e Placed) error
	rec  *recorder
}

// Path names, as printed.
const (
	PathStagehand = "stagehand"
	PathForwarder = "forwarder"
)

// recorder collects, per phase, what a path's consumer handled: how many, the append → handled latencies, and
// when the last one was handled.
type recorder struct {
	mu     sync.Mutex
	phases map[int]*phaseLog
}

type phaseLog struct {
	handled int
	latency []time.Duration
	last    time.Time
}

func newRecorder() *recorder { return &recorder{phases: map[int]*phaseLog{}} }

func (r *recorder) handled(phase int, at time.Time, latency time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.phases[phase]
	if l == nil {
		l = &phaseLog{}
		r.phases[phase] = l
	}
	l.handled++
	l.latency = append(l.latency, latency)
	if at.After(l.last) {
		l.last = at
	}
}

// count returns how many messages of phase were handled.
func (r *recorder) count(phase int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.phases[phase]; l != nil {
		return l.handled
	}
	return 0
}

// take returns a copy of phase's log.
func (r *recorder) take(phase int) phaseLog {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.phases[phase]
	if l == nil {
		return phaseLog{}
	}
	return phaseLog{handled: l.handled, latency: append([]time.Duration(nil), l.latency...), last: l.last}
}

// handledKey carries, through the message's context, what the inbox-wrapped handler decoded, so the router handler
// records the latency only once the inbox transaction has committed.
type handledKey struct{}

type handledNote struct {
	ran bool
	p   Payload
}

// consumerHandler is the consumer logic of both paths: behind the inbox, it writes one effect row per message in
// the inbox's transaction; a message is handled when that transaction has committed.
func consumerHandler(inbox *outbox.Inbox, name, effects string, rec *recorder) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + effects + ` (message_id, path, order_id, amount) VALUES ($1, $2, $3, $4)`
	h := inbox.Handler(name, func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
		var p Payload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return outbox.Permanent(fmt.Errorf("decode %s: %w", msg.UUID, err))
		}
		if _, err := tx.Exec(ctx, insert, msg.UUID, name, p.OrderID, p.Amount); err != nil {
			return fmt.Errorf("effect of %s: %w", msg.UUID, err)
		}
		if note, ok := ctx.Value(handledKey{}).(*handledNote); ok {
			note.ran, note.p = true, p
		}
		return nil
	})
	return func(msg *message.Message) error {
		note := &handledNote{}
		msg.SetContext(context.WithValue(msg.Context(), handledKey{}, note))
		if err := h(msg); err != nil {
			return err
		}
		if note.ran {
			now := time.Now()
			rec.handled(note.p.Phase, now, now.Sub(time.Unix(0, note.p.SentAt)))
		}
		return nil
	}
}

// stagehandPath is stagehand's own: Save on a repository with the Transactional strategy (the event and its
// message commit together), a relay through a Watermill router publishing to NATS JetStream.
func stagehandPath(repo *aggregate.Repository[*Order], rec *recorder) *path {
	return &path{name: PathStagehand, rec: rec, save: func(ctx context.Context, id string, e Placed) error {
		o := repo.New(id)
		aggregate.Raise(o, e)
		return repo.Save(ctx, o)
	}}
}

// forwarderPath is the peer: the same append (the same event store, no stager) and, in the same pgx
// transaction, the message published through watermill-sql v4's default schema wrapped by Watermill's forwarder
// publisher; the forwarder (run elsewhere) moves it to NATS JetStream.
func forwarderPath(pool *pgxpool.Pool, repo *aggregate.Repository[*Order], rec *recorder) *path {
	logger := watermill.NopLogger{}
	return &path{name: PathForwarder, rec: rec, save: func(ctx context.Context, id string, e Placed) error {
		payload, err := json.Marshal(Payload{OrderID: id, Phase: e.Phase, SentAt: e.SentAt, Amount: e.Amount})
		if err != nil {
			return fmt.Errorf("e2ebench: encode: %w", err)
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			o := repo.New(id)
			aggregate.Raise(o, e)
			if err := repo.SaveTx(ctx, tx, o); err != nil {
				return err
			}
			sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{
				SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, logger)
			if err != nil {
				return fmt.Errorf("e2ebench: watermill-sql publisher: %w", err)
			}
			msg := message.NewMessage(watermill.NewUUID(), payload)
			return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: envelopeTopic}).
				Publish(TopicForwarder, msg)
		})
	}}
}

// runForwarder starts Watermill's forwarder: a watermill-sql subscriber on the default schema (SubscribeBatchSize
// 100, polling every 10 ms: its lowest-latency setting, with no wake-up notification to rely on) forwarding to a
// NATS JetStream publisher. The subscriber creates the envelope table before Running is closed.
func runForwarder(ctx context.Context, pool *pgxpool.Pool, pub message.Publisher, logger *slog.Logger) (
	stop func() error, err error) {
	wlog := watermill.NewSlogLogger(logger)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		ConsumerGroup:    "e2ebench",
		PollInterval:     10 * time.Millisecond,
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 100},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, wlog)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: watermill-sql subscriber: %w", err)
	}
	fwd, err := forwarder.NewForwarder(sub, pub, wlog, forwarder.Config{ForwarderTopic: envelopeTopic,
		CloseTimeout: 10 * time.Second})
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("e2ebench: forwarder: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-done:
		_ = sub.Close()
		return nil, fmt.Errorf("e2ebench: forwarder: %w", err)
	case <-time.After(30 * time.Second):
		_ = fwd.Close()
		<-done
		_ = sub.Close()
		return nil, errors.New("e2ebench: the forwarder did not start within 30s")
	}
	return func() error {
		err := fwd.Close()
		<-done
		return errors.Join(err, sub.Close())
	}, nil
}
