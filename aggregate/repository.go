package aggregate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// Batch is what a repository hands a Stager on save: the append request and the domain events it encodes.
type Batch struct {
	// Request is the append, ready for the store.
	Request eventstore.AppendRequest
	// Events are the raised domain event values, aligned with Request.Events.
	Events []any
}

// Stager combines a repository's appends with staging integration messages (package staging implements it). A
// repository without a Stager only appends.
type Stager interface {
	// Append appends batch to store and stages the messages derived from it, as the stager's strategy decides.
	Append(ctx context.Context, store eventstore.Store, batch Batch) (eventstore.AppendResult, error)
	// AppendTx appends batch on the caller's transaction. The repository never sees the commit, so a strategy that
	// stages after commit leaves staging to its background worker.
	AppendTx(ctx context.Context, tx pgx.Tx, store eventstore.TransactionalStore, batch Batch) (
		eventstore.AppendResult, error)
}

// Snapshotter is implemented by aggregates whose state can be snapshotted. The repository stores the bytes with a
// schema version; a snapshot of another schema version is ignored on load (full replay instead).
type Snapshotter interface {
	MarshalSnapshot() ([]byte, error)
	UnmarshalSnapshot(data []byte) error
}

// RepositoryConfig configures a Repository. A nil *RepositoryConfig uses the defaults.
type RepositoryConfig struct {
	// Stager stages integration messages on save. Default nil: events are appended, nothing is staged.
	Stager Stager
	// SnapshotEvery takes a snapshot after a save that crosses a multiple of this many events, when the
	// aggregate implements Snapshotter. Default 0: no snapshots. Must not be negative.
	SnapshotEvery int
	// SnapshotSchemaVersion is the version of the aggregate's snapshot encoding; bump it when the state's shape
	// changes so stale snapshots are ignored. Default 1.
	SnapshotSchemaVersion int
	// UpdateRetries is how many times Update, Upsert, UpdateTx and UpsertTx retry after a concurrency conflict (so
	// 3 means up to 4 attempts). Default 3; -1 means no retries.
	UpdateRetries int
	// Clock stamps each event's occurred-at. Default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics (a failed snapshot write, for instance). Default: silent.
	Logger *slog.Logger
	// TracerProvider creates the stagehand.save span of every save (Save, Create, Update, Upsert and their Tx
	// twins). Default nil: the global provider (otel.GetTracerProvider), which records nothing until the
	// application installs an SDK.
	TracerProvider trace.TracerProvider
	// MeterProvider creates the stagehand.events.appended counter. Default nil: the global provider.
	MeterProvider metric.MeterProvider
}

// Repository loads and saves aggregates of type A. It is safe for concurrent use.
type Repository[A Aggregate] struct {
	store  eventstore.Store
	reg    *Registry
	typ    *aggregateType
	cfg    RepositoryConfig
	logger *slog.Logger
	tel    instruments
}

// NewRepository returns a repository for aggregate type A, which must be registered in reg. Invalid configuration
// or registry errors fail here, naming the field or the registration.
func NewRepository[A Aggregate](store eventstore.Store, reg *Registry, cfg *RepositoryConfig) (*Repository[A], error) {
	var c RepositoryConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case store == nil:
		return nil, &ConfigError{Package: "aggregate", Field: "store", Reason: "must not be nil"}
	case reg == nil:
		return nil, &ConfigError{Package: "aggregate", Field: "registry", Reason: "must not be nil"}
	case c.SnapshotEvery < 0:
		return nil, &ConfigError{Package: "aggregate", Field: "SnapshotEvery", Reason: fmt.Sprintf(
			"must not be negative, got %d", c.SnapshotEvery)}
	case c.SnapshotSchemaVersion < 0:
		return nil, &ConfigError{Package: "aggregate", Field: "SnapshotSchemaVersion", Reason: fmt.Sprintf(
			"must not be negative, got %d", c.SnapshotSchemaVersion)}
	case c.UpdateRetries < -1:
		return nil, &ConfigError{Package: "aggregate", Field: "UpdateRetries", Reason: fmt.Sprintf(
			"must be -1 (no retries) or more, got %d", c.UpdateRetries)}
	}
	switch c.UpdateRetries {
	case 0:
		c.UpdateRetries = 3
	case -1:
		c.UpdateRetries = 0
	}
	if err := reg.Validate(); err != nil {
		return nil, fmt.Errorf("aggregate: registry: %w", err)
	}
	typ, err := reg.aggregate(reflect.TypeFor[A]())
	if err != nil {
		return nil, err
	}
	if c.SnapshotSchemaVersion == 0 {
		c.SnapshotSchemaVersion = 1
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	logger := c.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Repository[A]{store: store, reg: reg, typ: typ, cfg: c, logger: logger,
		tel: newInstruments(c.TracerProvider, c.MeterProvider, typ.name)}, nil
}

