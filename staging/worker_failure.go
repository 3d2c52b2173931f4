package staging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
)

// DB is what the status and parked-event functions need; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB = logfollow.DB

// FailureMode is what a worker does with an event whose mapping or staging keeps failing (or that cannot be read).
type FailureMode int

const (
	// Stop (the default) stops the worker once an event has failed MaxAttempts times: Run returns a *WorkerError
	// naming the event, its status shows the failure, and every later event waits until an operator acts.
	Stop FailureMode = iota
	// Park records the event in the parked list (ParkedWork) and goes on with the next: an operator replays it
	// (the running worker stages it) or discards it.
	Park
)

func (m FailureMode) String() string {
	switch m {
	case Stop:
		return "stop"
	case Park:
		return "park"
	}
	return fmt.Sprintf("FailureMode(%d)", int(m))
}

// ErrParkedNotFound: no parked event with that ID (replayed or discarded meanwhile, or another worker's).
var ErrParkedNotFound = errors.New("staging: parked event not found")

// WorkerState is what a worker is doing, as seen from the database.
type WorkerState string

const (
	// WorkerRunning: a process holds the worker's lease and follows the log.
	WorkerRunning WorkerState = "running"
	// WorkerStopped: no process runs it.
	WorkerStopped WorkerState = "stopped"
	// WorkerFailed: it stopped because an event exhausted its attempts under Stop; LastError says why.
	WorkerFailed WorkerState = "failed"
)

// WorkerStatus describes one staging worker, read from the database (any process sees every worker).
type WorkerStatus struct {
	// Name is the checkpoint name ("stager:NAME" or "reconciler:NAME"); Kind "stager" or "reconciler".
	Name, Kind string
	State      WorkerState
	// Position is the checkpoint; Head the highest committed position; Lag = Head - Position; TimeLag how long
	// the oldest event after the checkpoint has been waiting. Head, Lag and TimeLag are zero without a store.
	Position, Head, Lag int64
	TimeLag             time.Duration
	// LastError is the last failure, and when it happened (kept after recovery).
	LastError   string
	LastErrorAt time.Time
	// FailingPosition is the event being retried (0 when none); Attempts how many times it failed so far.
	FailingPosition int64
	Attempts        int
	// Parked counts the worker's parked events.
	Parked int
	// Owner is the process holding (or last holding) the lease.
	Owner       string
	LastEventAt time.Time
	UpdatedAt   time.Time
}

