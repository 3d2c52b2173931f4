package eventstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Types of the marker events ArchiveStream and DeleteStream append to the stream they archive or delete. A marker
// takes the stream's next version and a position in the global log, carries an empty payload, and is never
// returned by a stream read. ReadLog passes over markers, except that a query with Deletions set receives each
// deletion's marker (so a projection is told, at that position, that the stream is gone). Appends may not use
// event types starting with LifecycleTypePrefix.
const (
	// LifecycleTypePrefix starts every type the store reserves for itself.
	LifecycleTypePrefix = "$stagehand."
	// StreamArchivedType is the type of the marker an archive appends.
	StreamArchivedType = LifecycleTypePrefix + "stream-archived"
	// StreamDeletedType is the type of the marker a deletion appends.
	StreamDeletedType = LifecycleTypePrefix + "stream-deleted"
)

// IsLifecycleMarker reports whether an event type is one of the store's own lifecycle markers.
func IsLifecycleMarker(eventType string) bool {
	return strings.HasPrefix(eventType, LifecycleTypePrefix)
}

// StreamState is where a stream is in its lifecycle.
type StreamState string

// Stream states.
const (
	// StreamActive: the stream takes appends.
	StreamActive StreamState = "active"
	// StreamArchiving: archived, appends refused, but its events are still in the hot table (the archive's second
	// step has not run: ArchiveStream again finishes it). Loads work.
	StreamArchiving StreamState = "archiving"
	// StreamArchived: appends refused, its events moved to the archive; loads read them there.
	StreamArchived StreamState = "archived"
	// StreamDeleting: deleted, appends and loads refused, but its events' data is not removed yet (DeleteStream
	// again finishes it).
	StreamDeleting StreamState = "deleting"
	// StreamDeleted: appends and loads refused, its events' data removed; tombstones keep their positions.
	StreamDeleted StreamState = "deleted"
)

// Done reports whether the state is final for its operation (an archive or a deletion whose events have moved).
func (s StreamState) Done() bool {
	return s == StreamActive || s == StreamArchived || s == StreamDeleted
}

// LifecycleRequest names the stream to archive or delete, and records who asks and why.
type LifecycleRequest struct {
	// Tenant owns the stream. Empty means stagehand.NoTenant.
	Tenant string
	// StreamID identifies the stream within the tenant.
	StreamID string
	// Actor says who asked (an operator's name, a service), for the audit record. Default: the database user (the
	// in-memory store: "unknown").
	Actor string
	// Reason says why; required by DeleteStream (the legal ground for the erasure, a ticket), optional for
	// ArchiveStream. Never put the stream's personal data in it: it is kept.
	Reason string
}

// StreamLifecycle is the record of an archived or deleted stream: its state, what moved, and who asked, when and
// why. It never holds the events' data.
type StreamLifecycle struct {
	Tenant     string
	StreamID   string
	StreamType string
	State      StreamState
	// Version is the stream's last event before its first marker.
	Version int64
	// FirstPosition and LastPosition are the positions of the stream's first and last events (0 until the events
	// have moved).
	FirstPosition, LastPosition int64
	// MarkerPosition is the position of the latest marker (the archive's, then the deletion's).
	MarkerPosition int64
	// Events is how many events were moved out of the hot table.
	Events int64
	// ArchivedAt and ArchivedBy record the archive (zero for a stream deleted without being archived first).
	ArchivedAt time.Time
	ArchivedBy string
	// DeletedAt, DeletedBy and Reason record the deletion.
	DeletedAt time.Time
	DeletedBy string
	Reason    string
}

// LifecycleStore is implemented by stores that can archive and delete single streams (both stores of this package
// do). Discover it by type assertion on a Store.
//
// ArchiveStream takes a finished stream out of the hot table: its events move to the archive, where loads still
// read them (ReadStream returns them as before, transparently) and the global log still has them at their
// positions (a projection rebuilt from the start sees them). Appends to it fail with a *StreamArchivedError.
//
// DeleteStream erases a stream where the law requires it: its events' payloads and metadata are removed, and a
// tombstone per event keeps its position (with tenant, stream, version, event ID and type), so the global log has no
// gap that readers would wait on: they pass over the tombstones. The deletion appends a marker event to the
// stream, which log readers that ask for it (LogQuery.Deletions: projections do) receive at its position, to
// remove what they derived from the stream. The stream's snapshot is deleted. Loads and appends then fail with a
// *StreamDeletedError (which also matches ErrStreamNotFound): the stream ID stays taken, never reused by a new
// stream. An archived stream can be deleted.
//
// Both are safe under concurrent appends and running log readers: an append racing them either commits before
// (and its events are archived or deleted with the stream) or fails with the typed error; it never lands in a
// stream that is half archived. Both are idempotent in effect: a second call for a stream in the state asked for
// returns the typed error and changes nothing, and a call that stopped between its two steps (see StreamState) is
// finished by calling it again.
type LifecycleStore interface {
	Store
	// ArchiveStream archives a stream and returns its record. A stream that does not exist returns
	// ErrStreamNotFound; one archived already a *StreamArchivedError; a deleted one a *StreamDeletedError.
	ArchiveStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error)
	// DeleteStream deletes a stream and returns its record. req.Reason is required. A stream that does not exist
	// returns ErrStreamNotFound; one deleted already a *StreamDeletedError.
	DeleteStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error)
	// Lifecycle returns a stream's lifecycle record: State StreamActive (and the stream's type and version) for a
	// stream never archived nor deleted, ErrStreamNotFound for a stream that does not exist.
	Lifecycle(ctx context.Context, tenant, streamID string) (StreamLifecycle, error)
}

