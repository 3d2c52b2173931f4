// Package aggregate models event-sourced aggregates and stores them through an eventstore.Store.
//
// An aggregate is a Go type that embeds Root and implements Apply. Command methods check invariants and call Raise
// with a domain event; Raise records the event and applies it. A Repository loads an aggregate by replaying its
// stream (from its latest snapshot when enabled) and saves its changes with optimistic concurrency: a concurrent
// writer makes Save fail with an error matching eventstore.ErrConcurrencyConflict and nothing is stored.
//
// Everything stored is named by stable names held in a Registry (a value, never a global): renaming a Go type never
// makes history unreadable, and upcasters turn old versions of an event into the current type on load.
//
// Per-event metadata (event ID as UUIDv7, occurred-at in UTC, correlation and causation IDs, tenant and user
// key/values) comes from the context.Context given to Save: see stagehand.WithTenant, stagehand.WithCorrelationID,
// stagehand.WithCausationID and stagehand.WithMetadata, and WithEventMetadata for a single event.
//
// # Snapshots
//
// With RepositoryConfig.SnapshotEvery set and an aggregate implementing Snapshotter, a save that crosses a multiple
// of SnapshotEvery stores a snapshot of the saved state. A snapshot never describes a version that did not commit:
// Save, Update and Create write it after their append has committed, and SaveTx writes it on the caller's
// transaction (eventstore.TransactionalStore.SaveSnapshotTx), so it commits or rolls back with the events. Load
// checks a snapshot against its stream before trusting it: one whose version has no event (ahead of the stream,
// however it got there) or that is older than the event at its version is ignored with a warning and the stream is
// replayed. DropSnapshot (and the CLI's "stagehand snapshots drop") deletes an aggregate's snapshot.
//
// # Creating, updating, and either
//
// Create builds a new aggregate, runs a command on it and saves it expecting no stream; Update loads one, runs a
// command and saves, retrying on a concurrency conflict; Upsert does whichever applies, running the command on the
// stored aggregate or on a new one (Version 0). Update of an aggregate with no events returns an error matching
// ErrNotFound (the command does not run). Create, or Save of an aggregate from New, whose stream already exists
// returns an *AlreadyExistsError: it matches ErrAlreadyExists and, since it is a failed optimistic-concurrency
// check, eventstore.ErrConcurrencyConflict too. Create does not retry it; Upsert does, like any conflict: when two
// writers create the same aggregate at once, the loser reloads the winner's aggregate and applies its command to
// it.
//
// # Inside a caller's transaction
//
// LoadTx and SaveTx read and write on a pgx.Tx the caller owns (an inbox handler's transaction, for instance): the
// load sees the transaction's own writes, the save's events, staged messages and snapshot commit or roll back
// together. CreateTx, UpdateTx and UpsertTx are Create, Update and Upsert on such a transaction. UpdateTx and
// UpsertTx run each attempt under a savepoint, so a conflict is retried without undoing the caller's other writes.
// Under READ COMMITTED (the default, and the inbox's) an UpsertTx that loses a race to create the aggregate sees the
// winner's events on its retry and applies its change to them. Under REPEATABLE READ or SERIALIZABLE the
// transaction cannot see the winner, so the conflict (an *AlreadyExistsError, or a serialization failure) is
// returned at once with the transaction still usable; a new transaction then finds the aggregate (the inbox reruns
// a handler that fails with a conflict at once, as contention).
//
// A repository takes an optional Stager (package staging implements it) that stages integration messages derived
// from the saved events in the outbox, with one of four strategies.
//
// # Telemetry
//
// Every Save, SaveTx, Create, CreateTx, Update, UpdateTx, Upsert and UpsertTx with changes is one OpenTelemetry span, stagehand.save (aggregate type and
// ID, tenant, event count, the staging strategy, and for the updates and upserts the attempts they took), covering the append and the
// staging, with its error recorded. Its span context is written into each saved event's metadata (traceparent,
// tracestate, unless set explicitly), so whoever stages the events, even later from the log, continues the trace
// up to the consumer's handler. The counter stagehand.events.appended counts appended events by aggregate type.
// RepositoryConfig.TracerProvider and MeterProvider inject the providers; nil means the global ones, which record
// nothing until the application installs an SDK.
//
// Package aggregatetest has given/when/then helpers to test an aggregate's decisions without a database; they
// round-trip every given and raised event through the registry, so an event a save and a load would change fails
// the test.
package aggregate
