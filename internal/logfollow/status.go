package logfollow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/lease"
)

// State is what a follower is doing, as seen from the database.
type State string

const (
	// StateRunning: a process holds the follower's lease and follows the log.
	StateRunning State = "running"
	// StateStopped: no process holds the lease (stopped gracefully, or died and its lease expired).
	StateStopped State = "stopped"
	// StateFailed: the follower stopped because an event exhausted its attempts; LastError says why.
	StateFailed State = "failed"
)

// Checkpoint is a follower's checkpoint row and lease, for status listings (CLI, health checks).
type Checkpoint struct {
	Name       string
	Kind       string
	ResetGroup string
	Filter     string
	Position   int64
	State      State
	// LastError is the last handler error (kept after recovery, with its time).
	LastError   string
	LastErrorAt time.Time
	// FailingPosition is the event being retried (0 when none) and Attempts how many times it failed so far.
	FailingPosition int64
	Attempts        int
	ResetRequested  bool
	// LastEventAt is when the last handled event was recorded; UpdatedAt when the row last changed.
	LastEventAt time.Time
	UpdatedAt   time.Time
	// Owner and Token describe the lease (empty / 0 when it was never taken); Held whether it is held now.
	Owner string
	Token int64
	Held  bool
}

// DB is what the status queries need; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB = lease.DB

// List returns the checkpoints of kind ("" for all), by name, read from the database (not from in-process state),
// so a CLI or a health check in another process sees every follower.
func List(ctx context.Context, db DB, schema, kind string) ([]Checkpoint, error) {
	// The leases are the lease package's; read first, so a follower that takes its lease while the checkpoints
	// are read is at worst shown stopped, never running without one.
	leases, err := lease.List(ctx, db, schema, LeasePrefix)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	byName := make(map[string]lease.Info, len(leases))
	for _, l := range leases {
		byName[l.Name] = l
	}
	list, err := checkpointStatement(schema, "list")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, list.SQL, list.Args(&checkpoint{Kind: kind})...)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Checkpoint, error) {
		var c Checkpoint
		var state string
		var errAt, evAt *time.Time
		err := r.Scan(&c.Name, &c.Kind, &c.ResetGroup, &c.Filter, &c.Position, &state, &c.LastError, &errAt,
			&c.FailingPosition, &c.Attempts, &c.ResetRequested, &evAt, &c.UpdatedAt)
		if l, ok := byName[LeasePrefix+c.Name]; ok {
			c.Owner, c.Token, c.Held = l.Owner, l.Token, l.Held
		}
		if errAt != nil {
			c.LastErrorAt = errAt.UTC()
		}
		if evAt != nil {
			c.LastEventAt = evAt.UTC()
		}
		c.UpdatedAt = c.UpdatedAt.UTC()
		switch {
		case state == string(StateFailed):
			c.State = StateFailed
		case c.Held:
			c.State = StateRunning
		default:
			c.State = StateStopped
		}
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	return out, nil
}

// Positions returns the checkpoint positions of a reset group's followers of kind, by name: what a lag gauge
// reads. A follower that never ran has none.
func Positions(ctx context.Context, db DB, schema, kind, group string) (map[string]int64, error) {
	positions, err := checkpointStatement(schema, "positions")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, positions.SQL, positions.Args(&checkpoint{ResetGroup: group, Kind: kind})...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint positions: %w", err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var pos int64
		if err := rows.Scan(&name, &pos); err != nil {
			rows.Close()
			return nil, fmt.Errorf("checkpoint positions: %w", err)
		}
		out[name] = pos
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint positions: %w", err)
	}
	return out, nil
}

// RequestReset asks every follower of a reset group to start again from position after of the log (0: from the
// beginning). The holder of a follower's lease performs it (OnReset, then the position) within about a
// PollInterval; a follower that is not running does it when it next starts. It returns how many checkpoints were
// marked (0 when the group never ran).
func RequestReset(ctx context.Context, db DB, schema, group string, after int64) (int64, error) {
	reset, err := checkpointStatement(schema, "request_reset")
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, reset.SQL, reset.Args(&checkpoint{ResetGroup: group, Position: after})...)
	if err != nil {
		return 0, fmt.Errorf("request reset of %q: %w", group, err)
	}
	return tag.RowsAffected(), nil
}

// Lag is how far a follower is behind the head of the log.
type Lag struct {
	// Position is the checkpoint; Head the highest committed position.
	Position, Head int64
	// Events is Head - Position: the positions still ahead (events filtered out, or holes left by aborted
	// appends, count too, so it is an upper bound on the events left to handle; 0 means caught up).
	Events int64
	// Time is how long the oldest event still ahead has been waiting (0 when caught up).
	Time time.Duration
}

// LagAt computes the lag of a checkpoint at position against store. now is the clock to measure time lag with.
func LagAt(ctx context.Context, store eventstore.Store, position int64, now time.Time) (Lag, error) {
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return Lag{}, err
	}
	lag := Lag{Position: position, Head: head, Events: max(head-position, 0)}
	if lag.Events > 0 {
		page, err := store.ReadLog(ctx, eventstore.LogQuery{After: position, Limit: 1})
		var rerr *eventstore.RecordError
		if errors.As(err, &rerr) {
			// The next event cannot be read, but when it was recorded is known: its wait is the lag.
			page, err = eventstore.LogPage{Records: []eventstore.Record{rerr.Record}}, nil
		}
		if err != nil {
			return Lag{}, err
		}
		if len(page.Records) > 0 {
			lag.Time = max(now.Sub(page.Records[0].RecordedAt), 0)
		}
	}
	return lag, nil
}

// Lag reads the follower's checkpoint from the database and measures its lag against the store.
func (f *Follower) Lag(ctx context.Context) (Lag, error) {
	var pos int64
	err := f.pool.QueryRow(ctx, f.q.position.SQL, f.q.position.Args(&checkpoint{Name: f.cfg.Name})...).Scan(&pos)
	if err != nil {
		return Lag{}, f.errorf("read checkpoint: %w", err)
	}
	return LagAt(ctx, f.store, pos, f.cfg.Clock())
}
