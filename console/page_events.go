package console

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

type eventView struct {
	Position, Version                  int64
	Tenant, StreamID, StreamType, Type clipped
	EventID                            string
	TypeVersion                        int
	OccurredAt, RecordedAt             time.Time
	Payload                            payload
	// Summary is the payload on one line, cut short, for lists.
	Summary  clipped
	Metadata []pair
	Messages []stagedView
	// Corrupt is the reason the event cannot be read in full ("" when it can).
	Corrupt    clipped
	StreamLink string
}

type stagedView struct {
	ID, Topic, Type, Tenant clipped
	State                   string
	Attempts                int
	LastError               clipped
	StagedAt, DoneAt        time.Time
	Handled                 []handledView
	Link                    string
}

type handledView struct {
	Handler clipped
	Outcome string
	At      time.Time
}

type eventsPage struct {
	// Mode is "tail", "stream" or "event".
	Mode string
	// The lookup form's values.
	StreamQ, TenantQ string
	Events           []eventView
	// Tail: the positions shown, the head, and the links to older and newer pages.
	From, To, Head int64
	Older, Newer   string
	Live           bool
	// Stream: its description.
	Stream *eventstore.StreamInfo
	// Lifecycle is the stream's archive or deletion record (nil for a stream never archived nor deleted); for a
	// deleted stream it is all the page shows.
	Lifecycle *lifecycleView
	StreamC   clipped
	TenantC   clipped
	Estate    bool
	// Problem is an event of the stream that cannot be read (ProblemLink shows it by position).
	Problem     clipped
	ProblemLink string
}

// eventsPage looks a stream up (its events, versions, payloads, metadata and the messages staged from each), shows
// one event by position, or tails the global log, newest first.
func (c *Console) eventsPage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := eventsPage{Estate: c.estate()}
	stream, err := textParam("stream", q.Get("stream"), 1024)
	if err != nil {
		return err
	}
	p.StreamQ = stream
	if c.estate() {
		tq, err := textParam("tenant", q.Get("tenant"), 255)
		if err != nil {
			return err
		}
		p.TenantQ = tq
	}
	switch {
	case stream != "":
		err = c.streamView(r, q.Get("tenant"), stream, q.Get("from"), &p)
	case q.Get("position") != "":
		err = c.eventByPosition(r, q.Get("position"), &p)
	default:
		err = c.tail(r, q.Get("before"), &p)
	}
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "events", "Events", p)
	return nil
}

// tail shows the last PageSize positions before before (the head when empty), newest first.
func (c *Console) tail(r *http.Request, beforeText string, p *eventsPage) error {
	ctx := r.Context()
	p.Mode = "tail"
	head, err := c.store.HeadPosition(ctx)
	if err != nil {
		return err
	}
	p.Head = head
	upTo := head
	if beforeText != "" {
		before, err := intParam("before", beforeText, 0)
		if err != nil {
			return err
		}
		upTo = min(max(before-1, 0), head)
	} else {
		p.Live = true
	}
	from := max(upTo-int64(c.cfg.PageSize), 0)
	recs, err := c.readRange(r, from, upTo)
	if err != nil {
		return err
	}
	p.From, p.To = from+1, upTo
	for i := len(recs) - 1; i >= 0; i-- {
		p.Events = append(p.Events, c.eventView(recs[i].rec, recs[i].corrupt, false))
	}
	if from > 0 {
		p.Older = c.link("/events", "before", strconv.FormatInt(from+1, 10))
	}
	if upTo < head {
		p.Newer = c.link("/events", "before", strconv.FormatInt(min(upTo+int64(c.cfg.PageSize), head)+1, 10))
	}
	return nil
}

// readItem is a record read from the log, or one that cannot be read (corrupt is its reason).
type readItem struct {
	rec     eventstore.Record
	corrupt string
}

