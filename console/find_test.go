package console_test

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/outbox"
)

// foundStates returns "id=state" of each message the find page shows.
func foundStates(page string) []string {
	var out []string
	for _, part := range strings.Split(page, `<article class="found" data-state="`)[1:] {
		state, rest, _ := strings.Cut(part, `"`)
		_, rest, _ = strings.Cut(rest, `data-id="`)
		id, _, _ := strings.Cut(rest, `"`)
		out = append(out, unescape(id)+"="+state)
	}
	return out
}

// The find page looks a message up by ID, correlation ID, stream (through its events, with a tenant) and key,
// says where each is, and refuses what it cannot read.
func TestFindPageLooksUpEachKind(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.seed()
	_, err := w.ob.Stage(context.Background(), outbox.Message{ID: "c-1", Topic: "orders", Tenant: "acme",
		CorrelationID: "corr-7", Payload: []byte("{}")})
	require.NoError(t, err)

	page := w.page("/find")
	require.Contains(t, page, `id="find-q"`)
	require.Nil(t, foundStates(page), "no search, no result")

	page = w.page("/find?q=acme-1&by=id")
	require.Equal(t, []string{"acme-1=dead-lettered"}, foundStates(page))
	require.Contains(t, page, "/dead/message?id=acme-1")
	require.Contains(t, page, "payment gateway timeout for acme-1")
	require.Contains(t, page, template.HTMLEscapeString("error: payment gateway timeout for acme-<n>"),
		"the cause, linked to its group")
	require.Equal(t, []string{"acme-2=parked"}, foundStates(w.page("/find?q=acme-2&by=id")), "behind acme-1")
	require.Equal(t, []string{"globex-1=sent"}, foundStates(w.page("/find?q=globex-1&by=id")))
	require.Equal(t, []string{"c-1=pending"}, foundStates(w.page("/find?q=corr-7&by=correlation")))
	require.Equal(t, []string{"c-1=pending"}, foundStates(w.page("/find?q=corr-7")), "any: as a correlation ID")

	// A stream: its events' messages, sent or dead, with a tenant; without one the page says why it cannot.
	require.ElementsMatch(t, []string{"acme-1=dead-lettered", "acme-2=parked", "acme-3=parked"},
		foundStates(w.page("/find?q=order-1&by=stream&tenant=acme")))
	require.ElementsMatch(t, []string{"globex-1=sent", "globex-2=dead-lettered"},
		foundStates(w.page("/find?q=order-9&by=stream&tenant=globex")), "the ledger, through the events")
	page = w.page("/find?q=order-1&by=stream")
	require.Contains(t, page, `id="find-nostream"`)
	require.Empty(t, foundStates(page), "the seeded messages carry no stream header")
	require.ElementsMatch(t, []string{"acme-1=dead-lettered", "acme-2=parked", "acme-3=parked"},
		foundStates(w.page("/find?q=order-1&by=key")))

	// The inbox: a message known only to its handler's dead letters.
	page = w.page("/find?q=inv-1")
	require.Equal(t, []string{"inv-1=received"}, foundStates(page))
	require.Contains(t, page, `data-handler="billing"`)
	require.Contains(t, page, "ledger is down")

	page = w.page("/find?q=nothing-like-it")
	require.Contains(t, page, `id="find-none"`)
	for path, code := range map[string]int{
		"/find?q=x&by=everything":                         http.StatusBadRequest,
		"/find?q=" + strings.Repeat("x", 1025):            http.StatusBadRequest,
		"/find?q=x&tenant=" + url.QueryEscape("bad\x00t"): http.StatusBadRequest,
	} {
		got, body := w.get(path)
		require.Equal(t, code, got, "%s: %s", path, body)
	}

	// A tenant's console finds its own tenant's messages only.
	acme := newWorldOn(t, w.pool, w.schema, func(c *console.Config) { c.Tenant = ptr("acme") })
	require.Empty(t, foundStates(acme.page("/find?q=globex-2")))
	require.Equal(t, []string{"acme-1=dead-lettered"}, foundStates(acme.page("/find?q=acme-1")))
	got, _ := acme.get("/find?q=globex-2&tenant=globex")
	require.Equal(t, http.StatusForbidden, got)
}

func ptr[T any](v T) *T { return &v }