// TypeName returns the stable name of the repository's aggregate type (its streams' type).
func (r *Repository[A]) TypeName() string { return r.typ.name }

// Store returns the event store the repository appends to.
func (r *Repository[A]) Store() eventstore.Store { return r.store }

// Registry returns the repository's registry.
func (r *Repository[A]) Registry() *Registry { return r.reg }

// New returns a new aggregate with the given ID, built by the registered constructor. Nothing is stored until
// Save.
func (r *Repository[A]) New(id string) A {
	a := r.typ.new(id).(A)
	a.base().id = id
	return a
}

// Load rebuilds the aggregate from its latest snapshot (when enabled) and the events after it, for the tenant in
// ctx. A stream with no events returns an error matching ErrNotFound. An archived stream loads from the archive
// (see eventstore.LifecycleStore); a deleted one returns an error matching ErrNotFound and
// eventstore.ErrStreamDeleted.
//
// A snapshot is trusted only when the stream's event at the snapshot's version exists and was recorded no later
// than the snapshot: a snapshot ahead of its stream (however it got there) or older than the event it claims to
// describe is ignored with a warning, and the stream is replayed from its first event.
func (r *Repository[A]) Load(ctx context.Context, id string) (A, error) {
	return r.load(ctx, r.store, id)
}

// streamReader is where a load reads: the store itself, or a caller's transaction (txReader).
type streamReader interface {
	ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) ([]eventstore.Record, error)
	LoadSnapshot(ctx context.Context, tenant, streamID string) (eventstore.Snapshot, error)
}

// txReader reads through a caller's transaction, so a load sees that transaction's own writes.
type txReader struct {
	ts eventstore.TransactionalStore
	tx pgx.Tx
}

func (t txReader) ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) (
	[]eventstore.Record, error) {
	return t.ts.ReadStreamTx(ctx, t.tx, tenant, streamID, fromVersion)
}

func (t txReader) LoadSnapshot(ctx context.Context, tenant, streamID string) (eventstore.Snapshot, error) {
	return t.ts.LoadSnapshotTx(ctx, t.tx, tenant, streamID)
}