// readRange reads the log's positions (from, upTo] in the scope, gap-safely; a record that cannot be read is kept
// with its reason instead of ending the page.
func (c *Console) readRange(r *http.Request, from, upTo int64) ([]readItem, error) {
	var out []readItem
	after := from
	for tries := 0; after < upTo && tries < 1000; tries++ {
		page, err := c.store.ReadLog(r.Context(), eventstore.LogQuery{After: after, Limit: int(upTo - after),
			Tenants: c.tenants})
		var rerr *eventstore.RecordError
		if errors.As(err, &rerr) {
			out = append(out, readItem{rec: rerr.Record, corrupt: rerr.Err.Error()})
			after = rerr.Record.Position
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, rec := range page.Records {
			if rec.Position <= upTo {
				out = append(out, readItem{rec: rec})
			}
		}
		if page.Last <= after {
			break // in flight: what is safe was handed out
		}
		after = page.Last
	}
	return out, nil
}

// eventByPosition shows the event at a position, with the messages staged from it.
func (c *Console) eventByPosition(r *http.Request, posText string, p *eventsPage) error {
	p.Mode = "event"
	pos, err := intParam("position", posText, 0)
	if err != nil {
		return err
	}
	if pos < 1 {
		return badRequest("position must be 1 or more")
	}
	recs, err := c.readRange(r, pos-1, pos)
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return notFound("no event at position %d in %s", pos, c.scopeName())
	}
	v := c.eventView(recs[0].rec, recs[0].corrupt, true)
	if err := c.attachMessages(r, []*eventView{&v}); err != nil {
		return err
	}
	p.Events = []eventView{v}
	return nil
}

// streamView shows a page of a stream: the latest PageSize versions, or from a version on.
func (c *Console) streamView(r *http.Request, tenantText, stream, fromText string, p *eventsPage) error {
	ctx := r.Context()
	p.Mode = "stream"
	tenant, err := c.tenantParam(tenantText)
	if err != nil {
		return err
	}
	info, err := c.store.Stream(ctx, tenant, stream)
	if errors.Is(err, eventstore.ErrStreamDeleted) || err == nil && info.State != eventstore.StreamActive {
		rec, lerr := c.store.Lifecycle(ctx, tenant, stream)
		if lerr != nil {
			return lerr
		}
		p.Lifecycle, p.StreamC, p.TenantC = lifecycleOf(rec), clip(stream, 1024), clip(tenant, 255)
		if rec.MarkerPosition > 0 {
			p.Lifecycle.MarkerLink = c.link("/events", "position", strconv.FormatInt(rec.MarkerPosition, 10))
		}
		if err != nil {
			return nil // deleted: its events are gone, the record is the page
		}
	}
	if errors.Is(err, eventstore.ErrStreamNotFound) {
		return notFound("no stream %q of tenant %q", clipForError(stream), clipForError(tenant))
	}
	if err != nil {
		return err
	}
	p.Stream, p.StreamC, p.TenantC = &info, clip(stream, 1024), clip(tenant, 255)
	size := int64(c.cfg.PageSize)
	from := max(info.Version-size+1, 1)
	if fromText != "" {
		if from, err = intParam("from", fromText, 1); err != nil {
			return err
		}
		from = max(from, 1)
	}
	recs, err := c.store.ReadStreamPage(ctx, tenant, stream, from, c.cfg.PageSize)
	var rerr *eventstore.RecordError
	if errors.As(err, &rerr) {
		p.Problem = clip(rerr.Error(), 1000)
		p.ProblemLink = c.link("/events", "position", strconv.FormatInt(rerr.Record.Position, 10))
		return nil
	}
	if err != nil {
		return err
	}
	views := make([]*eventView, 0, len(recs))
	for i := len(recs) - 1; i >= 0; i-- {
		v := c.eventView(recs[i], "", true)
		p.Events = append(p.Events, v)
	}
	for i := range p.Events {
		views = append(views, &p.Events[i])
	}
	if err := c.attachMessages(r, views); err != nil {
		return err
	}
	keep := func(kv ...string) []string {
		if c.estate() {
			kv = append(kv, "tenant", tenant)
		}
		return kv
	}
	if from > 1 {
		p.Older = c.link("/events", keep("stream", stream, "from", strconv.FormatInt(max(from-size, 1), 10))...)
	}
	if from+size <= info.Version {
		p.Newer = c.link("/events", keep("stream", stream, "from", strconv.FormatInt(from+size, 10))...)
	}
	p.From, p.To = from, from+int64(len(recs))-1
	return nil
}

