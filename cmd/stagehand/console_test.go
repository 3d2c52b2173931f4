package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// serveConsole runs stagehand console in the background on a free port, with the environment env, and returns its
// base URL and a stop that interrupts it and returns its result.
func (e *env) serveConsole(env map[string]string, args ...string) (string, func() result) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	opts := options{getenv: func(k string) string { return env[k] }}
	go func() {
		done <- runWith(ctx, e.args(append([]string{"console", "--listen", "127.0.0.1:0"}, args...)...), &stdout,
			&stderr, opts)
	}()
	var res *result
	stop := func() result {
		if res == nil {
			cancel()
			code := <-done
			res = &result{code: code, stdout: stdout.String(), stderr: stderr.String()}
		}
		return *res
	}
	e.t.Cleanup(func() { stop() })
	served := regexp.MustCompile(`console: serving (http://\S+?)/? \(`)
	var base string
	pgtest.Eventually(e.t, 20*time.Second, func() bool {
		if m := served.FindStringSubmatch(stdout.String()); m != nil {
			base = strings.TrimSuffix(m[1], "/")
			return true
		}
		select {
		case code := <-done:
			done <- code
			e.t.Fatalf("stagehand console ended (%d): %s %s", code, stdout.String(), stderr.String())
		default:
		}
		return false
	}, "the console says where it serves")
	return base, stop
}

func fetch(t *testing.T, method, u string, form url.Values, header ...string) (int, http.Header, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// Without credentials the console is read-only and serves this machine only; credentials and actions go
// together; a wrong flag is a usage error before anything listens.
func TestConsoleFlags(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.fails(exitUsage, "--actions needs credentials", "console", "--actions")
	e.fails(exitUsage, "not both", "console", "--token", "t", "--basic-auth", "u:p")
	e.fails(exitUsage, "serves beyond this machine", "console", "--listen", ":0")
	e.fails(exitUsage, "serves beyond this machine", "console", "--listen", "0.0.0.0:0")
	e.fails(exitUsage, "USER:PASSWORD", "console", "--basic-auth", "nopassword")
	e.fails(exitUsage, "is not HOST:PORT", "console", "--listen", "8080")
	e.fails(exitUsage, "Prefix", "console", "--prefix", "no-slash")
	e.fails(exitUsage, "Tenant", "console", "--tenant", "bad\x01tenant")
	e.fails(exitUsage, "at least 32 characters", "console", "--csrf-key", "short")
	e.fails(exitUsage, "IdleSampleInterval", "console", "--sample-interval", "10s", "--idle-sample-interval", "5s")
	e.fails(exitUsage, "Retention", "console", "--retention", "10m")
}

// The console's JSON API answers scripts that send the token, and refuses those that do not.
func TestConsoleJSONAPI(t *testing.T) {
	t.Parallel()
	e := setup(t)
	base, _ := e.serveConsole(nil, "--token", "s3cret", "--sample-interval", "2s", "--retention", "48h")
	code, _, body := fetch(t, http.MethodGet, base+"/api/v1/overview", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, `"error"`)
	code, hdr, body := fetch(t, http.MethodGet, base+"/api/v1/overview", nil, "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	require.Contains(t, body, `"health"`)
	code, _, body = fetch(t, http.MethodGet, base+"/api/v1/charts?range=24h", nil, "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"step_seconds": 300`)
}

// On a schema that was never migrated the console does not start: one line says which schema and how to
// migrate it.
func TestConsoleRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	e := &env{t: t, pool: pool, schema: schema, url: pgtest.URL(t)}
	e.fails(exitFailure, "stagehand migrate up --schema "+schema, "console", "--listen", "127.0.0.1:0")
}

// confirmForm returns the hidden fields of a confirmation page's form.
func confirmForm(t *testing.T, confirm string) url.Values {
	t.Helper()
	i := strings.Index(confirm, `id="confirm-form"`)
	require.GreaterOrEqual(t, i, 0, confirm)
	act := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).
		FindAllStringSubmatch(confirm[i:], -1) {
		act.Add(m[1], strings.NewReplacer("&#43;", "+", "&amp;", "&").Replace(m[2]))
	}
	return act
}

// Two consoles given the same --csrf-key (one by the flag, one by the environment) accept each other's forms and
// confirmations, as replicas behind a load balancer or a restarted console must; one with another key does not.
func TestConsolesSharingACSRFKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o, outbox.Message{ID: "order-41", Topic: "orders", Tenant: "acme", Payload: []byte(`{}`)})
	key := strings.Repeat("0123456789abcdef", 4)
	a, _ := e.serveConsole(map[string]string{envConsoleToken: "s3cret"}, "--actions", "--csrf-key", key)
	b, _ := e.serveConsole(map[string]string{envConsoleToken: "s3cret", envConsoleCSRFKey: key}, "--actions")
	c, _ := e.serveConsole(map[string]string{envConsoleToken: "s3cret"}, "--actions")
	auth := []string{"Authorization", "Bearer s3cret"}
	_, _, page := fetch(t, http.MethodGet, a+"/dead", nil, auth...)
	token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, token)
	form := url.Values{"csrf": {token[1]}, "source": {"outbox"}, "do": {"redrive:matching"}}
	code, _, _ := fetch(t, http.MethodPost, c+"/confirm", form, auth...)
	require.Equal(t, http.StatusForbidden, code, "a console with its own random key refuses a's form")
	code, _, confirm := fetch(t, http.MethodPost, b+"/confirm", form, auth...)
	require.Equal(t, http.StatusOK, code, "b accepts a's form: %s", confirm)
	code, _, _ = fetch(t, http.MethodPost, a+"/act", confirmForm(t, confirm), auth...)
	require.Equal(t, http.StatusSeeOther, code, "a accepts b's confirmation")
	require.EqualValues(t, 1, pgtest.Count(t, e.pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "outbox")))
}