func (r *Repository[A]) load(ctx context.Context, src streamReader, id string) (A, error) {
	var zero A
	tenant := stagehand.TenantFrom(ctx)
	a := r.New(id)
	b := a.base()
	b.tenant = tenant
	var records []eventstore.Record
	fromSnapshot := false
	if s, ok := any(a).(Snapshotter); ok && r.cfg.SnapshotEvery > 0 {
		snap, err := src.LoadSnapshot(ctx, tenant, id)
		switch {
		case err == nil && snap.SchemaVersion == r.cfg.SnapshotSchemaVersion && snap.StreamType == r.typ.name:
			// Read from the snapshot's own event, to check the snapshot against the stream.
			recs, err := src.ReadStream(ctx, tenant, id, snap.Version)
			if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
				return zero, fmt.Errorf("aggregate: load %s %q: %w", r.typ.name, id, err)
			}
			if reason := snapshotMismatch(snap, recs); reason != "" {
				r.logger.WarnContext(ctx, "stagehand: ignoring a snapshot that does not match its stream; "+
					"replaying the stream", "aggregate", r.typ.name, "id", id, "version", snap.Version,
					"reason", reason)
			} else if err := s.UnmarshalSnapshot(snap.Payload); err != nil {
				r.logger.WarnContext(ctx, "stagehand: ignoring undecodable snapshot; replaying the stream",
					"aggregate", r.typ.name, "id", id, "version", snap.Version, "error", err)
				a = r.New(id)
				b = a.base()
				b.tenant = tenant
			} else {
				b.version, b.persisted = snap.Version, snap.Version
				records, fromSnapshot = recs[1:], true
			}
		case err != nil && !errors.Is(err, eventstore.ErrSnapshotNotFound):
			return zero, fmt.Errorf("aggregate: load snapshot of %s %q: %w", r.typ.name, id, err)
		}
	}
	if !fromSnapshot {
		var err error
		records, err = src.ReadStream(ctx, tenant, id, 1)
		if errors.Is(err, eventstore.ErrStreamDeleted) {
			// Also eventstore.ErrStreamNotFound; the store's error says when it was deleted.
			return zero, fmt.Errorf("%w: %s %q (tenant %q): %w", ErrNotFound, r.typ.name, id, tenant, err)
		}
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return zero, fmt.Errorf("%w: %s %q (tenant %q) (%w)", ErrNotFound, r.typ.name, id, tenant,
				eventstore.ErrStreamNotFound)
		}
		if err != nil {
			return zero, fmt.Errorf("aggregate: load %s %q: %w", r.typ.name, id, err)
		}
	}
	for _, rec := range records {
		if rec.StreamType != r.typ.name {
			return zero, fmt.Errorf("%w: stream %q is a %q, not a %q", ErrWrongType, id, rec.StreamType, r.typ.name)
		}
		ev, err := r.reg.Decode(rec)
		if err != nil {
			return zero, err
		}
		Replay(a, ev)
		if b.persisted != rec.Version {
			return zero, fmt.Errorf("aggregate: stream %q of %s has version %d where %d was expected", id,
				r.typ.name, rec.Version, b.persisted)
		}
	}
	return a, nil
}

// snapshotMismatch says why snap cannot describe the stream whose events from snap.Version on are recs, or "".
// A snapshot is written in the transaction that appends the event at its version (or after that commits), never
// before that transaction started; so one whose event is missing, or older than its event, describes a history the
// stream does not have (a snapshot planted by hand, or written by a save that never committed).
func snapshotMismatch(snap eventstore.Snapshot, recs []eventstore.Record) string {
	if len(recs) == 0 || recs[0].Version != snap.Version {
		return fmt.Sprintf("the stream has no event at the snapshot's version %d", snap.Version)
	}
	if !snap.CreatedAt.IsZero() && snap.CreatedAt.Before(recs[0].RecordedAt) {
		return fmt.Sprintf("the snapshot (taken %s) is older than the event at its version %d (recorded %s)",
			snap.CreatedAt.Format(time.RFC3339Nano), snap.Version, recs[0].RecordedAt.Format(time.RFC3339Nano))
	}
	return ""
}

// LoadTx is Load on the caller's transaction: it reads the snapshot and the events through tx, so it sees what
// tx has appended, and rows tx has read stay consistent with what it later writes as far as tx's isolation level
// promises. The store must be an eventstore.TransactionalStore.
func (r *Repository[A]) LoadTx(ctx context.Context, tx pgx.Tx, id string) (A, error) {
	ts, ok := r.store.(eventstore.TransactionalStore)
	if !ok {
		var zero A
		return zero, fmt.Errorf("%w: %T", ErrNotTransactional, r.store)
	}
	return r.load(ctx, txReader{ts: ts, tx: tx}, id)
}

