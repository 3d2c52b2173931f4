package aggregate

import (
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

// Errors of the aggregate package. Compare with errors.Is.
var (
	// ErrNotFound: the aggregate has no stored events. It also matches eventstore.ErrStreamNotFound.
	ErrNotFound = errors.New("aggregate: not found")
	// ErrUnknownEvent: a stored event's type is not registered (and no upcaster handles it).
	ErrUnknownEvent = errors.New("aggregate: unknown event type")
	// ErrDecode: a stored event's payload could not be decoded or upcast.
	ErrDecode = errors.New("aggregate: cannot decode event")
	// ErrUnregisteredEvent: a raised event's Go type is not registered.
	ErrUnregisteredEvent = errors.New("aggregate: event type not registered")
	// ErrPointerEvent: an event was raised as a pointer (Raise(a, &E{})). Save refuses it before anything is
	// written: stored events load as values, so an Apply written for one of the two forms would miss the other.
	ErrPointerEvent = errors.New("aggregate: event raised as a pointer")
	// ErrRegistration: a registration was invalid (empty or duplicate name, bad version).
	ErrRegistration = errors.New("aggregate: invalid registration")
	// ErrInvalidConfig: a repository was constructed with invalid configuration.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrNotTransactional: SaveTx was called on a repository whose store cannot append on a caller's transaction.
	ErrNotTransactional = errors.New("aggregate: the event store does not support transactional appends")
	// ErrTenantMismatch: an aggregate loaded under one tenant was saved under another.
	ErrTenantMismatch = errors.New("aggregate: tenant mismatch")
	// ErrWrongType: the stream exists but belongs to another aggregate type.
	ErrWrongType = errors.New("aggregate: stream belongs to another aggregate type")
	// ErrAlreadyExists: a new aggregate (Create, CreateTx, or Save of an aggregate from New) was saved with an ID
	// whose stream already exists. It matches an *AlreadyExistsError, which also matches
	// eventstore.ErrConcurrencyConflict.
	ErrAlreadyExists = errors.New("aggregate: already exists")
)

// AlreadyExistsError reports that a new aggregate could not be stored because its stream already exists: the
// append expected no stream and found one. Nothing was stored.
//
// It matches ErrAlreadyExists and also, through Unwrap, eventstore.ErrConcurrencyConflict (errors.As finds the
// *eventstore.ConflictError): the failure is an optimistic-concurrency check that lost, so code that treats a
// conflict as "someone else wrote first" keeps working, and an inbox reruns a handler that returns it as
// contention (a rerun that loads the aggregate, rather than creating it, then succeeds).
type AlreadyExistsError struct {
	// Type is the aggregate type's stable name.
	Type string
	// ID is the aggregate ID (the stream ID).
	ID string
	// Tenant owns the stream.
	Tenant string
	// Version is the stream's version when the save failed (0 when the store could not read it, for instance
	// from inside a transaction whose snapshot predates the stream).
	Version int64
	// Err is the store's conflict error.
	Err error
}

func (e *AlreadyExistsError) Error() string {
	at := ""
	if e.Version > 0 {
		at = fmt.Sprintf(" at version %d", e.Version)
	}
	return fmt.Sprintf("aggregate: %s %q (tenant %q) already exists%s: load it and update it instead (Update, "+
		"UpdateTx), or use Upsert or UpsertTx", e.Type, e.ID, e.Tenant, at)
}

// Is matches ErrAlreadyExists.
func (e *AlreadyExistsError) Is(target error) bool { return target == ErrAlreadyExists }

// Unwrap returns the store's conflict error (it matches eventstore.ErrConcurrencyConflict).
func (e *AlreadyExistsError) Unwrap() error { return e.Err }

// UnknownEventError reports a stored event whose type the registry does not know. It matches ErrUnknownEvent.
type UnknownEventError struct {
	Record eventstore.Record
}

func (e *UnknownEventError) Error() string {
	return fmt.Sprintf("aggregate: unknown event type %q (version %d) at version %d of stream %q (tenant %q, "+
		"position %d): register it with aggregate.RegisterEvent or an upcaster", e.Record.Type,
		e.Record.TypeVersion, e.Record.Version, e.Record.StreamID, e.Record.Tenant, e.Record.Position)
}

// Is matches ErrUnknownEvent.
func (e *UnknownEventError) Is(target error) bool { return target == ErrUnknownEvent }

// DecodeError reports a stored event that could not be decoded or upcast. It matches ErrDecode and unwraps to the
// codec's or upcaster's error.
type DecodeError struct {
	Record eventstore.Record
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("aggregate: cannot decode event %q (version %d) at version %d of stream %q (tenant %q, "+
		"position %d): %v", e.Record.Type, e.Record.TypeVersion, e.Record.Version, e.Record.StreamID,
		e.Record.Tenant, e.Record.Position, e.Err)
}

// Is matches ErrDecode.
func (e *DecodeError) Is(target error) bool { return target == ErrDecode }

// Unwrap returns the underlying error.
func (e *DecodeError) Unwrap() error { return e.Err }

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "aggregate"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError
