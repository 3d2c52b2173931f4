package console

import (
	"net/http"
	"strconv"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

type outboxPage struct {
	Stats outbox.Stats
	// By is the grouping shown ("topic", "tenant", "key"); ByLinks switch it.
	By      string
	ByLinks []tab
	Groups  []groupView
	// Scheduled and Held are pages of their lists, with the link to the next page ("" on the last).
	Scheduled     []pendingView
	ScheduledNext string
	Held          []heldView
	HeldNext      string
	// Relays are shown estate-wide only.
	Relays       []relayView
	Maintenance  *outbox.MaintenanceStatus
	MaintOverdue bool
}

type tab struct {
	Name, Link string
	Current    bool
}

type groupView struct {
	Tenant, Topic, Key clipped
	outbox.PendingGroup
	OldestAge time.Duration
	// Link lists the group's messages: a key's messages in order, or the dead letters of a topic.
	Link string
}

type pendingView struct {
	ID, Tenant, Topic, Type, Key clipped
	LastError                    clipped
	M                            outbox.PendingMessage
	In                           time.Duration // until it is due (scheduled), or since it was staged
	StreamLink                   string
}

type heldView struct {
	Tenant, Key, ID, Topic, Type clipped
	LastError                    clipped
	H                            outbox.HeldKey
	Since                        time.Duration
	DeadLink, KeyLink            string
}

// relayView is one relay process: the leases it holds and the rows it has in flight.
type relayView struct {
	Owner clipped
	// Beat is its heartbeat (nil when it has none: an older relay, or one whose beat was pruned).
	Beat   *processView
	Leases []leaseView
	Rows   int64
	// LeaseEnds is when its row leases lapse (the latest).
	LeaseEnds time.Duration
}

type leaseView struct {
	Election clipped
	What     string
	Held     bool
	Token    int64
	Expires  time.Duration
	Since    time.Duration
}

// outboxPage shows where the backlog is (pending by topic, tenant or key), the scheduled messages, the keys held by
// a dead letter, the relays with their leases (leader, partitions, membership) and rows in flight, and the routine
// maintenance.
func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	by := outbox.ByTopic
	switch q.Get("by") {
	case "", "topic":
	case "tenant":
		by = outbox.ByTenant
	case "key":
		by = outbox.ByKey
	default:
		return badRequest("by must be topic, tenant or key")
	}
	if by == outbox.ByTenant && !c.estate() {
		by = outbox.ByTopic
	}
	now := c.cfg.Clock()
	// The figures of the latest sample when it is recent (Run keeps it so), else read now: one scan of the hot
	// table fewer per page load.
	st, ok := outbox.Stats{}, false
	if c.samples.age() <= 2*c.cfg.SampleInterval {
		st, ok = outboxFigures(c.samples.snapshot().report)
	}
	if !ok {
		var err error
		if st, err = c.admin.Backlog(ctx); err != nil {
			return err
		}
	}
	p := outboxPage{Stats: st, By: by.String()}
	for _, g := range []outbox.GroupBy{outbox.ByTopic, outbox.ByTenant, outbox.ByKey} {
		if g == outbox.ByTenant && !c.estate() {
			continue
		}
		p.ByLinks = append(p.ByLinks, tab{Name: "by " + g.String(), Link: c.link("/outbox", "by", g.String()),
			Current: g == by})
	}
	groups, err := c.admin.PendingGroups(ctx, by, c.cfg.PageSize)
	if err != nil {
		return err
	}
	for _, g := range groups {
		gv := groupView{Tenant: clip(g.Tenant, 120), Topic: clip(g.Topic, 200), Key: clip(g.Key, 200),
			PendingGroup: g}
		if !g.OldestDueAt.IsZero() {
			gv.OldestAge = max(now.Sub(g.OldestDueAt), 0)
		}
		switch {
		case by == outbox.ByKey && g.Key != "":
			gv.Link = c.link("/outbox/key", "tenant", g.Tenant, "key", g.Key)
		case by == outbox.ByTopic:
			gv.Link = c.link("/dead", "source", "outbox", "topic", g.Topic)
		}
		p.Groups = append(p.Groups, gv)
	}

	var schedAfter *outbox.PendingMessage
	if cur := q.Get("scheduled"); cur != "" {
		var k struct {
			At  time.Time `json:"t"`
			Row int64     `json:"r"`
		}
		if err := decodeCursor(cur, &k); err != nil {
			return err
		}
		schedAfter = &outbox.PendingMessage{NextAttemptAt: k.At, Row: k.Row}
	}
	sched, err := c.admin.ScheduledMessages(ctx, c.cfg.PageSize, schedAfter)
	if err != nil {
		return err
	}
	for _, m := range sched {
		p.Scheduled = append(p.Scheduled, c.pendingView(m, max(m.ScheduledAt.Sub(now), 0)))
	}
	if len(sched) == c.cfg.PageSize {
		last := sched[len(sched)-1]
		p.ScheduledNext = c.link("/outbox", "by", by.String(), "scheduled", encodeCursor(struct {
			At  time.Time `json:"t"`
			Row int64     `json:"r"`
		}{last.NextAttemptAt, last.Row})) + "#scheduled"
	}

	var heldAfter *outbox.HeldKey
	if cur := q.Get("held"); cur != "" {
		var k heldCursor
		if err := decodeCursor(cur, &k); err != nil {
			return err
		}
		heldAfter = &outbox.HeldKey{DeadAt: k.At, Tenant: k.Tenant, Key: k.Key, MessageID: k.ID, Topic: k.Topic}
	}
	held, err := c.admin.HeldKeys(ctx, c.cfg.PageSize, heldAfter)
	if err != nil {
		return err
	}
	for _, h := range held {
		p.Held = append(p.Held, heldView{Tenant: clip(h.Tenant, 120), Key: clip(h.Key, 200), ID: clip(h.MessageID, 120),
			Topic: clip(h.Topic, 200), Type: clip(h.Type, 200), LastError: clip(h.LastError, 300), H: h,
			Since:    max(now.Sub(h.DeadAt), 0),
			DeadLink: c.link("/dead/message", "source", "outbox", "tenant", h.Tenant, "id", h.MessageID, "topic", h.Topic),
			KeyLink:  c.link("/outbox/key", "tenant", h.Tenant, "key", h.Key)})
	}
	if len(held) == c.cfg.PageSize {
		last := held[len(held)-1]
		p.HeldNext = c.link("/outbox", "by", by.String(), "held", encodeCursor(heldCursor{At: last.DeadAt,
			Tenant: last.Tenant, Key: last.Key, ID: last.MessageID, Topic: last.Topic})) + "#held"
	}

	if c.estate() {
		if p.Relays, err = c.relays(r, now, st.InFlight > 0); err != nil {
			return err
		}
	}
	m, ok, err := c.admin.Maintenance(ctx)
	if err != nil {
		return err
	}
	if ok {
		p.Maintenance, p.MaintOverdue = &m, m.Overdue(now)
	}
	c.render(w, r, http.StatusOK, "outbox", "Outbox", p)
	return nil
}

