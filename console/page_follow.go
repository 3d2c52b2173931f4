package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// followerView is a projection checkpoint or a staging worker, as the pages list them.
type followerView struct {
	Name, Checkpoint clipped
	Kind, State      string
	Partition        string
	Position, Head   int64
	Lag              int64
	TimeLag          time.Duration
	LastError        clipped
	LastErrorAgo     time.Duration
	Failing          int64
	Attempts         int
	Parked           int
	Rebuilding       bool
	Owner            clipped
	LastEventAgo     time.Duration
	Link             string
}

type followersPage struct {
	Projections []followerView
	Workers     []followerView
	// ParkedForm lists the parked events of the scope (a tenant's console: its own).
	ParkedForm parkedForm
	// Scoped is true in a tenant's console, which lists only the tenant's parked events.
	Scoped bool
	Next   string
}

type parkedView struct {
	ID                              int64
	Owner, Stream, StreamType, Type clipped
	Tenant                          clipped
	Kind                            string
	Position, Version               int64
	Attempts                        int
	LastError                       clipped
	Ago                             time.Duration
	ReplayRequested                 bool
	EventLink, OwnerLink            string
}

// followersPage lists the projections (each checkpoint) and staging workers with their state, position, lag and
// last error, and the parked events. A tenant's console shows the tenant's parked events only: the checkpoints
// serve every tenant.
func (c *Console) followersPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	now := c.cfg.Clock()
	p := followersPage{Scoped: !c.estate()}
	if c.estate() {
		sts, err := c.projectionStatus(ctx, "")
		if err != nil {
			return err
		}
		for _, s := range sts {
			p.Projections = append(p.Projections, c.projectionView(s, now))
		}
		ws, err := staging.ListWorkerStatus(ctx, c.cfg.Pool, c.store, c.cfg.Schema)
		if err != nil {
			return err
		}
		for _, s := range ws {
			p.Workers = append(p.Workers, c.workerView(s, now))
		}
	}
	parked, next, err := c.parked(ctx, r.URL.Query().Get("after"), "", "", now)
	if err != nil {
		return err
	}
	p.ParkedForm, p.Next = parkedForm{Rows: parked, Back: c.link("/projections")}, next
	c.render(w, r, http.StatusOK, "projections", "Projections and workers", p)
	return nil
}

