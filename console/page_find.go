package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// findKinds are the lookups of the find page, as its "by" parameter names them.
var findKinds = []struct {
	Value, Label string
	By           outbox.FindBy
}{
	{"any", "anything", outbox.FindAny}, {"id", "message ID", outbox.FindByID},
	{"correlation", "correlation ID", outbox.FindByCorrelation}, {"stream", "stream", outbox.FindByStream},
	{"key", "partition key", outbox.FindByKey},
}

// findStreamEvents bounds how many events of a stream the find page reads from the log to find the messages staged
// from them (the sent ledger keeps no stream ID: it is found by the events' positions).
const findStreamEvents = 500

type findPage struct {
	Q, By, Tenant string
	Kinds         []findKind
	// Searched is true once a query was given; Messages what it found.
	Searched bool
	Messages []foundView
	// Truncated: more matched than are shown; ScanBounded: the outbox table is larger than a correlation or stream
	// lookup reads; NoStream: a stream lookup without a tenant, which the event log cannot answer; StreamCut: the
	// stream has more events than were read.
	Truncated, ScanBounded, NoStream, StreamCut bool
	ScanLimit, StreamLimit                      string
}

type findKind struct {
	Value, Label string
	Current      bool
}

type foundView struct {
	ID, Tenant, Topic, Type, Key, Corr, Stream clipped
	State                                      string
	Attempts                                   int
	LastError, Signature                       clipped
	StagedAt, DoneAt, NextAttemptAt            time.Time
	HoldsKey                                   bool
	Position                                   int64
	// Links: the dead letter, its group, its key, its event, its stream.
	DeadLink, GroupLink, KeyLink, EventLink, StreamLink string
	Failures                                            []failureView
	Handlers                                            []handlerView
}

type failureView struct {
	N, Attempt       int
	Type, Error, Sig clipped
	At               time.Time
}

type handlerView struct {
	Handler                 clipped
	Outcome                 string
	At                      time.Time
	Attempts                int
	LastError, Signature    clipped
	DeadLink, GroupLink     string
	Failures                []failureView
	Dead, Failing, Finished bool
}

// findPage finds a message by its ID, correlation ID, stream or partition key: where it is (pending, scheduled, in
// flight, backing off, parked, dead-lettered, sent or discarded), its attempts and failure history, and what each
// inbox handler made of it. A stream's messages already sent are found through the stream's events in the log
// (with a tenant: a stream belongs to one).
func (c *Console) findPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	text, err := textParam("q", q.Get("q"), maxParam)
	if err != nil {
		return err
	}
	by := q.Get("by")
	if by == "" {
		by = "any"
	}
	kind := -1
	p := findPage{Q: text, By: by, ScanLimit: number(outbox.FindScanLimit), StreamLimit: number(findStreamEvents)}
	for i, k := range findKinds {
		if k.Value == by {
			kind = i
		}
		p.Kinds = append(p.Kinds, findKind{Value: k.Value, Label: k.Label, Current: k.Value == by})
	}
	if kind < 0 {
		return badRequest("by must be any, id, correlation, stream or key")
	}
	scope := c.admin
	tenant := ""
	if t := q.Get("tenant"); t != "" || !c.estate() {
		if tenant, err = c.tenantParam(t); err != nil {
			return err
		}
		scope = c.outbox.Tenant(tenant)
		p.Tenant = c.estateTenant(tenant)
	}
	if text == "" {
		c.render(w, r, http.StatusOK, "find", "Find a message", p)
		return nil
	}
	p.Searched = true
	query := outbox.FindQuery{Text: text, By: findKinds[kind].By, Limit: c.cfg.PageSize}
	if query.By == outbox.FindAny || query.By == outbox.FindByStream {
		switch {
		case tenant == "" && c.estate():
			p.NoStream = true
		default:
			positions, cut, err := c.streamPositions(ctx, tenant, text)
			if err != nil {
				return err
			}
			query.Positions, p.StreamCut = positions, cut
		}
	}
	res, err := scope.Find(ctx, query)
	if errors.Is(err, outbox.ErrInvalidQuery) {
		return badRequest("%v", err)
	}
	if err != nil {
		return err
	}
	p.Truncated, p.ScanBounded = res.Truncated, res.ScanBounded
	for _, m := range res.Messages {
		p.Messages = append(p.Messages, c.foundView(m))
	}
	c.render(w, r, http.StatusOK, "find", "Find a message", p)
	return nil
}

