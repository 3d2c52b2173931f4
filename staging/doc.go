// Package staging turns the domain events a repository saves into integration messages in the outbox, with one of
// four strategies, and loses none in any of them.
//
// A Mapping derives zero or more messages (topic, stable type name, payload, partition key defaulting to the
// aggregate ID, headers, optional schedule) from each recorded event, typed (Map) or raw (MapRaw). Every derived
// message has a deterministic ID, a UUIDv5 of (tenant, stream, version, mapping name, index): whichever component
// stages an event, and however often, the outbox stores its messages once.
//
// A Stager, given to a repository as aggregate.RepositoryConfig.Stager, applies one strategy:
//
//   - Transactional: the messages are staged in the append's own transaction, after the version check; a
//     conflict or a staging error rolls both back. A save is one round trip: the append, the staging statements
//     and the commit go to the server as one batch, so the messages are derived before the insert (see "What a
//     mapping sees"). In SaveTx it stages on the caller's transaction.
//   - EventuallyConsistent: the append commits, then the messages are staged in a second transaction. A
//     Reconciler following the log stages whatever a crash between the two left out, so nothing is lost. The save
//     path skips events the reconciler has already passed (their messages may be published and cleaned up since)
//     and holds the reconciler back until its own staging commits. That staging is one round trip and commits
//     without waiting for its WAL flush (outbox.StageOptions.AsyncCommit): the save waits for one flush, the
//     append's. A crash of the database server right after it can lose the staging, never the events, and the
//     reconciler stages them again (its watermark cannot have passed them durably: that durable commit would have
//     flushed the staging first).
//   - Deferred: saves stage nothing; a DeferredStager follows the log and stages in the transaction that advances
//     its checkpoint.
//   - Auto (the default) resolves once, at construction: Transactional when the store can share a transaction
//     with the outbox, else EventuallyConsistent when an outbox is configured, else Deferred (with a warning).
//     Transactional requested explicitly without those parts fails at construction, naming what is missing.
//
// In SaveTx the repository never sees the commit: EventuallyConsistent and Deferred leave staging to their worker.
//
// The workers (DeferredStager, Reconciler) run one active instance per name across processes, on the lease shared
// with projections, stage exactly once per event (a crash rolls back both the staging and the checkpoint), report
// their lag, and keep an outbox watermark so cleanup never forgets a sent message they could stage again. A worker
// that cannot stage an event's messages (a mapping error, five times over) stops at it with a *WorkerError
// (errors.Is ErrWorkerStopped): the event is never skipped.
//
// Auto and Transactional need the event store and the outbox on one database; New asks both databases who they
// are (see Auto), so host names and addresses that differ do not matter.
//
// An event whose mapping or staging keeps failing, or whose row cannot be read, is retried (WorkerConfig.MaxAttempts,
// RetryDelay) and then handled by WorkerConfig.OnFailure: Stop (the default) stops the worker with a *WorkerError
// naming the event; Park records it in the parked list and goes on. Parked events are listed (ListParked),
// replayed by the running worker (RequestReplay, Worker.ReplayParked) or discarded (DiscardParked), also
// from the CLI (stagehand worker parked / replay / discard). ListWorkerStatus reads every worker's state, lag, last
// error, failing event and parked count from the database without building a worker, for monitoring processes,
// health.Config.WorkerStatus and 'stagehand worker status'.
//
// # What a mapping sees
//
// A mapping receives the event's eventstore.Record. Under EventuallyConsistent and Deferred, and in SaveTx, it is
// the stored record, complete. Under Transactional (Save, Update, Create) the mapping runs before the insert, so
// the record has everything the save decides (tenant, stream, type, version, event ID, type version, payload,
// metadata, occurred-at) but not what the insert assigns: Position is 0 and RecordedAt is zero. The source
// position of each staged message (kept on its outbox row for cleanup's watermark rules) is still filled in, in
// SQL, from its event. A mapping that puts the global position or the recorded-at time into the message itself
// needs EventuallyConsistent or Deferred.
//
// # Checking mapped types against handlers
//
// A message type that a mapping produces and no handler handles is found late: its messages are dead-lettered by
// the consumer's outbox.Handlers with outbox.ErrUnknownMessageType. A mapping can declare what it produces with the
// MessageTypes option of Map and MapRaw (the declaration is enforced: a message of another type fails its staging),
// and a service that consumes its own messages calls CheckHandled(mapping, handlers...) at start: it returns an
// *UnhandledError listing the declared types no handler handles and the mappings that declare nothing, with the
// types handled but never mapped for information. Mapping.MessageTypes and outbox.Handlers.Types expose each side.
//
// # Telemetry
//
// Staging is traced as stagehand.stage spans (strategy, aggregate, events, messages, error recorded). On save
// (Transactional, EventuallyConsistent) the span is a child of the repository's stagehand.save span, which the
// Stager tags with its strategy. The DeferredStager and the Reconciler read events from the log later: they
// start one stage span per save found in a batch, whose parent is the trace context recorded in the events'
// metadata, so the save's trace goes on. Every message derived from an event carries the event's traceparent and
// tracestate in its metadata (a traceparent the mapping sets in Message.Headers wins), which the relay and the
// consumer continue. Config.TracerProvider and WorkerConfig.TracerProvider inject the provider (nil: the global
// one). Staged messages are counted once, by the outbox (stagehand.messages.staged, outbox.Config.MeterProvider).
//
// # Ordering
//
// Messages sharing a partition key are published in staging-commit order. Under Transactional and Deferred that
// is the order of the events. Under EventuallyConsistent a crash between an append and its staging lets a later
// event's message overtake the one the reconciler restores, and so can a save of the same aggregate that commits
// and stages while the previous save's staging is still in flight; use Transactional when per-aggregate order
// must hold exactly.
package staging
