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
	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
	"github.com/stagehand-es/stagehand/internal/names"
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

// Inbox defaults.
const (
	// DefaultInboxMaxAttempts is InboxConfig.MaxAttempts's default: 5.
	DefaultInboxMaxAttempts = 5
	// DefaultInboxRetryDelay is InboxConfig.RetryDelay's default: 1s. With the default MaxAttempts (5) a message
	// that keeps failing is dead-lettered after waits of about 1s, 2s, 4s and 8s (plus jitter), some 15-18s in all.
	DefaultInboxRetryDelay = time.Second
	// DefaultInboxMaxRetryDelay is InboxConfig.MaxRetryDelay's default: 30s.
	DefaultInboxMaxRetryDelay = 30 * time.Second
	// DefaultInboxHandlerTimeout is InboxConfig.HandlerTimeout's default: 30s.
	DefaultInboxHandlerTimeout = 30 * time.Second
)

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
	// RetryDelay is how long the inbox waits after a failed attempt before it nacks the message for redelivery;
	// it doubles with every further failed attempt of the message (plus up to Jitter at random), capped by
	// MaxRetryDelay. The wait holds no database connection, ends at once when the subscription stops (the message
	// is nacked, not lost), and adds to whatever delay the broker puts on a redelivery (gochannel has none).
	// Default DefaultInboxRetryDelay (1s). Rule: positive.
	RetryDelay time.Duration
	// MaxRetryDelay caps the wait between attempts. Default DefaultInboxMaxRetryDelay (30s), or RetryDelay when
	// that is longer. Rule: not below RetryDelay.
	MaxRetryDelay time.Duration
	// Jitter is the largest fraction of a wait added at random, so the retries of many messages spread out.
	// Default 0.2. Rule: 0 to 1 (0 means the default; use a tiny value such as 1e-9 for none).
	Jitter float64
	// HandlerTimeout bounds every handler run: the context the handler gets, and its transaction, end after this
	// long, so a stuck handler's transaction is rolled back and its connection returned to the pool; the run
	// counts as a failed attempt (retried after RetryDelay, dead-lettered after MaxAttempts). A handler must honour
	// its ctx (every pgx statement does). Default DefaultInboxHandlerTimeout (30s); negative means no deadline.
	HandlerTimeout time.Duration
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
	o             *Outbox
	maxAttempts   int
	contention    int
	retryDelay    time.Duration
	maxRetryDelay time.Duration
	jitter        float64
	timeout       time.Duration // 0: none
	txOptions     pgx.TxOptions
	logger        *slog.Logger
	tel           inboxInstruments
}

// NewInbox returns an Inbox on the outbox's database and schema.
func (o *Outbox) NewInbox(cfg *InboxConfig) (*Inbox, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
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
	return &Inbox{o: o, maxAttempts: c.MaxAttempts, contention: c.ContentionRetries, retryDelay: c.RetryDelay,
		maxRetryDelay: c.MaxRetryDelay, jitter: c.Jitter, timeout: c.HandlerTimeout, txOptions: c.TxOptions,
		logger: c.Logger, tel: newInboxInstruments(c.TracerProvider, c.MeterProvider)}, nil
}

