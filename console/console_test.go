package console_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Invalid configurations fail at construction with a *stagehand.ConfigError naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	other, err := outbox.New(pool, &outbox.Config{Schema: "elsewhere"})
	require.NoError(t, err)
	defer func() { _ = other.Close() }()
	bad := "a\x00"
	checker, err := health.New(nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		field, reason string
		cfg           *console.Config
	}{
		{"Pool", "is required", nil},
		{"Schema", "at most 63 bytes", &console.Config{Pool: pool, Schema: strings.Repeat("s", 64)}},
		{"Schema", "must not be blank", &console.Config{Pool: pool, Schema: " "}},
		{"Outbox", `works on schema "elsewhere", the console on "stagehand"`, &console.Config{Pool: pool, Outbox: other}},
		{"Tenant", "", &console.Config{Pool: pool, Tenant: &bad}},
		{"Authorize", "is required when Actions is set", &console.Config{Pool: pool, Actions: true}},
		{"Authorize", "is required when AuthenticateReads is set", &console.Config{Pool: pool, AuthenticateReads: true}},
		{"CSRFKey", "must be at least 32 bytes (5 given)", &console.Config{Pool: pool, CSRFKey: []byte("short")}},
		{"Prefix", "must start with '/'", &console.Config{Pool: pool, Prefix: "console/"}},
		{"Title", "without control characters", &console.Config{Pool: pool, Title: "a\nb"}},
		{"PageSize", "must be between 1 and 500", &console.Config{Pool: pool, PageSize: 501}},
		{"PageSize", "must be between 1 and 500", &console.Config{Pool: pool, PageSize: -1}},
		{"MaxPayload", "must be between 1024 and 16777216", &console.Config{Pool: pool, MaxPayload: 10}},
		{"SampleInterval", "must be at least 1s", &console.Config{Pool: pool, SampleInterval: time.Millisecond}},
		{"SampleInterval", "must be at most 1h0m0s", &console.Config{Pool: pool, SampleInterval: 2 * time.Hour}},
		{"History", "must be at least SampleInterval",
			&console.Config{Pool: pool, SampleInterval: time.Minute, History: time.Second}},
		{"History", "holds more than 10000 samples",
			&console.Config{Pool: pool, SampleInterval: time.Second, History: 3 * time.Hour}},
		{"IdleSampleInterval", "must be at least SampleInterval",
			&console.Config{Pool: pool, SampleInterval: time.Minute, IdleSampleInterval: time.Second}},
		{"IdleSampleInterval", "must be at most 1h0m0s", &console.Config{Pool: pool, IdleSampleInterval: 2 * time.Hour}},
		{"Retention", "must be at least 1h0m0s", &console.Config{Pool: pool, Retention: time.Minute}},
		{"Retention", "must be at most 9600h0m0s", &console.Config{Pool: pool, Retention: 500 * 24 * time.Hour}},
		{"Challenge", "must not hold a line break", &console.Config{Pool: pool, Challenge: "Basic\r\nSet-Cookie: x"}},
		{"Health", "cannot be given to a console scoped to a tenant",
			&console.Config{Pool: pool, Tenant: new(string), Health: checker}},
	} {
		_, err := console.New(tc.cfg)
		var ce *stagehand.ConfigError
		require.ErrorAs(t, err, &ce, tc.field)
		require.Equal(t, "console", ce.Package, tc.field)
		require.Equal(t, tc.field, ce.Field, "%s: %v", tc.field, err)
		require.Contains(t, ce.Reason, tc.reason, tc.field)
		require.ErrorIs(t, err, console.ErrInvalidConfig)
	}
	migrated, schema := pgtest.Migrated(t)
	c, err := console.New(&console.Config{Pool: migrated, Schema: schema})
	require.NoError(t, err, "every other field has a default")
	require.NoError(t, c.Close())
}

// Run samples on its ticker until its context ends, and leaves no goroutine behind.
func TestRunSamplesUntilItsContextEnds(t *testing.T) {
	pgtest.CheckLeaks(t)
	w := newWorld(t, func(c *console.Config) { c.SampleInterval = time.Second; c.History = time.Minute })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.con.Run(ctx) }()
	pgtest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(w.page("/"), "checked") },
		"a verdict is sampled")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// The rates are what the database recorded in a sample's window, per second: with a window of exactly ten seconds
