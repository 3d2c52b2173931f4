package staging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/outbox"
)

// WorkerConfig configures a DeferredStager or a Reconciler. A nil *WorkerConfig uses the defaults.
type WorkerConfig struct {
	// Name distinguishes workers of one kind (one per mapping, say). Default "default". The worker's checkpoint
	// and lease are named "stager:NAME" or "reconciler:NAME", and so is its outbox watermark.
	Name string
	// Schema holding the checkpoint and lease tables. Default: the outbox's schema.
	Schema string
	// BatchSize is the most log positions read and staged per transaction. Default 1000; 1 to 10000.
	BatchSize int
	// PollInterval is how often the log is polled when no wake-up arrives. Default 1s.
	PollInterval time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups (polling only): needed when the event store's pool goes
	// through a pooler in transaction pooling mode, where Run otherwise fails with stagehand.ErrPooledConnection.
	// Default false.
	DisableListen bool
	// LeaseTTL is how long a dead worker blocks its successor: one instance per name runs at a time across
	// processes. Default 5s (a successor takes over about 5-6s after a crash).
	LeaseTTL time.Duration
	// Owner names this process in the lease table. Default: host name and process ID.
	Owner string
	// OnFailure is what the worker does with an event whose mapping or staging keeps failing, or that cannot be
	// read: Stop (the default) or Park. Events that fail are retried MaxAttempts times first, RetryDelay apart
	// (doubling up to MaxRetryDelay); an event that cannot be read, or that the registry cannot decode, is given up on
	// at once. Errors of the database connection are retried without counting.
	OnFailure FailureMode
	// MaxAttempts is how many times an event is tried before OnFailure applies. Default 5; at least 1.
	MaxAttempts int
	// RetryDelay is the wait after the first failure. Default 100ms. MaxRetryDelay caps the doubling. Default
	// 30s; at least RetryDelay.
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
	// TracerProvider creates the worker's stagehand.stage spans, each the child of the trace context recorded in
	// the metadata of the events it stages (the save's span). Default nil: the global provider.
	TracerProvider trace.TracerProvider
}

// Worker follows the global log and stages the messages of the mapped events it reads, in the transaction that
// advances its checkpoint, so each event's messages are staged exactly once by it: a crash rolls back both, a
// zombie instance's commit is refused. One instance per name is active across processes (a shared lease); others
// wait as standbys and take over when it stops or dies.
//
// It starts from the beginning of the log the first time it runs. Staging an event whose messages are already in
// the outbox, or still in the sent ledger, inserts nothing (deterministic message IDs), so overlap with the save
// path costs no duplicate. Its outbox watermark, registered when Run starts, keeps cleanup (Admin.CleanupSent) from
// removing the ledger entries it could still stage again; entries removed before its first run are not protected,
// so start a new worker before cleanup runs, or expect the messages of events whose entries are gone to be
// published again.
type Worker struct {
	kind      string
	name      string
	schema    string
	store     eventstore.Store
	poll      time.Duration
	follower  *logfollow.Follower
	outbox    *outbox.Outbox
	mapping   *Mapping
	watermark string
	logger    *slog.Logger
	tracer    trace.Tracer
	strategy  Strategy // the strategy the worker stages for, as a span attribute
}

// NewDeferredStager returns the worker that stages for repositories using the Deferred strategy. It reads the
// events of store and stages through o, on o's database.
func NewDeferredStager(store eventstore.Store, o *outbox.Outbox, m *Mapping, cfg *WorkerConfig) (*Worker, error) {
	return newWorker("stager", store, o, m, cfg)
}

// NewReconciler returns the worker that makes EventuallyConsistent lose nothing: it stages whatever a crash
// between an append and its staging left out. Run it wherever repositories use EventuallyConsistent.
func NewReconciler(store eventstore.Store, o *outbox.Outbox, m *Mapping, cfg *WorkerConfig) (*Worker, error) {
	return newWorker("reconciler", store, o, m, cfg)
}

func newWorker(kind string, store eventstore.Store, o *outbox.Outbox, m *Mapping, cfg *WorkerConfig) (
	*Worker, error) {
	var c WorkerConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case store == nil:
		return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: "store",
			Reason: "(the event store) must not be nil"}
	case o == nil:
		return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: "outbox",
			Reason: "must not be nil"}
	case m == nil:
		return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: "mapping",
			Reason: "must not be nil"}
	}
	if err := m.Err(); err != nil {
		return nil, err
	}
	if c.Name != "" {
		if reason := names.Identifier(c.Name) + names.Text(c.Name); reason != "" {
			return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: "Name", Reason: reason}
		}
	}
	if c.Schema == "" {
		c.Schema = o.Schema()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	types := m.EventTypes()
	if len(types) == 0 {
		return nil, fmt.Errorf("%w: %s %q: the mapping maps no event type", ErrInvalidConfig, kind, workerName(kind,
			c.Name))
	}
	if c.OnFailure != Stop && c.OnFailure != Park {
		return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: "OnFailure",
			Reason: fmt.Sprintf("must be Stop or Park, not %d", int(c.OnFailure))}
	}
	w := &Worker{kind: kind, name: workerName(kind, c.Name), schema: c.Schema, store: store,
		poll: c.PollInterval, outbox: o, mapping: m, logger: c.Logger,
		tracer: telemetry.Tracer(c.TracerProvider), strategy: Deferred}
	if kind == "reconciler" {
		w.strategy = EventuallyConsistent
	}
	w.watermark = w.name
	f, err := logfollow.New(o.Pool(), store, w.handle, &logfollow.Config{
		Name:          w.name,
		Kind:          kind,
		Schema:        c.Schema,
		EventTypes:    types,
		BatchSize:     c.BatchSize,
		PollInterval:  c.PollInterval,
		DisableListen: c.DisableListen,
		LeaseTTL:      c.LeaseTTL,
		Owner:         c.Owner,
		Logger:        c.Logger,
		AfterCommit:   o.Notify,
		MaxAttempts:   c.MaxAttempts, RetryDelay: c.RetryDelay, MaxRetryDelay: c.MaxRetryDelay,
		OnExhausted: w.onExhausted(c.OnFailure),
	})
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return nil, &ConfigError{Package: "staging", Component: workerName(kind, c.Name), Field: ce.Field,
				Reason: ce.Reason, Err: ce.Err}
		}
		return nil, fmt.Errorf("staging: %s %q: %w", kind, c.Name, err)
	}
	w.follower = f
	return w, nil
}