// projectionStatus lists the projections' checkpoints (of name, or every one).
func (c *Console) projectionStatus(ctx context.Context, name string) ([]projection.Status, error) {
	sts, err := projection.ListStatus(ctx, c.cfg.Pool, c.store, c.cfg.Schema)
	if err != nil || name == "" {
		return sts, err
	}
	var out []projection.Status
	for _, s := range sts {
		if s.Projection == name {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *Console) projectionView(s projection.Status, now time.Time) followerView {
	v := followerView{Name: clip(s.Projection, 200), Checkpoint: clip(s.Checkpoint, 200), Kind: "projection",
		State: string(s.State), Position: s.Position, Head: s.Head, Lag: s.Lag, TimeLag: s.TimeLag,
		LastError: clip(s.LastError, 300), Failing: s.FailingPosition, Attempts: s.Attempts, Parked: s.Parked,
		Rebuilding: s.Rebuilding, Owner: clip(s.Owner, 200), Link: c.link("/projection", "name", s.Projection)}
	if s.Partitions > 1 {
		v.Partition = strconv.Itoa(s.Partition) + "/" + strconv.Itoa(s.Partitions)
	}
	if !s.LastErrorAt.IsZero() {
		v.LastErrorAgo = max(now.Sub(s.LastErrorAt), 0)
	}
	if !s.LastEventAt.IsZero() {
		v.LastEventAgo = max(now.Sub(s.LastEventAt), 0)
	}
	return v
}

func (c *Console) workerView(s staging.WorkerStatus, now time.Time) followerView {
	v := followerView{Name: clip(s.Name, 200), Checkpoint: clip(s.Name, 200), Kind: s.Kind, State: string(s.State),
		Position: s.Position, Head: s.Head, Lag: s.Lag, TimeLag: s.TimeLag, LastError: clip(s.LastError, 300),
		Failing: s.FailingPosition, Attempts: s.Attempts, Parked: s.Parked, Owner: clip(s.Owner, 200),
		Link: c.link("/projection", "worker", s.Name)}
	if !s.LastErrorAt.IsZero() {
		v.LastErrorAgo = max(now.Sub(s.LastErrorAt), 0)
	}
	if !s.LastEventAt.IsZero() {
		v.LastEventAgo = max(now.Sub(s.LastEventAt), 0)
	}
	return v
}

// parkedForm is a list of parked events, with what its replay and discard forms need: the projection or worker
// they belong to (Owner, Kind; "" for a list of every one's, which offers no action) and the page to return to.
type parkedForm struct {
	Rows        []parkedView
	Owner, Kind string
	Back        string
}

// parkedList is what the "parked" template gets: the form and the page's view.
type parkedList struct {
	View view
	parkedForm
}

// parkedCursor is the keyset of a parked-events page: the last projection and worker IDs shown.
type parkedCursor struct {
	Projection int64 `json:"p"`
	Worker     int64 `json:"w"`
}

// parked lists a page of parked events: of the projection or the worker named (or of every one), of the scope's
// tenant in a tenant's console; projections' first, then workers'.
func (c *Console) parked(ctx context.Context, cursor, projectionName, workerName string, now time.Time) (
	[]parkedView, string, error) {
	var k parkedCursor
	if cursor != "" {
		if err := decodeCursor(cursor, &k); err != nil {
			return nil, "", err
		}
	}
	var out []parkedView
	next := k
	for _, part := range []struct {
		ops   parkedOps
		owner string
		after *int64
		skip  bool
	}{
		{parkedOf("projection"), projectionName, &next.Projection, workerName != ""},
		{parkedOf("worker"), workerName, &next.Worker, projectionName != ""},
	} {
		room := c.cfg.PageSize - len(out)
		if part.skip || room <= 0 {
			continue
		}
		evs, err := part.ops.page(ctx, c.cfg.Pool, c.cfg.Schema, stagehand.ParkedQuery{Owner: part.owner,
			Tenants: c.tenants, AfterID: *part.after, Limit: room})
		if err != nil {
			return nil, "", err
		}
		for _, e := range evs {
			out = append(out, parkedView{ID: e.ID, Owner: clip(e.Owner, 200), Kind: part.ops.kind,
				Tenant: clip(e.Tenant, 120), Stream: clip(e.StreamID, 200), StreamType: clip(e.StreamType, 200),
				Type: clip(e.EventType, 200), Position: e.Position, Version: e.Version, Attempts: e.Attempts,
				LastError: clip(e.LastError, 300), Ago: max(now.Sub(e.ParkedAt), 0),
				ReplayRequested: e.ReplayRequested,
				EventLink:       c.link("/events", "position", strconv.FormatInt(e.Position, 10)),
				OwnerLink:       c.link("/projection", part.ops.ownerArg, e.Owner)})
			*part.after = e.ID
		}
		if len(evs) == room {
			return out, encodeCursor(next), nil
		}
	}
	return out, "", nil
}

type projectionPage struct {
	Name    clipped
	RawName string
	Worker  bool
	// Checkpoints are its partitions (one for an unpartitioned projection, or the worker).
	Checkpoints []followerView
	ParkedForm  parkedForm
	Next        string
	// Rebuild is the progress of the latest rebuild the console requested (nil when none).
	Rebuild *rebuildView
	// CanRebuild is true for a projection in an estate-wide console.
	CanRebuild bool
	Back       string
}

// rebuildView follows a rebuild the console requested: until the running process resets the projection
// (Requested), then while it replays the log up to the head at the request (Position of Target), then done.
type rebuildView struct {
	By               clipped
	Ago              time.Duration
	Target, Position int64
	Percent          int
	Waiting, Done    bool
	Error            clipped
}

// projectionPage shows one projection (every partition) or one staging worker: state, position, lag, last error,
// its parked events with the forms to replay or discard them, and for a projection the form to request a rebuild
// and the progress of the latest one.
func (c *Console) projectionPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	now := c.cfg.Clock()
	name, err := textParam("name", q.Get("name"), 255)
	if err != nil {
		return err
	}
	worker, err := textParam("worker", q.Get("worker"), 255)
	if err != nil {
		return err
	}
	p := projectionPage{Worker: worker != ""}
	if p.Worker {
		name = worker
	}
	if name == "" {
		return badRequest("name (or worker) is required")
	}
	p.Name, p.RawName = clip(name, 255), name
	if c.estate() {
		if p.Worker {
			ws, err := staging.ListWorkerStatus(ctx, c.cfg.Pool, c.store, c.cfg.Schema)
			if err != nil {
				return err
			}
			for _, s := range ws {
				if s.Name == name {
					p.Checkpoints = append(p.Checkpoints, c.workerView(s, now))
				}
			}
		} else {
			sts, err := c.projectionStatus(ctx, name)
			if err != nil {
				return err
			}
			for _, s := range sts {
				p.Checkpoints = append(p.Checkpoints, c.projectionView(s, now))
			}
			p.CanRebuild = len(sts) > 0
			if p.Rebuild, err = c.rebuildProgress(ctx, name, sts, now); err != nil {
				return err
			}
		}
		if len(p.Checkpoints) == 0 {
			return notFound("no %s %q in this schema", map[bool]string{true: "worker", false: "projection"}[p.Worker],
				clipForError(name))
		}
	}
	pn, wn := name, ""
	if p.Worker {
		pn, wn = "", name
	}
	parked, next, err := c.parked(ctx, q.Get("after"), pn, wn, now)
	if err != nil {
		return err
	}
	p.Next = next
	if p.Next != "" {
		p.Next = c.link("/projection", map[bool]string{true: "worker", false: "name"}[p.Worker], name, "after", p.Next)
	}
	p.Back = c.link("/projection", map[bool]string{true: "worker", false: "name"}[p.Worker], name)
	p.ParkedForm = parkedForm{Rows: parked, Owner: name, Kind: "projection", Back: p.Back}
	if p.Worker {
		p.ParkedForm.Kind = "worker"
	}
	c.render(w, r, http.StatusOK, "projection", "Projection", p)
	return nil
}

// rebuildProgress follows the latest rebuild of name the console recorded.
func (c *Console) rebuildProgress(ctx context.Context, name string, sts []projection.Status, now time.Time) (
	*rebuildView, error) {
	e, ok, err := c.auditLatest(ctx, "projection.rebuild", name)
	if err != nil || !ok {
		return nil, err
	}
	v := &rebuildView{By: clip(e.User, 200), Ago: max(now.Sub(e.StartedAt), 0), Error: clip(e.Error, 500)}
	var d struct {
		Head int64 `json:"head"`
	}
	_ = json.Unmarshal(e.Details, &d)
	v.Target = d.Head
	v.Position = -1
	for _, s := range sts {
		if s.Rebuilding {
			v.Waiting = true
		}
		if v.Position < 0 || s.Position < v.Position {
			v.Position = s.Position
		}
	}
	v.Position = max(v.Position, 0)
	switch {
	case e.Error != "":
	case v.Waiting:
	case v.Target <= 0 || v.Position >= v.Target:
		v.Done, v.Percent = true, 100
	default:
		v.Percent = int(100 * v.Position / v.Target)
	}
	return v, nil
}

// auditEntry is a row of the audit table.
type auditEntry struct {
	ID                  int64
	User, Scope, Tenant string
	Action, Target      string
	Confirmed, Affected *int64
	Error, Remote       string
	Details             []byte
	StartedAt           time.Time
	FinishedAt          *time.Time
}

func scanAudit(row pgx.CollectableRow) (auditEntry, error) {
	var e auditEntry
	err := row.Scan(&e.ID, &e.User, &e.Scope, &e.Tenant, &e.Action, &e.Target, &e.Confirmed, &e.Affected, &e.Error,
		&e.Remote, &e.Details, &e.StartedAt, &e.FinishedAt)
	e.StartedAt = e.StartedAt.UTC()
	return e, err
}

// auditScope is the audit_list scope argument: the tenant of a tenant's console, nil for every entry.
func (c *Console) auditScope() *string { return c.cfg.Tenant }

func (c *Console) auditLatest(ctx context.Context, action, target string) (auditEntry, bool, error) {
	rows, err := c.cfg.Pool.Query(ctx, c.q.latest, action, target, c.auditScope())
	if err != nil {
		return auditEntry{}, false, err
	}
	e, err := pgx.CollectOneRow(rows, scanAudit)
	if errors.Is(err, pgx.ErrNoRows) {
		return auditEntry{}, false, nil
	}
	return e, err == nil, err
}
