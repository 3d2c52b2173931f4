package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// refusal is one audit record of a refused action.
type refusal struct {
	action, errText  string
	confirmed        int64
	affected         int64
	finished         bool
	refusedInDetails bool
}

func (w *world) refusals() []refusal {
	w.t.Helper()
	rows, err := w.pool.Query(context.Background(), `SELECT action, error, confirmed, affected,
		finished_at IS NOT NULL, details ? 'refused' FROM `+qualified(w, "console_audit")+
		` WHERE error LIKE 'refused: %' ORDER BY id`)
	require.NoError(w.t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (refusal, error) {
		var f refusal
		err := r.Scan(&f.action, &f.errText, &f.confirmed, &f.affected, &f.finished, &f.refusedInDetails)
		return f, err
	})
	require.NoError(w.t, err)
	return out
}

func clone(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// A direct POST to /act with a valid CSRF token, a bound in the future and a made-up count, but no confirmation,
// is refused: nothing is discarded, and the refusal is recorded with the count it claimed and none affected.
// Neither is a confirmed action whose scope was changed afterwards (its bound, count, filter, or an added field).
func TestActRefusesWhatWasNotConfirmed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
	})
	w.seed()
	auth := []string{"Authorization", basic("ops", "pw")}
	page := w.page("/dead", auth...)

	attack := url.Values{"csrf": {csrf(t, page)}, "action": {"outbox.discard"}, "mode": {"matching"},
		"source": {"outbox"}, "bound": {"2030-01-01T00:00:00Z"}, "expected": {"99"}}
	resp := w.post("/act", attack, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body(t, resp), "not confirmed")
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was discarded")
	refused := w.refusals()
	require.Len(t, refused, 1)
	require.Equal(t, "outbox.discard", refused[0].action)
	require.EqualValues(t, 99, refused[0].confirmed, "the count it claimed")
	require.Zero(t, refused[0].affected)
	require.True(t, refused[0].finished)
	require.True(t, refused[0].refusedInDetails)
	require.Contains(t, refused[0].errText, "not confirmed")

	// A genuine confirmation of the discard of one tenant's dead letters ...
	form := hidden(t, page, "dead-actions")
	form.Set("do", "discard:matching")
	form.Set("tenant", "acme")
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirm := hidden(t, body(t, resp), "confirm-form")
	require.Equal(t, "1", confirm.Get("expected"))
	require.NotEmpty(t, confirm.Get("confirmation"))

	// ... changed in any way is refused.
	for name, change := range map[string]func(url.Values){
		"a later bound":   func(v url.Values) { v.Set("bound", "2030-01-01T00:00:00Z") },
		"a larger count":  func(v url.Values) { v.Set("expected", "99") },
		"a wider filter":  func(v url.Values) { v.Del("tenant") },
		"another filter":  func(v url.Values) { v.Set("tenant", "globex") },
		"another action":  func(v url.Values) { v.Set("action", "outbox.redrive") },
		"an added field":  func(v url.Values) { v.Set("do", "discard:matching") },
		"no confirmation": func(v url.Values) { v.Del("confirmation") },
		"a forged one":    func(v url.Values) { v.Set("confirmation", forge(t, v.Get("confirmation"))) },
		"another text of it": func(v url.Values) { // the same bytes, its padding bits set: refused as not canonical
			c := v.Get("confirmation")
			v.Set("confirmation", c[:len(c)-1]+padded(c[len(c)-1]))
		},
	} {
		f := clone(confirm)
		change(f)
		resp := w.post("/act", f, auth...)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, name)
	}
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was done")
	require.Len(t, w.refusals(), 10, "every refusal is recorded")

	// Another user cannot replay it either.
	other := newWorldOn(t, w.pool, w.schema, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("eve", "pw")
	})
	f := clone(confirm)
	f.Set("csrf", csrf(t, other.page("/dead", "Authorization", basic("eve", "pw"))))
	resp = other.post("/act", f, "Authorization", basic("eve", "pw"))
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "another console's (other key) and user's confirmation")

	// As confirmed, it runs.
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
	require.EqualValues(t, 0, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters WHERE tenant_id = 'acme'`))
}

// An action that would now touch more than was confirmed is refused (the operator confirms again, seeing the new
// count) and recorded with both counts; a confirmation whose bound is in the future (the console's clock went
// back) is refused; an expired confirmation is refused.
func TestActRefusesMoreThanConfirmedAndFutureBounds(t *testing.T) {
	t.Parallel()
	clk := &clock{}
	w := newWorld(t, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
		c.Clock = clk.now
	})
	w.seed()
	auth := []string{"Authorization", basic("ops", "pw")}
	form := hidden(t, w.page("/dead?error=acme-1", auth...), "dead-actions")
	form.Set("do", "redrive:matching")
	resp := w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirm := hidden(t, body(t, resp), "confirm-form")
	require.Equal(t, "1", confirm.Get("expected"))

	// A second dead letter, dead before the bound, comes to match the filter.
	pgtest.Exec(t, w.pool, `UPDATE `+qualified(w, "outbox_dead_letters")+
		` SET last_error = last_error || ' (see acme-1)' WHERE message_id = 'globex-2'`)
	resp = w.post("/act", confirm, auth...)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, body(t, resp), "would now touch 2, more than the 1 confirmed")
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was redriven")
	refused := w.refusals()
	require.Len(t, refused, 1)
	require.EqualValues(t, 1, refused[0].confirmed)
	require.EqualValues(t, 1, w.count(`SELECT count(*) FROM {s}.console_audit WHERE (details->>'matching')::int = 2`))

	// Confirmed half a minute ahead, acted on now: the bound is in the future.
	clk.set(time.Now().Add(30 * time.Second))
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ahead := hidden(t, body(t, resp), "confirm-form")
	clk.set(time.Now())
	resp = w.post("/act", ahead, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body(t, resp), "in the future")

	// Confirmed, then left for longer than a confirmation lives.
	resp = w.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	stale := hidden(t, body(t, resp), "confirm-form")
	clk.set(time.Now().Add(16 * time.Minute))
	resp = w.post("/act", stale, auth...)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body(t, resp), "expired")
	require.Len(t, w.refusals(), 3)
	require.EqualValues(t, 2, w.count(`SELECT count(*) FROM {s}.outbox_dead_letters`), "nothing was redriven")
}

// Two consoles with the same CSRFKey (replicas behind one load balancer, or a console restarted) accept each
// other's CSRF tokens and confirmations.
func TestConsolesSharingAKeyAcceptEachOthersTokens(t *testing.T) {
	t.Parallel()
	key := []byte(strings.Repeat("s", 32))
	mod := func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("ops", "pw")
		c.CSRFKey = key
	}
	a := newWorld(t, mod)
	b := newWorldOn(t, a.pool, a.schema, mod)
	a.seed()
	auth := []string{"Authorization", basic("ops", "pw")}
	form := hidden(t, a.page("/dead", auth...), "dead-actions")
	form.Set("do", "redrive:matching")
	resp := b.post("/confirm", form, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode, "b accepts a's CSRF token")
	confirm := hidden(t, body(t, resp), "confirm-form")
	resp = a.post("/act", confirm, auth...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "a accepts b's confirmation")
	require.Zero(t, a.count(`SELECT count(*) FROM {s}.outbox_dead_letters`))
}

// The static assets are served, their directory is not listed.
func TestStaticDirectoryIsNotListed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	code, _ := w.get("/static/console.css")
	require.Equal(t, http.StatusOK, code)
	for _, p := range []string{"/static/", "/static", "/static/./", "/static//"} {
		code, page := w.get(p)
		require.NotEqual(t, http.StatusOK, code, p)
		require.NotContains(t, page, "console.css", p)
	}
}

// A console on a schema that is not migrated, or lacks a migration of this build, fails at start with an error
// naming the schema, what is missing and how to migrate, instead of serving SQL errors.
func TestNewRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, empty := pgtest.Schema(t)
	_, err := console.New(&console.Config{Pool: pool, Schema: empty})
	require.ErrorIs(t, err, console.ErrSchemaNotMigrated)
	require.Contains(t, err.Error(), `schema "`+empty+`"`)
	require.Contains(t, err.Error(), "no stagehand tables")
	require.Contains(t, err.Error(), "stagehand migrate up --schema "+empty)

	_, err = console.New(&console.Config{Pool: pool, Schema: "no_such_schema_here"})
	require.ErrorIs(t, err, console.ErrSchemaNotMigrated)

	pool, schema := pgtest.Migrated(t)
	pgtest.Exec(t, pool, `DELETE FROM `+pgtest.Q(schema, "schema_migrations")+` WHERE version = 41`)
	_, err = console.New(&console.Config{Pool: pool, Schema: schema})
	require.ErrorIs(t, err, console.ErrSchemaNotMigrated)
	require.Contains(t, err.Error(), "041_console_audit")
	require.False(t, errors.Is(err, console.ErrInvalidConfig))
}

// padded returns the base64url character with the same two leading bits as c (the last character of a 40-byte
// token carries two bits of it) and other padding bits.
func padded(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return string(alphabet[(i&^15)|((i+1)&15)])
}