// streamPositions returns the log positions of the latest events of a tenant's stream (at most findStreamEvents),
// and whether the stream has more; none when there is no such stream.
func (c *Console) streamPositions(ctx context.Context, tenant, stream string) ([]int64, bool, error) {
	info, err := c.store.Stream(ctx, tenant, stream)
	if errors.Is(err, eventstore.ErrStreamNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	from := max(info.Version-findStreamEvents+1, 1)
	recs, err := c.store.ReadStreamPage(ctx, tenant, stream, from, findStreamEvents)
	var rerr *eventstore.RecordError
	if err != nil && !errors.As(err, &rerr) {
		return nil, false, err
	}
	out := make([]int64, 0, len(recs))
	for _, rec := range recs {
		out = append(out, rec.Position)
	}
	return out, from > 1, nil
}

func (c *Console) foundView(m outbox.FoundMessage) foundView {
	v := foundView{ID: clip(m.ID, 300), Tenant: clip(m.Tenant, 255), Topic: clip(m.Topic, 300),
		Type: clip(m.Type, 300), Key: clip(m.PartitionKey, 300), Corr: clip(m.CorrelationID, 300),
		Stream: clip(m.StreamID, 300), State: m.State, Attempts: m.Attempts, LastError: clip(m.LastError, 1000),
		Signature: clip(m.ErrorSignature, 300), StagedAt: m.StagedAt, DoneAt: m.DoneAt,
		NextAttemptAt: m.NextAttemptAt, HoldsKey: m.HoldsKey, Position: m.SourcePosition}
	if m.State == outbox.StateDeadLettered {
		v.DeadLink = c.link("/dead/message", "source", "outbox", "tenant", m.Tenant, "id", m.ID, "topic", m.Topic)
		v.GroupLink = c.link("/dead", "source", "outbox", "signature", m.ErrorSignature)
	}
	if m.PartitionKey != "" && m.State != outbox.StateSent && m.State != outbox.StateDiscarded {
		v.KeyLink = c.link("/outbox/key", "tenant", m.Tenant, "key", m.PartitionKey)
	}
	if m.SourcePosition > 0 {
		v.EventLink = c.link("/events", "position", strconv.FormatInt(m.SourcePosition, 10))
	}
	if m.StreamID != "" {
		v.StreamLink = c.link("/events", "stream", m.StreamID, "tenant", m.Tenant)
	}
	v.Failures = failureViews(m.Failures)
	for _, h := range m.Handlers {
		hv := handlerView{Handler: clip(h.Handler, 300), Outcome: h.Outcome, At: h.At, Attempts: h.Attempts,
			LastError: clip(h.LastError, 1000), Signature: clip(h.ErrorSignature, 300),
			Failures: failureViews(h.Failures), Dead: h.Outcome == outbox.OutcomeDeadLettered,
			Failing: h.Outcome == outbox.OutcomeFailing, Finished: h.Outcome == outbox.OutcomeHandled}
		if hv.Dead {
			hv.DeadLink = c.link("/dead/message", "source", "inbox", "tenant", m.Tenant, "handler", h.Handler,
				"id", m.ID)
			if h.ErrorSignature != "" {
				hv.GroupLink = c.link("/dead", "source", "inbox", "signature", h.ErrorSignature)
			}
		}
		v.Handlers = append(v.Handlers, hv)
	}
	return v
}

func failureViews(fs []outbox.Failure) []failureView {
	out := make([]failureView, 0, len(fs))
	for _, f := range fs {
		out = append(out, failureView{N: f.N, Attempt: f.Attempt, Type: clip(f.ErrorType, 200),
			Error: clip(f.Error, 1000), Sig: clip(f.Signature, 300), At: f.At})
	}
	return out
}

// estateTenant is the tenant to name in a link's tenant parameter: the tenant on an estate-wide console (which
// narrows to it), nothing on a tenant's own (always its own).
func (c *Console) estateTenant(tenant string) string {
	if !c.estate() {
		return ""
	}
	return tenant
}

// findLink is a link to a message's find page.
type findLink struct {
	ID   clipped
	Link string
}

// maxFindLinks bounds the find links the page after an action shows.
const maxFindLinks = 20

// findLinks turns message IDs (the page after an action names them) into links to their find pages.
func (c *Console) findLinks(ids []string) []findLink {
	var out []findLink
	for _, id := range ids {
		if len(out) == maxFindLinks {
			break
		}
		if id == "" || len(id) > maxParam {
			continue
		}
		out = append(out, findLink{ID: clip(id, 120), Link: c.link("/find", "q", id, "by", "id")})
	}
	return out
}

// doneLink is the page after an action: its record, the page to go back to, and the messages it named.
func (c *Console) doneLink(id int64, p *plan) string {
	link := c.link("/done", "id", strconv.FormatInt(id, 10), "back", p.Back)
	ids := p.Find
	if len(ids) > maxFindLinks {
		ids = ids[:maxFindLinks]
	}
	for _, m := range ids {
		link += "&find=" + url.QueryEscape(m)
	}
	return link
}
