package projection

import (
	"context"
	"fmt"
	"slices"
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
	// NotStarted: a partition that no process has run yet, so it has no checkpoint. Status lists it beside the
	// partitions of its projection that have one (at Position 0), so they never look caught up without it.
	NotStarted State = "not-started"
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
	if err := logfollow.CheckSchema("projection", schema); err != nil {
		return nil, err
	}
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
		out = append(out, s)
	}
	out = withUnstarted(out)
	if store != nil {
		for i := range out {
			lag, err := logfollow.LagAt(ctx, store, out[i].Position, now())
			if err != nil {
				return nil, fmt.Errorf("projection: status of %s: %w", out[i].Checkpoint, err)
			}
			out[i].Head, out[i].Lag, out[i].TimeLag = lag.Head, lag.Events, lag.Time
		}
	}
	return out, nil
}

// withUnstarted adds, for every partitioned projection in sts, the partitions of its layout that have no
// checkpoint (NotStarted, at position 0): a partition's checkpoint appears when a process first runs it. sts stays
// ordered by checkpoint name.
func withUnstarted(sts []Status) []Status {
	type layout struct {
		projection, base string // base: the checkpoint name before "#i/n"
		n                int
	}
	ran := map[layout]map[int]bool{}
	for _, s := range sts {
		base, _, partitioned := strings.Cut(s.Checkpoint, "#")
		if !partitioned || s.Partitions < 2 {
			continue
		}
		l := layout{s.Projection, base, s.Partitions}
		if ran[l] == nil {
			ran[l] = map[int]bool{}
		}
		ran[l][s.Partition] = true
	}
	added := false
	for l, parts := range ran {
		for i := range l.n {
			if !parts[i] {
				sts = append(sts, Status{Projection: l.projection, Checkpoint: checkpointName(l.base, i, l.n),
					Partition: i, Partitions: l.n, State: NotStarted})
				added = true
			}
		}
	}
	if added {
		slices.SortStableFunc(sts, func(a, b Status) int { return strings.Compare(a.Checkpoint, b.Checkpoint) })
	}
	return sts
}
