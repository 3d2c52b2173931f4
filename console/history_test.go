package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type chartsJSON struct {
	Range       string `json:"range"`
	StepSeconds int    `json:"step_seconds"`
	All         []struct {
		At           time.Time `json:"at"`
		Published    *int64    `json:"published"`
		DeadLettered *int64    `json:"dead_lettered"`
		Handled      *int64    `json:"handled"`
		Pending      *int64    `json:"pending"`
	} `json:"all"`
	Topics   map[string][]struct{ Published, Staged *int64 } `json:"topics"`
	Handlers map[string][]struct {
		Handled *int64 `json:"handled"`
	} `json:"handlers"`
}

func (w *world) charts(path string) chartsJSON {
	w.t.Helper()
	var c chartsJSON
	require.NoError(w.t, json.Unmarshal([]byte(w.page(path)), &c))
	return c
}

func sum[T any](list []T, get func(T) *int64) int64 {
	var n int64
	for _, x := range list {
		if v := get(x); v != nil {
			n += *v
		}
	}
	return n
}

// The chart history is written to the database as buckets of ten seconds, by topic and by handler, and a console
// started later (a restart) shows it: the publications, handlings and dead letters recorded before, counted once
// even though both consoles sampled the same span.
func TestChartHistorySurvivesARestart(t *testing.T) {
	pool, schema := pgtest.Migrated(t)
	clock := &fakeClock{now: time.Now().UTC().Truncate(10 * time.Second).Add(5 * time.Second)}
	t0 := clock.Now()
	q := func(name string) string { return pgtest.Q(schema, name) }
	// 30 publications of "orders", 12 of "invoices", 7 handlings by "billing", 3 dead letters of "orders", all
	// within the 10 seconds before t0 - 3s (so the first sample, which starts at its bucket's start, sees them).
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_sent")+` (message_id, topic, tenant_id, message_type, attempts,
			created_at, sent_at)
		SELECT 'm' || i, CASE WHEN i <= 30 THEN 'orders' ELSE 'invoices' END, 'acme', 'T', 1,
			$1::timestamptz - interval '4 s' - i * interval '10 ms', $1::timestamptz - interval '3 s' - i * interval '10 ms'
		FROM generate_series(1, 42) i`, t0)
	pgtest.Exec(t, pool, `INSERT INTO `+q("inbox")+` (message_id, handler, tenant_id, processed_at)
		SELECT 'm' || i, 'billing', 'acme', $1::timestamptz - interval '3 s' FROM generate_series(1, 7) i`, t0)
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_dead_letters")+` (message_id, topic, tenant_id, message_type,
			payload, metadata, correlation_id, causation_id, partition_key, attempts, last_error, holds_key,
			created_at, dead_at)
		SELECT 'd' || i, 'orders', 'acme', 'T', '\x00', '{}', '', '', '', 5, 'boom', false,
			$1::timestamptz - interval '5 s', $1::timestamptz - interval '4 s' FROM generate_series(1, 3) i`, t0)

	first := newWorldOn(t, pool, schema, func(c *console.Config) { c.Clock = clock.Now; c.SampleInterval = time.Second })
	first.page("/api/v1/overview") // the first sample: from its bucket's start
	clock.Add(20 * time.Second)
	first.page("/api/v1/overview") // the buckets end: written
	before := first.charts("/api/v1/charts?range=15m")
	require.NoError(t, first.con.Close())

	clock.Add(30 * time.Second)
	second := newWorldOn(t, pool, schema, func(c *console.Config) { c.Clock = clock.Now; c.SampleInterval = time.Second })
	second.page("/api/v1/overview") // resumes where the history ends
	after := second.charts("/api/v1/charts?range=15m")
	for name, c := range map[string]chartsJSON{"before the restart": before, "after the restart": after} {
		require.Equal(t, "15m", c.Range)
		require.Equal(t, 10, c.StepSeconds)
		require.EqualValues(t, 42, sum(c.All, func(b struct {
			At           time.Time `json:"at"`
			Published    *int64    `json:"published"`
			DeadLettered *int64    `json:"dead_lettered"`
			Handled      *int64    `json:"handled"`
			Pending      *int64    `json:"pending"`
		}) *int64 {
			return b.Published
		}), name)
		require.EqualValues(t, 30, sum(c.Topics["orders"], func(b struct{ Published, Staged *int64 }) *int64 { return b.Published }), name)
		require.EqualValues(t, 12, sum(c.Topics["invoices"], func(b struct{ Published, Staged *int64 }) *int64 { return b.Published }), name)
		require.EqualValues(t, 7, sum(c.Handlers["billing"], func(b struct {
			Handled *int64 `json:"handled"`
		}) *int64 {
			return b.Handled
		}), name)
	}
	// The dead letters over time, and the backlog seen at a bucket's end.
	var dead, pendingSeen int64
	for _, b := range after.All {
		if b.DeadLettered != nil {
			dead += *b.DeadLettered
		}
		if b.Pending != nil {
			pendingSeen++
		}
	}
	require.EqualValues(t, 3, dead)
	require.Positive(t, pendingSeen, "a bucket ending at a sample holds the backlog")
	// The charts page draws them, by topic and by handler, with a time axis and the values for the hover.
	page := second.page("/charts?range=15m")
	for _, want := range []string{`id="chart-published-by-topic"`, `data-names="orders|invoices"`, `data-names="billing"`,
		`id="chart-dead-lettered--per-10s"`, `class="timeaxis"`, `data-points="[{`} {
		require.Contains(t, page, want)
	}
	code, body := second.get("/charts?range=2y")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "is not one of")
	require.EqualValues(t, second.count(`SELECT count(*) FROM `+q("console_samples")+` WHERE kind = 'topic' AND name = 'orders' AND published > 0`),
		second.count(`SELECT count(DISTINCT at) FROM `+q("console_samples")+` WHERE kind = 'topic' AND name = 'orders' AND published > 0`),
		"each bucket written once")
}

