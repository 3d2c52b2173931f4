package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// world is a migrated schema with an outbox, an event store and a console served by an httptest server.
type world struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	ob     *outbox.Outbox
	store  *eventstore.PostgresStore
	con    *console.Console
	srv    *httptest.Server
	// client keeps no cookies and follows no redirects.
	client *http.Client
}

// newWorld builds a world; mod adjusts the console's configuration (Pool and Schema are set).
func newWorld(t *testing.T, mod func(*console.Config)) *world {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return newWorldOn(t, pool, schema, mod)
}

func newWorldOn(t *testing.T, pool *pgxpool.Pool, schema string, mod func(*console.Config)) *world {
	t.Helper()
	w := &world{t: t, pool: pool, schema: schema}
	var err error
	w.ob, err = outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.ob.Close() })
	w.store, err = eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, DisableNotify: true,
		MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(w.store.Close)
	cfg := &console.Config{Pool: pool, Schema: schema, Outbox: w.ob, Store: w.store,
		Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelError}))}
	if mod != nil {
		mod(cfg)
	}
	w.con, err = console.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.con.Close() })
	w.srv = httptest.NewServer(w.con)
	t.Cleanup(w.srv.Close)
	jar, _ := cookiejar.New(nil)
	w.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	return w
}

// testLog writes the console's errors to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// get fetches a page and returns its status and body.
func (w *world) get(path string, header ...string) (int, string) {
	w.t.Helper()
	req, err := http.NewRequest(http.MethodGet, w.srv.URL+path, nil)
	require.NoError(w.t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := w.client.Do(req)
	require.NoError(w.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(w.t, err)
	return resp.StatusCode, string(b)
}

// page fetches a page that must answer 200.
func (w *world) page(path string, header ...string) string {
	w.t.Helper()
	code, body := w.get(path, header...)
	require.Equal(w.t, http.StatusOK, code, "GET %s: %s", path, body)
	return body
}

// post submits a form as the browser would (same origin), with the given headers, and returns the response.
func (w *world) post(path string, form url.Values, header ...string) *http.Response {
	w.t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(w.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := w.client.Do(req)
	require.NoError(w.t, err)
	w.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of a page's forms.
func csrf(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, "the page has no CSRF token")
	return m[1]
}

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// hidden returns the hidden fields of the form with the given id in a page.
func hidden(t *testing.T, page, formID string) url.Values {
	t.Helper()
	i := strings.Index(page, `id="`+formID+`"`)
	require.GreaterOrEqual(t, i, 0, "no form %s", formID)
	end := strings.Index(page[i:], "</form>")
	require.Greater(t, end, 0)
	v := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page[i:i+end], -1) {
		v.Add(unescape(m[1]), unescape(m[2]))
	}
	return v
}

// unescape undoes html/template's escaping of an attribute value.
func unescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'",
		"&quot;", `"`).Replace(s)
}

// appendEvents appends n events to a stream and returns them.
func (w *world) appendEvents(tenant, stream string, n int, payload func(i int) string) []eventstore.Record {
	w.t.Helper()
	req := eventstore.AppendRequest{Tenant: tenant, StreamID: stream, StreamType: "order",
		Expected: eventstore.AnyVersion}
	for i := range n {
		p := fmt.Sprintf(`{"n":%d}`, i)
		if payload != nil {
			p = payload(i)
		}
		req.Events = append(req.Events, eventstore.EventData{Type: "order.placed", Payload: []byte(p),
			Metadata: eventstore.Metadata{"source": "test"}})
	}
	res, err := w.store.Append(context.Background(), req)
	require.NoError(w.t, err)
	return res.Records
}

// rejecting is a broker that rejects the messages fail names, and records the others. A relay's workers call it
// concurrently.
type rejecting struct {
	fail func(*message.Message) error
	mu   sync.Mutex
	sent []*message.Message
}

func (b *rejecting) Publish(_ string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		if b.fail != nil {
			if err := b.fail(m); err != nil {
				return err
			}
		}
		b.sent = append(b.sent, m)
	}
	return nil
}

func (b *rejecting) Close() error { return nil }

// deadLetter stages the messages and drains the outbox through a broker that rejects every one whose ID fail
// names (with that error), dead-lettering them on the first rejection; the others are published.
func (w *world) deadLetter(msgs []outbox.Message, fail func(id string) error) {
	w.t.Helper()
	ctx := context.Background()
	_, err := w.ob.Stage(ctx, msgs...)
	require.NoError(w.t, err)
	r, err := w.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0), PollingInterval: 50 * time.Millisecond,
		RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond})
	require.NoError(w.t, err)
	defer func() { _ = r.Close() }()
	_, err = r.Drain(ctx, &rejecting{fail: func(m *message.Message) error { return fail(m.UUID) }})
	require.NoError(w.t, err)
}

// inboxDeadLetter has an inbox handler fail on a message until it is dead-lettered.
func (w *world) inboxDeadLetter(handler, tenant, id, payload string, meta map[string]string, failure string) {
	w.t.Helper()
	in, err := w.ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(w.t, err)
	m := message.NewMessage(id, []byte(payload))
	for k, v := range meta {
		m.Metadata.Set(k, v)
	}
	m.Metadata.Set(stagehand.HeaderTenantID, tenant)
	h := in.Handler(handler, func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message) error {
		return errors.New(failure)
	})
	require.NoError(w.t, h(m))
}

// count runs a count query on the world's schema ({s} is the schema, quoted).
func (w *world) count(sql string, args ...any) int64 {
	w.t.Helper()
	return pgtest.Count(w.t, w.pool, strings.ReplaceAll(sql, "{s}", pgx.Identifier{w.schema}.Sanitize()), args...)
}