// ListWorkerStatus returns the status of every Deferred stager and reconciler in schema, read-only (it builds no
// worker), for monitoring processes, health checks and the CLI. store measures lag; nil leaves it zero.
func ListWorkerStatus(ctx context.Context, db DB, store eventstore.Store, schema string) (
	[]WorkerStatus, error) {
	if err := checkArgs(schema, ""); err != nil {
		return nil, err
	}
	var out []WorkerStatus
	parkedBy, err := parked(schema).Counts(ctx, db, false)
	if err != nil {
		return nil, err
	}
	for _, kind := range []string{"reconciler", "stager"} {
		cps, err := logfollow.List(ctx, db, schema, kind)
		if err != nil {
			return nil, fmt.Errorf("staging: worker status: %w", err)
		}
		for _, c := range cps {
			s := WorkerStatus{Name: c.Name, Kind: c.Kind, State: WorkerState(c.State), Position: c.Position,
				LastError: c.LastError, LastErrorAt: c.LastErrorAt, FailingPosition: c.FailingPosition,
				Attempts: c.Attempts, Parked: parkedBy[c.Name], Owner: c.Owner, LastEventAt: c.LastEventAt,
				UpdatedAt: c.UpdatedAt}
			if store != nil {
				lag, err := logfollow.LagAt(ctx, store, c.Position, time.Now())
				if err != nil {
					return nil, fmt.Errorf("staging: status of %s: %w", c.Name, err)
				}
				s.Head, s.Lag, s.TimeLag = lag.Head, lag.Events, lag.Time
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// ParkedWork is an event a worker parked (Park failure mode).
type ParkedWork struct {
	ID         int64
	Worker     string
	Position   int64
	Tenant     string
	StreamID   string
	StreamType string
	Version    int64
	EventID    uuid.UUID
	EventType  string
	Attempts   int
	LastError  string
	ParkedAt   time.Time
	// ReplayRequested is true between RequestReplayWork and the replay attempt.
	ReplayRequested bool
}

// checkArgs refuses the schema and worker name arguments of an exported function as the constructors refuse them
// (a *ConfigError matching ErrInvalidConfig).
func checkArgs(schema, worker string) error {
	if err := logfollow.CheckSchema("staging", schema); err != nil {
		return err
	}
	return logfollow.CheckName("staging", "worker", worker)
}

// parked is the staging workers' parked-event table.
func parked(schema string) logfollow.Parked {
	return logfollow.NewParked(schema, "staging_parked", "worker", false, ErrParkedNotFound, "staging")
}

// ListParkedWork returns the parked events of worker ("stager:NAME" or "reconciler:NAME"; "" for every worker) in
// schema, oldest position first.
func ListParkedWork(ctx context.Context, db DB, schema, worker string) ([]ParkedWork, error) {
	if err := checkArgs(schema, worker); err != nil {
		return nil, err
	}
	evs, err := parked(schema).List(ctx, db, worker)
	return parkedWork(evs), err
}

func parkedWork(evs []logfollow.ParkedEvent) []ParkedWork {
	if evs == nil {
		return nil
	}
	out := make([]ParkedWork, len(evs))
	for i, e := range evs {
		out[i] = ParkedWork{ID: e.ID, Worker: e.Owner, Position: e.Position, Tenant: e.Tenant, StreamID: e.StreamID,
			StreamType: e.StreamType, Version: e.Version, EventID: e.EventID, EventType: e.EventType,
			Attempts: e.Attempts, LastError: e.LastError, ParkedAt: e.ParkedAt, ReplayRequested: e.ReplayRequested}
	}
	return out
}

// ParkedWorkQuery selects a page of parked events (ListParkedWorkPage). Its zero value selects the first page of
// every worker's parked events.
type ParkedWorkQuery struct {
	// Worker keeps only one worker's parked events ("stager:NAME" or "reconciler:NAME"). Default "": every
	// worker's.
	Worker string
	// Tenants keeps only the events of these tenants (each checked with stagehand.ValidateTenant). Default: every
	// tenant's.
	Tenants []string
	// IDs keeps only these parked events. Default nil: all; an empty slice that is not nil selects none.
	IDs []int64
	// AfterID continues after the parked event with this ID: pages run in ID order, the earliest parked first.
	// Default 0: from the start.
	AfterID int64
	// Limit caps the page. Default 100.
	Limit int
}

// ListParkedWorkPage returns a page of the parked events in schema that q selects, in ID order (the earliest
// parked first), reading the parked table by its primary key: a long list is read a page at a time.
func ListParkedWorkPage(ctx context.Context, db DB, schema string, q ParkedWorkQuery) ([]ParkedWork, error) {
	if err := checkArgs(schema, q.Worker); err != nil {
		return nil, err
	}
	for _, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("staging: list parked events: %w", err)
		}
	}
	evs, err := parked(schema).Page(ctx, db, logfollow.ParkedPage{Owner: q.Worker, Tenants: q.Tenants, IDs: q.IDs,
		AfterID: q.AfterID, Limit: q.Limit})
	return parkedWork(evs), err
}

// DiscardParkedWork deletes a parked event without staging it (an operator's decision). It returns
// ErrParkedNotFound when no such parked event exists.
func DiscardParkedWork(ctx context.Context, db DB, schema string, id int64) error {
	if err := checkArgs(schema, ""); err != nil {
		return err
	}
	return parked(schema).Discard(ctx, db, id)
}

// RequestReplayWork asks the process running worker to replay its parked events ids (all when ids is empty),
// for code that has no Worker (a CLI). The running worker replays requested events every PollInterval: each is
// staged once and leaves the list, or stays with its new error and the request cleared. It returns how many
// events were marked.
func RequestReplayWork(ctx context.Context, db DB, schema, worker string, ids ...int64) (int64, error) {
	if err := checkArgs(schema, worker); err != nil {
		return 0, err
	}
	return parked(schema).RequestReplay(ctx, db, worker, ids...)
}

// park records the failed event in the parked list, in the transaction that moves the checkpoint past it.
func (w *Worker) park(ctx context.Context, tx pgx.Tx, failure *logfollow.HandlerError) error {
	if err := parked(w.schema).Park(ctx, tx, w.name, "", failure); err != nil {
		return err
	}
	rec := failure.Record
	w.logger.WarnContext(ctx, "stagehand: staging worker parked an event", "worker", w.name,
		"position", rec.Position, "event_type", rec.Type, "stream_id", rec.StreamID, "error", failure.Err)
	return nil
}

// Parked returns the worker's parked events.
func (w *Worker) Parked(ctx context.Context) ([]ParkedWork, error) {
	return ListParkedWork(ctx, w.outbox.Pool(), w.schema, w.name)
}

// ReplayParked stages a parked event again, in a transaction that deletes it from the parked list: on success
// its messages are staged once and it is no longer parked; on failure nothing is staged, the parked row records
// the new error, and the error is returned.
func (w *Worker) ReplayParked(ctx context.Context, id int64) error {
	return parked(w.schema).Replay(ctx, w.outbox.Pool(), w.store, w.name, id,
		func(ctx context.Context, tx pgx.Tx, rec eventstore.Record) error {
			return w.stage(ctx, tx, []eventstore.Record{rec}, false)
		})
}

// replayRequested replays the parked events an operator asked for (RequestReplayWork), oldest first.
func (w *Worker) replayRequested(ctx context.Context) {
	parked(w.schema).ReplayRequested(ctx, w.outbox.Pool(), w.name, w.logger, w.ReplayParked)
}

func workerError(name string, err error) error {
	var herr *logfollow.HandlerError
	if errors.As(err, &herr) {
		return &WorkerError{Worker: name, Record: herr.Record, Attempts: herr.Attempts, Err: herr.Err}
	}
	return err
}

// onExhausted is the follower's OnExhausted for mode: nil (stop) or park.
func (w *Worker) onExhausted(mode FailureMode) func(context.Context, pgx.Tx, *logfollow.HandlerError) error {
	if mode != Park {
		return nil
	}
	return w.park
}
