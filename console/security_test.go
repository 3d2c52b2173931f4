package console_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Hostile payloads, metadata, errors, IDs, stream names and tenants (markup, scripts, invalid UTF-8, text-reordering
// characters, megabytes) are shown escaped and cut, never executed: no page carries them as markup, and a huge
// payload is cut with a marker saying how much was left out.
func TestHostileDataIsShownEscapedAndCut(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	const script = `<script>alert("x")</script>`
	const img = `<img src=x onerror=alert(1)>`
	huge := append([]byte(`"`), append([]byte(strings.Repeat("A", 2<<20)), '"')...)
	evil := "evil<b>\u202eFDP.exe"
	eventPayload, err := json.Marshal(map[string]string{"note": "</pre>" + script, "rlo": "\u202e"})
	require.NoError(t, err)
	recs := w.appendEvents(evil, `<svg onload=alert(2)>`, 1, func(int) string { return string(eventPayload) })
	w.deadLetter([]outbox.Message{
		{ID: "m-" + img, Topic: "t" + script, Type: "T" + img, Tenant: evil, PartitionKey: "k" + script,
			Payload: []byte(script + "\xff\xfe" + img), SourcePosition: recs[0].Position,
			Metadata: map[string]string{"h" + script: "v" + img + "\u202e", "bidi\u2067": "x"}},
		{ID: "huge", Topic: "t", Tenant: evil, Payload: huge},
	}, func(id string) error { return errors.New("rejected: " + img + " \u202e") })
	w.inboxDeadLetter("h"+script, evil, "in-"+img, script+"\xff", map[string]string{"x" + img: script},
		"handler says "+script)

	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	pages := []string{"/", "/outbox", "/outbox?by=key", "/outbox?by=tenant", "/dead", "/dead?source=inbox",
		"/dead/message?" + q("source", "outbox", "tenant", evil, "id", "m-"+img, "topic", "t"+script),
		"/dead/message?" + q("source", "outbox", "tenant", evil, "id", "huge"),
		"/dead/message?" + q("source", "inbox", "tenant", evil, "handler", "h"+script, "id", "in-"+img),
		"/events", "/events?" + q("stream", `<svg onload=alert(2)>`, "tenant", evil),
		"/events?position=1", "/outbox/key?" + q("tenant", evil, "key", "k"+script),
		"/dead?" + q("error", img),
		"/dead/groups", "/dead/groups?source=inbox", "/find?" + q("q", "m-"+img), "/find?" + q("q", "in-"+img),
		"/find?" + q("q", "k"+script, "by", "key"), "/find?" + q("q", "huge", "tenant", evil),
	}
	for _, p := range pages {
		// The filter forms give back what was asked for, as it was typed (escaped by html/template): that is
		// the request's text, not stored data, and changing it would change the query.
		page := inputValue.ReplaceAllString(w.page(p), `value=""`)
		for _, raw := range []string{"<script>alert", "<img src=x", "<svg onload", "<b>", "\u202e", "\u2067",
			"\xff"} {
			require.NotContains(t, page, raw, "GET %s shows %q as it is", p, raw)
		}
		require.Less(t, len(page), 400<<10, "GET %s is cut", p)
	}
	detail := w.page("/dead/message?" + q("source", "outbox", "tenant", evil, "id", "m-"+img, "topic", "t"+script))
	require.Contains(t, detail, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	require.Contains(t, detail, `\xff\xfe`, "invalid UTF-8 shown as escapes")
	require.Contains(t, detail, `\u202e`, "the right-to-left override shown as an escape")
	require.Contains(t, detail, "invalid UTF-8 bytes shown as")
	big := w.page("/dead/message?" + q("source", "outbox", "tenant", evil, "id", "huge"))
	require.True(t, strings.Contains(big, "2,031,618 more bytes not shown (65,536 of 2,097,154 shown)"),
		"the huge payload is cut with a marker")
	ev := w.page("/events?" + q("stream", `<svg onload=alert(2)>`, "tenant", evil))
	require.Contains(t, ev, "&lt;/pre&gt;&lt;script&gt;")
	require.Contains(t, ev, "m-&lt;img src=x onerror=alert(1)&gt;", "the message staged from the event")
}

var inputValue = regexp.MustCompile(`value="[^"]*"`)

// A read-only console (the default) offers no action and refuses every action, however the request is made.
func TestReadOnlyConsoleOffersAndTakesNoAction(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Authorize = console.BasicAuth("ops", "secret") // a user does not make it writable
	})
	w.seed()
	for _, p := range []string{"/", "/outbox", "/dead", "/dead?source=inbox", "/projections",
		"/dead/message?source=outbox&tenant=acme&id=acme-1&topic=orders", "/events?stream=order-1&tenant=acme",
		"/dead/groups", "/dead/groups?source=inbox", "/find?q=acme-1"} {
		page := w.page(p, "Authorization", basic("ops", "secret"))
		require.NotContains(t, page, `method="post"`, "GET %s offers a form that acts", p)
		require.NotContains(t, page, `name="csrf"`, p)
		require.Contains(t, page, "read-only", p)
	}
	for _, path := range []string{"/confirm", "/act"} {
		resp := w.post(path, url.Values{"action": {"outbox.redrive"}, "mode": {"matching"}, "source": {"outbox"},
			"bound": {time.Now().Format(time.RFC3339Nano)}}, "Authorization", basic("ops", "secret"))
		require.Equal(t, http.StatusForbidden, resp.StatusCode, path)
		require.Contains(t, body(t, resp), "read-only")
	}
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was redriven")
	require.Zero(t, w.count(`SELECT count(*) FROM {s}.console_audit`))
}

