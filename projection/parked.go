package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
)

// DB is what the status and parked-event functions need; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB = logfollow.DB

// ParkedEvent is an event a projection gave up on (Park failure mode); Owner is the projection's name. It is the
// one parked-event type of projections and staging workers.
type ParkedEvent = stagehand.ParkedEvent

// ParkedQuery selects a page of parked events (ListParkedPage); Owner keeps one projection's. Its zero value
// selects the first page of every projection's parked events.
type ParkedQuery = stagehand.ParkedQuery

// parked is the projections' parked-event table.
func parked(schema string) logfollow.Parked {
	return logfollow.NewParked(schema, "projection_parked", "projection", true, ErrParkedNotFound, "projection")
}

// checkArgs refuses the schema and projection name arguments of an exported function as the constructor refuses
// them (a *ConfigError matching ErrInvalidConfig).
func checkArgs(schema, name string) error {
	if err := logfollow.CheckSchema("projection", schema); err != nil {
		return err
	}
	return logfollow.CheckName("projection", "name", name)
}

// park records rec in the parked table, in the follower's transaction that moves the checkpoint past it.
func (p *Projection) park(ctx context.Context, tx pgx.Tx, checkpoint string, failure *logfollow.HandlerError) error {
	if err := parked(p.cfg.Schema).Park(ctx, tx, p.cfg.Name, checkpoint, failure); err != nil {
		return err
	}
	rec := failure.Record
	p.cfg.Logger.WarnContext(ctx, "stagehand: projection parked an event", "position", rec.Position,
		"event_type", rec.Type, "stream_id", rec.StreamID, "error", failure.Err)
	return nil
}

// ListParked returns the parked events of the projection name in schema ("" for every projection), oldest
// position first.
func ListParked(ctx context.Context, db DB, schema, name string) ([]ParkedEvent, error) {
	if err := checkArgs(schema, name); err != nil {
		return nil, err
	}
	return parked(schema).List(ctx, db, name)
}

// ListParkedPage returns a page of the parked events in schema that q selects, in ID order (the earliest parked
// first), reading the parked table by its primary key: a long list is read a page at a time.
func ListParkedPage(ctx context.Context, db DB, schema string, q ParkedQuery) ([]ParkedEvent, error) {
	if err := checkArgs(schema, q.Owner); err != nil {
		return nil, err
	}
	for _, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("projection: list parked events: %w", err)
		}
	}
	return parked(schema).Page(ctx, db, q)
}

// DiscardParked deletes a parked event without applying it (an operator's decision: it is then skipped for
// good, and only by this explicit call). It returns ErrParkedNotFound when no such parked event exists.
func DiscardParked(ctx context.Context, db DB, schema string, id int64) error {
	if err := checkArgs(schema, ""); err != nil {
		return err
	}
	return parked(schema).Discard(ctx, db, id)
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
	return parked(p.cfg.Schema).Replay(ctx, p.pool, p.store, p.cfg.Name, id,
		func(ctx context.Context, tx pgx.Tx, rec eventstore.Record) error {
			return p.handle(ctx, tx, []eventstore.Record{rec})
		})
}

// RequestReplay asks the processes running the projection name to replay its parked events ids (all of them
// when ids is empty), for code that has no Projection (a CLI). A running projection replays requested events
// every PollInterval with ReplayParked: each is applied exactly once and leaves the parked table, or stays with
// its new error and the request cleared. It returns how many events were marked.
func RequestReplay(ctx context.Context, db DB, schema, name string, ids ...int64) (int64, error) {
	if err := checkArgs(schema, name); err != nil {
		return 0, err
	}
	return parked(schema).RequestReplay(ctx, db, name, ids...)
}

// replayRequested replays the parked events an operator asked for (RequestReplay), oldest first.
func (p *Projection) replayRequested(ctx context.Context) {
	parked(p.cfg.Schema).ReplayRequested(ctx, p.pool, p.cfg.Name, p.cfg.Logger, p.ReplayParked)
}