// groupDeadLetters dead-letters three messages of one cause (timeouts, numbers varying) and one of another.
func (w *world) groupDeadLetters() {
	w.t.Helper()
	var msgs []outbox.Message
	for _, id := range []string{"d-1", "d-2", "d-3", "d-4"} {
		msgs = append(msgs, outbox.Message{ID: id, Topic: "orders", Tenant: "acme", Payload: []byte("{}")})
	}
	w.deadLetter(msgs, func(id string) error {
		if id == "d-4" {
			return fmt.Errorf(`card declined for %q`, id)
		}
		return fmt.Errorf("timeout after %dms on order %s", 10*len(id)+int(id[2]), id)
	})
}

// The groups page groups dead letters by cause; a group is redriven and another discarded through the
// confirmation, and a confirmation whose group was changed afterwards is refused and recorded.
func TestDeadLetterGroupsPageAndGroupActions(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
	})
	w.groupDeadLetters()
	w.inboxDeadLetter("billing", "acme", "inv-1", `{}`, nil, "ledger row 17 is locked")
	auth := []string{"Authorization", basic("ops", "pw")}

	page := w.page("/dead/groups?source=outbox", auth...)
	timeout, declined := "error: timeout after <duration> on order d-<n>", `error: card declined for "?"`
	require.Contains(t, page, `data-signature="`+template.HTMLEscapeString(timeout))
	i, j := strings.Index(page, "timeout after"), strings.Index(page, "card declined")
	require.True(t, i > 0 && j > i, "the largest group first")
	inbox := w.page("/dead/groups?source=inbox", auth...)
	require.Contains(t, inbox, "error: ledger row &lt;n&gt; is locked")

	// The list of a group's dead letters.
	list := w.page("/dead?source=outbox&signature="+url.QueryEscape(timeout), auth...)
	require.Contains(t, list, `<strong id="match-count">3</strong>`)

	confirmGroup := func(form string, do string) url.Values {
		t.Helper()
		f := hidden(t, page, form)
		f.Set("do", do)
		resp := w.post("/confirm", f, auth...)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return hidden(t, body(t, resp), "confirm-form")
	}
	// group-0 is the timeouts (three), group-1 the declined card.
	redrive := confirmGroup("group-0", "redrive:matching")
	require.Equal(t, "3", redrive.Get("expected"))
	require.Equal(t, timeout, redrive.Get("signature"))

	// The same confirmation with the other group's signature: refused, recorded, nothing moved.
	changed := clone(redrive)
	changed.Set("signature", declined)
	resp := w.post("/act", changed, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.EqualValues(t, 4, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
	refused := w.refusals()
	require.Len(t, refused, 1)
	require.Equal(t, "outbox.redrive", refused[0].action)

	resp = w.post("/act", redrive, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
	require.EqualValues(t, 3, w.count(`SELECT count(*) FROM {s}.outbox WHERE message_id LIKE 'd-%'`))

	page = w.page("/dead/groups?source=outbox", auth...)
	discard := confirmGroup("group-0", "discard:matching")
	require.Equal(t, "1", discard.Get("expected"))
	require.Equal(t, declined, discard.Get("signature"))
	resp = w.post("/act", discard, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Zero(t, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.outbox_sent WHERE outcome = 'discarded'`))
	require.Contains(t, w.page("/audit", auth...), "error signature")
}

// The page after a redrive of selected dead letters links to each message's find page, which shows it pending
// again with its failed attempt.
func TestDonePageLinksToTheMessage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
	})
	w.groupDeadLetters()
	auth := []string{"Authorization", basic("ops", "pw")}
	msg := w.page("/dead/message?source=outbox&tenant=acme&id=d-2&topic=orders", auth...)
	require.Contains(t, msg, `/find?by=id&amp;q=d-2&amp;tenant=acme" id="find-message"`)
	f := hidden(t, msg, "message-actions")
	f.Set("csrf", csrf(t, msg))
	f.Set("do", "redrive:selected")
	resp := w.post("/confirm", f, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = w.post("/act", hidden(t, body(t, resp), "confirm-form"), auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	done := resp.Header.Get("Location")
	require.Contains(t, done, "find=d-2")
	page := w.page(strings.TrimPrefix(done, w.srv.URL), auth...)
	require.Contains(t, page, `href="/find?by=id&amp;q=d-2" class="find-link"`)
	found := w.page("/find?by=id&q=d-2", auth...)
	require.Equal(t, []string{"d-2=pending"}, foundStates(found))
	require.Contains(t, found, `<td class="r">1</td><td class="r">1</td>`, "its failed attempt, kept in the history")
	require.Contains(t, found, "timeout after 80ms on order d-2")
}