// DropSnapshot deletes the snapshot of the aggregate with the given ID, for the tenant in ctx: the next Load
// replays its stream from the first event, and the next save that crosses a multiple of SnapshotEvery writes a
// fresh one. Use it after fixing a snapshot encoding bug, or to clear a snapshot an operator does not trust. An
// aggregate without a snapshot returns an error matching eventstore.ErrSnapshotNotFound.
func (r *Repository[A]) DropSnapshot(ctx context.Context, id string) error {
	if err := r.store.DeleteSnapshot(ctx, stagehand.TenantFrom(ctx), id); err != nil {
		return fmt.Errorf("aggregate: drop snapshot of %s %q: %w", r.typ.name, id, err)
	}
	return nil
}

// Save appends the aggregate's changes (through the Stager when configured) with its stored version as the
// expected version, for the tenant in ctx. A concurrent change returns an error matching
// eventstore.ErrConcurrencyConflict and stores nothing; reload and retry (or use Update). A new aggregate (from
// New, never saved) whose stream already exists returns an *AlreadyExistsError (ErrAlreadyExists, which also
// matches eventstore.ErrConcurrencyConflict). Saving an aggregate without changes does nothing. A save to an
// archived or deleted stream stores nothing and returns an error matching eventstore.ErrStreamArchived (an
// *eventstore.StreamArchivedError) or eventstore.ErrStreamDeleted, never a conflict: Update does not retry it.
//
// A save with changes is traced as one stagehand.save span (append and staging), whose span context is written
// into the metadata of the saved events (traceparent, tracestate) so staging done later continues the trace.
func (r *Repository[A]) Save(ctx context.Context, a A) error {
	if len(a.base().pending) == 0 {
		return nil
	}
	ctx, span := r.tel.startSave(ctx, a.base().id)
	n, err := r.save(ctx, a)
	endSave(span, n, err)
	return err
}

// save is Save inside its span; it returns how many events it tried to append.
func (r *Repository[A]) save(ctx context.Context, a A) (int, error) {
	batch, err := r.batch(ctx, a)
	if err != nil || batch == nil {
		return 0, err
	}
	var res eventstore.AppendResult
	if r.cfg.Stager != nil {
		res, err = r.cfg.Stager.Append(ctx, r.store, *batch)
	} else {
		res, err = r.store.Append(ctx, batch.Request)
	}
	n := len(batch.Request.Events)
	if err != nil {
		return n, r.saveError(ctx, a, err)
	}
	r.tel.appendedEvents(ctx, n)
	// The append has committed: a snapshot of this version describes committed state.
	r.saved(ctx, a, res, func(snap eventstore.Snapshot) error { return r.store.SaveSnapshot(ctx, snap) })
	return n, nil
}

// SaveTx is Save on the caller's transaction: the caller commits or rolls back. The store must be an
// eventstore.TransactionalStore. Under the Transactional strategy messages are staged on tx; strategies that stage
// after commit leave it to their background worker (the repository never sees the commit). A snapshot taken by the
// save is written on tx too, so it never outlives a rollback. If the caller rolls back, reload the aggregate before
// using it again. Its events count as appended (stagehand.events.appended)
// when they are appended on tx, whether or not the caller commits.
func (r *Repository[A]) SaveTx(ctx context.Context, tx pgx.Tx, a A) error {
	if len(a.base().pending) == 0 {
		return nil
	}
	ctx, span := r.tel.startSave(ctx, a.base().id)
	n, err := r.saveTx(ctx, tx, a)
	endSave(span, n, err)
	return err
}