func (c *Console) eventView(rec eventstore.Record, corrupt string, full bool) eventView {
	v := eventView{Position: rec.Position, Version: rec.Version, Tenant: clip(rec.Tenant, 120),
		StreamID: clip(rec.StreamID, 300), StreamType: clip(rec.StreamType, 200), Type: clip(rec.Type, 200),
		EventID: rec.EventID.String(), TypeVersion: rec.TypeVersion, OccurredAt: rec.OccurredAt.UTC(),
		RecordedAt: rec.RecordedAt.UTC(), Corrupt: clip(corrupt, 500)}
	v.Summary = clip(string(rec.Payload), 160)
	if full {
		v.Payload = showPayload(rec.Payload, len(rec.Payload), c.cfg.MaxPayload)
		v.Metadata = showMetadata(rec.Metadata, c.cfg.MaxPayload)
	}
	kv := []string{"stream", rec.StreamID}
	if c.estate() {
		kv = append(kv, "tenant", rec.Tenant)
		if rec.Tenant == stagehand.NoTenant {
			kv[len(kv)-1] = ""
		}
	}
	v.StreamLink = c.link("/events", kv...)
	return v
}

// attachMessages adds to each event the messages staged from it, and what became of them.
func (c *Console) attachMessages(r *http.Request, views []*eventView) error {
	if len(views) == 0 {
		return nil
	}
	positions := make([]int64, 0, len(views))
	byPos := map[int64]*eventView{}
	for _, v := range views {
		positions = append(positions, v.Position)
		byPos[v.Position] = v
	}
	msgs, err := c.admin.StagedFrom(r.Context(), positions)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		v := byPos[m.SourcePosition]
		if v == nil {
			continue
		}
		sv := stagedView{ID: clip(m.ID, 200), Topic: clip(m.Topic, 200), Type: clip(m.Type, 200),
			Tenant: clip(m.Tenant, 120), State: m.State, Attempts: m.Attempts, LastError: clip(m.LastError, 300),
			StagedAt: m.StagedAt, DoneAt: m.DoneAt}
		if m.State == outbox.StateDeadLettered {
			sv.Link = c.link("/dead/message", "source", "outbox", "tenant", m.Tenant, "id", m.ID, "topic", m.Topic)
		}
		for _, h := range m.Handled {
			sv.Handled = append(sv.Handled, handledView{Handler: clip(h.Handler, 200), Outcome: h.Outcome, At: h.At})
		}
		v.Messages = append(v.Messages, sv)
	}
	return nil
}

// lifecycleView is a stream's archive or deletion record as the stream page shows it: who asked, when and why, and
// what moved. Actors and reasons are operators' text, clipped like every stored text.
type lifecycleView struct {
	State                       string
	Version, Events             int64
	FirstPosition, LastPosition int64
	MarkerPosition              int64
	ArchivedAt, DeletedAt       time.Time
	ArchivedBy, DeletedBy       clipped
	Reason                      clipped
	MarkerLink                  string
}

func lifecycleOf(rec eventstore.StreamLifecycle) *lifecycleView {
	return &lifecycleView{State: string(rec.State), Version: rec.Version, Events: rec.Events,
		FirstPosition: rec.FirstPosition, LastPosition: rec.LastPosition, MarkerPosition: rec.MarkerPosition,
		ArchivedAt: rec.ArchivedAt, DeletedAt: rec.DeletedAt, ArchivedBy: clip(rec.ArchivedBy, 200),
		DeletedBy: clip(rec.DeletedBy, 200), Reason: clip(rec.Reason, 1000)}
}
