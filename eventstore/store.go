package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
)

// ExpectedVersion is the optimistic-concurrency condition of an append: the exact version the stream must be at,
// or one of AnyVersion, NoStream and StreamExists.
type ExpectedVersion int64

const (
	// NoStream requires that the stream does not exist yet (version 0).
	NoStream ExpectedVersion = 0
	// AnyVersion appends whatever the stream's version is, creating it when needed.
	AnyVersion ExpectedVersion = -1
	// StreamExists requires that the stream exists, at any version.
	StreamExists ExpectedVersion = -2
)

// String renders the condition for error messages.
func (e ExpectedVersion) String() string {
	switch e {
	case AnyVersion:
		return "any"
	case NoStream:
		return "no stream"
	case StreamExists:
		return "stream exists"
	}
	return fmt.Sprintf("%d", int64(e))
}

// Metadata is the string key/value metadata stored with each event.
type Metadata map[string]string

// EventData is an event to append: its payload is already encoded (JSON for the PostgreSQL store, which stores
// payloads as jsonb).
type EventData struct {
	// EventID identifies the event; unique across the store. Zero means "generate a UUIDv7".
	EventID uuid.UUID
	// Type is the event's stable name (never a Go type name).
	Type string
	// TypeVersion is the schema version of the payload, used for upcasting on load. Zero means 1.
	TypeVersion int
	// Payload is the encoded event.
	Payload []byte
	// Metadata is stored with the event (correlation and causation IDs, user key/values).
	Metadata Metadata
	// OccurredAt is when the event happened. Zero means the store's clock at append time.
	OccurredAt time.Time
}

// AppendRequest appends events to one stream.
type AppendRequest struct {
	// Tenant owns the stream; part of the stream's identity. Empty means stagehand.NoTenant.
	Tenant string
	// StreamID identifies the stream within the tenant (for aggregates, the aggregate ID).
	StreamID string
	// StreamType is the stable name of the stream's type (for aggregates, the aggregate type name).
	StreamType string
	// Expected is the optimistic-concurrency condition.
	Expected ExpectedVersion
	// Events are appended in order with versions current+1, current+2, ...
	Events []EventData
}

// AppendResult describes a successful append.
type AppendResult struct {
	// Records are the stored events, with their versions and global positions.
	Records []Record
	// Version is the stream's version after the append.
	Version int64
}

// Record is a stored event.
type Record struct {
	Position    int64
	Tenant      string
	StreamID    string
	StreamType  string
	Version     int64
	EventID     uuid.UUID
	Type        string
	TypeVersion int
	Payload     []byte
	Metadata    Metadata
	OccurredAt  time.Time
	RecordedAt  time.Time
}

// LogQuery selects a page of the global log.
type LogQuery struct {
	// After is the position to read after (exclusive). 0 reads from the start.
	After int64
	// Limit is the most positions examined in one page. Default 1000.
	Limit int
	// EventTypes, when not empty, keeps only events of these types.
	EventTypes []string
	// StreamTypes, when not empty, keeps only events of streams of these types.
	StreamTypes []string
	// Tenants, when not empty, keeps only events of these tenants. A blank tenant ("" or whitespace) is
	// stagehand.NoTenant, as everywhere a tenant is taken.
	Tenants []string
	// Deletions, when set, also returns the marker of each stream deletion (Type StreamDeletedType, at the position
	// of the deletion; see LifecycleStore) whose stream passes StreamTypes and Tenants, whatever EventTypes says.
	// Without it, markers are passed over like the tombstones of deleted events always are.
	Deletions bool
}

// LogPage is a page of the global log.
type LogPage struct {
	// Records are the events in the page that match the query's filters, in position order.
	Records []Record
	// Last is the position a reader has safely passed: every committed event up to Last is either in Records or
	// filtered out, and no event with a position up to Last can still commit. Continue with After = Last.
	// Last equals the query's After when nothing new could be read safely.
	Last int64
}

// Snapshot is the saved state of a stream at a version.
type Snapshot struct {
	Tenant     string
	StreamID   string
	StreamType string
	// Version is the stream version the state reflects.
	Version int64
	// SchemaVersion is the version of the snapshot's encoding; a reader that expects another version ignores it.
	SchemaVersion int
	Payload       []byte
	CreatedAt     time.Time
}

// StreamInfo describes a stream.
type StreamInfo struct {
	Tenant     string
	StreamID   string
	StreamType string
	Version    int64
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// State is StreamActive, or StreamArchiving or StreamArchived for an archived stream (whose Version is its last
	// event's). A deleted stream has no StreamInfo: Stream returns a *StreamDeletedError.
	State StreamState
}

