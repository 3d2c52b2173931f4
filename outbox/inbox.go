package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// DefaultInboxRetention is how long the inbox remembers a handled message by default: 7 days.
//
// A duplicate can arrive as long as anything may still deliver the message again: the producing relay's retries
// (its RetryHorizon: about 2 h 15 min under Balanced, about 9 h under HighReliability, when a publish failed after
// the broker had in fact taken the message), the broker's own redelivery (ack timeouts, consumer-group rebalances,
// a consumer restarting from an older offset), and an operator redriving a dead letter days later. MassTransit's
// 30 minutes covers only broker redelivery; a week covers all of these with a wide margin, at the cost of one small
// row per message and handler.
const DefaultInboxRetention = 7 * 24 * time.Hour

// InboxConfig configures an Inbox. A nil *InboxConfig uses the defaults.
type InboxConfig struct {
	// MaxAttempts is how many times a message may fail in a handler (across redeliveries, counted in the
	// database) before it is moved to the inbox dead letters and acknowledged, so it stops blocking the
	// subscription. Errors marked Permanent (undecodable payloads, unknown message types) are dead-lettered at
	// once. Default 5. Rule: at least 1.
	MaxAttempts int
	// ContentionRetries is how many times a handler run that failed from contention is rerun at once, in a new
	// transaction and without counting an attempt. Contention is an error matching
	// eventstore.ErrConcurrencyConflict (an aggregate changed concurrently, and the handler's own retries, such as
	// aggregate.Repository.UpdateTx's, did not absorb it), or a serialization failure or deadlock reported by
	// PostgreSQL in the handler or at the inbox's commit: it says nothing about the message, so it must not push
	// the message towards the dead letters. Reruns pause up to a few milliseconds each (jittered). Only when they
	// are used up does the delivery count as one failed attempt, like any other error. Default
	// DefaultContentionRetries (10); -1 means no reruns.
	ContentionRetries int
	// TxOptions are the options of the handler's transaction. Default: READ COMMITTED, read-write. Rule: IsoLevel,
	// AccessMode and DeferrableMode are pgx's named values (or empty).
	TxOptions pgx.TxOptions
	// Logger overrides the Outbox's logger.
	Logger *slog.Logger
	// TracerProvider creates the stagehand.inbox.handle span of every handler run. Default: the Outbox's
	// Config.TracerProvider, else the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider creates the stagehand.inbox.messages counter. Default: the Outbox's Config.MeterProvider, else
	// the global provider (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
}

// Inbox makes Watermill handlers idempotent: each message is handled at most once per (tenant, message ID, handler
// name) when the handler writes its effects in the transaction the inbox gives it. The tenant is the message's
// stagehand.HeaderTenantID metadata value (stagehand.NoTenant when absent): message IDs are only unique within a
// tenant, so another tenant's message with the same ID is handled, not skipped as a duplicate.
type Inbox struct {
	o           *Outbox
	maxAttempts int
	contention  int
	txOptions   pgx.TxOptions
	logger      *slog.Logger
	tel         inboxInstruments
}

// NewInbox returns an Inbox on the outbox's database and schema.
func (o *Outbox) NewInbox(cfg *InboxConfig) (*Inbox, error) {
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = 5
	case c.MaxAttempts < 1:
		return nil, &ConfigError{Package: "outbox", Field: "MaxAttempts", Reason: "MaxAttempts must be at least 1."}
	}
	if err := checkTxOptions(c.TxOptions); err != nil {
		return nil, err
	}
	switch {
	case c.ContentionRetries == 0:
		c.ContentionRetries = DefaultContentionRetries
	case c.ContentionRetries == -1:
		c.ContentionRetries = 0
	case c.ContentionRetries < -1:
		return nil, &ConfigError{Package: "outbox", Field: "ContentionRetries",
			Reason: "ContentionRetries must be -1 (no reruns) or more."}
	}
	if c.Logger == nil {
		c.Logger = o.logger
	}
	if c.TracerProvider == nil {
		c.TracerProvider = o.tp
	}
	if c.MeterProvider == nil {
		c.MeterProvider = o.mp
	}
	return &Inbox{o: o, maxAttempts: c.MaxAttempts, contention: c.ContentionRetries, txOptions: c.TxOptions,
		logger: c.Logger, tel: newInboxInstruments(c.TracerProvider, c.MeterProvider)}, nil
}

