// Package eventstore stores event streams and the ordered global log.
//
// A Store appends events to a stream with an expected version (exact, AnyVersion, NoStream or StreamExists),
// atomically: all events of an append or none. A failed version check returns an error matching
// ErrConcurrencyConflict (a *ConflictError naming the stream, the expected and the actual version) and appends
// nothing. Under REPEATABLE READ or SERIALIZABLE a racing append can also lose to a serialization failure (SQLSTATE
// 40001) or a deadlock (40P01), in its statement, in the statements staged with it or at its COMMIT (AppendWith,
// AppendQueued): that too is a *ConflictError (its Reason says which), never a raw SQLSTATE, so a retry loop treats
// every loser alike. The COMMIT of a caller's own transaction (after AppendTx) is the caller's to classify. Under
// SERIALIZABLE PostgreSQL can also cancel a statement that only reads (when it reads a row of a transaction that
// has prepared or committed and that formed a dangerous structure with a third); the PostgreSQL store's reads
// through its pool (Stream, ReadStream, ReadStreamPage, ReadLog, LoadSnapshot, HeadPosition, CountLog, RecordedAt,
// Lifecycle) write nothing, so they read again, for up to about 1.6 s, rather than hand the caller a SQLSTATE.
//
// A stream's versions are 1..n with no gaps and no duplicates. A stream's identity includes its tenant: the same
// stream ID in two tenants is two streams, and no read of one tenant returns another's events.
//
// Every committed event gets a position in the global log. ReadLog pages through it in position order and never
// skips an event that commits later, whatever order concurrent transactions commit or abort in.
//
// Two implementations pass the same conformance suite (package eventstoretest):
//
//   - PostgresStore (pgx v5): the production store. It also implements TransactionalStore, whose appends share a
//     transaction with other writes: AppendTx on a caller's pgx.Tx, and AppendWith, which runs a staging callback
//     in the append's own transaction after the version check (the Transactional staging strategy uses it).
//     ReadStreamTx, LoadSnapshotTx and SaveSnapshotTx read and write on a caller's transaction too, so a snapshot
//     commits or rolls back with the events it describes. Tables are created by stagehand.Migrate, never by a
//     constructor.
//   - MemoryStore: the same semantics in memory, for users' unit tests.
//
// # Lost commits
//
// When the connection is lost while an append commits (a network failure, a server restart, pg_terminate_backend,
// a context cancelled during COMMIT), the append may or may not have been stored. The PostgreSQL store finds out
// on another connection: AppendWith and AppendQueued wait for the lost session's server process to end, then look
// for the append's event IDs, and return success when they are stored or a plain error when they are not; Append
// (one statement) can confirm that it committed but not rule it out. When the outcome cannot be known the error
// matches ErrCommitUnknown: a *CommitUnknownError naming the stream, the expected version and the event IDs to look
// for. Never retry such an append blindly (aggregate.Repository.Update does not): reload and check whether its
// first event is in the stream.
//
// # The gap-safe global log
//
// Positions come from a sequence drawn by the INSERT itself. A transaction can draw a position and commit after a
// later position has become visible, or abort and leave a hole. A reader that meets a missing position waits only
// for the transactions that held a RowExclusiveLock on the events table when it saw the gap (whoever drew the
// missing position is among them), then re-reads: a position still missing belongs to an aborted transaction and
// is final. Readers therefore stall only while an event writer is in flight, never on unrelated long transactions
// (unlike ordering by transaction ID), and never forever under continuous writes. PostgresConfig.MaxGapWait bounds
// one ReadLog call's wait; the caller simply retries.
//
// # Partitioned events table
//
// An events table can be range-partitioned by global position, so that the log grows for years and old
// partitions are detached and archived without downtime. It is opt-in: Partitions.Convert (or `stagehand events
// partitions convert`) converts a live table once; a store that never runs it keeps its single table. Every
// PostgresStore on the schema follows the change by itself (it reads the table's layout at most every 10 s, through
// the connection the call runs on, the caller's transaction for the Tx methods, and appends correctly meanwhile;
// a read that finds a stream missing checks the layout in its own statement); the conformance suite passes on both
// layouts.
//
// A unique index of a partitioned table must include the partition key, so (tenant_id, stream_id, version), the
// index that is the concurrency control, and the one on event_id cannot span partitions. Two compact,
// unpartitioned tables take their place, kept by a BEFORE INSERT row trigger of the partitioned table in the
// appending statement: event_streams, one row per stream (its version, first and last position), and event_ids.
// Each new event must continue its stream's head (version 1 creates it, version v moves it from v-1) and bring a
// new ID, or the statement fails with the unique violation the unpartitioned table raised: a concurrency conflict
// is still ErrConcurrencyConflict, a repeated ID ErrDuplicateEventID. Appends read the stream's version from its
// head (one probe) and stream reads visit only the partitions between the stream's first and last events.
//
// The gap-safe log is unchanged: an INSERT through the partitioned table holds a RowExclusiveLock on the table
// itself (and on the partition its row goes to), so a reader that meets a gap waits for the same transactions
// whichever partition they write.
//
// Partitions.Ensure creates partitions ahead of the log (Partitions.Keep runs it every interval in the
// application; `stagehand events partitions create` from cron does the same); an append whose position has no partition fails with a *NoPartitionError, nothing appended.
// Partitions.Archive detaches the oldest partition (DETACH PARTITION CONCURRENTLY) and moves it to an archive
// schema, drops it, or leaves it for pg_dump; it refuses while a log follower's checkpoint, an outbox watermark or
// parked events still need it, or while streams with events in it have no snapshot taken after them (unless told
// to go on). Reads that need archived events return an *ArchivedError (ErrArchived): a stream read names the stream
// and the versions, so a load never rebuilds a state from part of its history; a log read names the archived
// positions, so a projection rebuilt from the start fails loudly instead of skipping them, and one rebuilt from
// after them (its checkpoint set past the archived range) reads on.
//
// # Archiving and deleting single streams
//
// Both stores implement LifecycleStore. ArchiveStream moves a finished stream's events out of the events table into
// stream_archive (migration 050): ReadStream and loads read them there transparently, ReadLog still returns them at
// their positions, and appends fail with a *StreamArchivedError (ErrStreamArchived). DeleteStream removes a stream's
// event data and snapshot, keeping a tombstone per position (identity without payload or metadata) that ReadLog
// passes over without waiting, and records who, when and why; loads and appends then fail with a
// *StreamDeletedError (ErrStreamDeleted, also ErrStreamNotFound). Each appends a marker event to its stream (types
// StreamArchivedType, StreamDeletedType): the marker takes the stream's next version, so an append racing the
// operation loses on the version and then reports the stream's state; readers never see markers, except deletion
// markers for a LogQuery with Deletions (projections use it to remove what they derived from a deleted stream).
// The events move in a second transaction once every transaction that began before the first step has ended (a
// REPEATABLE READ transaction could otherwise still append with its older view); see PostgresStore.ArchiveStream.
//
// After each append commits, the PostgreSQL store sends a coalesced NOTIFY (never inside the append's
// transaction, which would serialise commits) on NotifyChannel, so followers react within milliseconds; they also
// poll, so a lost notification only costs latency.
package eventstore