// Store is an event store. Implementations must pass the conformance suite in eventstoretest.
type Store interface {
	// Append appends events to a stream if its version satisfies req.Expected, atomically: all or none.
	// A failed condition returns an error that errors.Is ErrConcurrencyConflict and appends nothing.
	Append(ctx context.Context, req AppendRequest) (AppendResult, error)
	// ReadStream returns the events of a stream with version >= fromVersion, in version order. A stream that does
	// not exist returns ErrStreamNotFound.
	ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) ([]Record, error)
	// ReadLog returns the next page of the global log after q.After. It never skips an event that commits later:
	// it stops before a position that an in-flight transaction may still commit.
	ReadLog(ctx context.Context, q LogQuery) (LogPage, error)
	// HeadPosition returns the highest committed position (0 for an empty store).
	HeadPosition(ctx context.Context) (int64, error)
	// Stream describes a stream, or returns ErrStreamNotFound.
	Stream(ctx context.Context, tenant, streamID string) (StreamInfo, error)
	// SaveSnapshot stores s unless a snapshot at a higher version is already stored.
	SaveSnapshot(ctx context.Context, s Snapshot) error
	// LoadSnapshot returns the latest snapshot of a stream, or ErrSnapshotNotFound.
	LoadSnapshot(ctx context.Context, tenant, streamID string) (Snapshot, error)
	// DeleteSnapshot removes the snapshot of a stream (the next load replays the stream from its first event), or
	// returns ErrSnapshotNotFound when it has none. The stream's events are untouched.
	DeleteSnapshot(ctx context.Context, tenant, streamID string) error
}

// StageFunc runs inside an append's transaction after the version check and the insert; returning an error rolls
// the whole append back.
type StageFunc func(ctx context.Context, tx pgx.Tx, res AppendResult) error

// QueueFunc queues, onto q.Batch, statements to run in an append's transaction after its insert, which the batch
// already holds: the insert, the queued statements and the commit are one round trip. It is called before anything
// is sent, so q.Planned describes the events as they will be stored (tenant, stream, versions, event IDs, types,
// payloads, metadata, occurred-at) except what only the insert assigns: Position is 0 and RecordedAt is zero. A
// queued statement that needs an event's position writes it with q.Positions (SQL the store writes). The queued
// statements run only when the version check passed; one that fails makes the server roll the whole transaction
// back, so nothing is appended.
//
// Statements may register result callbacks (pgx.QueuedQuery's Exec, Query, QueryRow); they run as the results are
// read, once the server has committed, so a callback observes and must not decide: an error it returns is
// reported, but cannot undo the commit. Returning an error from QueueFunc sends nothing.
type QueueFunc func(ctx context.Context, q Queued) error

// QueuedAppender is implemented by stores that can run an append and a caller's statements in one transaction and
// one round trip (the PostgreSQL store does). Discover it by type assertion.
type QueuedAppender interface {
	// AppendQueued appends req and runs the statements queue adds in one transaction of its own, sent as one
	// batch. It returns the stored records, positions and recorded-at included.
	AppendQueued(ctx context.Context, req AppendRequest, queue QueueFunc) (AppendResult, error)
}

// TransactionalStore is a Store whose appends can share a PostgreSQL transaction with other writes (outbox rows,
// read models). The PostgreSQL store implements it; the in-memory store does not.
//
// Everything a Tx method does runs on the caller's transaction: it never takes a second connection from the pool
// while the caller's transaction holds one, so a pool of one connection per concurrent transaction is enough, and
// callers never wait for one another inside their transactions. AppendWith holds one connection at a time too.
type TransactionalStore interface {
	Store
	// Begin starts a transaction on the store's database, for use with AppendTx.
	Begin(ctx context.Context) (pgx.Tx, error)
	// AppendTx appends on the caller's transaction. The caller commits or rolls back. A version conflict leaves
	// the transaction usable.
	AppendTx(ctx context.Context, tx pgx.Tx, req AppendRequest) (AppendResult, error)
	// AppendWith opens a transaction, appends, runs stage on that transaction (only when the version check
	// passed), and commits. A conflict or an error from stage rolls everything back.
	AppendWith(ctx context.Context, req AppendRequest, stage StageFunc) (AppendResult, error)
	// ReadStreamTx is ReadStream on the caller's transaction: it sees the transaction's own appends.
	ReadStreamTx(ctx context.Context, tx pgx.Tx, tenant, streamID string, fromVersion int64) ([]Record, error)
	// LoadSnapshotTx is LoadSnapshot on the caller's transaction.
	LoadSnapshotTx(ctx context.Context, tx pgx.Tx, tenant, streamID string) (Snapshot, error)
	// SaveSnapshotTx is SaveSnapshot on the caller's transaction, so the snapshot commits (or rolls back) with the
	// events it describes. It runs under a savepoint: a failure leaves the transaction usable.
	SaveSnapshotTx(ctx context.Context, tx pgx.Tx, s Snapshot) error
}

