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
	var out []WorkerStatus
	parked := map[string]int{}
	rows, err := db.Query(ctx, `SELECT worker, count(*) FROM `+parkedTable(schema)+` GROUP BY worker`)
	if err != nil {
		return nil, fmt.Errorf("staging: worker status: %w", err)
	}
	for rows.Next() {
		var w string
		var n int
		if err := rows.Scan(&w, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("staging: worker status: %w", err)
		}
		parked[w] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("staging: worker status: %w", err)
	}
	for _, kind := range []string{"reconciler", "stager"} {
		cps, err := logfollow.List(ctx, db, schema, kind)
		if err != nil {
			return nil, fmt.Errorf("staging: worker status: %w", err)
		}
		for _, c := range cps {
			s := WorkerStatus{Name: c.Name, Kind: c.Kind, State: WorkerState(c.State), Position: c.Position,
				LastError: c.LastError, LastErrorAt: c.LastErrorAt, FailingPosition: c.FailingPosition,
				Attempts: c.Attempts, Parked: parked[c.Name], Owner: c.Owner, LastEventAt: c.LastEventAt,
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

func parkedTable(schema string) string { return pgx.Identifier{schema, "staging_parked"}.Sanitize() }

// ListParkedWork returns the parked events of worker ("stager:NAME" or "reconciler:NAME"; "" for every worker) in
// schema, oldest position first.
func ListParkedWork(ctx context.Context, db DB, schema, worker string) ([]ParkedWork, error) {
	rows, err := db.Query(ctx, `SELECT id, worker, position, tenant_id, stream_id, stream_type, version, event_id,
			event_type, attempts, last_error, parked_at, replay_requested
		FROM `+parkedTable(schema)+` WHERE $1 = '' OR worker = $1 ORDER BY worker, position`, worker)
	if err != nil {
		return nil, fmt.Errorf("staging: list parked events: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParkedWork)
	if err != nil {
		return nil, fmt.Errorf("staging: list parked events: %w", err)
	}
	return out, nil
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
	for _, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("staging: list parked events: %w", err)
		}
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	var tenants []string
	if len(q.Tenants) > 0 {
		tenants = q.Tenants
	}
	rows, err := db.Query(ctx, `SELECT id, worker, position, tenant_id, stream_id, stream_type, version, event_id,
			event_type, attempts, last_error, parked_at, replay_requested
		FROM `+parkedTable(schema)+`
		WHERE ($1 = '' OR worker = $1) AND ($2::text[] IS NULL OR tenant_id = ANY ($2))
			AND ($3::bigint[] IS NULL OR id = ANY ($3)) AND id > $4
		ORDER BY id LIMIT $5`, q.Worker, tenants, q.IDs, q.AfterID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("staging: list parked events: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParkedWork)
	if err != nil {
		return nil, fmt.Errorf("staging: list parked events: %w", err)
	}
	return out, nil
}

func scanParkedWork(r pgx.CollectableRow) (ParkedWork, error) {
	var e ParkedWork
	err := r.Scan(&e.ID, &e.Worker, &e.Position, &e.Tenant, &e.StreamID, &e.StreamType, &e.Version,
		&e.EventID, &e.EventType, &e.Attempts, &e.LastError, &e.ParkedAt, &e.ReplayRequested)
	e.ParkedAt = e.ParkedAt.UTC()
	return e, err
}

// DiscardParkedWork deletes a parked event without staging it (an operator's decision). It returns
// ErrParkedNotFound when no such parked event exists.
func DiscardParkedWork(ctx context.Context, db DB, schema string, id int64) error {
	tag, err := db.Exec(ctx, `DELETE FROM `+parkedTable(schema)+` WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("staging: discard parked event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrParkedNotFound, id)
	}
	return nil
}

// RequestReplayWork asks the process running worker to replay its parked events ids (all when ids is empty),
// for code that has no Worker (a CLI). The running worker replays requested events every PollInterval: each is
// staged once and leaves the list, or stays with its new error and the request cleared. It returns how many
// events were marked.
func RequestReplayWork(ctx context.Context, db DB, schema, worker string, ids ...int64) (int64, error) {
	tag, err := db.Exec(ctx, `UPDATE `+parkedTable(schema)+` SET replay_requested = true
		WHERE worker = $1 AND (coalesce(cardinality($2::bigint[]), 0) = 0 OR id = ANY($2))`, worker, ids)
	if err != nil {
		return 0, fmt.Errorf("staging: request replay of parked events of %q: %w", worker, err)
	}
	return tag.RowsAffected(), nil
}

// park records the failed event in the parked list, in the transaction that moves the checkpoint past it.
func (w *Worker) park(ctx context.Context, tx pgx.Tx, failure *logfollow.HandlerError) error {
	rec := failure.Record
	_, err := tx.Exec(ctx, `INSERT INTO `+parkedTable(w.schema)+` AS pk (worker, position, tenant_id, stream_id,
			stream_type, version, event_id, event_type, attempts, last_error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (worker, position) DO UPDATE SET attempts = pk.attempts + EXCLUDED.attempts,
			last_error = EXCLUDED.last_error, parked_at = now()`,
		w.name, rec.Position, rec.Tenant, rec.StreamID, rec.StreamType, rec.Version, rec.EventID, rec.Type,
		failure.Attempts, failure.Err.Error())
	if err != nil {
		return fmt.Errorf("staging: %s: park event at position %d: %w", w.name, rec.Position, err)
	}
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
	pool := w.outbox.Pool()
	var pos int64
	var worker string
	err := pool.QueryRow(ctx, `SELECT position, worker FROM `+parkedTable(w.schema)+` WHERE id = $1`, id).
		Scan(&pos, &worker)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && worker != w.name) {
		return fmt.Errorf("%w: %d (worker %s)", ErrParkedNotFound, id, w.name)
	}
	if err != nil {
		return fmt.Errorf("staging: %s: read parked event %d: %w", w.name, id, err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		page, err := w.store.ReadLog(ctx, eventstore.LogQuery{After: pos - 1, Limit: 1})
		if err != nil {
			return fmt.Errorf("read event at position %d: %w", pos, err)
		}
		if len(page.Records) != 1 || page.Records[0].Position != pos {
			return fmt.Errorf("the event at position %d is no longer in the log", pos)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM `+parkedTable(w.schema)+` WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: %d (replayed or discarded meanwhile)", ErrParkedNotFound, id)
		}
		return w.stage(ctx, tx, page.Records, false)
	})
	if err == nil || errors.Is(err, ErrParkedNotFound) {
		return err
	}
	if _, uerr := pool.Exec(context.WithoutCancel(ctx), `UPDATE `+parkedTable(w.schema)+`
		SET attempts = attempts + 1, last_error = $2, replay_requested = false WHERE id = $1`, id,
		err.Error()); uerr != nil {
		w.logger.WarnContext(ctx, "stagehand: could not record a replay failure", "id", id, "error", uerr)
	}
	return fmt.Errorf("staging: %s: replay parked event %d: %w", w.name, id, err)
}

// replayRequested replays the parked events an operator asked for (RequestReplayWork), oldest first.
func (w *Worker) replayRequested(ctx context.Context) {
	rows, err := w.outbox.Pool().Query(ctx, `SELECT id FROM `+parkedTable(w.schema)+`
		WHERE worker = $1 AND replay_requested ORDER BY position`, w.name)
	if err != nil {
		if ctx.Err() == nil {
			w.logger.WarnContext(ctx, "stagehand: could not read replay requests", "worker", w.name, "error", err)
		}
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return
	}
	for _, id := range ids {
		if err := w.ReplayParked(ctx, id); err != nil && !errors.Is(err, ErrParkedNotFound) && ctx.Err() == nil {
			w.logger.WarnContext(ctx, "stagehand: requested replay of a parked event failed", "worker", w.name,
				"id", id, "error", err)
		}
	}
}

// replayLoop runs replayRequested every interval until ctx ends.
func (w *Worker) replayLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.replayRequested(ctx)
		}
	}
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
