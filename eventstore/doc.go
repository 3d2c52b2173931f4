// Package eventstore stores event streams and the ordered global log.
//
// A Store appends events to a stream with an expected version (exact, AnyVersion, NoStream or StreamExists),
// atomically: all events of an append or none. A failed version check returns an error matching
// ErrConcurrencyConflict (a *ConflictError naming the stream, the expected and the actual version) and appends
// nothing. Under REPEATABLE READ or SERIALIZABLE a racing append can also lose to a serialization failure (SQLSTATE
// 40001) or a deadlock (40P01), in its statement, in the statements staged with it or at its COMMIT (AppendWith,
// AppendQueued): that too is a *ConflictError (its Reason says which), never a raw SQLSTATE, so a retry loop treats
// every loser alike. The COMMIT of a caller's own transaction (after AppendTx) is the caller's to classify.
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
// After each append commits, the PostgreSQL store sends a coalesced NOTIFY (never inside the append's
// transaction, which would serialise commits) on NotifyChannel, so followers react within milliseconds; they also
// poll, so a lost notification only costs latency.
package eventstore