// withDefaults returns the configuration with every default applied, or the first rule it breaks.
func (cfg *InboxConfig) withDefaults() (InboxConfig, error) {
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	check := conf.Check{Package: "outbox"}
	check.Int("MaxAttempts", &c.MaxAttempts, DefaultInboxMaxAttempts, 1, 0)
	if err := checkTxOptions(c.TxOptions); err != nil {
		return c, err
	}
	switch {
	case c.ContentionRetries == 0:
		c.ContentionRetries = DefaultContentionRetries
	case c.ContentionRetries == -1:
		c.ContentionRetries = 0
	case c.ContentionRetries < -1:
		check.Fail("ContentionRetries", "must be -1 (no reruns) or more")
	}
	check.Duration("RetryDelay", &c.RetryDelay, DefaultInboxRetryDelay, 0)
	check.Duration("MaxRetryDelay", &c.MaxRetryDelay, max(DefaultInboxMaxRetryDelay, c.RetryDelay), 0)
	check.AtLeast("MaxRetryDelay", c.MaxRetryDelay, "RetryDelay", c.RetryDelay)
	check.Fraction("Jitter", &c.Jitter, DefaultJitter)
	switch {
	case c.HandlerTimeout == 0:
		c.HandlerTimeout = DefaultInboxHandlerTimeout
	case c.HandlerTimeout < 0:
		c.HandlerTimeout = 0
	}
	return c, check.Err()
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
// already handled, then commits; a duplicate delivered concurrently waits for the first and is skipped. h runs
// under HandlerTimeout. When h fails the transaction rolls back and the attempt is counted; the inbox logs it
// (one line per failed attempt), waits RetryDelay (doubling per attempt, capped by MaxRetryDelay) and nacks the
// message itself, so the broker redelivers it. It returns nil then: the router would otherwise log the failure
// again, and its Ack after the inbox's Nack does nothing, so the message is never acknowledged unhandled (a
// middleware outside the inbox sees no error; Watermill's Retry middleware is not needed). After MaxAttempts
// failures (or at once for a Permanent error) the message goes to the inbox dead letters with its error and is
// acknowledged. A message whose context ends while it is handled or waits for its retry (a subscription stopping,
// for subscribers that end their messages' contexts with it) is nacked at once without counting an attempt. name
// must be stable: it is part of the key.
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
	delivered := msg // the message the router acknowledges; a redriven dead letter is handled as its original
	msg, skip := redriveTarget(name, msg)
	if skip {
		return nil // a redriven inbox dead letter of another handler
	}
	ctx := msg.Context()
	tenant := stagehand.NormalizeTenant(msg.Metadata.Get(stagehand.HeaderTenantID))
	if err := checkInbound(name, tenant, msg); err != nil {
		if names.Stored(name) != "" {
			return err // the handler's own name: the program's fault, not the message's
		}
		// The message's tenant or ID can never be recorded: quarantined among the dead letters and acknowledged.
		if qerr := i.quarantine(ctx, name, msg, err); qerr != nil {
			return err
		}
		return nil
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
		// The subscription is stopping: no attempt counted, and the message is redelivered later.
		i.logger.Debug("stagehand: inbox handler stopped with its subscription; the message will be redelivered",
			"handler", name, "message_id", msg.UUID, "error", err)
		delivered.Nack()
		return nil
	}
	f := i.failed(ctx, name, tenant, msgType, msg, cause)
	switch {
	case f.handledBefore:
		outcome = telemetry.OutcomeDuplicate
		return nil
	case f.deadLettered:
		outcome = telemetry.OutcomeDeadLettered
		return nil
	}
	i.retryLater(ctx, name, msg, delivered, cause, f)
	return nil
}

// retryLater logs a failed attempt (the one line it gets), waits its backoff and nacks the message, so the broker
// redelivers it. The router is given no error: it would log the failure a second time, and nack what the inbox
// has already nacked (its Ack after a Nack does nothing, so the message is never acknowledged unhandled).
func (i *Inbox) retryLater(ctx context.Context, name string, msg, delivered *message.Message, cause error,
	f failure) {
	wait := i.retryWait(f.attempts)
	text := "stagehand: inbox handler failed; the message will be redelivered"
	attrs := []any{"handler", name, "message_id", msg.UUID}
	switch {
	case f.countErr != nil:
		text = "stagehand: inbox handler failed and the attempt could not be counted; the message will be redelivered"
		attrs = append(attrs, "count_error", f.countErr)
	case f.deadLetterErr != nil:
		text = "stagehand: inbox could not dead-letter a message that failed its last attempt; it will be redelivered"
		attrs = append(attrs, "attempt", f.attempts, "max_attempts", i.maxAttempts, "dead_letter_error",
			f.deadLetterErr)
	default:
		attrs = append(attrs, "attempt", f.attempts, "max_attempts", i.maxAttempts)
	}
	i.logger.Warn(text, append(attrs, "retry_in", wait, "error", cause)...)
	backoff.Sleep(ctx, wait) // a stop ends the wait: the message is nacked at once
	delivered.Nack()
}