func basic(user, pass string) string {
	r := &http.Request{Header: http.Header{}}
	r.SetBasicAuth(user, pass)
	return r.Header.Get("Authorization")
}

// clock is a console clock a test moves.
type clock struct {
	mu sync.Mutex
	at time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return time.Now()
	}
	return c.at
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.at = t
	c.mu.Unlock()
}

// With actions enabled, an action needs credentials (401 with the challenge, so the browser asks), a same-origin
// request, and a CSRF token issued to the same user within its lifetime (403 otherwise); nothing is done or
// recorded for a refused request.
func TestActionsNeedCredentialsOriginAndCSRF(t *testing.T) {
	t.Parallel()
	clk := &clock{}
	key := []byte(strings.Repeat("k", 32))
	users := map[string]string{"ops": "secret", "eve": "hunter2"}
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = func(r *http.Request) (string, bool) {
			u, p, ok := r.BasicAuth()
			return u, ok && users[u] == p && p != ""
		}
		c.Challenge = console.BasicChallenge
		c.CSRFKey = key
		c.Clock = clk.now
	})
	w.seed()
	auth := []string{"Authorization", basic("ops", "secret")}
	page := w.page("/dead", auth...)
	token := csrf(t, page)
	form := hidden(t, page, "dead-actions")
	form.Set("do", "redrive:matching")

	// Signed out: the page offers a sign-in link and no form; an action is refused with the challenge.
	anon := w.page("/dead")
	require.Contains(t, anon, "sign in to act")
	require.NotContains(t, anon, `name="csrf"`)
	resp := w.post("/confirm", form)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, console.BasicChallenge, resp.Header.Get("WWW-Authenticate"))
	code, _ := w.get("/login")
	require.Equal(t, http.StatusUnauthorized, code)
	resp = w.post("/confirm", form, "Authorization", basic("ops", "wrong"))
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	refused := func(f url.Values, why string, header ...string) {
		t.Helper()
		resp := w.post("/confirm", f, append(append([]string{}, auth...), header...)...)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, why)
		resp = w.post("/act", f, append(append([]string{}, auth...), header...)...)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, why)
	}
	without := url.Values{}
	for k, v := range form {
		without[k] = v
	}
	without.Del("csrf")
	refused(without, "no token")
	forged := url.Values{}
	for k, v := range form {
		forged[k] = v
	}
	forged.Set("csrf", forge(t, token))
	refused(forged, "a forged token")
	evePage := w.page("/dead", "Authorization", basic("eve", "hunter2"))
	stolen := url.Values{}
	for k, v := range form {
		stolen[k] = v
	}
	stolen.Set("csrf", csrf(t, evePage))
	refused(stolen, "another user's token")
	refused(form, "a cross-site request", "Sec-Fetch-Site", "cross-site")
	refused(form, "another origin", "Sec-Fetch-Site", "", "Origin", "https://evil.example")
	clk.set(time.Now().Add(13 * time.Hour))
	refused(form, "an expired token")
	clk.set(time.Time{})

	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was done")
	require.Zero(t, w.count(`SELECT count(*) FROM {s}.console_audit`), "nothing was recorded")

	// The right user, token and origin: the count to confirm.
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body(t, resp), `<strong id="confirm-count">2</strong>`)
}

