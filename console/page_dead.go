package console

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

// deadFilter is the dead-letter filter of the list, the confirmation and the action: from the query (GET) or the
// form (POST), validated.
type deadFilter struct {
	// Source is "outbox" or "inbox".
	Source string
	// Tenant narrows an estate-wide console to one tenant (HasTenant); a tenant's console is always its own.
	Tenant    string
	HasTenant bool
	// Topic, Type, Error (a substring of the last error), Handler (inbox), ID and Signature (the last error's
	// signature: a group of one cause) select; Older and Newer are ages.
	Topic, Type, Error, Handler, ID, Signature string
	Older, Newer                               string
	// Newest orders the list newest first (the default); false is oldest first.
	Newest bool

	older, newer time.Duration
}

// parseDeadFilter reads and checks a filter.
func (c *Console) parseDeadFilter(get func(string) string) (deadFilter, error) {
	f := deadFilter{Source: get("source"), Newest: get("order") != "oldest"}
	switch f.Source {
	case "":
		f.Source = "outbox"
	case "outbox", "inbox":
	default:
		return f, badRequest("source must be outbox or inbox")
	}
	if o := get("order"); o != "" && o != "oldest" && o != "newest" {
		return f, badRequest("order must be newest or oldest")
	}
	var err error
	for _, field := range []struct {
		name string
		dst  *string
	}{{"topic", &f.Topic}, {"type", &f.Type}, {"error", &f.Error}, {"handler", &f.Handler}, {"id", &f.ID},
		{"signature", &f.Signature}, {"older", &f.Older}, {"newer", &f.Newer}} {
		if *field.dst, err = textParam(field.name, get(field.name), maxParam); err != nil {
			return f, err
		}
	}
	if f.Source == "outbox" {
		f.Handler = ""
	}
	if f.Older != "" {
		if f.older, err = parseAge(f.Older); err != nil {
			return f, badRequest("older: %v", err)
		}
	}
	if f.Newer != "" {
		if f.newer, err = parseAge(f.Newer); err != nil {
			return f, badRequest("newer: %v", err)
		}
	}
	if t := get("tenant"); t != "" || get("notenant") == "1" {
		if f.Tenant, err = c.tenantParam(t); err != nil {
			return f, err
		}
		f.HasTenant = c.estate()
	}
	return f, nil
}

// values writes the filter back as query values (for links and the forms' hidden fields).
func (f deadFilter) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("source", f.Source)
	set("topic", f.Topic)
	set("type", f.Type)
	set("error", f.Error)
	set("handler", f.Handler)
	set("id", f.ID)
	set("signature", f.Signature)
	set("older", f.Older)
	set("newer", f.Newer)
	if f.HasTenant {
		set("tenant", f.Tenant)
		if f.Tenant == stagehand.NoTenant {
			v.Set("notenant", "1")
		}
	}
	if !f.Newest {
		v.Set("order", "oldest")
	}
	return v
}

// describe says what the filter selects, for confirmations and the audit record.
func (f deadFilter) describe() string {
	s := ""
	add := func(k, v string) {
		if v != "" {
			if s != "" {
				s += ", "
			}
			s += k + " " + strconv.Quote(v)
		}
	}
	if f.HasTenant {
		add("tenant", f.Tenant)
	}
	add("topic", f.Topic)
	add("type", f.Type)
	add("handler", f.Handler)
	add("message ID", f.ID)
	add("error contains", f.Error)
	add("error signature", f.Signature)
	add("dead for more than", f.Older)
	add("dead for less than", f.Newer)
	if s == "" {
		return "every " + f.Source + " dead letter"
	}
	return s
}

// scope is the admin the filter acts through: the console's, or the filter's tenant's.
func (c *Console) deadScope(f deadFilter) *outbox.Admin {
	if f.HasTenant {
		return c.outbox.Tenant(f.Tenant)
	}
	return c.admin
}