func (r *Repository[A]) saveTx(ctx context.Context, tx pgx.Tx, a A) (int, error) {
	ts, ok := r.store.(eventstore.TransactionalStore)
	if !ok {
		return 0, fmt.Errorf("%w: %T", ErrNotTransactional, r.store)
	}
	batch, err := r.batch(ctx, a)
	if err != nil || batch == nil {
		return 0, err
	}
	var res eventstore.AppendResult
	if r.cfg.Stager != nil {
		res, err = r.cfg.Stager.AppendTx(ctx, tx, ts, *batch)
	} else {
		res, err = ts.AppendTx(ctx, tx, batch.Request)
	}
	n := len(batch.Request.Events)
	if err != nil {
		return n, r.saveError(ctx, a, err)
	}
	r.tel.appendedEvents(ctx, n)
	// The snapshot goes on tx, so it commits or rolls back with the events it describes.
	r.saved(ctx, a, res, func(snap eventstore.Snapshot) error { return ts.SaveSnapshotTx(ctx, tx, snap) })
	return n, nil
}

// Update loads the aggregate, runs fn on it and saves it, retrying the whole sequence after a concurrency conflict
// up to UpdateRetries times (a serialization failure or deadlock of the save, under REPEATABLE READ or
// SERIALIZABLE, is one). An aggregate with no stored events returns an error matching ErrNotFound without calling
// fn (Upsert creates it instead). An append whose commit outcome is unknown (eventstore.ErrCommitUnknown: the
// connection was lost during its commit and the store could not find out) is never retried: it is returned, and
// the caller reloads to see whether it was stored. An error from fn is returned as is and nothing is saved. The
// whole sequence, retries included, is one stagehand.save span (with the number of attempts).
func (r *Repository[A]) Update(ctx context.Context, id string, fn func(A) error) (A, error) {
	return r.updateSpan(ctx, id, fn, false)
}

// Upsert is Update that creates the aggregate when it has no stored events: fn runs on the loaded aggregate, or
// on a new one from New (Version 0) when there is none, and the result is saved. fn decides what to raise in
// either case; if it raises nothing for a new aggregate, nothing is stored and the aggregate stays absent.
//
// When two writers create the same aggregate at once, one wins and the other's save finds the stream existing:
// that is a concurrency conflict, so the loser reloads, now finds the winner's aggregate, and runs fn again on
// it (its change applies to the winner's state). Retries, errors and the span are as for Update.
func (r *Repository[A]) Upsert(ctx context.Context, id string, fn func(A) error) (A, error) {
	return r.updateSpan(ctx, id, fn, true)
}

func (r *Repository[A]) updateSpan(ctx context.Context, id string, fn func(A) error, create bool) (A, error) {
	ctx, span := r.tel.startSave(ctx, id)
	attempts, events := 0, 0
	a, err := r.update(ctx, id, fn, create, &attempts, &events)
	span.SetAttributes(telemetry.AttrAttempts.Int(attempts))
	endSave(span, events, err)
	return a, err
}

func (r *Repository[A]) update(ctx context.Context, id string, fn func(A) error, create bool, attempts,
	events *int) (A, error) {
	for attempt := 0; ; attempt++ {
		*attempts = attempt + 1
		a, err := r.Load(ctx, id)
		if create && errors.Is(err, ErrNotFound) {
			a, err = r.New(id), nil
		}
		if err != nil {
			return a, err
		}
		if err := fn(a); err != nil {
			return a, err
		}
		*events, err = r.save(ctx, a)
		if err == nil {
			return a, nil
		}
		if !errors.Is(err, eventstore.ErrConcurrencyConflict) || attempt >= r.cfg.UpdateRetries {
			return a, r.gaveUp(id, attempt, err)
		}
		if err := conflictPause(ctx, attempt); err != nil {
			return a, err
		}
	}
}

// gaveUp is the error an update returns after attempt (counted from 0) failed with err.
func (r *Repository[A]) gaveUp(id string, attempt int, err error) error {
	if err == nil || attempt == 0 {
		return err
	}
	return fmt.Errorf("aggregate: update of %s %q gave up after %d attempts: %w", r.typ.name, id, attempt+1, err)
}