// A redrive of everything a filter selects: the confirmation counts it, the action moves exactly that (bounded by
// the confirmation's time: a message dead-lettered after it is left), records who did it with both counts, and
// the record is where the action leads.
func TestRedriveByFilterIsConfirmedBoundedAndRecorded(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.TokenAuth("s3cret")
	})
	ctx := context.Background()
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("pay-%d", i), Topic: "payments", Tenant: "acme",
			Payload: []byte("{}")})
	}
	msgs = append(msgs, outbox.Message{ID: "other", Topic: "payments", Tenant: "acme", Payload: []byte("{}")})
	w.deadLetter(msgs, func(id string) error {
		if id == "other" {
			return errors.New("schema mismatch")
		}
		return errors.New("gateway TIMEOUT after 30s")
	})
	auth := []string{"Authorization", "Bearer s3cret"}
	page := w.page("/dead?error=timeout", auth...)
	require.Contains(t, page, `<strong id="match-count">5</strong>`)
	form := hidden(t, page, "dead-actions")
	form.Set("do", "redrive:matching")
	resp := w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirmPage := body(t, resp)
	require.Contains(t, confirmPage, "Redrive 5 outbox dead letters")
	confirm := hidden(t, confirmPage, "confirm-form")
	require.Equal(t, "5", confirm.Get("expected"))

	// A matching dead letter that dies after the confirmation is not swept in.
	time.Sleep(5 * time.Millisecond)
	w.deadLetter([]outbox.Message{{ID: "late", Topic: "payments", Tenant: "acme", Payload: []byte("{}")}},
		func(string) error { return errors.New("gateway timeout again") })

	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	done := resp.Header.Get("Location")
	require.True(t, strings.HasPrefix(done, "/done?"), done)
	donePage := w.page(done, auth...)
	require.Contains(t, donePage, `<strong id="done-affected">5</strong>`)
	require.Contains(t, donePage, "outbox.redrive")

	require.EqualValues(t, 5, w.count(`SELECT count(*) FROM {s}.outbox WHERE message_id LIKE 'pay-%'`))
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "other and late stay")
	var user, action, target, scope string
	var confirmed, affected int64
	var finished *time.Time
	require.NoError(t, w.pool.QueryRow(ctx, `SELECT username, action, target, scope, confirmed, affected,
		finished_at FROM `+qualified(w, "console_audit")).Scan(&user, &action, &target, &scope, &confirmed, &affected,
		&finished))
	require.Equal(t, "token", user)
	require.Equal(t, "outbox.redrive", action)
	require.Contains(t, target, `error contains "timeout"`)
	require.Equal(t, "all-tenants", scope)
	require.EqualValues(t, 5, confirmed)
	require.EqualValues(t, 5, affected)
	require.NotNil(t, finished)
	require.Contains(t, w.page("/audit", auth...), "outbox.redrive")

	// A posted "back" outside the console is never followed.
	confirm.Set("back", "https://evil.example/")
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.NotContains(t, resp.Header.Get("Location"), "evil.example")
}

// A selection is acted on item by item (its tenant's items in its tenant's scope), the inbox's by handler; the
// confirmation counts exactly the selection.
func TestSelectionsOfOutboxAndInboxDeadLetters(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
	})
	w.seed()
	auth := []string{"Authorization", basic("ops", "pw")}
	page := w.page("/dead", auth...)
	form := hidden(t, page, "dead-actions")
	form.Set("do", "discard:selected")
	sels := selValues(page)
	require.Len(t, sels, 2)
	form["sel"] = sels[:1]
	resp := w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirm := hidden(t, body(t, resp), "confirm-form")
	require.Equal(t, "1", confirm.Get("expected"))
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.outbox_sent WHERE outcome = 'discarded'`))

	inbox := w.page("/dead?source=inbox", auth...)
	form = hidden(t, inbox, "dead-actions")
	form.Set("do", "discard:selected")
	form["sel"] = selValues(inbox)
	require.Len(t, form["sel"], 1)
	resp = w.post("/confirm", form, auth...)
	confirm = hidden(t, body(t, resp), "confirm-form")
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Zero(t, w.count(`SELECT count(*) FROM {s}.inbox_dead_letters`))

	// A selected item that is not valid is refused, not acted on.
	form.Set("sel", "not-a-selection")
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// selection is a selected item as the pages write it.
func selection(parts ...string) string {
	b, _ := json.Marshal(parts)
	return base64.RawURLEncoding.EncodeToString(b)
}

var selField = `name="sel" value="`

