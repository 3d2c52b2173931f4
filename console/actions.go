package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Every action goes the same way. A form posts to /confirm; the console checks that actions are enabled, that
// the request has a user, that it comes from the console's own origin and carries that user's CSRF token, then
// counts what the action would touch and shows the count with a confirmation form. That form posts to /act, which
// checks everything again, records the action in the audit table, runs it through the owning package's operation,
// records its outcome, and redirects to the record. Dead-letter actions are bounded by the time of the
// confirmation: what dies after it is never swept in.

// maxForm bounds a posted form.
const maxForm = 1 << 20

// maxSelection bounds how many items a selection names.
const maxSelection = 1000

// plan is an action, ready to be confirmed or run.
type plan struct {
	// Action is the action's name ("outbox.redrive", ...); Verb and Noun say it in words (one is the Noun of a
	// single item).
	Action, Verb, Noun, one string
	// Target is what it acts on, in words, for the confirmation and the audit record.
	Target string
	// Count is how many items it would touch now (confirmation only); Bound the time dead-letter actions are
	// bounded by.
	Count int64
	Bound time.Time
	// Note warns about what the action does.
	Note string
	// Preview lists some of the items.
	Preview []string
	// Hidden are the form fields the confirmation carries to /act.
	Hidden []hiddenField
	// Back is the page to return to.
	Back string
	// Find are the message IDs the action names, which the page after it links to (find a message).
	Find []string
	// details are kept in the audit record.
	details map[string]any
	// count counts the items (confirmation); run performs the action and returns how many items it affected.
	count func(ctx context.Context) (int64, error)
	run   func(ctx context.Context) (int64, error)
}

// authorizeAction checks what every action needs and returns the user.
func (c *Console) authorizeAction(r *http.Request) (string, error) {
	if !c.cfg.Actions {
		return "", forbidden("this console is read-only: actions are not enabled")
	}
	user, ok := c.user(r)
	if !ok {
		return "", &statusError{code: http.StatusUnauthorized, msg: "actions need an authenticated user"}
	}
	if err := c.origins.Check(r); err != nil {
		return "", forbidden("the request does not come from the console's own pages: %v", err)
	}
	r.Body = http.MaxBytesReader(nil, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		return "", badRequest("the form cannot be read: %v", err)
	}
	if err := c.checkCSRF(r.PostForm.Get("csrf"), user, c.cfg.Clock()); err != nil {
		return "", forbidden("%v", err)
	}
	return user, nil
}

type confirmPage struct {
	P       *plan
	Count   string
	Nothing bool
}

// confirm counts what an action would touch and asks to confirm it. The confirmation form carries a token (see
// confirmToken) signing the action, its filter or selection, its bound and the count shown, for confirmLifetime.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request) error {
	user, err := c.authorizeAction(r)
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	p, err := c.plan(r.PostForm, now)
	if err != nil {
		return err
	}
	n, err := p.count(r.Context())
	if err != nil {
		return err
	}
	p.Count = n
	if n == 1 {
		p.Noun = p.one
	}
	p.Hidden = append(p.Hidden, hiddenField{"bound", p.Bound.Format(time.RFC3339Nano)},
		hiddenField{"expected", strconv.FormatInt(n, 10)})
	signed := url.Values{}
	for _, f := range p.Hidden {
		signed.Add(f.Name, f.Value)
	}
	p.Hidden = append(p.Hidden, hiddenField{"confirmation", c.confirmToken(user, signed, now.Add(confirmLifetime))},
		hiddenField{"back", p.Back})
	c.render(w, r, http.StatusOK, "confirm", "Confirm", confirmPage{P: p, Count: number(n), Nothing: n == 0})
	return nil
}