type heldCursor struct {
	At     time.Time `json:"t"`
	Tenant string    `json:"n"`
	Key    string    `json:"k"`
	ID     string    `json:"i"`
	Topic  string    `json:"p"`
}

func (c *Console) pendingView(m outbox.PendingMessage, in time.Duration) pendingView {
	v := pendingView{ID: clip(m.ID, 120), Tenant: clip(m.Tenant, 120), Topic: clip(m.Topic, 200),
		Type: clip(m.Type, 200), Key: clip(m.PartitionKey, 200), LastError: clip(m.LastError, 300), M: m, In: in}
	if m.SourcePosition > 0 {
		v.StreamLink = c.link("/events", "position", strconv.FormatInt(m.SourcePosition, 10))
	}
	return v
}

// relays groups the leases of leader-elected relays and the rows in flight (read only when some are) by relay
// (lease owner).
func (c *Console) relays(r *http.Request, now time.Time, inFlight bool) ([]relayView, error) {
	leases, err := c.outbox.RelayLeases(r.Context())
	if err != nil {
		return nil, err
	}
	var claims []outbox.RelayClaims
	if inFlight {
		if claims, err = c.admin.InFlight(r.Context()); err != nil {
			return nil, err
		}
	}
	var out []relayView
	index := map[string]int{}
	at := func(owner string) *relayView {
		i, ok := index[owner]
		if !ok {
			i = len(out)
			index[owner] = i
			out = append(out, relayView{Owner: clip(owner, 200)})
		}
		return &out[i]
	}
	for _, l := range leases {
		what := "leader"
		switch {
		case l.Member:
			what = "member"
		case l.Partition >= 0:
			what = "partition " + strconv.Itoa(l.Partition)
		}
		rv := at(l.Owner)
		rv.Leases = append(rv.Leases, leaseView{Election: clip(l.Election, 200), What: what, Held: l.Held,
			Token: l.Token, Expires: l.ExpiresAt.Sub(now), Since: max(now.Sub(l.AcquiredAt), 0)})
	}
	for _, cl := range claims {
		rv := at(cl.Owner)
		rv.Rows, rv.LeaseEnds = cl.Rows, max(cl.LastExpiry.Sub(now), 0)
	}
	// Every relay that beats, leader-elected or not, holding rows now or not.
	procs, err := c.processes(r.Context(), now)
	if err != nil {
		return nil, err
	}
	for i := range procs {
		if procs[i].Kind.Text == "relay" {
			at(procs[i].Instance.Text).Beat = &procs[i]
		}
	}
	return out, nil
}

type keyPage struct {
	Tenant, Key clipped
	Messages    []pendingView
	Next        string
}

// keyPage lists a partition key's pending messages in order: its head first, what waits behind it and why.
func (c *Console) keyPage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tenant, err := c.tenantParam(q.Get("tenant"))
	if err != nil {
		return err
	}
	key, err := textParam("key", q.Get("key"), 1024)
	if err != nil {
		return err
	}
	if key == "" {
		return badRequest("key is required")
	}
	var after int64
	if s := q.Get("after"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			return badRequest("after must be a sequence number")
		}
	}
	msgs, err := c.admin.KeyMessages(r.Context(), tenant, key, c.cfg.PageSize, after)
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	p := keyPage{Tenant: clip(stagehand.NormalizeTenant(tenant), 200), Key: clip(key, 1024)}
	for _, m := range msgs {
		p.Messages = append(p.Messages, c.pendingView(m, max(now.Sub(m.CreatedAt), 0)))
	}
	if len(msgs) == c.cfg.PageSize {
		p.Next = c.link("/outbox/key", "tenant", tenant, "key", key, "after",
			strconv.FormatInt(msgs[len(msgs)-1].Sequence, 10))
	}
	c.render(w, r, http.StatusOK, "key", "Key", p)
	return nil
}
