package projection

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
)

// State is what a projection (partition) is doing, as seen from the database.
type State string

const (
	// Running: a process holds the projection's lease and applies the log.
	Running State = "running"
	// Stopped: no process runs it (stopped, or died and its lease expired).
	Stopped State = "stopped"
	// Failed: it stopped because an event exhausted its attempts in Stop mode; LastError says why.
	Failed State = "failed"
)

// Status describes one projection checkpoint (one partition in partitioned mode). Everything in it is read from
// the database, so any process sees every projection.
type Status struct {
	// Projection is the projection's name; Checkpoint the checkpoint's ("name#i/n" for partition i of n).
	Projection string
	Checkpoint string
	Partition  int
	Partitions int
	State      State
	// Position is the checkpoint; Head the highest committed position of the log.
	Position, Head int64
	// Lag is Head - Position (positions filtered out or left empty by aborted appends count too: 0 means
	// caught up). TimeLag is how long the oldest event after the checkpoint has been waiting (0 when caught up).
	Lag     int64
	TimeLag time.Duration
	// LastError is the last handler error, and when it happened (kept after recovery).
	LastError   string
	LastErrorAt time.Time
	// FailingPosition is the event being retried (0 when none); Attempts how many times it failed so far.
	FailingPosition int64
	Attempts        int
	// Parked counts the parked events of this checkpoint.
	Parked int
	// Rebuilding is true from a rebuild request until the reset is done.
	Rebuilding bool
	// Filter is the log filter, as text.
	Filter string
	// Owner is the process holding (or last holding) the lease.
	Owner string
	// LastEventAt is when the last applied event was recorded; UpdatedAt when the checkpoint last changed.
	LastEventAt time.Time
	UpdatedAt   time.Time
}

// ListStatus returns the status of every projection in schema (every partition), by checkpoint name. It reads
// the database, not in-process state, so a CLI or a health check sees projections run by any process. Head, Lag
// and TimeLag are measured against store; with a nil store they are left zero.
func ListStatus(ctx context.Context, db DB, store eventstore.Store, schema string) ([]Status, error) {
	return listStatus(ctx, db, store, schema, "", time.Now)
}

// Status returns the status of this projection's checkpoints (one per partition).
func (p *Projection) Status(ctx context.Context) ([]Status, error) {
	return listStatus(ctx, p.pool, p.store, p.cfg.Schema, p.cfg.Name, p.cfg.Clock)
}

func listStatus(ctx context.Context, db DB, store eventstore.Store, schema, name string,
	now func() time.Time) ([]Status, error) {
	cps, err := logfollow.List(ctx, db, schema, kind)
	if err != nil {
		return nil, fmt.Errorf("projection: status: %w", err)
	}
	parkedBy, err := parked(schema).Counts(ctx, db, true)
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, c := range cps {
		s := Status{Projection: c.ResetGroup, Checkpoint: c.Name, Partitions: 1, State: State(c.State),
			Position: c.Position, LastError: c.LastError, LastErrorAt: c.LastErrorAt,
			FailingPosition: c.FailingPosition, Attempts: c.Attempts, Parked: parkedBy[c.Name],
			Rebuilding: c.ResetRequested, Filter: c.Filter, Owner: c.Owner, LastEventAt: c.LastEventAt,
			UpdatedAt: c.UpdatedAt}
		if name != "" && s.Projection != name {
			continue
		}
		if _, part, ok := strings.Cut(c.Name, "#"); ok {
			i, n, _ := strings.Cut(part, "/")
			s.Partition, _ = strconv.Atoi(i)
			s.Partitions, _ = strconv.Atoi(n)
		}
		if store != nil {
			lag, err := logfollow.LagAt(ctx, store, c.Position, now())
			if err != nil {
				return nil, fmt.Errorf("projection: status of %s: %w", c.Name, err)
			}
			s.Head, s.Lag, s.TimeLag = lag.Head, lag.Events, lag.Time
		}
		out = append(out, s)
	}
	return out, nil
}