// conflictPause waits before an update's next attempt after a concurrency conflict: a little, with jitter growing
// with the attempt, so retrying writers spread out.
func conflictPause(ctx context.Context, attempt int) error {
	trace.SpanFromContext(ctx).AddEvent("concurrency conflict: retrying")
	pause := time.Duration(rand.Int64N(int64(time.Millisecond)*int64(attempt+1))) + 100*time.Microsecond
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pause):
		return nil
	}
}

// UpdateTx is Update inside the caller's transaction tx (an inbox handler's, for instance): it loads the aggregate
// through tx, runs fn and saves on tx, each attempt under its own savepoint. After a concurrency conflict it rolls
// back to the savepoint (undoing only that attempt: the caller's earlier writes on tx stay) and retries, up to
// UpdateRetries times, so a conflict is not the caller's problem. The caller commits or rolls back tx. An
// aggregate with no stored events (as tx sees it) returns an error matching ErrNotFound without calling fn, and
// leaves tx usable (UpsertTx creates it instead).
//
// Retrying inside the transaction works under READ COMMITTED (the default, and the inbox's), where each attempt's
// load sees what concurrent writers have committed meanwhile. Under REPEATABLE READ or SERIALIZABLE the
// transaction's snapshot is fixed, so a retry cannot see the winner's events: the conflict is returned at once,
// and the caller retries with a new transaction (the inbox does, promptly and without counting an attempt). An
// error from fn is returned as is, with that attempt's writes rolled back. The store must be an
// eventstore.TransactionalStore.
func (r *Repository[A]) UpdateTx(ctx context.Context, tx pgx.Tx, id string, fn func(A) error) (A, error) {
	return r.updateTxSpan(ctx, tx, id, fn, false)
}

// UpsertTx is UpdateTx that creates the aggregate when tx sees no stored events for it: fn runs on the loaded
// aggregate, or on a new one from New (Version 0), and the result is saved on tx; if fn raises nothing for a new
// aggregate, nothing is stored. It is the call for a handler that must create an aggregate when absent and change
// it otherwise.
//
// When two transactions create the same aggregate at once, the first to commit wins; the other's append waits for
// that commit and then finds the stream existing. Under READ COMMITTED (the default, and the inbox's) UpsertTx
// rolls back to its savepoint, reloads through tx, which now sees the winner's events, and runs fn again on the
// winner's aggregate: its change applies on top, and the race never reaches the caller. Under REPEATABLE READ or
// SERIALIZABLE the transaction cannot see the winner, so UpsertTx returns at once an error matching
// eventstore.ErrConcurrencyConflict (an *AlreadyExistsError when the store reported the existing stream, matching
// ErrAlreadyExists too; a serialization failure otherwise), with tx still usable; the caller retries in a new
// transaction, which finds the aggregate and updates it (the inbox does so by itself, as contention).
func (r *Repository[A]) UpsertTx(ctx context.Context, tx pgx.Tx, id string, fn func(A) error) (A, error) {
	return r.updateTxSpan(ctx, tx, id, fn, true)
}

func (r *Repository[A]) updateTxSpan(ctx context.Context, tx pgx.Tx, id string, fn func(A) error, create bool) (
	A, error) {
	ctx, span := r.tel.startSave(ctx, id)
	attempts, events := 0, 0
	a, err := r.updateTx(ctx, tx, id, fn, create, &attempts, &events)
	span.SetAttributes(telemetry.AttrAttempts.Int(attempts))
	endSave(span, events, err)
	return a, err
}

func (r *Repository[A]) updateTx(ctx context.Context, tx pgx.Tx, id string, fn func(A) error, create bool,
	attempts, events *int) (A, error) {
	if tx == nil {
		var zero A
		return zero, fmt.Errorf("aggregate: update of %s %q: nil transaction", r.typ.name, id)
	}
	for attempt := 0; ; attempt++ {
		*attempts = attempt + 1
		a, err := r.attemptTx(ctx, tx, id, fn, create, events)
		if err == nil || !errors.Is(err, eventstore.ErrConcurrencyConflict) || attempt >= r.cfg.UpdateRetries ||
			(attempt == 0 && fixedSnapshot(ctx, tx)) {
			return a, r.gaveUp(id, attempt, err)
		}
		if err := conflictPause(ctx, attempt); err != nil {
			return a, err
		}
	}
}

