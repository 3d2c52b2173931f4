package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/heartbeat"
	"github.com/stagehand-es/stagehand/internal/lease"
)

// Relay delivers staged messages. It is a Watermill message.Subscriber: Subscribe(ctx, topic) delivers the rows
// staged for topic, one Watermill message per row (UUID = message ID, metadata = the staged metadata plus the
// standard headers). Ack marks the row sent; Nack, an AckDeadline without an answer, or the relay's death leave it
// for a retry (see RelayConfig). AddToRouter wires it to any Watermill publisher through a message.Router, and Drain
// publishes what is due once, without a background loop.
//
// Several relays, in one process or many, may work on one outbox: rows are claimed under leases with
// FOR UPDATE SKIP LOCKED, and a relay only marks rows it still holds. With RelayConfig.LeaderElection only the
// leader claims, fenced by the leader lease's token on every claim and mark (a demoted leader's writes are
// rejected with ErrFenced); with RelayConfig.Partitions the claim runs as independent loops per partition, led
// separately and shared among the relays. Under leader election, use one subscription per relay (SubscribeTopics
// for several topics): subscriptions of one relay contend for the same leases as the same owner, so only one of
// them leads at a time.
//
// Per-key order: messages sharing a partition key are delivered one at a time in staging-commit order, and a
// message is delivered only after every earlier message of its key was acknowledged, so the first publication of
// each reaches the broker in that order, whatever the number of relays and MaxDegreeOfParallelism. A message
// that fails holds back only the later messages of its own key; a dead-lettered one keeps holding them until it is
// redriven or discarded (unless RelayConfig.ReleaseKeyOnDeadLetter).
type Relay struct {
	o      *Outbox
	s      settings
	st     relayStatements
	owner  string         // names this relay in the leader leases (and, with a suffix per term, in row leases)
	leases *lease.Manager // nil without LeaderElection
	tel    *relayTelemetry

	fenceChecked atomic.Bool
	// listenChecked: checkListen found that the pool delivers notifications.
	listenChecked atomic.Bool
	poolWarned    atomic.Bool       // a pool smaller than a subscription holds at once is logged once
	maint         *relayMaintenance // nil when RelayConfig.Maintenance.Disabled
	beat          *heartbeat.Beat   // the relay's heartbeat (heartbeat.go); nil when it cannot be made

	mu     sync.Mutex
	closed bool
	groups map[*group]struct{}
	wg     sync.WaitGroup
}

// NewRelay returns a relay with the given processing settings (nil: Balanced()). Invalid settings return a
// *ConfigError naming the field. With RelayConfig.SingleWriter it logs a warning that the relay runs unfenced.
func (o *Outbox) NewRelay(cfg *RelayConfig) (*Relay, error) {
	s, err := cfg.settings(o.logger)
	if err != nil {
		return nil, err
	}
	r := &Relay{o: o, s: s, owner: newLeaseOwner(s.ProcessorID), groups: map[*group]struct{}{}}
	if r.st, err = o.q.relay(s.LeaderElection != "", s.Partitions > 1, s.PartitionBy); err != nil {
		return nil, err
	}
	if s.LeaderElection != "" {
		r.leases, err = lease.New(o.pool, &lease.Config{Schema: o.schema, Owner: r.owner, TTL: s.LeaderTTL,
			AcquireInterval: min(time.Second, s.LeaderTTL/3), Logger: s.Logger})
		if err != nil {
			return nil, &ConfigError{Package: "outbox", Field: "LeaderTTL", Reason: err.Error()}
		}
	}
	if s.SingleWriter {
		s.Logger.Warn("stagehand: outbox relay runs unfenced (SingleWriter): the operator guarantees that it is "+
			"the only relay draining this outbox", "processor_id", s.ProcessorID, "schema", o.schema)
	}
	r.beat = newRelayBeat(r)
	if r.tel, err = newRelayTelemetry(r); err != nil {
		return nil, err
	}
	if s.maintenance != nil {
		m, err := o.NewMaintainer(s.maintenance)
		if err != nil {
			return nil, err
		}
		r.maint = &relayMaintenance{m: m}
	}
	return r, nil
}

var _ message.Subscriber = (*Relay)(nil)