// HandlerFunc handles one message inside the inbox transaction tx. Write the handler's effects with tx and
// publish the messages it produces with out (they are staged in the outbox in tx, with causation ID = the incoming
// message's ID and its correlation ID). Returning an error rolls everything back; the message is retried.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, out *Publisher, msg *message.Message) error

// ErrPermanent is stagehand.ErrPermanent, matched (errors.Is) by errors wrapped with Permanent.
var ErrPermanent = stagehand.ErrPermanent

// Permanent is stagehand.Permanent, here for handlers: a handler error it marks makes the inbox dead-letter the
// message at once.
func Permanent(err error) error { return stagehand.Permanent(err) }

// Handler wraps h for a Watermill router (router.AddConsumerHandler). For every message it opens a transaction,
// records (tenant, message ID, name) in the inbox under a unique constraint, and runs h unless the message was
// already handled, then commits; a duplicate delivered concurrently waits for the first and is skipped. When h
// fails the transaction rolls back and the error is returned, so the router nacks and the message is redelivered;
// after MaxAttempts failures (or at once for a Permanent error) the message goes to the inbox dead letters with its
// error and is acknowledged. name must be stable: it is part of the key.
//
// Contention is not failure: a run that fails with a concurrency conflict (eventstore.ErrConcurrencyConflict), a
// serialization failure or a deadlock is rerun at once in a new transaction, up to ContentionRetries times, without
// counting an attempt; only a delivery whose reruns are all used up counts as one failed attempt.
//
// Every run is traced as a stagehand.inbox.handle span, the child of the trace context in the message's metadata,
// with its outcome (handled, duplicate, failed, dead_lettered); h's ctx carries it, so the handler's own spans and
// the messages it publishes continue the trace.
func (i *Inbox) Handler(name string, h HandlerFunc) message.NoPublishHandlerFunc {
	beat := i.o.inboxBeat(name)
	return func(msg *message.Message) error {
		err := i.handle(name, msg, h)
		handledBeat(beat, err)
		return err
	}
}

// Middleware is Handler as a Watermill middleware, for handlers written as message.HandlerFunc: the inner
// handler finds the transaction with InboxTx and the publisher with InboxPublisher in msg.Context(). It must
// publish through that publisher: messages it returns are refused (an error), because a router publishes them after
// the commit, where a failure would be skipped as a duplicate on redelivery and lost.
func (i *Inbox) Middleware(name string) message.HandlerMiddleware {
	beat := i.o.inboxBeat(name)
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (_ []*message.Message, err error) {
			defer func() { handledBeat(beat, err) }()
			return nil, i.handle(name, msg, func(ctx context.Context, tx pgx.Tx, out *Publisher,
				msg *message.Message) error {
				orig := msg.Context()
				msg.SetContext(context.WithValue(ctx, inboxKey{}, &inboxScope{tx: tx, out: out}))
				defer msg.SetContext(orig)
				produced, err := next(msg)
				if err != nil {
					return err
				}
				if len(produced) > 0 {
					return fmt.Errorf("outbox: inbox handler %q returned %d message(s): publish them with "+
						"outbox.InboxPublisher(ctx) so they are staged in the handler's transaction", name,
						len(produced))
				}
				return nil
			})
		}
	}
}

type inboxKey struct{}

type inboxScope struct {
	tx  pgx.Tx
	out *Publisher
}

// InboxTx returns the inbox transaction of a handler wrapped by Inbox.Middleware.
func InboxTx(ctx context.Context) (pgx.Tx, bool) {
	s, ok := ctx.Value(inboxKey{}).(*inboxScope)
	if !ok {
		return nil, false
	}
	return s.tx, true
}

// InboxPublisher returns the publisher staging into the inbox transaction of a handler wrapped by
// Inbox.Middleware.
func InboxPublisher(ctx context.Context) (*Publisher, bool) {
	s, ok := ctx.Value(inboxKey{}).(*inboxScope)
	if !ok {
		return nil, false
	}
	return s.out, true
}

