package console

import (
	"net/http"
	"time"

	"github.com/stagehand-es/stagehand/outbox"
)

type groupsPage struct {
	F       deadFilter
	Sources []tab
	Outbox  bool
	Groups  []causeView
	// List is the same filter's list of dead letters; Describe says what the filter selects.
	List, Describe string
	// Back is this page, for the actions' forms.
	Back string
}

type causeView struct {
	Signature, Type, Sample clipped
	Count                   int64
	FirstDeadAt, LastDeadAt time.Time
	FirstAge, LastAge       time.Duration
	// List lists the group's dead letters; Hidden are the fields of its actions' forms (the filter and the
	// signature), which the confirmation signs.
	List   string
	Hidden []hiddenField
}

// groupsPage groups the dead letters of the outbox or the inbox that the filter selects by the signature of their
// last error (its type and its message with numbers, IDs and quoted values replaced): each group's size, first and
// last death and a sample error, the largest first, with the forms to list, redrive or discard a group. A group's
// actions are the list's "every matching" actions with the group's signature added to the filter, so they are
// confirmed, signed and recorded as every other.
func (c *Console) groupsPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	f, err := c.parseDeadFilter(r.URL.Query().Get)
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	scope := c.deadScope(f)
	vals := f.values()
	p := groupsPage{F: f, Outbox: f.Source == "outbox", Describe: f.describe(),
		List: c.cfg.Prefix + "/dead?" + vals.Encode(), Back: c.cfg.Prefix + "/dead/groups?" + vals.Encode()}
	for _, s := range []string{"outbox", "inbox"} {
		p.Sources = append(p.Sources, tab{Name: s, Link: c.link("/dead/groups", "source", s),
			Current: s == f.Source})
	}
	var groups []outbox.DeadLetterGroup
	if p.Outbox {
		opts := f.listOptions(now)
		opts.Limit = c.cfg.PageSize
		groups, err = scope.DeadLetterGroups(ctx, opts)
	} else {
		opts := f.inboxOptions(now)
		opts.Limit = c.cfg.PageSize
		groups, err = scope.InboxDeadLetterGroups(ctx, opts)
	}
	if err != nil {
		return err
	}
	for _, g := range groups {
		gf := f
		gf.Signature = g.Signature
		gv := gf.values()
		p.Groups = append(p.Groups, causeView{Signature: clip(g.Signature, 300), Type: clip(g.ErrorType, 200),
			Sample: clip(g.SampleError, 300), Count: g.Count, FirstDeadAt: g.FirstDeadAt, LastDeadAt: g.LastDeadAt,
			FirstAge: max(now.Sub(g.FirstDeadAt), 0), LastAge: max(now.Sub(g.LastDeadAt), 0),
			List: c.cfg.Prefix + "/dead?" + gv.Encode(), Hidden: hiddenFields(gv)})
	}
	c.render(w, r, http.StatusOK, "groups", "Dead letters by cause", p)
	return nil
}
