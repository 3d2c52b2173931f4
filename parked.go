package stagehand

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// FailureMode is what a log follower (a projection, a staging worker) does with an event it failed to handle
// MaxAttempts times. projection and staging name its values Stop and Park.
type FailureMode int

const (
	// StopOnFailure stops the follower with its checkpoint just before the failing event: nothing after it is
	// handled until the cause is fixed and the follower restarted (or the event parked by an operator). The default.
	StopOnFailure FailureMode = iota
	// ParkOnFailure records the event as parked, in the transaction that moves the checkpoint past it, and goes on
	// with the next events. A parked event is replayed or discarded by an operator.
	ParkOnFailure
)

// String returns "stop" or "park".
func (m FailureMode) String() string {
	switch m {
	case StopOnFailure:
		return "stop"
	case ParkOnFailure:
		return "park"
	}
	return fmt.Sprintf("FailureMode(%d)", int(m))
}

// ParkedEvent is an event a log follower set aside under ParkOnFailure: the one shape of the parked events of
// projections (projection.ListParked) and of staging workers (staging.ListParked).
type ParkedEvent struct {
	// ID identifies the parked event for replay and discard.
	ID int64
	// Owner is the follower that parked it: the projection's name, or the staging worker's ("stager:NAME",
	// "reconciler:NAME").
	Owner string
	// Checkpoint is the checkpoint (a projection's partition) that parked it; "" for a staging worker.
	Checkpoint string
	// Position, Tenant, StreamID, StreamType, Version, EventID and EventType locate the event in the log.
	Position   int64
	Tenant     string
	StreamID   string
	StreamType string
	Version    int64
	EventID    uuid.UUID
	EventType  string
	// Attempts counts every failed attempt, replays included; LastError is the latest failure.
	Attempts  int
	LastError string
	ParkedAt  time.Time
	// ReplayRequested is true between a replay request and the replay attempt.
	ReplayRequested bool
}

// ParkedQuery selects a page of parked events. Its zero value selects the first page of every owner's parked
// events.
type ParkedQuery struct {
	// Owner keeps only one follower's parked events (a projection's name, or a staging worker's). Default "":
	// every owner's.
	Owner string
	// Tenants keeps only the events of these tenants (each checked with ValidateTenant). Default: every tenant's.
	Tenants []string
	// IDs keeps only these parked events. Default nil: all; an empty slice that is not nil selects none.
	IDs []int64
	// AfterID continues after the parked event with this ID: pages run in ID order, the earliest parked first.
	// Default 0: from the start.
	AfterID int64
	// Limit caps the page. Default 100.
	Limit int
}