func (i *Inbox) handle(name string, msg *message.Message, h HandlerFunc) error {
	if name == "" {
		return Permanent(errors.New("outbox: inbox handler name is empty"))
	}
	msg, skip := redriveTarget(name, msg)
	if skip {
		return nil // a redriven inbox dead letter of another handler
	}
	ctx := msg.Context()
	tenant := stagehand.NormalizeTenant(msg.Metadata.Get(stagehand.HeaderTenantID))
	if err := checkInbound(name, tenant, msg); err != nil {
		return err
	}
	msgType := msg.Metadata.Get(stagehand.HeaderMessageType)
	correlation := firstNonEmpty(msg.Metadata.Get(stagehand.HeaderCorrelationID),
		middleware.MessageCorrelationID(msg), msg.UUID)
	hctx, span := i.tel.startHandle(ctx, name, tenant, msgType, msg)
	outcome := telemetry.OutcomeFailed
	var cause error
	defer func() { i.tel.endHandle(ctx, span, name, outcome, cause) }()
	hctx = stagehand.WithTenant(hctx, tenant)
	hctx = stagehand.WithCorrelationID(hctx, correlation)
	hctx = stagehand.WithCausationID(hctx, msg.UUID)

	staged, duplicate, err := i.run(hctx, name, tenant, msgType, msg, h)
	for n := 0; err != nil && n < i.contention && contention(err) && ctx.Err() == nil; n++ {
		i.logger.Debug("stagehand: inbox reruns a handler after contention", "handler", name, "message_id", msg.UUID,
			"rerun", n+1, "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(contentionPause(n)):
			staged, duplicate, err = i.run(hctx, name, tenant, msgType, msg, h)
		}
	}
	if err == nil {
		outcome = telemetry.OutcomeHandled
		if duplicate {
			outcome = telemetry.OutcomeDuplicate
		}
		if staged > 0 {
			i.o.Notify()
		}
		return nil
	}
	cause = err
	if ctx.Err() != nil {
		return err // shutting down: no attempt counted
	}
	if err := i.failed(ctx, name, tenant, msgType, msg, cause); err != nil {
		if errors.Is(err, errHandledBefore) {
			outcome = telemetry.OutcomeDuplicate
			return nil
		}
		return err
	}
	outcome = telemetry.OutcomeDeadLettered
	return nil
}

// errHandledBefore: the delivery failed, but the message had been handled by another delivery, so it is a
// duplicate to acknowledge, not a failure to count.
var errHandledBefore = errors.New("outbox: inbox message handled before")

// run runs h in the inbox transaction; duplicate reports a message handled before (h did not run).
func (i *Inbox) run(ctx context.Context, name, tenant, msgType string, msg *message.Message, h HandlerFunc) (
	staged int, duplicate bool, err error) {
	tx, err := i.o.pool.BeginTx(ctx, i.txOptions)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: inbox begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, i.o.q.inboxClaim, msg.UUID, name, tenant, msgType, i.o.now())
	if err != nil {
		return 0, false, fmt.Errorf("outbox: inbox record: %w", err)
	}
	if tag.RowsAffected() == 0 {
		i.logger.Debug("stagehand: inbox skipped a duplicate", "handler", name, "message_id", msg.UUID)
		return 0, true, nil
	}
	out := i.o.Publisher(ctx, tx)
	if err := callHandler(ctx, h, tx, out, msg); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, i.o.q.inboxClearAttempts, msg.UUID, name, tenant); err != nil {
		return 0, false, fmt.Errorf("outbox: inbox clear attempts: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("outbox: inbox commit: %w", err)
	}
	return out.staged(), false, nil
}

func callHandler(ctx context.Context, h HandlerFunc, tx pgx.Tx, out *Publisher, msg *message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: inbox handler panicked: %v", p)
		}
	}()
	return h(ctx, tx, out, msg)
}