// fixedSnapshot reports whether tx runs at REPEATABLE READ or SERIALIZABLE, whose snapshot never shows what
// committed after it was taken: retrying a conflict inside such a transaction cannot succeed.
func fixedSnapshot(ctx context.Context, tx pgx.Tx) bool {
	var level string
	if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&level); err != nil {
		return false
	}
	return level == "repeatable read" || level == "serializable"
}

// attemptTx is one attempt of UpdateTx under a savepoint, released on success and rolled back to on failure.
func (r *Repository[A]) attemptTx(ctx context.Context, tx pgx.Tx, id string, fn func(A) error, create bool,
	events *int) (A, error) {
	var zero A
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return zero, fmt.Errorf("aggregate: update of %s %q: savepoint: %w", r.typ.name, id, err)
	}
	a, err := r.LoadTx(ctx, sp, id)
	if create && errors.Is(err, ErrNotFound) {
		a, err = r.New(id), nil
	}
	if err == nil {
		err = fn(a)
	}
	if err == nil {
		*events, err = r.saveTx(ctx, sp, a)
	}
	if err == nil {
		if err = sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
			err = fmt.Errorf("aggregate: update of %s %q: release savepoint: %w", r.typ.name, id, err)
		}
	}
	if err != nil {
		if rerr := sp.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			return a, fmt.Errorf("%w (and rolling back to the savepoint failed: %v)", err, rerr)
		}
		return a, err
	}
	return a, nil
}

// Create builds a new aggregate with New, runs fn on it and saves it (expecting no stream). If the stream already
// exists, nothing is stored and the error is an *AlreadyExistsError: it matches ErrAlreadyExists and, as the
// optimistic-concurrency check that failed, eventstore.ErrConcurrencyConflict. Create does not retry (the stream
// will not go away); use Upsert to change an existing aggregate instead. An error from fn is returned as is and
// nothing is saved.
func (r *Repository[A]) Create(ctx context.Context, id string, fn func(A) error) (A, error) {
	a := r.New(id)
	if err := fn(a); err != nil {
		return a, err
	}
	return a, r.Save(ctx, a)
}

// CreateTx is Create on the caller's transaction: it builds a new aggregate with New, runs fn on it and saves it
// on tx (SaveTx), expecting no stream. If the stream already exists (as tx's append sees it, which includes a
// stream created by a transaction that committed while the append waited for it), nothing is stored, tx stays
// usable, and the error is an *AlreadyExistsError (ErrAlreadyExists, and eventstore.ErrConcurrencyConflict). An
// error from fn is returned as is and nothing is written. The store must be an eventstore.TransactionalStore.
func (r *Repository[A]) CreateTx(ctx context.Context, tx pgx.Tx, id string, fn func(A) error) (A, error) {
	a := r.New(id)
	if err := fn(a); err != nil {
		return a, err
	}
	return a, r.SaveTx(ctx, tx, a)
}