// act runs a confirmed action, recording it, and redirects to its record. It refuses, and records as refused, an
// action that does not match a live confirmation of this user (see confirmToken), one bounded in the future, and
// one that would now touch more than was confirmed (the operator confirms again, seeing the new count); the
// action then touches only what its confirmed filter or selection and bound select.
func (c *Console) act(w http.ResponseWriter, r *http.Request) error {
	user, err := c.authorizeAction(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	now := c.cfg.Clock()
	form := r.PostForm
	expected, err := intParam("expected", form.Get("expected"), 0)
	if err != nil {
		expected = -1
	}
	bound, boundErr := time.Parse(time.RFC3339Nano, form.Get("bound"))
	p, planErr := c.plan(form, bound)
	// refuse records a refused action (with what it claimed) and answers with why.
	refuse := func(code int, why string, details map[string]any) error {
		action, target := form.Get("action"), "(the action's form could not be read)"
		if action == "" {
			action = "(unknown: " + form.Get("do") + ")"
		}
		action = clip(action, 200).Text
		if p != nil {
			action, target = p.Action, p.Target
		}
		if details == nil {
			details = map[string]any{}
		}
		details["refused"] = why
		rec := &plan{Action: action, Target: target, details: details}
		id, err := c.auditBegin(ctx, user, rec, max(expected, 0), r.RemoteAddr)
		if err == nil {
			err = c.auditFinish(context.WithoutCancel(ctx), id, 0, "refused: "+why, details)
		}
		if err != nil {
			c.cfg.Logger.ErrorContext(ctx, "console: a refused action could not be recorded", "error", err)
		}
		c.cfg.Logger.WarnContext(ctx, "console: action refused", "audit_id", id, "user", user, "action", action,
			"confirmed", expected, "reason", why)
		return &statusError{code: code, msg: why}
	}
	if err := c.checkConfirmation(form.Get("confirmation"), user, form, now); err != nil {
		return refuse(http.StatusForbidden, err.Error(), nil)
	}
	switch {
	case boundErr != nil || expected < 0:
		return refuse(http.StatusBadRequest, "the confirmation carries no valid time or count: confirm the "+
			"action again", nil)
	case bound.After(now):
		return refuse(http.StatusForbidden, fmt.Sprintf("the confirmation's bound (%s) is in the future: confirm "+
			"the action again", bound.UTC().Format(time.RFC3339)), nil)
	case planErr != nil:
		return planErr
	}
	matching, err := p.count(ctx)
	if err != nil {
		return err
	}
	if matching > expected {
		return refuse(http.StatusConflict, fmt.Sprintf("%s would now touch %d, more than the %d confirmed: "+
			"confirm the action again", p.Action, matching, expected), map[string]any{"matching": matching})
	}
	id, err := c.auditBegin(ctx, user, p, expected, r.RemoteAddr)
	if err != nil {
		return fmt.Errorf("console: record the action before running it: %w", err)
	}
	n, runErr := p.run(ctx)
	errText := ""
	if runErr != nil {
		errText = runErr.Error()
	}
	if n > expected {
		// Cannot happen but by clock skew between the console and the writers of the dead letters' times: the
		// bound excludes what dies after the confirmation. Recorded and logged, never silent.
		p.details["exceeded_confirmation"] = true
		c.cfg.Logger.ErrorContext(ctx, "console: an action affected more than was confirmed", "audit_id", id,
			"confirmed", expected, "affected", n)
	}
	if err := c.auditFinish(context.WithoutCancel(ctx), id, n, errText, p.details); err != nil {
		c.cfg.Logger.ErrorContext(ctx, "console: the outcome of an action could not be recorded", "audit_id", id,
			"error", err)
	}
	c.cfg.Logger.InfoContext(ctx, "console: action", "audit_id", id, "user", user, "action", p.Action,
		"target", p.Target, "confirmed", expected, "affected", n, "error", errText)
	http.Redirect(w, r, c.doneLink(id, p), http.StatusSeeOther)
	return nil
}

// back checks the page to return to: a path of this console, nothing else.
func (c *Console) back(s, def string) string {
	u, err := url.Parse(s)
	if s == "" || err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(u.Path, c.cfg.Prefix+"/") || strings.HasPrefix(u.Path, "//") ||
		strings.ContainsAny(s, "\\\r\n") || len(s) > 4096 {
		return def
	}
	return u.RequestURI()
}

// plan reads an action's form; bound bounds dead-letter actions.
func (c *Console) plan(form url.Values, bound time.Time) (*plan, error) {
	action, mode := form.Get("action"), form.Get("mode")
	if do := form.Get("do"); do != "" { // a dead-letter list's buttons: "verb:mode", the source from the filter
		verb, m, _ := strings.Cut(do, ":")
		src := form.Get("source")
		if src == "" {
			src = "outbox"
		}
		action, mode = src+"."+verb, m
	}
	kind, verb, ok := strings.Cut(action, ".")
	if !ok {
		return nil, badRequest("unknown action")
	}
	switch kind {
	case "outbox", "inbox":
		return c.deadPlan(form, kind, verb, mode, bound)
	case "projection":
		if verb == "rebuild" {
			return c.rebuildPlan(form)
		}
		return c.parkedPlan(form, kind, verb)
	case "worker":
		return c.parkedPlan(form, kind, verb)
	}
	return nil, badRequest("unknown action")
}

// deadPlan plans a redrive or discard of outbox or inbox dead letters: a selection, or everything a filter selects
// (a group of one cause is a filter on its signature).
func (c *Console) deadPlan(form url.Values, source, verb, mode string, bound time.Time) (*plan, error) {
	if verb != "redrive" && verb != "discard" {
		return nil, badRequest("unknown action")
	}
	f, err := c.parseDeadFilter(form.Get)
	if err != nil {
		return nil, err
	}
	if f.Source != source {
		return nil, badRequest("the action and the form's source disagree")
	}
	p := &plan{Action: source + "." + verb, Verb: strings.ToUpper(verb[:1]) + verb[1:], Bound: bound,
		Back: c.back(form.Get("back"), c.link("/dead", "source", source)), details: map[string]any{"mode": mode},
		Noun: source + " dead letters", one: source + " dead letter", Note: deadNotes[p2(source, verb)]}
	p.Hidden = []hiddenField{{"action", p.Action}, {"mode", mode}}
	p.Hidden = append(p.Hidden, hiddenFields(f.values())...)
	var sels []deadSelection
	switch mode {
	case "matching":
		p.Target = f.describe() + ", dead at or before " + bound.UTC().Format(time.RFC3339)
		sel := deadSelection{scope: c.deadScope(f), out: f.listOptions(bound), in: f.inboxOptions(bound)}
		sel.out.DeadBefore, sel.in.DeadBefore = minTime(sel.out.DeadBefore, bound), minTime(sel.in.DeadBefore, bound)
		sels = []deadSelection{sel}
	case "selected":
		picked := form["sel"]
		if len(picked) == 0 {
			return nil, badRequest("select at least one dead letter")
		}
		if len(picked) > maxSelection {
			return nil, badRequest("a selection holds at most %d dead letters", maxSelection)
		}
		groups, err := c.selection(picked, source)
		if err != nil {
			return nil, err
		}
		var names []string
		for _, g := range groups {
			for _, id := range g.ids {
				names = append(names, g.label(id))
			}
			for _, s := range g.sel {
				p.Hidden = append(p.Hidden, hiddenField{"sel", s})
			}
			p.Find = append(p.Find, g.ids...)
			sels = append(sels, deadSelection{scope: c.outbox.Tenant(g.tenant),
				out: outbox.ListOptions{IDs: g.ids, DeadBefore: bound},
				in:  outbox.InboxListOptions{Handler: g.handler, IDs: g.ids, DeadBefore: bound}})
		}
		p.Target = fmt.Sprintf("%d selected: %s", len(names), strings.Join(names, ", "))
		if len(p.Target) > 2000 {
			p.Target = p.Target[:boundary(p.Target, 2000)] + "…"
		}
		for i, n := range names {
			if i == 20 {
				p.Preview = append(p.Preview, fmt.Sprintf("… and %d more", len(names)-20))
				break
			}
			p.Preview = append(p.Preview, n)
		}
	default:
		return nil, badRequest("mode must be selected or matching")
	}
	p.count = func(ctx context.Context) (int64, error) {
		var total int64
		for _, s := range sels {
			n, err := s.count(ctx, source)
			total += n
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	p.run = func(ctx context.Context) (int64, error) {
		var total int64
		for _, s := range sels {
			n, err := s.act(ctx, source, verb)
			total += int64(n)
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	return p, nil
}

// p2 joins a source and a verb.
func p2(source, verb string) string { return source + "." + verb }

// deadNotes say what each dead-letter action does.
var deadNotes = map[string]string{
	"outbox.redrive": "Each goes back into the outbox, due now, with a fresh attempt count; the messages its key " +
		"held follow it in order.",
	"outbox.discard": "Each is deleted for good and releases its key; its ID stays in the sent ledger, so " +
		"re-staging it publishes nothing.",
	"inbox.redrive": "Each is staged again in this outbox for the topic it was consumed from; only its handler " +
		"handles the copy, under the original message ID.",
	"inbox.discard": "Each is deleted for good; the inbox keeps its entry, so redeliveries stay skipped.",
}

// deadSelection is the dead letters of one scope an action acts on: the outbox's by out, the inbox's by in. The
// outbox and the inbox offer the same verbs, so counting and acting is a choice of method, not of shape.
type deadSelection struct {
	scope *outbox.Admin
	out   outbox.ListOptions
	in    outbox.InboxListOptions
}

func (s deadSelection) count(ctx context.Context, source string) (int64, error) {
	if source == "outbox" {
		return s.scope.CountDeadLetters(ctx, s.out)
	}
	return s.scope.CountInboxDeadLetters(ctx, s.in)
}

func (s deadSelection) act(ctx context.Context, source, verb string) (int, error) {
	switch p2(source, verb) {
	case "outbox.redrive":
		return s.scope.RedriveMatching(ctx, s.out)
	case "outbox.discard":
		return s.scope.DiscardMatching(ctx, s.out)
	case "inbox.redrive":
		return s.scope.RedriveInboxMatching(ctx, s.in)
	}
	return s.scope.DiscardInboxMatching(ctx, s.in)
}

func minTime(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// selGroup is the part of a selection of one tenant (and, for the inbox, one handler).
type selGroup struct {
	tenant, handler string
	ids             []string
	sel             []string // the encoded items, carried to the confirmation's form
}

func (g selGroup) label(id string) string {
	s := strconv.Quote(id)
	if g.handler != "" {
		s = strconv.Quote(g.handler) + "/" + s
	}
	return s + " (tenant " + strconv.Quote(g.tenant) + ")"
}

// selection decodes and checks a selection: outbox items are (tenant, ID), inbox items (tenant, handler, ID). A
// tenant's console accepts only its own tenant's.
func (c *Console) selection(sel []string, source string) ([]selGroup, error) {
	var groups []selGroup
	index := map[[2]string]int{}
	seen := map[string]bool{}
	for _, s := range sel {
		if seen[s] {
			continue
		}
		seen[s] = true
		var parts []string
		if err := decodeCursor(s, &parts); err != nil {
			return nil, badRequest("a selected item is not valid")
		}
		want := 2
		if source == "inbox" {
			want = 3
		}
		if len(parts) != want {
			return nil, badRequest("a selected item is not valid")
		}
		tenant, err := c.tenantParam(parts[0])
		if err != nil {
			return nil, err
		}
		for _, p := range parts[1:] {
			if _, err := textParam("a selected item", p, maxParam); err != nil {
				return nil, err
			}
		}
		handler := ""
		if source == "inbox" {
			handler = parts[1]
		}
		id := parts[len(parts)-1]
		k := [2]string{tenant, handler}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, selGroup{tenant: tenant, handler: handler})
		}
		groups[i].ids = append(groups[i].ids, id)
		groups[i].sel = append(groups[i].sel, s)
	}
	return groups, nil
}

// rebuildPlan plans a projection's rebuild (an estate-wide console only: a rebuild replays every tenant's events).
func (c *Console) rebuildPlan(form url.Values) (*plan, error) {
	if !c.estate() {
		return nil, forbidden("a rebuild replays every tenant's events: only an estate-wide console requests one")
	}
	name, err := textParam("name", form.Get("name"), 255)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, badRequest("name is required")
	}
	p := &plan{Action: "projection.rebuild", Verb: "Rebuild", Noun: "projection", one: "projection", Target: name,
		Back:   c.back(form.Get("back"), c.link("/projection", "name", name)),
		Hidden: []hiddenField{{"action", "projection.rebuild"}, {"name", name}},
		Note: "The process running the projection resets its read model and clears its parked events, then " +
			"replays the whole log. The read model is incomplete until the rebuild catches up.",
		details: map[string]any{}}
	p.count = func(ctx context.Context) (int64, error) {
		sts, err := c.projectionStatus(ctx, name)
		if err != nil {
			return 0, err
		}
		if len(sts) == 0 {
			return 0, notFound("no projection %q in this schema", clipForError(name))
		}
		return 1, nil
	}
	p.run = func(ctx context.Context) (int64, error) {
		head, err := c.store.HeadPosition(ctx)
		if err != nil {
			return 0, err
		}
		p.details["head"] = head
		if err := projection.RequestRebuild(ctx, c.cfg.Pool, c.cfg.Schema, name); err != nil {
			return 0, err
		}
		return 1, nil
	}
	return p, nil
}

// parkedPlan plans a replay or discard of parked events of a projection or a staging worker. A tenant's console
// acts on its own tenant's events only.
func (c *Console) parkedPlan(form url.Values, kind, verb string) (*plan, error) {
	if verb != "replay" && verb != "discard" {
		return nil, badRequest("unknown action")
	}
	name, err := textParam("name", form.Get("name"), 255)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, badRequest("name is required")
	}
	var ids []int64
	for _, s := range form["parked"] {
		id, err := intParam("parked", s, 0)
		if err != nil || id == 0 {
			return nil, badRequest("a selected parked event is not valid")
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, badRequest("select at least one parked event")
	}
	if len(ids) > maxSelection {
		return nil, badRequest("a selection holds at most %d parked events", maxSelection)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	owner := "projection"
	if kind == "worker" {
		owner = "worker"
	}
	p := &plan{Action: kind + "." + verb, Verb: strings.ToUpper(verb[:1]) + verb[1:],
		Noun:   "parked events of " + owner + " " + strconv.Quote(name),
		one:    "parked event of " + owner + " " + strconv.Quote(name),
		Target: fmt.Sprintf("%s %q, parked events %s", owner, name, joinIDs(ids)),
		Back:   c.back(form.Get("back"), c.link("/projections")),
		Hidden: []hiddenField{{"action", kind + "." + verb}, {"name", name}}, details: map[string]any{}}
	for _, id := range ids {
		p.Hidden = append(p.Hidden, hiddenField{"parked", strconv.FormatInt(id, 10)})
	}
	if verb == "replay" {
		p.Note = "The process running it applies each event again, exactly once; one that fails again stays " +
			"parked with its new error."
	} else {
		p.Note = "Each event is skipped for good: it is never applied (or staged)."
	}
	ops := parkedOf(kind)
	// found returns the IDs that exist, belong to name, and (in a tenant's console) to the tenant.
	found := func(ctx context.Context) ([]int64, error) {
		evs, err := ops.page(ctx, c.cfg.Pool, c.cfg.Schema, stagehand.ParkedQuery{Owner: name, Tenants: c.tenants,
			IDs: ids, Limit: len(ids)})
		out := make([]int64, 0, len(evs))
		for _, e := range evs {
			out = append(out, e.ID)
		}
		return out, err
	}
	p.count = func(ctx context.Context) (int64, error) {
		ok, err := found(ctx)
		return int64(len(ok)), err
	}
	p.run = func(ctx context.Context) (int64, error) {
		ok, err := found(ctx)
		if err != nil || len(ok) == 0 {
			return 0, err
		}
		if verb == "replay" {
			return ops.replay(ctx, c.cfg.Pool, c.cfg.Schema, name, ok...)
		}
		var n int64
		for _, id := range ok {
			switch err := ops.discard(ctx, c.cfg.Pool, c.cfg.Schema, id); {
			case errors.Is(err, ops.notFound):
			case err != nil:
				return n, err
			default:
				n++
			}
		}
		return n, nil
	}
	return p, nil
}

// parkedOps are the parked-event operations of projections or of staging workers: one shape, two packages.
type parkedOps struct {
	page     func(ctx context.Context, db projection.DB, schema string, q stagehand.ParkedQuery) ([]stagehand.ParkedEvent, error)
	replay   func(ctx context.Context, db projection.DB, schema, owner string, ids ...int64) (int64, error)
	discard  func(ctx context.Context, db projection.DB, schema string, id int64) error
	notFound error
	kind     string // "projection" or "worker"
	ownerArg string // the query parameter naming the owner on the projection page
}

// parkedOf returns the parked-event operations of kind ("projection" or "worker").
func parkedOf(kind string) parkedOps {
	if kind == "worker" {
		return parkedOps{page: staging.ListParkedPage, replay: staging.RequestReplay, discard: staging.DiscardParked,
			notFound: staging.ErrParkedNotFound, kind: "worker", ownerArg: "worker"}
	}
	return parkedOps{page: projection.ListParkedPage, replay: projection.RequestReplay,
		discard: projection.DiscardParked, notFound: projection.ErrParkedNotFound, kind: "projection",
		ownerArg: "name"}
}

func joinIDs(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i == 50 {
			fmt.Fprintf(&b, " … (%d in all)", len(ids))
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// auditBegin records an action before it runs.
func (c *Console) auditBegin(ctx context.Context, user string, p *plan, confirmed int64, remote string) (int64,
	error) {
	scope, tenant := "all-tenants", ""
	if c.cfg.Tenant != nil {
		scope, tenant = "tenant", *c.cfg.Tenant
	}
	details, err := json.Marshal(p.details)
	if err != nil {
		return 0, err
	}
	var id int64
	err = c.cfg.Pool.QueryRow(ctx, c.q.begin, plain(user, false), scope, tenant, p.Action, plain(p.Target, false),
		confirmed, plain(remote, false), details, c.cfg.Clock()).Scan(&id)
	return id, err
}

// auditFinish records an action's outcome.
func (c *Console) auditFinish(ctx context.Context, id, affected int64, errText string, details map[string]any) error {
	b, err := json.Marshal(details)
	if err != nil {
		return err
	}
	_, err = c.cfg.Pool.Exec(ctx, c.q.finish, id, affected, plain(errText, false), b, c.cfg.Clock())
	return err
}