// Errors of the stream lifecycle. Compare with errors.Is.
var (
	// ErrStreamArchived matches a *StreamArchivedError: the stream is archived and takes no appends.
	ErrStreamArchived = errors.New("eventstore: stream archived")
	// ErrStreamDeleted matches a *StreamDeletedError: the stream was deleted.
	ErrStreamDeleted = errors.New("eventstore: stream deleted")
	// ErrLifecyclePending matches a *LifecyclePendingError: an archive or deletion is recorded (appends are
	// refused) but its events could not be moved yet; run it again.
	ErrLifecyclePending = errors.New("eventstore: stream archive or deletion pending")
)

// StreamArchivedError is the error of an append to an archived stream (or of archiving it again). Nothing was
// appended. It matches ErrStreamArchived, not ErrConcurrencyConflict: retrying cannot succeed.
type StreamArchivedError struct {
	Tenant   string
	StreamID string
	// Version is the stream's last event.
	Version    int64
	ArchivedAt time.Time
}

func (e *StreamArchivedError) Error() string {
	return fmt.Sprintf("eventstore: stream %q (tenant %q) is archived (at version %d, since %s) and takes no "+
		"appends", e.StreamID, e.Tenant, e.Version, e.ArchivedAt.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrStreamArchived) true.
func (e *StreamArchivedError) Is(target error) bool { return target == ErrStreamArchived }

// StreamDeletedError is the error of a load of, an append to, or an archive of a deleted stream. It matches
// ErrStreamDeleted and also ErrStreamNotFound (the stream's events are gone), not ErrConcurrencyConflict.
type StreamDeletedError struct {
	Tenant    string
	StreamID  string
	DeletedAt time.Time
}

func (e *StreamDeletedError) Error() string {
	return fmt.Sprintf("eventstore: stream %q (tenant %q) was deleted (%s); its ID cannot be used again",
		e.StreamID, e.Tenant, e.DeletedAt.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrStreamDeleted) and errors.Is(err, ErrStreamNotFound) true.
func (e *StreamDeletedError) Is(target error) bool {
	return target == ErrStreamDeleted || target == ErrStreamNotFound
}

// LifecyclePendingError is the error of an ArchiveStream or DeleteStream whose first step committed (the stream
// refuses appends, State says which operation) but whose events could not be moved: transactions that began
// before the first step were still open when the wait ended (Waiting of them; a transaction that began before
// could still append with its old view of the stream). Run the operation again once they have ended.
type LifecyclePendingError struct {
	Tenant   string
	StreamID string
	State    StreamState
	Waiting  int
	Err      error
}

func (e *LifecyclePendingError) Error() string {
	return fmt.Sprintf("eventstore: stream %q (tenant %q) is %s and refuses appends, but its events are not moved "+
		"yet: %d transactions that began before are still open (%v); run the operation again", e.StreamID,
		e.Tenant, e.State, e.Waiting, e.Err)
}

// Is makes errors.Is(err, ErrLifecyclePending) true.
func (e *LifecyclePendingError) Is(target error) bool { return target == ErrLifecyclePending }

// Unwrap returns what ended the wait.
func (e *LifecyclePendingError) Unwrap() error { return e.Err }

// lifecycleError is the error an append, a load or a lifecycle operation gets for a stream in state lc, or nil for
// an active stream.
func lifecycleError(lc StreamLifecycle) error {
	switch lc.State {
	case StreamArchiving, StreamArchived:
		return &StreamArchivedError{Tenant: lc.Tenant, StreamID: lc.StreamID, Version: lc.Version,
			ArchivedAt: lc.ArchivedAt}
	case StreamDeleting, StreamDeleted:
		return &StreamDeletedError{Tenant: lc.Tenant, StreamID: lc.StreamID, DeletedAt: lc.DeletedAt}
	}
	return nil
}

// checkLifecycleRequest validates and normalises req.
func checkLifecycleRequest(req *LifecycleRequest, op string, needReason bool) error {
	req.Tenant = tenantOrDefault(req.Tenant)
	if strings.TrimSpace(req.StreamID) == "" {
		return fmt.Errorf("%w: %s: StreamID must not be empty", ErrInvalidAppend, op)
	}
	if err := checkNames(AppendRequest{Tenant: req.Tenant, StreamID: req.StreamID}); err != nil {
		return fmt.Errorf("eventstore: %s: %w", op, err)
	}
	if err := checkName("Actor", req.Actor, MaxTypeLen); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalidAppend, op, err)
	}
	if err := checkName("Reason", req.Reason, 4096); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalidAppend, op, err)
	}
	if needReason && strings.TrimSpace(req.Reason) == "" {
		return fmt.Errorf("%w: %s of stream %q: a Reason is required (it is kept for the audit)", ErrInvalidAppend,
			op, req.StreamID)
	}
	return nil
}

// passes reports whether a log read with q returns r, a record the store holds at r.Position: tombstones
// (deleted events, with no payload) and lifecycle markers are passed over, except deletion markers when
// q.Deletions is set, which obey the stream type and tenant filters but not the event type filter.
func (q LogQuery) passes(r *Record, tombstone bool) bool {
	switch {
	case tombstone:
		return false
	case IsLifecycleMarker(r.Type):
		return q.Deletions && r.Type == StreamDeletedType && contains(q.StreamTypes, r.StreamType) &&
			contains(q.Tenants, r.Tenant)
	}
	return q.matches(r)
}