func selValues(page string) []string {
	var out []string
	for _, part := range strings.Split(page, selField)[1:] {
		out = append(out, unescape(part[:strings.Index(part, `"`)]))
	}
	return out
}

func qualified(w *world, table string) string {
	return `"` + w.schema + `".` + table
}

// A console scoped to a tenant shows and touches that tenant's data only: its dead letters, keys, events and
// parked events; nothing estate-wide (relays, checkpoints, other scopes' audit entries); an input naming another
// tenant is refused, and so is a selection holding another tenant's dead letter.
func TestTenantScopedConsole(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	estate := newWorldOn(t, pool, schema, nil)
	estate.seed()
	acmeTenant := "acme"
	w := newWorldOn(t, pool, schema, func(c *console.Config) {
		c.Tenant = &acmeTenant
		c.Actions = true
		c.Authorize = console.BasicAuth("acme-ops", "pw")
	})
	auth := []string{"Authorization", basic("acme-ops", "pw")}
	for path, check := range map[string]func(string){
		"/": func(p string) {
			require.Contains(t, p, "tenant acme")
			require.NotContains(t, p, "projection lag")
		},
		"/dead": func(p string) {
			require.Contains(t, p, "acme-1")
			require.NotContains(t, p, "globex")
		},
		"/dead?source=inbox": func(p string) { require.Contains(t, p, "inv-1") },
		"/outbox": func(p string) {
			require.Contains(t, p, "order-1")
			require.NotContains(t, p, "Relays")
			require.NotContains(t, p, "by tenant")
		},
		"/events": func(p string) {
			require.Contains(t, p, "order-1")
			require.NotContains(t, p, "order-9")
		},
		"/projections": func(p string) { require.Contains(t, p, "shown to an estate-wide console") },
	} {
		check(w.page(path, auth...))
	}
	for _, path := range []string{"/dead?tenant=globex", "/events?stream=order-9&tenant=globex",
		"/outbox/key?tenant=globex&key=order-9",
		"/dead/message?source=outbox&tenant=globex&id=globex-2&topic=billing"} {
		code, _ := w.get(path, auth...)
		require.Equal(t, http.StatusForbidden, code, path)
	}
	code, _ := w.get("/dead/message?source=outbox&id=globex-2&topic=billing", auth...)
	require.Equal(t, http.StatusNotFound, code, "another tenant's dead letter does not exist here")
	code, _ = w.get("/events?position=5", auth...) // globex's second event
	require.Equal(t, http.StatusNotFound, code)

	// Another tenant's dead letter, slipped into a selection, is refused; a matching discard touches acme's only.
	page := w.page("/dead", auth...)
	form := hidden(t, page, "dead-actions")
	form.Set("do", "discard:selected")
	form["sel"] = []string{selection("globex", "globex-2")}
	resp := w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	form = hidden(t, page, "dead-actions")
	form.Set("do", "discard:matching")
	resp = w.post("/confirm", form, auth...)
	confirm := hidden(t, body(t, resp), "confirm-form")
	require.Equal(t, "1", confirm.Get("expected"))
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.EqualValues(t, 1, estate.count(`SELECT count(*) FROM {s}.outbox_dead_letters WHERE tenant_id = 'globex'`))
	require.Zero(t, estate.count(`SELECT count(*) FROM {s}.outbox_dead_letters WHERE tenant_id = 'acme'`))

	// No rebuild from a tenant's console; its audit entries carry its scope.
	resp = w.post("/confirm", url.Values{"action": {"projection.rebuild"}, "name": {"board"},
		"csrf": {csrf(t, page)}}, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.EqualValues(t, 1, estate.count(`SELECT count(*) FROM {s}.console_audit WHERE scope = 'tenant'
		AND tenant_id = 'acme'`))
	require.Contains(t, w.page("/audit", auth...), "outbox.discard")

	bad := "bad\x00tenant"
	_, err := console.New(&console.Config{Pool: pool, Schema: schema, Tenant: &bad})
	var ce *stagehand.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Tenant", ce.Field)
}

// forge returns token with one bit of its MAC flipped: a token of the right shape that the console did not sign.
// (Rewriting its last characters can leave the decoded bytes as they were: the last character carries padding bits.)
func forge(t *testing.T, token string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(token)
	require.NoError(t, err)
	b[len(b)-1] ^= 1
	return base64.RawURLEncoding.EncodeToString(b)
}