// failed counts a failed attempt and dead-letters the message when it is permanent or out of attempts, in which
// case the message is acknowledged (nil); otherwise the handler's error goes back to the router. A message handled
// meanwhile by another delivery counts nothing (errHandledBefore).
func (i *Inbox) failed(ctx context.Context, name, tenant, msgType string, msg *message.Message, cause error) error {
	now := i.o.now()
	attempts := 1
	if err := i.o.pool.QueryRow(ctx, i.o.q.inboxAttempt, msg.UUID, name, tenant, truncateError(cause), now).
		Scan(&attempts); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			i.logger.Debug("stagehand: inbox acknowledged a failed duplicate of a handled message", "handler", name,
				"message_id", msg.UUID, "error", cause)
			return errHandledBefore
		}
		i.logger.Warn("stagehand: inbox could not count a failed attempt", "handler", name,
			"message_id", msg.UUID, "error", err)
		return cause
	}
	if !errors.Is(cause, ErrPermanent) && attempts < i.maxAttempts {
		return cause
	}
	meta := jsonmeta.Encode(msg.Metadata)
	topic := message.SubscribeTopicFromCtx(ctx)
	err := pgx.BeginFunc(ctx, i.o.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(i.o.q.inboxDeadLetter, msg.UUID, name, tenant, msgType, topic, []byte(msg.Payload), meta, attempts,
			truncateError(cause), now)
		b.Queue(i.o.q.inboxMarkDead, msg.UUID, name, tenant, msgType, now)
		b.Queue(i.o.q.inboxClearAttempts, msg.UUID, name, tenant)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		i.logger.Warn("stagehand: inbox could not dead-letter a message", "handler", name, "message_id", msg.UUID,
			"error", err)
		return cause
	}
	i.logger.Warn("stagehand: inbox dead-lettered a message", "handler", name, "message_id", msg.UUID,
		"attempts", attempts, "error", cause)
	return nil
}

// ErrUnknownMessageType is returned (as a Permanent error) by Handlers for a message type nobody registered.
var ErrUnknownMessageType = errors.New("outbox: unknown message type")

// ErrUndecodable is returned (as a Permanent error) by Handlers for a payload that does not decode.
var ErrUndecodable = errors.New("outbox: undecodable payload")

// Handlers dispatches messages to typed handlers by their stable message type name (the stagehand.HeaderMessageType
// metadata value), never by Go type name. Register with Handle, then pass Func to Inbox.Handler. It is a value you
// construct, not a global registry.
type Handlers struct {
	decode        func(data []byte, v any) error
	ignoreUnknown bool
	byType        map[string]HandlerFunc
}

// NewHandlers returns an empty set of typed handlers decoding payloads with decode (nil: encoding/json).
// With ignoreUnknown, a message of a type nobody registered is acknowledged and recorded as handled; otherwise it
// is dead-lettered with ErrUnknownMessageType.
func NewHandlers(decode func(data []byte, v any) error, ignoreUnknown bool) *Handlers {
	if decode == nil {
		decode = json.Unmarshal
	}
	return &Handlers{decode: decode, ignoreUnknown: ignoreUnknown, byType: map[string]HandlerFunc{}}
}

// Handle registers fn for messageType. The payload is decoded into a T; a payload that does not decode is a
// Permanent error wrapping ErrUndecodable. Registering a type twice replaces the first handler.
func Handle[T any](hs *Handlers, messageType string, fn func(ctx context.Context, tx pgx.Tx, out *Publisher,
	msg *message.Message, v T) error) {
	hs.byType[messageType] = func(ctx context.Context, tx pgx.Tx, out *Publisher, msg *message.Message) error {
		var v T
		if err := hs.decode(msg.Payload, &v); err != nil {
			return Permanent(fmt.Errorf("%w: message %s of type %q: %w", ErrUndecodable, msg.UUID, messageType, err))
		}
		return fn(ctx, tx, out, msg, v)
	}
}

// Func returns the dispatching HandlerFunc.
func (hs *Handlers) Func() HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, out *Publisher, msg *message.Message) error {
		t := msg.Metadata.Get(stagehand.HeaderMessageType)
		h, ok := hs.byType[t]
		if !ok {
			if hs.ignoreUnknown {
				return nil
			}
			return Permanent(fmt.Errorf("%w: %q (message %s)", ErrUnknownMessageType, t, msg.UUID))
		}
		return h(ctx, tx, out, msg)
	}
}
