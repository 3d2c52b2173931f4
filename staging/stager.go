package staging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/outbox"
)

// Errors of the staging package. Compare with errors.Is.
var (
	// ErrInvalidConfig: a stager, a mapping or a worker was configured with something missing or invalid.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrInvalidMessage: a mapping returned a message that cannot be staged (no topic, unencodable payload).
	ErrInvalidMessage = errors.New("staging: invalid message")
)

// Config configures a Stager. A nil *Config is invalid: a Mapping is required.
type Config struct {
	// Strategy is the staging strategy. Default Auto.
	Strategy Strategy
	// Outbox stages the messages. Required by Transactional and EventuallyConsistent; without it Auto resolves
	// to Deferred.
	Outbox *outbox.Outbox
	// Mapping derives messages from events. Required.
	Mapping *Mapping
	// ReconcilerName is the WorkerConfig.Name of the Reconciler that backs this stager under
	// EventuallyConsistent. Default "default".
	ReconcilerName string
	// Logger receives the one line naming the resolved strategy, and diagnostics. Default: silent.
	Logger *slog.Logger
	// TracerProvider creates the stagehand.stage span of each save's staging (a child of the repository's
	// stagehand.save span). Default nil: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
}

// Stager implements aggregate.Stager with one resolved strategy. Give one to each repository through
// aggregate.RepositoryConfig.Stager.
type Stager struct {
	strategy  Strategy
	requested Strategy
	outbox    *outbox.Outbox
	mapping   *Mapping
	logger    *slog.Logger
	tracer    trace.Tracer
	// reconciler is the outbox watermark of the Reconciler backing EventuallyConsistent.
	reconciler string
}

var _ aggregate.Stager = (*Stager)(nil)

// New resolves the strategy for the given event store and returns the stager. An explicitly requested strategy
// without the parts it needs fails here, naming what is missing; it never silently degrades.
func New(store eventstore.Store, cfg *Config) (*Stager, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: the event store is nil", ErrInvalidConfig)
	}
	if err := cfg.Mapping.Err(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Stager{requested: cfg.Strategy, outbox: cfg.Outbox, mapping: cfg.Mapping, logger: logger,
		reconciler: workerName("reconciler", cfg.ReconcilerName), tracer: telemetry.Tracer(cfg.TracerProvider)}
	missing := transactionalGaps(store, cfg.Outbox)
	switch cfg.Strategy {
	case Auto:
		switch {
		case len(missing) == 0:
			s.strategy = Transactional
		case cfg.Outbox != nil:
			s.strategy = EventuallyConsistent
		default:
			s.strategy = Deferred
			logger.Warn("stagehand: staging strategy auto resolved to deferred because no outbox is configured: " +
				"nothing is staged unless a DeferredStager runs")
		}
	case Transactional:
		if len(missing) > 0 {
			return nil, &ConfigError{Package: "staging", Field: "Strategy",
				Reason: "Transactional needs " + strings.Join(missing, "; and ")}
		}
		s.strategy = Transactional
	case EventuallyConsistent:
		if cfg.Outbox == nil {
			return nil, &ConfigError{Package: "staging", Field: "Outbox",
				Reason: "is required by the EventuallyConsistent strategy"}
		}
		s.strategy = EventuallyConsistent
	default: // Deferred: check refused every other value
		s.strategy = Deferred
	}
	logger.Info("stagehand: staging strategy resolved", "requested", cfg.Strategy.String(),
		"strategy", s.strategy.String())
	return s, nil
}

