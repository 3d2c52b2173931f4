// Package outbox is stagehand's transactional outbox on PostgreSQL, its relay to any Watermill publisher, and an
// inbox for idempotent Watermill handlers.
//
// # Staging
//
// A message staged with a business decision is written to the outbox table in the same transaction as the
// decision: Outbox.StageTx on the caller's pgx.Tx (or Outbox.Publisher, a Watermill publisher bound to it). If the
// transaction rolls back, nothing is staged; if it commits, the message will be published. Outbox.Stage does the
// same in a transaction of its own. A message is identified by its ID and destination topic: staging it again
// inserts nothing, as long as it is pending, dead-lettered, or sent and not yet cleaned up.
//
// Messages sharing a partition key (by default the "partition-key" metadata value, else "aggregate-id") are
// numbered in staging-commit order: a transaction staging a key holds that key's lock (a transaction-scoped
// advisory lock on a 64-bit hash of schema, tenant and key) until it ends, so a transaction that commits later gets
// higher numbers even if it staged first. Keys, like message identities, are per tenant: two tenants' messages with
// the same key (the same stream ID, say) are ordered independently, and a message is identified by (tenant, message
// ID, topic). The locks share the database's advisory-lock space: another holder of the same 64-bit value (a chance
// of one in 2^64 per pair) only waits for, or makes wait, the stagers of that key; no order changes. Nothing is
// stored per key beyond its messages, so there is nothing to prune.
//
// QueueStage queues the staging statements onto a caller's pgx.Batch, so that a caller can send them in the same
// round trip as its own statements (the staging package sends them with the save's COMMIT).
//
// Wake-up notifications (LISTEN/NOTIFY) are sent after commit, never inside the transaction, where they would
// serialise every committing transaction. StageTx cannot see the caller's commit: call Outbox.Notify after it, or
// let relays find the rows at their next poll.
//
// StageTx and Stage count the rows they insert in the counter stagehand.messages.staged (Config.MeterProvider), the
// one place every staging path shares, and give a message without trace context in its metadata the one of the
// span in ctx, so the relay and the consumer continue the caller's trace.
//
// # Relaying
//
// A Relay is a Watermill message.Subscriber: Subscribe(ctx, topic) delivers the rows staged for a topic, one
// Watermill message per row, with the message ID as UUID and the standard headers (tenant, correlation, causation,
// message type, partition key) in the metadata. Relay.AddToRouter wires a message.Router handler that forwards
// every row, on its own topic, to any Watermill publisher: Kafka, NATS, AMQP, watermill-sql, gochannel. Relay.Drain
// does the same once, with no background loop, for serverless triggers.
//
// The guarantees:
//
//   - At least once. A row leaves the outbox only when the broker accepted it and the relay still held its lease.
//     A relay that dies, stalls past its lease, or loses its database connection leaves its rows to be published
//     again by another relay: duplicates are possible, losses are not. Make consumers idempotent (see Inbox).
//   - Per-key order. Messages of one partition key are delivered one at a time in staging-commit order, the next
//     only after the previous was acknowledged, so their first publications reach the broker in that order, with
//     any number of relays and any MaxDegreeOfParallelism. A message that fails holds back only the later messages
//     of its own key. Scheduled messages are the documented exception: they are published when due, outside their
//     key's order. That is order at the broker. A handler sees it only when its subscription hands it one message
//     at a time and delivers a nacked or timed-out message again before any later one: with NATS JetStream, a
//     durable consumer with MaxAckPending 1 (examples/orders, tested with 8 subscribers, nacks and duplicates,
//     reads each of a topic's subject partitions by key through one such consumer, for several messages in
//     flight); several subscribers or a larger MaxAckPending on one consumer hand a key's messages to handlers
//     concurrently, and a redelivery can overtake. Behind the inbox, a duplicate is skipped (the first successful handling is the one
//     that counts), a message the inbox dead-letters no longer holds its key at the handler, and a redriven inbox
//     dead letter is handled when its copy arrives.
//   - Retries that throttle. A rejected message (nacked, or unanswered past AckDeadline) is retried after an
//     exponential backoff with jitter, capped by MaxRetryDelay; after MaxRetryCount retries it moves to the dead
//     letters with its last error. A dead letter keeps holding its key (a sequenced dead-letter queue) until it is
//     redriven or discarded, unless ReleaseKeyOnDeadLetter.
//   - Outages cost nothing. A broker that cannot be reached (connection refused, open circuit breaker, dial
//     timeout; see BrokerUnavailable) counts no attempt: the relay pauses as a whole and retries, so an outage never
//     fills the dead letters.
//   - Low latency, safe fallback. Relays wake on NOTIFY and poll every PollingInterval; a killed listening
//     connection or a database restart reconnects on its own, and polling covers the gap.
//
// Watermill's Nack carries no error: a handler records why it failed with RecordError before nacking (AddToRouter
// does it for the publish error), which is what the relay stores as the row's last error and classifies.
//
// # Several relays
//
// Relays share an outbox through row leases. RelayConfig.LeaderElection makes the relay single-active instead:
// only the holder of that lease (in the leases table shared with projections and stagers) claims, and every claim
// and every write to a claimed row carries the lease's fencing token in the same statement, so a demoted leader's
// late mark is rejected (ErrFenced) and its rows are left to the new leader. Subscribe and Drain fail fast with
// ErrCannotFence when the database cannot fence (no leases table, no privilege to lock it, a read-only session);
// RelayConfig.SingleWriter is the explicit unfenced opt-out. RelayConfig.Partitions splits the claim into
// independent loops by a hash of the partition key or the tenant, each with its own workers and backoff; with
// leader election each partition has its own lease, and the relay processes share the partitions fairly.
//
// # Telemetry
//
// With RelayConfig.TracerProvider and MeterProvider (nil: the global OpenTelemetry providers), the relay traces
// claims and publications in the trace carried by each message's metadata, injects the publish span's context
// into the delivered message, and reports messages published, failed and dead-lettered, claim durations, and the
// pending count and oldest pending age.
//
// # Operations
//
// Outbox.AllTenants and Outbox.Tenant give the statistics, dead letters (list, show, redrive, discard) and cleanup,
// estate-wide or for one tenant; the estate-wide scope is reached by name, never by a wildcard tenant. Published
// messages leave the hot outbox table at once (so claims stay cheap however long the system runs) for a compact
// ledger of sent IDs. Components that re-stage messages from the event log register a watermark
// (Outbox.AdvanceWatermarkTx), and Admin.CleanupSent keeps every ledger entry at or above the lowest watermark, so
// re-staging a message that was already sent publishes nothing.
//
// # Inbox
//
// Inbox.Handler wraps a handler for a Watermill router so it applies its effects at most once per (tenant, message
// ID, handler name), the tenant taken from the tenant-id header: in one transaction it records the pair under a unique constraint, skips the handler for a
// duplicate, runs it with the transaction and a Publisher bound to it (so messages it produces are staged in that
// same transaction, never handed back to the router), and commits. A failure rolls everything back and the message
// is redelivered; a message that cannot be decoded, or keeps failing, goes to the inbox dead letters instead of
// blocking the subscription. Outbox at least once plus inbox at most once is effectively once.
//
// Contention is not a failure of the message: a run that fails with a concurrency conflict (an error matching
// eventstore.ErrConcurrencyConflict, for instance from an aggregate changed by a concurrent handler), a
// serialization failure or a deadlock is rerun at once in a new transaction, up to InboxConfig.ContentionRetries
// times, and counts no attempt; only a delivery whose reruns are all used up counts as one failed attempt. A
// handler that changes an aggregate does best with aggregate.Repository.UpdateTx on the inbox transaction, which
// retries a conflict under a savepoint before it ever reaches the inbox.
//
// The inbox lives in this package, beside the producer side, on purpose. A consumer that produces messages stages
// them in the outbox in the inbox's transaction (the Publisher a HandlerFunc receives), so every consumer that
// produces anything needs this package anyway; an inbox dead letter is redriven by staging a copy in the outbox;
// and the inbox tables share the outbox's migrations, schema, tenant rules and routine maintenance (retention of
// handled entries and attempts runs in the same Maintainer pass as the sent ledger's). A package of its own would
// import outbox for all of that and split one transaction's two halves across two packages. A consumer that
// produces nothing still constructs an Outbox: it is a handle on the schema (no relay runs unless one is made) from which
// NewInbox takes its pool, tables and settings.
//
// Inbox dead letters are listed, shown, redriven and discarded through Admin with the outbox dead letters' verbs
// (InboxDeadLetters, InboxDeadLetter, InboxDeadLetterGroups, RedriveInbox, DiscardInbox, RedriveInboxMatching,
// DiscardInboxMatching) and the CLI. A redrive stages a copy of the message in this
// outbox that only its handler handles, under the original message ID, so effects still apply once.
//
// Every inbox-wrapped run is a stagehand.inbox.handle span (kind consumer; handler, message ID and type, tenant,
// topic, and the outcome: handled, duplicate, failed or dead_lettered), the child of the trace context in the
// message's metadata (the relay's publish span), and is counted in stagehand.inbox.messages by handler and outcome.
// The handler's ctx carries the span: its own spans, and the messages it publishes, continue the trace.
// InboxConfig.TracerProvider and MeterProvider inject the providers; by default the Outbox's, else the global ones.
//
// Tables are created by stagehand.Migrate (migrations 010 and 011), never by a constructor.
package outbox
