// Package projection builds read models from the global event log: checkpointed runners with exactly-once
// application to PostgreSQL read models, a live tail, rebuilds, parking of poison events, status for operators,
// and the log as a Watermill message.Subscriber.
//
// A Projection follows the log from a checkpoint stored in PostgreSQL, filtered by event types, stream types
// and tenants, and calls a Handler for each event, in position order, in batches that share one pgx.Tx. With an
// aggregate.Registry (or a Mux, which carries one) each event arrives decoded into its current Go type, upcast
// from older versions.
//
// # Guarantees
//
//   - Exactly-once for PostgreSQL read models. The handler writes through the transaction it is given; the
//     checkpoint is advanced in that same transaction, after a fenced check that this process still holds the
//     projection's lease. A crash before the commit loses the writes and the advance together; a zombie process
//     (paused, partitioned, slow to notice that its lease was taken over) is refused at commit. So every event is
//     applied once: never skipped, never twice.
//   - At-least-once for everything else. Effects outside the transaction (HTTP calls, messages, another
//     database) can be repeated after a crash, a retry or a takeover. Make them idempotent, or stage messages in
//     the outbox inside the transaction.
//   - No event is skipped. The log is gap-safe (eventstore.Store.ReadLog never passes a position an in-flight
//     transaction may still commit, whatever order concurrent appends commit or abort in). A failing event is
//     retried with backoff; after MaxAttempts the projection either stops (Stop, the default) with the
//     checkpoint just before it, or parks it (Park) in the transaction that moves past it. Undecodable events
//     count as failed at once. Only an explicit DiscardParked drops an event.
//   - Order. Events are applied in global position order, so each stream's events in version order. In
//     partitioned mode (Config.Partitions) each stream belongs to one worker (a hash of tenant and stream ID), so
//     per-stream order holds while streams in different partitions progress independently; there is no order
//     across partitions. A parked event is applied, if replayed, after the events that followed it.
//   - One active instance. Each projection (each partition) runs in at most one process at a time, through the
//     shared lease mechanism (package internal/lease): other processes wait as standbys and take over when the
//     holder stops (at once, the lease is released) or dies (after LeaseTTL). The partitions of a partitioned
//     projection are spread over the processes running it, each leading at most ceil(Partitions / processes);
//     a process that joins gets its share handed over by the others.
//   - Stalls only on event writers. A reader waits only for transactions that may still commit a missing
//     position (those holding a write lock on the events table); a long unrelated transaction does not delay
//     the live tail, unlike ordering by transaction ID.
//
// # Live tail
//
// After catching up, a projection waits for a wake-up: the PostgreSQL store sends a NOTIFY after each append
// commits (never inside the append's transaction), the projection LISTENs on a dedicated connection that
// reconnects by itself after a dropped connection or a database restart (and reads once after every reconnect),
// and it polls every PollInterval in case a notification is lost. The in-memory store sends no notifications:
// the projection polls, or call Wake.
//
// # Rebuild
//
// Rebuild (or RequestRebuild, from another process such as a CLI) records a request in the database; the
// process running the projection performs it: in one transaction it calls the handler's Reset (Resetter; Mux.OnReset)
// to clear the read model, clears the parked events, and moves every partition's checkpoint back to the start,
// then replays the log. A blue/green rebuild needs no special support: run the new version under a new Name
// writing to new tables, and switch readers once its Status shows it caught up.
//
// # Status
//
// ListStatus returns, for every projection and partition, from the database (so any process sees all of them):
// position, head, lag in events and in time, state (running while a process holds the lease, stopped, failed),
// last error, the event being retried, parked count, rebuild pending and the lease owner. ListParked,
// Projection.ReplayParked, RequestReplay (carried out by a running instance, for a CLI) and DiscardParked manage
// parked events.
//
// # Telemetry
//
// Every batch the handler applies is a stagehand.projection.batch span (projection, checkpoint, event count,
// first and last position, the handler's error recorded), linked to the traces of the saves that recorded its
// events (their traceparent metadata). The observable gauges stagehand.projection.lag (log positions behind the
// head) and stagehand.projection.lag_time (seconds the oldest waiting event has waited) are reported for each
// checkpoint, whether the projection runs or not, from New until Close: one query for the checkpoints and one for
// the head per collection, plus one per checkpoint behind the head. Config.TracerProvider and MeterProvider inject
// the providers (nil: the global ones).
//
// # Watermill
//
// Subscriber exposes the log as a message.Subscriber: the topic is a filter ("*", "events:A,B",
// "streams:Order;tenants:acme"), the consumer group names the checkpoint, a new group starts at the beginning of
// the log and a known group resumes after its checkpoint. Messages are delivered in order, one at a time; Ack
// advances the checkpoint (committed every BatchSize messages and when caught up), Nack delivers the message
// again. Delivery is at-least-once.
package projection
