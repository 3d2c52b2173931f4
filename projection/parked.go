package projection

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

// ParkedEvent is an event a projection gave up on (Park failure mode).
type ParkedEvent struct {
	ID         int64
	Projection string
	// Checkpoint is the checkpoint (partition) that parked it.
	Checkpoint string
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
	// ReplayRequested is true between RequestReplay and the replay attempt.
	ReplayRequested bool
}

// park records rec in the parked table, in the follower's transaction that moves the checkpoint past it.
func (p *Projection) park(ctx context.Context, tx pgx.Tx, checkpoint string, failure *HandlerError) error {
	rec := failure.Record
	_, err := tx.Exec(ctx, `INSERT INTO `+p.parkedTable()+` AS pk (projection, checkpoint, position, tenant_id,
			stream_id, stream_type, version, event_id, event_type, attempts, last_error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (projection, position) DO UPDATE SET attempts = pk.attempts + EXCLUDED.attempts,
			last_error = EXCLUDED.last_error, parked_at = now()`,
		p.cfg.Name, checkpoint, rec.Position, rec.Tenant, rec.StreamID, rec.StreamType, rec.Version, rec.EventID,
		rec.Type, failure.Attempts, failure.Err.Error())
	if err != nil {
		return fmt.Errorf("projection %s: park event at position %d: %w", p.cfg.Name, rec.Position, err)
	}
	p.cfg.Logger.WarnContext(ctx, "stagehand: projection parked an event", "position", rec.Position,
		"event_type", rec.Type, "stream_id", rec.StreamID, "error", failure.Err)
	return nil
}

func (p *Projection) parkedTable() string {
	return pgx.Identifier{p.cfg.Schema, "projection_parked"}.Sanitize()
}