// workerName is the checkpoint, lease and watermark name of a worker.
func workerName(kind, name string) string {
	if strings.TrimSpace(name) == "" {
		name = "default"
	}
	return kind + ":" + name
}

// Name returns the worker's checkpoint, lease and watermark name ("stager:NAME" or "reconciler:NAME").
func (w *Worker) Name() string { return w.name }

// Run follows the log until ctx ends. It registers the worker's outbox watermark first, so outbox cleanup keeps
// the IDs of sent messages the worker could still stage again. It stops early with a *WorkerError when staging
// one event's messages failed five times (or failed for good at once, as a mapping error does): the event is
// never skipped, so the worker stops at it.
func (w *Worker) Run(ctx context.Context) error {
	lag, err := w.follower.Lag(ctx)
	if err != nil {
		return fmt.Errorf("staging: %s: %w", w.name, err)
	}
	if err := w.outbox.RegisterWatermarkTx(ctx, w.outbox.Pool(), w.watermark, lag.Position); err != nil {
		return fmt.Errorf("staging: %s: %w", w.name, err)
	}
	stopReplay := logfollow.Every(ctx, w.pollInterval(), w.replayRequested)
	err = w.follower.Run(ctx)
	stopReplay()
	return workerError(w.name, err)
}

func (w *Worker) pollInterval() time.Duration {
	if w.poll > 0 {
		return w.poll
	}
	return time.Second
}

// ErrWorkerStopped matches every *WorkerError.
var ErrWorkerStopped = errors.New("staging: worker stopped at an event it could not stage")

// WorkerError is returned by Worker.Run when the messages of one event could not be staged: it matches
// errors.Is(err, ErrWorkerStopped) and unwraps to the last error (a mapping's, say: ErrInvalidMessage).
type WorkerError struct {
	// Worker is the worker's name ("stager:NAME" or "reconciler:NAME").
	Worker string
	// Record is the event whose messages failed, Attempts how many times it was tried, Err the last error.
	Record   eventstore.Record
	Attempts int
	Err      error
}

func (e *WorkerError) Error() string {
	return fmt.Sprintf("staging: %s stopped: event %q at position %d (stream %q version %d, tenant %q) failed "+
		"%d times: %v", e.Worker, e.Record.Type, e.Record.Position, e.Record.StreamID, e.Record.Version,
		e.Record.Tenant, e.Attempts, e.Err)
}

// Is matches ErrWorkerStopped.
func (e *WorkerError) Is(target error) bool { return target == ErrWorkerStopped }

// Unwrap returns the last error.
func (e *WorkerError) Unwrap() error { return e.Err }

// Wake makes the worker read the log now (for event stores without notifications, such as the in-memory one).
func (w *Worker) Wake() { w.follower.Wake() }

// Lag is how far a worker is behind the head of the log.
type Lag struct {
	// Position is the worker's checkpoint and Head the highest committed position.
	Position, Head int64
	// Events is Head - Position (an upper bound on the events left: filtered-out events count too).
	Events int64
	// Time is how long the oldest event still ahead has been waiting.
	Time time.Duration
}

// Lag reads the worker's checkpoint and measures how far behind the head it is.
func (w *Worker) Lag(ctx context.Context) (Lag, error) {
	l, err := w.follower.Lag(ctx)
	if err != nil {
		return Lag{}, err
	}
	return Lag{Position: l.Position, Head: l.Head, Events: l.Events, Time: l.Time}, nil
}

func (w *Worker) handle(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
	return w.stage(ctx, tx, recs, true)
}

// stage maps recs and stages their messages on tx; advance moves the worker's watermark to the last of them (not
// for a replayed parked event, which lies behind it).
func (w *Worker) stage(ctx context.Context, tx pgx.Tx, recs []eventstore.Record, advance bool) (err error) {
	stages := w.startStages(ctx, recs)
	defer func() { stages.end(err) }()
	var msgs []outbox.Message
	for _, rec := range recs {
		m, err := w.mapping.messages(rec, nil)
		if err != nil {
			return err
		}
		stages.counted(rec, len(m))
		msgs = append(msgs, m...)
	}
	// Messages of traced events carry their event's trace context already; the others take the span of the
	// untraced events.
	ctx = stages.untraced(ctx)
	// The watermark first, then the keys StageTx locks: the save path of EventuallyConsistent locks in the same
	// order (watermark FOR SHARE, then keys), so the two never deadlock. Both commit together.
	if len(recs) > 0 && advance {
		if _, err := w.outbox.AdvanceWatermarkTx(ctx, tx, w.watermark, recs[len(recs)-1].Position); err != nil {
			return err
		}
	}
	if _, err := w.outbox.StageTx(ctx, tx, msgs...); err != nil {
		return err
	}
	return nil
}