func (r *Repository[A]) batch(ctx context.Context, a A) (*Batch, error) {
	b := a.base()
	if len(b.pending) == 0 {
		return nil, nil
	}
	if b.id == "" {
		return nil, fmt.Errorf("aggregate: cannot save a %s without an ID", r.typ.name)
	}
	tenant := stagehand.TenantFrom(ctx)
	if b.tenant != "" && b.tenant != tenant {
		return nil, fmt.Errorf("%w: %s %q was loaded for tenant %q and saved for tenant %q", ErrTenantMismatch,
			r.typ.name, b.id, b.tenant, tenant)
	}
	base := eventstore.Metadata{}
	if id := stagehand.CorrelationIDFrom(ctx); id != "" {
		base[stagehand.HeaderCorrelationID] = id
	}
	if id := stagehand.CausationIDFrom(ctx); id != "" {
		base[stagehand.HeaderCausationID] = id
	}
	// The save's span context, so staging continues the trace even when a worker stages the events later.
	// Metadata set explicitly (context or event) wins.
	telemetry.Inject(ctx, base)
	maps.Copy(base, stagehand.MetadataFrom(ctx))
	now := r.cfg.Clock()
	req := eventstore.AppendRequest{
		Tenant:     tenant,
		StreamID:   b.id,
		StreamType: r.typ.name,
		Expected:   eventstore.ExpectedVersion(b.persisted),
		Events:     make([]eventstore.EventData, len(b.pending)),
	}
	events := make([]any, len(b.pending))
	for i, p := range b.pending {
		if err := pointerEvent(p.event); err != nil {
			return nil, fmt.Errorf("aggregate: save %s %q, change %d of %d: %w", r.typ.name, b.id, i+1,
				len(b.pending), err)
		}
		name, version, payload, err := r.reg.Encode(p.event)
		if err != nil {
			return nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("aggregate: event id: %w", err)
		}
		meta := maps.Clone(base)
		maps.Copy(meta, b.pendingMetadata(i))
		if len(meta) == 0 {
			meta = nil
		}
		req.Events[i] = eventstore.EventData{EventID: id, Type: name, TypeVersion: version, Payload: payload,
			Metadata: meta, OccurredAt: now}
		events[i] = p.event
	}
	return &Batch{Request: req, Events: events}, nil
}

// saveError is the error of a failed append of a's changes. A new aggregate's append expects no stream: when that
// check fails (a version check, not a transaction conflict whose cause is unknown), the stream exists.
// pointerEvent refuses an event raised as a pointer, naming its type and the value type to raise instead.
func pointerEvent(event any) error {
	typ := reflect.TypeOf(event)
	if typ == nil || typ.Kind() != reflect.Pointer {
		return nil
	}
	return fmt.Errorf("%w: %s: raise %s values, not pointers (Load hands Apply values, so an Apply written for "+
		"one form misses the other)", ErrPointerEvent, typ, typ.Elem())
}

func (r *Repository[A]) saveError(ctx context.Context, a A, err error) error {
	var ce *eventstore.ConflictError
	if a.base().persisted == 0 && errors.As(err, &ce) && ce.Expected == eventstore.NoStream && ce.Reason == "" {
		return &AlreadyExistsError{Type: r.typ.name, ID: a.base().id, Tenant: stagehand.TenantFrom(ctx),
			Version: max(ce.Actual, 0), Err: err}
	}
	return fmt.Errorf("aggregate: save %s %q: %w", r.typ.name, a.base().id, err)
}

// saved records a successful append on a and, when the save crossed a multiple of SnapshotEvery, writes a snapshot
// with write: after the commit for Save, on the caller's transaction for SaveTx, never through another connection
// before the events commit.
func (r *Repository[A]) saved(ctx context.Context, a A, res eventstore.AppendResult,
	write func(eventstore.Snapshot) error) {
	b := a.base()
	old := b.persisted
	b.tenant = stagehand.TenantFrom(ctx)
	b.markSaved(res.Version)
	n := int64(r.cfg.SnapshotEvery)
	s, ok := any(a).(Snapshotter)
	if !ok || n <= 0 || old/n == res.Version/n {
		return
	}
	data, err := s.MarshalSnapshot()
	if err == nil {
		err = write(eventstore.Snapshot{Tenant: b.tenant, StreamID: b.id, StreamType: r.typ.name,
			Version: res.Version, SchemaVersion: r.cfg.SnapshotSchemaVersion, Payload: data})
	}
	if err != nil { // the save itself succeeded; a missing snapshot only costs a longer replay
		r.logger.WarnContext(ctx, "stagehand: snapshot not stored", "aggregate", r.typ.name, "id", b.id,
			"version", res.Version, "error", err)
	}
}
