package console

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

type auditView struct {
	ID                  int64
	User, Target, Error clipped
	Action, Scope       string
	Confirmed, Affected string
	Remote              clipped
	Details             clipped
	At                  time.Time
	Took                string
	Running             bool
	Link                string
}

func (c *Console) auditView(e auditEntry) auditView {
	v := auditView{ID: e.ID, User: clip(e.User, 200), Target: clip(e.Target, 2000), Error: clip(e.Error, 2000),
		Action: e.Action, Scope: e.Scope, Remote: clip(e.Remote, 200), At: e.StartedAt,
		Link: c.link("/done", "id", strconv.FormatInt(e.ID, 10)), Confirmed: "–", Affected: "–"}
	if e.Scope == "tenant" {
		v.Scope = "tenant " + clipForError(e.Tenant)
	}
	if e.Confirmed != nil {
		v.Confirmed = number(*e.Confirmed)
	}
	if e.Affected != nil {
		v.Affected = number(*e.Affected)
	}
	if e.FinishedAt != nil {
		v.Took = duration(e.FinishedAt.Sub(e.StartedAt))
	} else {
		v.Running = true
	}
	if len(e.Details) > 2 {
		var compact map[string]any
		if json.Unmarshal(e.Details, &compact) == nil {
			b, _ := json.Marshal(compact)
			v.Details = clip(string(b), 500)
		}
	}
	return v
}

type auditPage struct {
	Entries []auditView
	Next    string
}

// auditPage lists the recorded actions, newest first: every entry in an estate-wide console, the tenant's own in a
// tenant's console.
func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) error {
	before, err := intParam("before", r.URL.Query().Get("before"), 1<<62)
	if err != nil {
		return err
	}
	rows, err := c.cfg.Pool.Query(r.Context(), c.q.list, c.auditScope(), before, c.cfg.PageSize)
	if err != nil {
		return err
	}
	entries, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return err
	}
	var p auditPage
	for _, e := range entries {
		p.Entries = append(p.Entries, c.auditView(e))
	}
	if len(entries) == c.cfg.PageSize {
		p.Next = c.link("/audit", "before", strconv.FormatInt(entries[len(entries)-1].ID, 10))
	}
	c.render(w, r, http.StatusOK, "audit", "Audit", p)
	return nil
}

type donePage struct {
	E    auditView
	Back string
	// Find links to the find page of each message the action named (the first few).
	Find []findLink
}

// donePage shows the record of one action: where an action's form leads once it ran.
func (c *Console) donePage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	id, err := intParam("id", q.Get("id"), 0)
	if err != nil {
		return err
	}
	rows, err := c.cfg.Pool.Query(r.Context(), c.q.get, id, c.auditScope())
	if err != nil {
		return err
	}
	e, err := pgx.CollectOneRow(rows, scanAudit)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound("no recorded action %d in this console's scope", id)
	}
	if err != nil {
		return err
	}
	p := donePage{E: c.auditView(e), Back: c.back(q.Get("back"), c.link("/audit")), Find: c.findLinks(q["find"])}
	c.render(w, r, http.StatusOK, "done", "Done", p)
	return nil
}