// Subscribe delivers the messages staged for topic until ctx ends or the relay is closed; then the channel is
// closed. Each subscription claims, delivers and marks on its own.
func (r *Relay) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return r.SubscribeTopics(ctx, topic)
}

// SubscribeTopics is Subscribe for a set of topics; with no topics it delivers every topic.
func (r *Relay) SubscribeTopics(ctx context.Context, topics ...string) (<-chan *message.Message, error) {
	out, _, err := r.subscribe(ctx, topics)
	return out, err
}

func (r *Relay) subscribe(ctx context.Context, topics []string) (<-chan *message.Message, *group, error) {
	out := make(chan *message.Message)
	g, err := r.start(ctx, topics, func(ctx context.Context, d *delivery) outcome {
		return d.viaChannel(ctx, out, r.s.AckDeadline)
	}, func() { close(out) })
	if err != nil {
		return nil, nil, err
	}
	return out, g, nil
}

// DrainResult counts what a Drain did.
type DrainResult struct {
	// Published is the number of messages the publisher accepted (and that were marked sent).
	Published int
	// Failed is the number of rejected attempts (each backed off or dead-lettered).
	Failed int
	// DeadLettered is the number of messages moved to the dead letters.
	DeadLettered int
	// Unreachable is the number of publishes that found the broker unreachable (no attempt counted).
	Unreachable int
}

// Drain publishes every message that is due now through pub, topic taken from the row, and returns when none is left
// that this relay can take (others may be leased by other relays, backing off or scheduled later), when the broker
// turns out to be unreachable, or when ctx ends. It runs no background loop: call it from a timer trigger in serverless
// environments (the Excalibur outbox documentation, "Manual Processing"). Processing settings apply as for Subscribe.
func (r *Relay) Drain(ctx context.Context, pub message.Publisher) (DrainResult, error) {
	g, err := r.start(ctx, nil, func(ctx context.Context, d *delivery) outcome {
		return d.viaPublisher(ctx, pub)
	}, nil)
	if err != nil {
		return DrainResult{}, err
	}
	<-g.ended
	g.mu.Lock()
	res, drainErr := g.result, g.drainErr
	g.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	r.maint.afterDrain(ctx, r.s.Logger)
	return res, drainErr
}

// Close stops every subscription: deliveries waiting for an ack are given up (their rows are released for a
// retry), acknowledged rows are marked, and the channels are closed. It is safe to call more than once.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	groups := make([]*group, 0, len(r.groups))
	for g := range r.groups {
		groups = append(groups, g)
	}
	r.mu.Unlock()
	for _, g := range groups {
		g.cancel()
	}
	r.wg.Wait()
	if r.tel != nil {
		r.tel.close()
	}
	return nil
}

// ErrNacked is the error recorded for a message that was nacked without an error recorded through RecordError.
var ErrNacked = errors.New("outbox: message nacked")

// ErrAckDeadline is the error recorded for a message not acknowledged within RelayConfig.AckDeadline.
var ErrAckDeadline = errors.New("outbox: ack deadline exceeded")

// checkPool logs once, at a subscription's start, when the pool is smaller than what a subscription of this relay
// holds at once (stagehand.PoolSize). The relay still makes progress with a single connection (none of its
// statements holds one while it waits for another), so this is a warning, not an error: its claims, marks and
// renewals wait for each other, and for whatever else shares the pool.
func (r *Relay) checkPool() {
	partitions := r.s.Partitions
	leader := r.s.LeaderElection != ""
	need := stagehand.PoolSize(stagehand.PoolUse{RelaySubscriptions: 1, RelayPartitions: partitions,
		RelayLeaderElection: leader})
	have := int(r.o.pool.Config().MaxConns)
	if have >= need || !r.poolWarned.CompareAndSwap(false, true) {
		return
	}
	parts := fmt.Sprintf("claim 1 and mark 1 per partition × %d, upkeep 1", partitions)
	if leader {
		parts += ", leader lease 1"
	}
	r.s.Logger.Warn("stagehand: outbox relay's pool is smaller than what a relay subscription holds at once; its "+
		"statements will wait for connections", "detail", fmt.Sprintf("pool MaxConns %d is below the %d "+
		"connections this relay subscription holds at once (%s)", have, need, parts), "pool_max_conns", have,
		"relay_conns", need)
}