// Errors returned by stores. Compare with errors.Is.
var (
	// ErrConcurrencyConflict: the stream's version did not satisfy the expected version. Nothing was appended.
	ErrConcurrencyConflict = errors.New("eventstore: concurrency conflict")
	// ErrStreamNotFound: the stream does not exist.
	ErrStreamNotFound = errors.New("eventstore: stream not found")
	// ErrSnapshotNotFound: the stream has no snapshot.
	ErrSnapshotNotFound = errors.New("eventstore: snapshot not found")
	// ErrDuplicateEventID: an event ID in the append is already stored. Nothing was appended.
	ErrDuplicateEventID = errors.New("eventstore: duplicate event id")
	// ErrInvalidAppend: the request is malformed (empty stream ID, no events, bad expected version).
	ErrInvalidAppend = errors.New("eventstore: invalid append")
	// ErrInRecovery matches an *InRecoveryError: the log cannot be followed safely on a server in recovery.
	ErrInRecovery = errors.New("eventstore: server in recovery")
	// ErrCorruptRecord matches a *RecordError: a stored event that cannot be read.
	ErrCorruptRecord = errors.New("eventstore: corrupt record")
	// ErrInvalidConfig: a store was constructed with invalid configuration.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrCommitUnknown: the connection was lost while an append was committing and the store could not find out
	// whether it committed. The error is a *CommitUnknownError naming the stream, the expected version and the
	// event IDs to look for. Never retry such an append blindly: it may have been stored.
	ErrCommitUnknown = errors.New("eventstore: commit outcome unknown")
)

// CommitUnknownError is the error of an append whose commit outcome is unknown. It matches ErrCommitUnknown and
// unwraps to the connection error.
//
// The PostgreSQL store resolves most lost commits itself: it looks the append's event IDs up on another connection
// (after waiting for the lost connection's server process to end, when it knows it), and returns success when they
// are stored, or a plain error when they are not and cannot be any more. This error remains when that was not
// possible (the database unreachable, the server process still running, or an Append whose events carry no IDs).
// To resolve it, read the stream (ReadStream from Expected+1) once the database is reachable: the append committed
// if and only if its first event ID, EventIDs[0], is there. For an aggregate, reload it and check whether its
// version moved past Expected with that event.
type CommitUnknownError struct {
	Tenant   string
	StreamID string
	Expected ExpectedVersion
	// EventIDs are the IDs of the append's events, in order (nil when the append left them to the store).
	EventIDs []uuid.UUID
	// Err is the connection error.
	Err error
}

func (e *CommitUnknownError) Error() string {
	first := "none given"
	if len(e.EventIDs) > 0 {
		first = e.EventIDs[0].String()
	}
	return fmt.Sprintf("eventstore: the append to stream %q (tenant %q, expected version %s) may or may not have "+
		"committed: the connection was lost during its commit (look for its first event %s): %v", e.StreamID,
		e.Tenant, e.Expected, first, e.Err)
}

// Is makes errors.Is(err, ErrCommitUnknown) true.
func (e *CommitUnknownError) Is(target error) bool { return target == ErrCommitUnknown }

// Unwrap returns the connection error.
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// ConflictError is the error of a failed optimistic-concurrency check. It matches ErrConcurrencyConflict.
type ConflictError struct {
	Tenant   string
	StreamID string
	Expected ExpectedVersion
	// Actual is the stream's version when the conflict was detected (0 when it does not exist, -1 when it could
	// not be read).
	Actual int64
	// Reason is empty for a failed version check. Otherwise it names the transaction conflict PostgreSQL reported
	// instead ("serialization failure" under REPEATABLE READ or SERIALIZABLE, "deadlock"): the append or its
	// commit was rolled back, nothing was appended, and the save can be retried like any conflict.
	Reason string
}

func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("eventstore: concurrency conflict on stream %q (tenant %q): expected version %s, actual %d",
		e.StreamID, e.Tenant, e.Expected, e.Actual)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrConcurrencyConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConcurrencyConflict }

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "eventstore"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// RecordError is the error of a stored event that cannot be read (its metadata column holds JSON that is not an
// object, written by something other than stagehand). Record holds what could be read: position, tenant, stream,
// version, type and payload, without metadata. It matches ErrCorruptRecord.
//
// Metadata values that are not strings are not corrupt: they are read as their JSON text ({"retries": 1} reads as
// "retries" → "1"); only metadata that is not a JSON object is.
type RecordError struct {
	Record Record
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("eventstore: event at position %d (stream %q version %d, tenant %q, type %q) cannot be read: %v",
		e.Record.Position, e.Record.StreamID, e.Record.Version, e.Record.Tenant, e.Record.Type, e.Err)
}

// Is makes errors.Is(err, ErrCorruptRecord) true.
func (e *RecordError) Is(target error) bool { return target == ErrCorruptRecord }

// Unwrap returns the decoding error.
func (e *RecordError) Unwrap() error { return e.Err }

// InRecoveryError is returned by the PostgreSQL store's ReadLog on a server in recovery (a hot standby). The
// gap-safe reader judges a missing position by the transactions that hold the events table's lock, and a standby
// does not see the primary's transactions: it would pass a position the primary may still commit, and that event
// would never be delivered. Follow the log on the primary. It matches ErrInRecovery.
type InRecoveryError struct {
	Schema string
}

func (e *InRecoveryError) Error() string {
	return fmt.Sprintf("eventstore: the global log of schema %q cannot be followed on a server in recovery (a "+
		"standby does not see the primary's in-flight appends); point log readers at the primary", e.Schema)
}

// Is makes errors.Is(err, ErrInRecovery) true.
func (e *InRecoveryError) Is(target error) bool { return target == ErrInRecovery }