// listOptions is the outbox filter at now.
func (f deadFilter) listOptions(now time.Time) outbox.ListOptions {
	o := outbox.ListOptions{Topic: f.Topic, Type: f.Type, ErrorContains: f.Error, ID: f.ID, Signature: f.Signature,
		NewestFirst: f.Newest}
	if f.older > 0 {
		o.DeadBefore = now.Add(-f.older)
	}
	if f.newer > 0 {
		o.DeadAfter = now.Add(-f.newer)
	}
	return o
}

// inboxOptions is the inbox filter at now.
func (f deadFilter) inboxOptions(now time.Time) outbox.InboxListOptions {
	o := outbox.InboxListOptions{Topic: f.Topic, Type: f.Type, ErrorContains: f.Error, Handler: f.Handler, ID: f.ID,
		Signature: f.Signature, NewestFirst: f.Newest}
	if f.older > 0 {
		o.DeadBefore = now.Add(-f.older)
	}
	if f.newer > 0 {
		o.DeadAfter = now.Add(-f.newer)
	}
	return o
}

type deadPage struct {
	F deadFilter
	// Groups is the same filter's page of groups by cause.
	Groups   string
	Sources  []tab
	Outbox   bool
	Rows     []deadRow
	Count    int64
	Next     string
	Describe string
	// Hidden are the filter's fields for the action forms.
	Hidden []hiddenField
	Clear  string
	Back   string
}

type hiddenField struct{ Name, Value string }

func hiddenFields(v url.Values) []hiddenField {
	var out []hiddenField
	for k, vs := range v {
		for _, s := range vs {
			out = append(out, hiddenField{k, s})
		}
	}
	sortHidden(out)
	return out
}

type deadRow struct {
	// Sel is the row's value in a selection.
	Sel                                   string
	ID, Tenant, Topic, Type, Handler, Key clipped
	LastError                             clipped
	Attempts                              int
	HoldsKey                              bool
	Age                                   time.Duration
	DeadAt                                time.Time
	Size                                  int
	Link                                  string
}