// covering the work, 20 events appended, 30 messages staged, 29 published and one dead-lettered read 2.0, 3.0, 2.9
// and 0.1 per second; the backlog is what is left pending.
func TestRatesComeFromTheDatabase(t *testing.T) {
	t.Parallel()
	clk := &clock{}
	w := newWorld(t, func(c *console.Config) {
		c.Clock = clk.now
		c.SampleInterval = 10 * time.Second
	})
	start := time.Now()
	clk.set(start.Add(2 * time.Second)) // the first window ends at start
	w.page("/")
	w.appendEvents("acme", "order-1", 20, nil)
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("m-%d", i), Topic: "orders", Payload: []byte("{}")})
	}
	w.deadLetter(msgs, func(id string) error {
		if id == "m-0" {
			return errors.New("rejected")
		}
		return nil
	})
	_, err := w.ob.Stage(context.Background(), outbox.Message{ID: "left", Topic: "orders", Payload: []byte("{}")})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 9*time.Second, "the work fits in the window")
	clk.set(start.Add(12 * time.Second)) // the second window: (start, start+10s]
	page := w.page("/")
	for name, want := range map[string]string{"appended": "2.0/s", "staged": "3.1/s", "published": "2.9/s",
		"failed": "0.1/s", "handled": "0/s", "outbox pending": "1"} {
		require.Contains(t, page, `<span class="t">`+name+`</span> <span class="now">`+want+`</span>`, name)
	}
}

// Mounted under a prefix, every link starts with it and nothing outside it is served.
func TestPrefix(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) { c.Prefix = "/ops/console" })
	w.seed()
	page := w.page("/ops/console/dead")
	require.Contains(t, page, `href="/ops/console/dead/message?`)
	require.Contains(t, page, `href="/ops/console/static/console.css"`)
	require.NotContains(t, page, `href="/dead`)
	code, _ := w.get("/dead")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = w.get("/ops/console")
	require.Equal(t, http.StatusMovedPermanently, code)
	css := w.page("/ops/console/static/console.css")
	require.Contains(t, css, "stagehand console")
}

// With AuthenticateReads, every page and asset needs a user.
func TestAuthenticateReads(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(c *console.Config) {
		c.Authorize = console.TokenAuth("t0ken")
		c.AuthenticateReads = true
		c.Challenge = console.BasicChallenge
	})
	for _, p := range []string{"/", "/dead", "/events", "/static/console.js"} {
		code, _ := w.get(p)
		require.Equal(t, http.StatusUnauthorized, code, p)
		code, _ = w.get(p, "Authorization", basic("anyone", "t0ken"))
		require.Equal(t, http.StatusOK, code, p)
	}
	code, _ := w.get("/", "Authorization", "Bearer nope")
	require.Equal(t, http.StatusUnauthorized, code)
}

// Every input is validated: malformed, overlong, invalid UTF-8 or control characters, bad numbers and forged
// cursors answer 400 (never 500), and nothing reaches the database from them.
func TestInputsAreValidated(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.seed()
	long := strings.Repeat("x", 2000)
	for _, p := range []string{
		"/dead?topic=" + long, "/dead?error=%FF%FE", "/dead?type=a%00b", "/dead?older=forever", "/dead?newer=-1h",
		"/dead?order=sideways", "/dead?after=!!!", "/dead?after=" + url.QueryEscape("eyJ0IjoxfQ"),
		"/dead?tenant=%00", "/dead?after=" + cursorOf(`{"t":"2030-01-01T00:00:00Z","i":"a\u0000","n":"x"}`),
		"/outbox?by=planet", "/outbox?held=bad", "/outbox?scheduled=bad", "/outbox/key?tenant=acme", "/outbox/key?tenant=acme&key=k&after=-3",
		"/events?position=abc", "/events?position=0", "/events?before=-1", "/events?stream=" + long,
		"/events?stream=a%0Ab", "/projection", "/projection?name=%FF", "/audit?before=x", "/done?id=x",
		"/projections?after=bad", "/find?by=planet&q=x", "/find?q=" + long, "/find?q=x&tenant=%00",
		"/dead/groups?source=planet", "/dead/groups?signature=" + long, "/dead?signature=%FF",
	} {
		code, page := w.get(p)
		require.Equal(t, http.StatusBadRequest, code, "GET %s: %s", p, page)
	}
	resp := w.post("/confirm", url.Values{"action": {"outbox.redrive"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only: refused before anything is read")
}

// cursorOf encodes a cursor's JSON as the pages do.
func cursorOf(json string) string { return base64.RawURLEncoding.EncodeToString([]byte(json)) }

// Each page's data loads in a handful of statements and in time: on the seeded world every page answers well
// under a second (the proof module's benchmark measures a large installation).
func TestPagesAreFast(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.seed()
	w.page("/") // the first sample
	for _, p := range []string{"/", "/outbox", "/dead", "/dead?source=inbox", "/projections", "/events",
		"/events?stream=order-1&tenant=acme", "/audit", "/dead/groups", "/find?q=acme-1",
		"/find?q=order-1&tenant=acme"} {
		start := time.Now()
		w.page(p)
		require.Less(t, time.Since(start), time.Second, p)
	}
}
