package console_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/outbox"
)

// found reads the find page's results: "state:id" of each message, in order.
func found(t *testing.T, ctx context.Context) []string {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("article.found"))
		.map(a => a.dataset.state + ":" + a.dataset.id)`))
	require.NoError(t, err)
	return out
}

// search fills the find form and submits it.
func search(t *testing.T, ctx context.Context, base, text, by, tenant string) {
	t.Helper()
	do(t, ctx, chromedp.Navigate(base+"/find"), chromedp.WaitVisible(chromedp.ID("find-q")),
		chromedp.SendKeys(chromedp.ID("find-q"), text), chromedp.SetValue(chromedp.ID("find-by"), by))
	if tenant != "" {
		do(t, ctx, chromedp.SendKeys(chromedp.ID("find-tenant"), tenant))
	}
	do(t, ctx, chromedp.Click(chromedp.ID("find-go")), chromedp.WaitVisible(chromedp.ID("find-summary")))
}

// An operator finds messages of the shop by each kind of lookup: the dead letter by its ID and its correlation ID,
// an order's messages by stream (its sent one through the order's events) and by key, and a message the billing
// handler dead-lettered; then redrives the dead letter from its page and follows the page after the redrive to
// the message, handled at last.
func TestFindAMessageEachWay(t *testing.T) {
	s := openShop(t)
	s.seed()
	base := serve(t, s, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("dana", "on-call")
	})
	dls, err := s.ob.AllTenants().DeadLetters(context.Background(), outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	dead := dls[0]
	ctx := browser(t)
	do(t, ctx, signIn("dana", "on-call"))

	search(t, ctx, base, dead.ID, "id", "")
	require.Equal(t, []string{"dead-lettered:" + dead.ID}, found(t, ctx))
	page := text(t, ctx, "main")
	require.Contains(t, page, "payment gateway: card declined for order order-7 (HTTP 402)")
	require.Contains(t, page, "error: payment gateway: card declined for order order-<n> (HTTP <n>)",
		"the cause")
	screenshot(t, ctx, "find")

	search(t, ctx, base, dead.CorrelationID, "correlation", "")
	require.Contains(t, found(t, ctx), "dead-lettered:"+dead.ID)

	// The order's stream: its two messages (the dead letter and the note its key holds); with the tenant, the
	// stream's events find them in the ledger too.
	search(t, ctx, base, "order-7", "stream", "")
	require.Len(t, found(t, ctx), 2)
	search(t, ctx, base, "order-3", "stream", acme)
	require.Len(t, found(t, ctx), 1)
	require.True(t, strings.HasPrefix(found(t, ctx)[0], "sent:"))
	require.Contains(t, text(t, ctx, "table.handlers"), "billing")
	require.Contains(t, text(t, ctx, "table.handlers"), "handled")

	search(t, ctx, base, "order-7", "key", "")
	states := strings.Join(found(t, ctx), " ")
	require.Contains(t, states, "dead-lettered:")
	require.Contains(t, states, "parked:")

	// The invoice billing dead-lettered: sent by the outbox, dead-lettered by its handler.
	search(t, ctx, base, "g-order-3", "any", globex)
	require.Len(t, found(t, ctx), 1)
	require.Contains(t, text(t, ctx, "table.handlers"), "dead-lettered")
	require.Contains(t, text(t, ctx, "main"), "invoice amount is negative: -500 cents")

	// Redrive the dead letter from its page; the page after it links to the message.
	s.gateway.down.Store(false)
	do(t, ctx, chromedp.Navigate(base+"/dead/message?source=outbox&tenant="+acme+"&id="+url.QueryEscape(dead.ID)+
		"&topic="+topic), chromedp.Click(chromedp.ID("redrive-one")), chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS("a.find-link")))
	require.Equal(t, "1", text(t, ctx, "#done-affected"))
	do(t, ctx, chromedp.Click(chromedp.CSS("a.find-link")), chromedp.WaitVisible(chromedp.ID("find-summary")))
	s.settle(0, 1)
	do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("find-summary")))
	require.Equal(t, []string{"sent:" + dead.ID}, found(t, ctx))
	require.Contains(t, text(t, ctx, "table.handlers"), "handled", "billing handled it")
	require.Contains(t, text(t, ctx, "table.failures"), "card declined", "the attempt that failed is kept")
}

// An operator sees the dead letters grouped by cause, redrives a group and discards another, each through its
// confirmation; a confirmation whose group was changed in the page is refused and recorded, and moves nothing.
func TestDeadLetterGroupsRedriveDiscardAndRefusal(t *testing.T) {
	s := openShop(t)
	s.seed()
	for _, id := range []string{"order-30", "order-31"} {
		s.place(acme, id, OrderPlaced{Item: "grinder", Cents: 9900, Note: declined})
	}
	s.settle(3, 1)
	base := serve(t, s, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("dana", "on-call")
	})
	ctx := browser(t)
	do(t, ctx, signIn("dana", "on-call"), chromedp.Navigate(base+"/dead"), chromedp.Click(chromedp.ID("by-cause")),
		chromedp.WaitVisible(chromedp.CSS("table.groups")))
	require.Equal(t, "3", text(t, ctx, "tr.group .count"))
	require.Contains(t, text(t, ctx, "tr.group"), "card declined for order order-<n>")
	screenshot(t, ctx, "dead-groups")

	// The confirmation of the group, its signature changed in the page before confirming: refused.
	do(t, ctx, chromedp.Click(chromedp.CSS("#group-0 .group-redrive")), chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "3", text(t, ctx, "#confirm-count"))
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.querySelector('#confirm-form input[name="signature"]').value = "error: anything else"; true`))
	require.NoError(t, err)
	do(t, ctx, chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS("section.error-page")))
	require.Contains(t, text(t, ctx, "section.error-page"), "403")
	st, err := s.ob.AllTenants().Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, st.DeadLettered, "nothing was redriven")
	var refused int
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		pgx.Identifier{s.schema, "console_audit"}.Sanitize()+` WHERE action = 'outbox.redrive'
		AND error LIKE 'refused: %'`).Scan(&refused))
	require.Equal(t, 1, refused, "the refusal is recorded")

	// The gateway is back: the group is redriven as confirmed, and its messages reach billing.
	s.gateway.down.Store(false)
	do(t, ctx, chromedp.Navigate(base+"/dead/groups"), chromedp.Click(chromedp.CSS("#group-0 .group-redrive")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Contains(t, text(t, ctx, "section.confirm"), "error signature")
	do(t, ctx, chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("done-affected")))
	require.Equal(t, "3", text(t, ctx, "#done-affected"))
	s.settle(0, 1)

	// The inbox's group: billing's negative invoice, discarded.
	do(t, ctx, chromedp.Navigate(base+"/dead/groups?source=inbox"), chromedp.WaitVisible(chromedp.CSS("tr.group")))
	require.Contains(t, text(t, ctx, "tr.group"), "invoice amount is negative: -<n> cents")
	do(t, ctx, chromedp.Click(chromedp.CSS("#group-0 .group-discard")), chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("done-affected")))
	require.Equal(t, "1", text(t, ctx, "#done-affected"))
	in, err := s.ob.AllTenants().InboxStats(context.Background())
	require.NoError(t, err)
	require.Zero(t, in.DeadLettered)
	do(t, ctx, chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(chromedp.CSS("table.audit")))
	audit := text(t, ctx, "table.audit")
	require.Contains(t, audit, "inbox.discard")
	require.Contains(t, audit, fmt.Sprintf("error signature %q", "error: invoice amount is negative: -<n> cents"))
}