// retryWait is the wait after failed attempt number attempts (1 = the first; 0 when it could not be counted):
// RetryDelay doubled per earlier failure, plus up to Jitter of it, capped by MaxRetryDelay.
func (i *Inbox) retryWait(attempts int) time.Duration {
	return backoff.Jittered(backoff.Exponential(i.retryDelay, i.maxRetryDelay, attempts-1), i.maxRetryDelay,
		i.jitter)
}

// run runs h in the inbox transaction; duplicate reports a message handled before (h did not run).
func (i *Inbox) run(ctx context.Context, name, tenant, msgType string, msg *message.Message, h HandlerFunc) (
	staged int, duplicate bool, err error) {
	if i.timeout > 0 {
		parent := ctx
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, i.timeout)
		defer cancel()
		defer func() {
			if err != nil && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("outbox: inbox handler %q ran past its HandlerTimeout (%s): %w", name, i.timeout,
					err)
			}
		}()
	}
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

// failure is what counting a failed attempt found.
type failure struct {
	attempts      int   // the message's failed attempts so far, this one included (0: not counted)
	handledBefore bool  // another delivery had handled the message: a duplicate to acknowledge, nothing counted
	deadLettered  bool  // permanent or out of attempts, and moved to the inbox dead letters: acknowledge
	countErr      error // the attempt could not be counted
	deadLetterErr error // the message was due for the dead letters but could not be moved there
}

// failed counts a failed attempt and dead-letters the message when it is permanent or out of attempts. It logs
// only a dead-lettering; a failure to retry is logged by the caller, once.
func (i *Inbox) failed(ctx context.Context, name, tenant, msgType string, msg *message.Message, cause error) failure {
	now := i.o.now()
	attempts := 1
	if err := i.o.pool.QueryRow(ctx, i.o.q.inboxAttempt, msg.UUID, name, tenant, truncateError(cause), now).
		Scan(&attempts); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			i.logger.Debug("stagehand: inbox acknowledged a failed duplicate of a handled message", "handler", name,
				"message_id", msg.UUID, "error", cause)
			return failure{handledBefore: true}
		}
		return failure{countErr: err}
	}
	rec := recordFailure(cause)
	if !errors.Is(cause, ErrPermanent) && attempts < i.maxAttempts {
		b := &pgx.Batch{}
		i.o.queueFailure(b, "inbox", msg.UUID, name, tenant, attempts, rec, now)
		if err := i.o.pool.SendBatch(ctx, b).Close(); err != nil {
			i.logger.Debug("stagehand: inbox could not record a failure in the history", "handler", name,
				"message_id", msg.UUID, "error", err)
		}
		return failure{attempts: attempts}
	}
	meta := jsonmeta.Encode(msg.Metadata)
	topic := message.SubscribeTopicFromCtx(ctx)
	payload := []byte(msg.Payload)
	if payload == nil {
		payload = []byte{} // an empty payload is kept as empty, not NULL (the column is NOT NULL)
	}
	err := pgx.BeginFunc(ctx, i.o.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(i.o.q.inboxDeadLetter, msg.UUID, name, tenant, msgType, topic, payload, meta, attempts,
			truncateError(cause), now, rec.typ, rec.signature)
		b.Queue(i.o.q.inboxMarkDead, msg.UUID, name, tenant, msgType, now)
		i.o.queueFailure(b, "inbox", msg.UUID, name, tenant, attempts, rec, now)
		b.Queue(i.o.q.inboxClearAttempts, msg.UUID, name, tenant)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return failure{attempts: attempts, deadLetterErr: err}
	}
	i.logger.Warn("stagehand: inbox dead-lettered a message", "handler", name, "message_id", msg.UUID,
		"attempts", attempts, "error", cause)
	return failure{attempts: attempts, deadLettered: true}
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