// deadPage lists the dead letters of the outbox or the inbox that the filter selects (topic, type, tenant, handler,
// error text, age), newest first, a page at a time, with the forms to redrive or discard a selection or everything
// the filter selects.
func (c *Console) deadPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	f, err := c.parseDeadFilter(q.Get)
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	scope := c.deadScope(f)
	vals := f.values()
	p := deadPage{F: f, Outbox: f.Source == "outbox", Describe: f.describe(), Hidden: hiddenFields(vals),
		Clear: c.link("/dead", "source", f.Source)}
	p.Back = c.cfg.Prefix + "/dead?" + vals.Encode()
	p.Groups = c.cfg.Prefix + "/dead/groups?" + vals.Encode()
	for _, s := range []string{"outbox", "inbox"} {
		p.Sources = append(p.Sources, tab{Name: s, Link: c.link("/dead", "source", s), Current: s == f.Source})
	}
	next := func(cursor string) string {
		v := f.values()
		v.Set("after", cursor)
		return c.cfg.Prefix + "/dead?" + v.Encode()
	}
	if p.Outbox {
		opts := f.listOptions(now)
		opts.Limit, opts.PayloadLimit, opts.TextLimit = c.cfg.PageSize, 1, listErrorChars
		if cur := q.Get("after"); cur != "" {
			var k deadCursor
			if err := decodeCursor(cur, &k); err != nil {
				return err
			}
			opts.After = &outbox.DeadLetter{Message: outbox.Message{ID: k.ID, Topic: k.Topic, Tenant: k.Tenant},
				DeadAt: k.At}
		}
		dls, err := scope.DeadLetters(ctx, opts)
		if err != nil {
			return err
		}
		if p.Count, err = scope.CountDeadLetters(ctx, opts); err != nil {
			return err
		}
		for _, d := range dls {
			p.Rows = append(p.Rows, deadRow{Sel: encodeCursor([]string{d.Tenant, d.ID}), ID: clip(d.ID, 120),
				Tenant: clip(d.Tenant, 120), Topic: clip(d.Topic, 200), Type: clip(d.Type, 200),
				Key: clip(d.PartitionKey, 200), LastError: clip(d.LastError, 300), Attempts: d.Attempts,
				HoldsKey: d.HoldsKey, Age: max(now.Sub(d.DeadAt), 0), DeadAt: d.DeadAt, Size: d.PayloadSize,
				Link: c.link("/dead/message", "source", "outbox", "tenant", d.Tenant, "id", d.ID, "topic", d.Topic)})
		}
		if len(dls) == c.cfg.PageSize {
			last := dls[len(dls)-1]
			p.Next = next(encodeCursor(deadCursor{At: last.DeadAt, ID: last.ID, Topic: last.Topic,
				Tenant: last.Tenant}))
		}
	} else {
		opts := f.inboxOptions(now)
		opts.Limit, opts.PayloadLimit, opts.TextLimit = c.cfg.PageSize, 1, listErrorChars
		if cur := q.Get("after"); cur != "" {
			var k deadCursor
			if err := decodeCursor(cur, &k); err != nil {
				return err
			}
			opts.After = &outbox.InboxDeadLetter{MessageID: k.ID, Handler: k.Handler, Tenant: k.Tenant, DeadAt: k.At}
		}
		dls, err := scope.InboxDeadLetters(ctx, opts)
		if err != nil {
			return err
		}
		if p.Count, err = scope.CountInboxDeadLetters(ctx, opts); err != nil {
			return err
		}
		for _, d := range dls {
			p.Rows = append(p.Rows, deadRow{Sel: encodeCursor([]string{d.Tenant, d.Handler, d.MessageID}),
				ID: clip(d.MessageID, 120), Tenant: clip(d.Tenant, 120), Topic: clip(d.Topic, 200),
				Type: clip(d.MessageType, 200), Handler: clip(d.Handler, 200), LastError: clip(d.LastError, 300),
				Attempts: d.Attempts, Age: max(now.Sub(d.DeadAt), 0), DeadAt: d.DeadAt, Size: d.PayloadSize,
				Link: c.link("/dead/message", "source", "inbox", "tenant", d.Tenant, "handler", d.Handler,
					"id", d.MessageID)})
		}
		if len(dls) == c.cfg.PageSize {
			last := dls[len(dls)-1]
			p.Next = next(encodeCursor(deadCursor{At: last.DeadAt, ID: last.MessageID, Handler: last.Handler,
				Tenant: last.Tenant}))
		}
	}
	c.render(w, r, http.StatusOK, "dead", "Dead letters", p)
	return nil
}

// deadCursor is the keyset of a dead-letter page.
type deadCursor struct {
	At      time.Time `json:"t"`
	ID      string    `json:"i"`
	Topic   string    `json:"p,omitempty"`
	Handler string    `json:"h,omitempty"`
	Tenant  string    `json:"n"`
}

type messagePage struct {
	Outbox                                             bool
	ID, Tenant, Topic, Type, Handler, Key, Corr, Cause clipped
	LastError                                          payload
	Payload                                            payload
	Metadata                                           []pair
	Attempts                                           int
	Sequence, SourcePosition                           int64
	HoldsKey                                           bool
	CreatedAt, DeadAt, ScheduledAt                     time.Time
	Age                                                time.Duration
	// Sel is the message's value in an action's selection; Back the list to return to; Find its find page
	// (every place it is, its failure history).
	Sel, Back, Find string
	// Signature is the last error's signature; Group lists the dead letters of that cause.
	Signature          clipped
	Group              string
	EventLink, KeyLink string
}

