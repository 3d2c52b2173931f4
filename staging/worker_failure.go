package staging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
)

// DB is what the status and parked-event functions need; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB = logfollow.DB

// FailureMode is what a worker does with an event whose mapping or staging keeps failing (or that cannot be read).
// It is stagehand.FailureMode, the one failure mode of staging workers and projections.
type FailureMode = stagehand.FailureMode

const (
	// Stop (the default) stops the worker once an event has failed MaxAttempts times: Run returns a *WorkerError
	// naming the event, its status shows the failure, and every later event waits until an operator acts.
	Stop = stagehand.StopOnFailure
	// Park records the event in the parked list (ListParked) and goes on with the next: an operator replays it
	// (the running worker stages it) or discards it.
	Park = stagehand.ParkOnFailure
)

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

// ParkedEvent is an event a worker parked (Park failure mode); Owner is the worker's name ("stager:NAME" or
// "reconciler:NAME"). It is the one parked-event type of staging workers and projections.
type ParkedEvent = stagehand.ParkedEvent

// ParkedQuery selects a page of parked events (ListParkedPage); Owner keeps one worker's ("stager:NAME" or
// "reconciler:NAME"). Its zero value selects the first page of every worker's parked events.
type ParkedQuery = stagehand.ParkedQuery

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

// ListParked returns the parked events of worker ("stager:NAME" or "reconciler:NAME"; "" for every worker) in
// schema, oldest position first.
func ListParked(ctx context.Context, db DB, schema, worker string) ([]ParkedEvent, error) {
	if err := checkArgs(schema, worker); err != nil {
		return nil, err
	}
	return parked(schema).List(ctx, db, worker)
}

// ListParkedPage returns a page of the parked events in schema that q selects, in ID order (the earliest
// parked first), reading the parked table by its primary key: a long list is read a page at a time.
func ListParkedPage(ctx context.Context, db DB, schema string, q ParkedQuery) ([]ParkedEvent, error) {
	if err := checkArgs(schema, q.Owner); err != nil {
		return nil, err
	}
	for _, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("staging: list parked events: %w", err)
		}
	}
	return parked(schema).Page(ctx, db, q)
}

// DiscardParked deletes a parked event without staging it (an operator's decision). It returns
// ErrParkedNotFound when no such parked event exists.
func DiscardParked(ctx context.Context, db DB, schema string, id int64) error {
	if err := checkArgs(schema, ""); err != nil {
		return err
	}
	return parked(schema).Discard(ctx, db, id)
}

// RequestReplay asks the process running worker to replay its parked events ids (all when ids is empty),
// for code that has no Worker (a CLI). The running worker replays requested events every PollInterval: each is
// staged once and leaves the list, or stays with its new error and the request cleared. It returns how many
// events were marked.
func RequestReplay(ctx context.Context, db DB, schema, worker string, ids ...int64) (int64, error) {
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
func (w *Worker) Parked(ctx context.Context) ([]ParkedEvent, error) {
	return ListParked(ctx, w.outbox.Pool(), w.schema, w.name)
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

// replayRequested replays the parked events an operator asked for (RequestReplay), oldest first.
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