// The JSON API answers what the pages show, with the pages' authentication, and refuses writes.
func TestJSONAPI(t *testing.T) {
	w := newWorld(t, func(c *console.Config) {
		c.Authorize = console.BasicAuth("ops", "pw")
		c.AuthenticateReads = true
		c.Challenge = console.BasicChallenge
	})
	code, body := w.get("/api/v1/overview")
	require.Equal(t, http.StatusUnauthorized, code)
	require.JSONEq(t, `{"error":"this console needs an authenticated user"}`, body)
	auth := "Basic b3BzOnB3" // ops:pw
	code, body = w.get("/api/v1/overview", "Authorization", auth)
	require.Equal(t, http.StatusOK, code, body)
	var ov struct {
		Scope   string          `json:"scope"`
		Health  json.RawMessage `json:"health"`
		Outbox  map[string]any  `json:"outbox"`
		Latency struct {
			Covers string `json:"covers"`
			Steps  []any  `json:"steps"`
		} `json:"latency"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &ov))
	require.Equal(t, "all tenants (estate-wide)", ov.Scope)
	require.Contains(t, string(ov.Health), `"status"`)
	require.Contains(t, ov.Outbox, "dead_letters")
	require.Contains(t, ov.Latency.Covers, "last 5m")
	code, body = w.get("/api/v1/charts?range=6h", "Authorization", auth)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"step_seconds": 60`)
	code, body = w.get("/api/v1/charts?range=nope", "Authorization", auth)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, `"error"`)
	code, _ = w.get("/api/v1/nothing", "Authorization", auth)
	require.Equal(t, http.StatusNotFound, code)
	resp := w.post("/api/v1/overview", nil, "Authorization", auth)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"))
}

// The JSON API lists the dead letters (cut, no metadata), their groups by cause and a message's whereabouts, as
// the dead-letter, groups and find pages show them; bad parameters are 400s.
func TestJSONAPIDeadLettersGroupsAndFind(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.groupDeadLetters()
	w.inboxDeadLetter("billing", "acme", "inv-1", `{}`, map[string]string{"k": strings.Repeat("v", 5000)},
		strings.Repeat("ledger row 17 is locked ", 100))

	code, body := w.get("/api/v1/dead-letters?limit=2")
	require.Equal(t, http.StatusOK, code, body)
	var list struct {
		Source      string `json:"source"`
		DeadLetters []struct {
			ID        string
			MessageID string // an inbox dead letter's
			LastError string
			Metadata  map[string]string
		} `json:"dead_letters"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Equal(t, "outbox", list.Source)
	require.Len(t, list.DeadLetters, 2, "limit")

	code, body = w.get("/api/v1/dead-letters?source=inbox")
	require.Equal(t, http.StatusOK, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Len(t, list.DeadLetters, 1)
	require.Equal(t, "inv-1", list.DeadLetters[0].MessageID)
	require.LessOrEqual(t, len(list.DeadLetters[0].LastError), 1024, "the error is cut")
	require.Empty(t, list.DeadLetters[0].Metadata, "no metadata in a list")

	code, body = w.get("/api/v1/dead-letter-groups")
	require.Equal(t, http.StatusOK, code, body)
	var groups struct {
		Groups []struct {
			Signature string
			Count     int64
		} `json:"groups"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &groups))
	require.Len(t, groups.Groups, 2)
	require.EqualValues(t, 3, groups.Groups[0].Count, "the largest group first")

	code, body = w.get("/api/v1/find?q=d-2")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"d-2"`)
	require.Contains(t, body, "timeout after")

	for _, bad := range []string{"/api/v1/dead-letters?source=nope", "/api/v1/dead-letters?limit=0",
		"/api/v1/dead-letter-groups?source=x", "/api/v1/find", "/api/v1/find?q=" + strings.Repeat("x", 2000)} {
		code, body = w.get(bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
		require.Contains(t, body, `"error"`, bad)
	}
}