// deadMessagePage shows one dead letter: its payload, metadata, headers and last error, with the forms to redrive
// or discard it.
func (c *Console) deadMessagePage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	f, err := c.parseDeadFilter(func(k string) string {
		if k == "tenant" || k == "older" || k == "newer" || k == "error" || k == "type" {
			return "" // the message is named by the rest
		}
		return q.Get(k)
	})
	if err != nil {
		return err
	}
	tenant, err := c.tenantParam(q.Get("tenant"))
	if err != nil {
		return err
	}
	if f.ID == "" {
		return badRequest("id is required")
	}
	scope := c.outbox.Tenant(tenant)
	now := c.cfg.Clock()
	p := messagePage{Outbox: f.Source == "outbox", Back: c.link("/dead", "source", f.Source)}
	limit := c.cfg.MaxPayload
	if p.Outbox {
		dls, err := scope.DeadLetters(ctx, outbox.ListOptions{ID: f.ID, Topic: f.Topic, Limit: 1, PayloadLimit: limit})
		if err != nil {
			return err
		}
		if len(dls) == 0 {
			return notFound("no outbox dead letter %q of %s (redriven, discarded, or never dead-lettered)",
				clipForError(f.ID), clipForError(tenant))
		}
		d := dls[0]
		p.ID, p.Tenant, p.Topic, p.Type = clip(d.ID, 1024), clip(d.Tenant, 300), clip(d.Topic, 1024), clip(d.Type, 1024)
		p.Key, p.Corr, p.Cause = clip(d.PartitionKey, 1024), clip(d.CorrelationID, 1024), clip(d.CausationID, 1024)
		p.LastError = showPayload([]byte(d.LastError), len(d.LastError), limit)
		p.Payload = showPayload(d.Payload, d.PayloadSize, limit)
		p.Metadata = showMetadata(d.Metadata, limit)
		p.Attempts, p.Sequence, p.SourcePosition, p.HoldsKey = d.Attempts, d.Sequence, d.SourcePosition, d.HoldsKey
		p.CreatedAt, p.DeadAt, p.ScheduledAt = d.CreatedAt, d.DeadAt, d.ScheduledAt
		p.Signature = clip(d.ErrorSignature, 300)
		p.Group = c.link("/dead", "source", "outbox", "signature", d.ErrorSignature)
		p.Sel = encodeCursor([]string{d.Tenant, d.ID})
		if d.SourcePosition > 0 {
			p.EventLink = c.link("/events", "position", strconv.FormatInt(d.SourcePosition, 10))
		}
		if d.PartitionKey != "" {
			p.KeyLink = c.link("/outbox/key", "tenant", d.Tenant, "key", d.PartitionKey)
		}
	} else {
		if f.Handler == "" {
			return badRequest("handler is required for an inbox dead letter")
		}
		dls, err := scope.InboxDeadLetters(ctx, outbox.InboxListOptions{Handler: f.Handler, ID: f.ID, Limit: 1,
			PayloadLimit: limit})
		if err != nil {
			return err
		}
		if len(dls) == 0 {
			return notFound("no inbox dead letter %q of handler %q (redriven, discarded, or never dead-lettered)",
				clipForError(f.ID), clipForError(f.Handler))
		}
		d := dls[0]
		p.ID, p.Tenant, p.Topic, p.Type = clip(d.MessageID, 1024), clip(d.Tenant, 300), clip(d.Topic, 1024),
			clip(d.MessageType, 1024)
		p.Handler = clip(d.Handler, 1024)
		p.LastError = showPayload([]byte(d.LastError), len(d.LastError), limit)
		p.Payload = showPayload(d.Payload, d.PayloadSize, limit)
		p.Metadata = showMetadata(d.Metadata, limit)
		p.Attempts, p.DeadAt = d.Attempts, d.DeadAt
		p.Signature = clip(d.ErrorSignature, 300)
		p.Group = c.link("/dead", "source", "inbox", "signature", d.ErrorSignature)
		p.Corr = clip(d.Metadata[stagehand.HeaderCorrelationID], 1024)
		p.Cause = clip(d.Metadata[stagehand.HeaderCausationID], 1024)
		p.Sel = encodeCursor([]string{d.Tenant, d.Handler, d.MessageID})
	}
	p.Age = max(now.Sub(p.DeadAt), 0)
	p.Find = c.link("/find", "q", f.ID, "by", "id", "tenant", c.estateTenant(tenant))
	c.render(w, r, http.StatusOK, "message", "Dead letter", p)
	return nil
}

// listErrorChars is how much of each last error a dead-letter list reads (its first characters; the list shows 300
// bytes and the rest on hover): a list never reads a huge error, nor any metadata, whole.
const listErrorChars = 1024