// A read-only console serves the pages of the schema and ends normally when interrupted.
func TestConsoleServesReadOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o, outbox.Message{ID: "order-41", Topic: "orders", Tenant: "acme", Payload: []byte(`{}`)})
	base, stop := e.serveConsole(nil, "--title", "orders staging")
	code, _, page := fetch(t, http.MethodGet, base+"/dead", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "order-41")
	require.Contains(t, page, "orders staging")
	require.Contains(t, page, "read-only")
	code, _, _ = fetch(t, http.MethodPost, base+"/confirm", url.Values{"action": {"outbox.redrive"}})
	require.Equal(t, http.StatusForbidden, code)
	r := stop()
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "(read-only; all tenants (estate-wide))")
}

// With a token, every page needs it (a browser is asked for it), and the actions it enables are confirmed, run and
// recorded under the token's user.
func TestConsoleTokenAndActions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o, outbox.Message{ID: "order-41", Topic: "orders", Tenant: "acme", Payload: []byte(`{}`)},
		outbox.Message{ID: "order-42", Topic: "orders", Tenant: "globex", Payload: []byte(`{}`)})
	base, stop := e.serveConsole(map[string]string{envConsoleToken: "s3cret"}, "--actions", "--tenant", "acme")
	code, header, _ := fetch(t, http.MethodGet, base+"/dead", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, header.Get("WWW-Authenticate"), "Basic")
	code, _, _ = fetch(t, http.MethodGet, base+"/dead", nil, "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	auth := []string{"Authorization", "Bearer s3cret"}
	code, _, page := fetch(t, http.MethodGet, base+"/dead", nil, auth...)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "order-41")
	require.NotContains(t, page, "order-42", "the console is scoped to acme")

	token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, token)
	form := url.Values{"csrf": {token[1]}, "source": {"outbox"}, "do": {"redrive:matching"}}
	code, _, confirm := fetch(t, http.MethodPost, base+"/confirm", form, auth...)
	require.Equal(t, http.StatusOK, code, confirm)
	require.Contains(t, confirm, "Redrive 1 outbox dead letter?")
	act := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).
		FindAllStringSubmatch(confirm[strings.Index(confirm, `id="confirm-form"`):], -1) {
		act.Add(m[1], strings.NewReplacer("&#43;", "+", "&amp;", "&").Replace(m[2]))
	}
	code, header, _ = fetch(t, http.MethodPost, base+"/act", act, auth...)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, header.Get("Location"), "/done?")
	require.EqualValues(t, 1, pgtest.Count(t, e.pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "outbox")))
	require.EqualValues(t, 1, pgtest.Count(t, e.pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "console_audit")+
		` WHERE username = 'token' AND action = 'outbox.redrive' AND affected = 1 AND tenant_id = 'acme'`))
	r := stop()
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "actions enabled, sign in with token; tenant acme")
	require.Contains(t, r.stderr, "console: action", "every action is logged")
}