// transactionalGaps lists what keeps store and o from sharing one transaction. Whether the event store and the
// outbox are on one database is asked of the databases themselves (see samePoolDatabase), so two pools reaching one
// database by different host names count as one; the question has its own timeout, since New takes no context.
func transactionalGaps(store eventstore.Store, o *outbox.Outbox) []string {
	var missing []string
	ts, ok := store.(eventstore.TransactionalStore)
	if !ok {
		missing = append(missing, fmt.Sprintf("an event store that appends inside a transaction "+
			"(eventstore.TransactionalStore); %T is not one", store))
	}
	if o == nil {
		missing = append(missing, "an outbox (Config.Outbox is nil)")
	}
	if ok && o != nil {
		switch same, err := sameDatabase(ts, o); {
		case err != nil:
			missing = append(missing, fmt.Sprintf("the outbox on the event store's database (could not tell "+
				"whether their pools reach one database: %v)", err))
		case !same:
			missing = append(missing, "the outbox on the event store's database (their pools connect to different "+
				"databases)")
		}
	}
	return missing
}

func sameDatabase(store eventstore.TransactionalStore, o *outbox.Outbox) (bool, error) {
	sp, ok := store.(interface{ Pool() *pgxpool.Pool })
	if !ok {
		return false, nil
	}
	return samePoolDatabase(sp.Pool(), o.Pool())
}

// Strategy returns the resolved strategy (never Auto).
func (s *Stager) Strategy() Strategy { return s.strategy }

// Requested returns the strategy the stager was configured with (possibly Auto).
func (s *Stager) Requested() Strategy { return s.requested }