// ListParked returns the parked events of the projection name in schema ("" for every projection), oldest
// position first.
func ListParked(ctx context.Context, db DB, schema, name string) ([]ParkedEvent, error) {
	rows, err := db.Query(ctx, `SELECT id, projection, checkpoint, position, tenant_id, stream_id, stream_type,
			version, event_id, event_type, attempts, last_error, parked_at, replay_requested
		FROM `+pgx.Identifier{schema, "projection_parked"}.Sanitize()+`
		WHERE $1 = '' OR projection = $1 ORDER BY projection, position`, name)
	if err != nil {
		return nil, fmt.Errorf("projection: list parked events: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("projection: list parked events: %w", err)
	}
	return out, nil
}

// ParkedQuery selects a page of parked events (ListParkedPage). Its zero value selects the first page of every
// projection's parked events.
type ParkedQuery struct {
	// Projection keeps only one projection's parked events. Default "": every projection's.
	Projection string
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

// ListParkedPage returns a page of the parked events in schema that q selects, in ID order (the earliest parked
// first), reading the parked table by its primary key: a long list is read a page at a time.
func ListParkedPage(ctx context.Context, db DB, schema string, q ParkedQuery) ([]ParkedEvent, error) {
	for _, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("projection: list parked events: %w", err)
		}
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	var tenants []string
	if len(q.Tenants) > 0 {
		tenants = q.Tenants
	}
	rows, err := db.Query(ctx, `SELECT id, projection, checkpoint, position, tenant_id, stream_id, stream_type,
			version, event_id, event_type, attempts, last_error, parked_at, replay_requested
		FROM `+pgx.Identifier{schema, "projection_parked"}.Sanitize()+`
		WHERE ($1 = '' OR projection = $1) AND ($2::text[] IS NULL OR tenant_id = ANY ($2))
			AND ($3::bigint[] IS NULL OR id = ANY ($3)) AND id > $4
		ORDER BY id LIMIT $5`, q.Projection, tenants, q.IDs, q.AfterID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("projection: list parked events: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("projection: list parked events: %w", err)
	}
	return out, nil
}

func scanParked(r pgx.CollectableRow) (ParkedEvent, error) {
	var e ParkedEvent
	err := r.Scan(&e.ID, &e.Projection, &e.Checkpoint, &e.Position, &e.Tenant, &e.StreamID, &e.StreamType,
		&e.Version, &e.EventID, &e.EventType, &e.Attempts, &e.LastError, &e.ParkedAt, &e.ReplayRequested)
	e.ParkedAt = e.ParkedAt.UTC()
	return e, err
}

// DiscardParked deletes a parked event without applying it (an operator's decision: it is then skipped for
// good, and only by this explicit call). It returns ErrParkedNotFound when no such parked event exists.
func DiscardParked(ctx context.Context, db DB, schema string, id int64) error {
	tag, err := db.Exec(ctx, `DELETE FROM `+pgx.Identifier{schema, "projection_parked"}.Sanitize()+
		` WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("projection: discard parked event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrParkedNotFound, id)
	}
	return nil
}

// Parked returns this projection's parked events.
func (p *Projection) Parked(ctx context.Context) ([]ParkedEvent, error) {
	return ListParked(ctx, p.pool, p.cfg.Schema, p.cfg.Name)
}

// ReplayParked applies a parked event again through the handler, in a transaction that deletes it from the
// parked table: on success it is applied exactly once and no longer parked; on failure nothing is applied, the
// parked row records the new error, and the error is returned. The event is applied after events that came later
// in the log (that is what parking means); handlers that care must be written for it.
func (p *Projection) ReplayParked(ctx context.Context, id int64) error {
	var pe ParkedEvent
	err := p.pool.QueryRow(ctx, `SELECT position, projection FROM `+p.parkedTable()+` WHERE id = $1`, id).
		Scan(&pe.Position, &pe.Projection)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && pe.Projection != p.cfg.Name) {
		return fmt.Errorf("%w: %d (projection %s)", ErrParkedNotFound, id, p.cfg.Name)
	}
	if err != nil {
		return fmt.Errorf("projection %s: read parked event %d: %w", p.cfg.Name, id, err)
	}
	page, err := p.store.ReadLog(ctx, eventstore.LogQuery{After: pe.Position - 1, Limit: 1})
	if err != nil {
		return fmt.Errorf("projection %s: read event at position %d: %w", p.cfg.Name, pe.Position, err)
	}
	if len(page.Records) != 1 || page.Records[0].Position != pe.Position {
		return fmt.Errorf("projection %s: the event at position %d is no longer in the log", p.cfg.Name,
			pe.Position)
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM `+p.parkedTable()+` WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: %d (replayed or discarded meanwhile)", ErrParkedNotFound, id)
		}
		return p.handle(ctx, tx, page.Records)
	})
	if err == nil || errors.Is(err, ErrParkedNotFound) {
		return err
	}
	if _, uerr := p.pool.Exec(context.WithoutCancel(ctx), `UPDATE `+p.parkedTable()+`
		SET attempts = attempts + 1, last_error = $2, replay_requested = false WHERE id = $1`, id,
		err.Error()); uerr != nil {
		p.cfg.Logger.WarnContext(ctx, "stagehand: could not record a replay failure", "id", id, "error", uerr)
	}
	return fmt.Errorf("projection %s: replay parked event %d: %w", p.cfg.Name, id, err)
}

// RequestReplay asks the processes running the projection name to replay its parked events ids (all of them
// when ids is empty), for code that has no Projection (a CLI). A running projection replays requested events
// every PollInterval with ReplayParked: each is applied exactly once and leaves the parked table, or stays with
// its new error and the request cleared. It returns how many events were marked.
func RequestReplay(ctx context.Context, db DB, schema, name string, ids ...int64) (int64, error) {
	tag, err := db.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "projection_parked"}.Sanitize()+`
		SET replay_requested = true WHERE projection = $1 AND (coalesce(cardinality($2::bigint[]), 0) = 0 OR id = ANY($2))`,
		name, ids)
	if err != nil {
		return 0, fmt.Errorf("projection: request replay of parked events of %q: %w", name, err)
	}
	return tag.RowsAffected(), nil
}

// replayRequested replays the parked events an operator asked for (RequestReplay), oldest first.
func (p *Projection) replayRequested(ctx context.Context) {
	rows, err := p.pool.Query(ctx, `SELECT id FROM `+p.parkedTable()+`
		WHERE projection = $1 AND replay_requested ORDER BY position`, p.cfg.Name)
	if err != nil {
		if ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "stagehand: could not read replay requests", "error", err)
		}
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return
	}
	for _, id := range ids {
		if err := p.ReplayParked(ctx, id); err != nil && !errors.Is(err, ErrParkedNotFound) && ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "stagehand: requested replay of a parked event failed", "id", id,
				"error", err)
		}
	}
}