// Append implements aggregate.Stager. It names its strategy on the span in ctx (the repository's stagehand.save
// span) and traces the staging it does as a stagehand.stage span, a child of it.
func (s *Stager) Append(ctx context.Context, store eventstore.Store, batch aggregate.Batch) (
	eventstore.AppendResult, error) {
	s.tagSave(ctx)
	switch s.strategy {
	case Transactional:
		if qa, ok := store.(eventstore.QueuedAppender); ok {
			return s.appendQueued(ctx, qa, batch)
		}
		ts, ok := store.(eventstore.TransactionalStore)
		if !ok {
			return eventstore.AppendResult{}, fmt.Errorf("%w: transactional staging with %T", ErrInvalidConfig, store)
		}
		res, err := ts.AppendWith(ctx, batch.Request, func(ctx context.Context, tx pgx.Tx,
			res eventstore.AppendResult) (err error) {
			ctx, span := startStage(ctx, s.tracer, s.strategy, batch.Request)
			var msgs []outbox.Message
			defer func() { endStage(span, len(msgs), err) }()
			msgs, err = s.messagesFor(res.Records, batch.Events)
			if err != nil {
				return err
			}
			if err := s.stage(ctx, tx, msgs, &outbox.StageOptions{NewIDs: true}); err != nil {
				return err
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		s.outbox.Notify()
		return res, nil
	case EventuallyConsistent:
		res, err := store.Append(ctx, batch.Request)
		if err != nil {
			return res, err
		}
		sctx, span := startStage(ctx, s.tracer, s.strategy, batch.Request)
		n, err := s.stageAfterCommit(sctx, res.Records, batch.Events)
		endStage(span, n, err)
		if err != nil {
			// The events are committed: the save succeeded. The reconciler stages what is missing; reporting an
			// error here would invite the caller to repeat a decision that is already stored.
			s.logger.WarnContext(ctx, "stagehand: staging after the append failed; the reconciler will stage it",
				"stream", batch.Request.StreamID, "version", res.Version, "error", err)
		}
		return res, nil
	default: // Deferred
		return store.Append(ctx, batch.Request)
	}
}

// appendQueued is a Transactional save in one round trip: the append, the staging statements and the commit are
// sent as one batch. The messages are derived before the insert, from the records as they will be stored (without
// their global positions, which the staging statement reads from the inserted events). Their IDs derive from the
// stream versions this transaction inserts under the event store's unique index, so no one else can have staged
// them: staging skips its ledger and dead-letter checks.
func (s *Stager) appendQueued(ctx context.Context, store eventstore.QueuedAppender, batch aggregate.Batch) (
	eventstore.AppendResult, error) {
	var (
		span trace.Span
		n    int
	)
	res, err := store.AppendQueued(ctx, batch.Request, func(ctx context.Context, q eventstore.Queued) error {
		planned, b := q.Planned, q.Batch
		opts := &outbox.StageOptions{NewIDs: true, EndsTransaction: true, Source: &q.Positions}
		var sctx context.Context
		sctx, span = startStage(ctx, s.tracer, s.strategy, batch.Request)
		msgs, err := s.messagesFor(planned.Records, batch.Events)
		if err != nil {
			return err
		}
		n = len(msgs)
		if _, err := s.outbox.QueueStage(sctx, b, opts, msgs...); err != nil {
			return err
		}
		return nil
	})
	if span != nil {
		endStage(span, n, err)
	}
	if err != nil {
		return res, err
	}
	s.outbox.Notify()
	return res, nil
}

// AppendTx implements aggregate.Stager. Under Transactional the messages are staged on tx; the caller's commit
// makes both visible (call the outbox's Notify after committing for low latency). Under EventuallyConsistent and
// Deferred the repository never sees the commit, so staging is left to the Reconciler or the DeferredStager.
func (s *Stager) AppendTx(ctx context.Context, tx pgx.Tx, store eventstore.TransactionalStore,
	batch aggregate.Batch) (eventstore.AppendResult, error) {
	s.tagSave(ctx)
	res, err := store.AppendTx(ctx, tx, batch.Request)
	if err != nil || s.strategy != Transactional {
		return res, err
	}
	ctx, span := startStage(ctx, s.tracer, s.strategy, batch.Request)
	msgs, err := s.messagesFor(res.Records, batch.Events)
	if err == nil {
		// The IDs derive from the stream version just inserted on tx: no one else can have staged them.
		err = s.stage(ctx, tx, msgs, &outbox.StageOptions{NewIDs: true})
	}
	endStage(span, len(msgs), err)
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	return res, nil
}

// stage stages msgs on db, in one round trip.
func (s *Stager) stage(ctx context.Context, db outbox.DB, msgs []outbox.Message, opts *outbox.StageOptions) error {
	if len(msgs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	if _, err := s.outbox.QueueStage(ctx, b, opts, msgs...); err != nil {
		return err
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("staging: stage %d message(s): %w", len(msgs), err)
	}
	return nil
}

// stageAfterCommit stages in a transaction of its own on the outbox's database, in one round trip (the statements
// run as one implicit transaction), and returns how many messages it staged.
//
// The transaction first locks the reconciler's watermark until the commit. Messages of events the reconciler has
// already passed are left out: the reconciler staged them, and their outbox entries may be cleaned up by now, so
// staging them again could publish them twice. For the others, the lock keeps the reconciler (and so cleanup) from
// passing them before this transaction commits.
//
// The commit does not wait for the WAL flush (outbox.StageOptions.AsyncCommit): the events are durable already,
// and a staging that a crash of the database server loses is staged again by the reconciler, whose watermark on
// disk is then still below those events (its advance past them, a durable commit, would have flushed this one
// first). A save pays for one flush, the append's.
func (s *Stager) stageAfterCommit(ctx context.Context, recs []eventstore.Record, events []any) (int, error) {
	msgs, err := s.messagesFor(recs, events)
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	b := &pgx.Batch{}
	staged, err := s.outbox.QueueStage(ctx, b, &outbox.StageOptions{EndsTransaction: true, Watermark: s.reconciler,
		AsyncCommit: true}, msgs...)
	if err != nil {
		return 0, err
	}
	if err := s.outbox.Pool().SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("staging: stage %d message(s) after the append: %w", len(msgs), err)
	}
	s.outbox.Notify()
	return staged.Count(), nil
}

// messagesFor derives the messages of recs. events are the decoded values aligned with recs (nil entries are
// decoded when a typed mapping needs them).
func (s *Stager) messagesFor(recs []eventstore.Record, events []any) ([]outbox.Message, error) {
	var out []outbox.Message
	for i, rec := range recs {
		if !s.mapping.Applies(rec.Type) {
			continue
		}
		var ev any
		if i < len(events) {
			ev = events[i]
		}
		msgs, err := s.mapping.messages(rec, ev)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}
