package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/outbox"
)

// The read-only JSON API: what the overview and the charts page show, for scripts. Same scope and the same
// authentication as the pages (Config.AuthenticateReads); it offers no action. Errors answer
// {"error": "..."} with the page's status.

func (c *Console) apiRoutes(m *http.ServeMux) {
	p := c.cfg.Prefix
	m.HandleFunc("GET "+p+"/api/v1/overview", c.api(c.apiOverview))
	m.HandleFunc("GET "+p+"/api/v1/charts", c.api(c.apiCharts))
	m.HandleFunc("GET "+p+"/api/v1/dead-letters", c.api(c.apiDeadLetters))
	m.HandleFunc("GET "+p+"/api/v1/dead-letter-groups", c.api(c.apiDeadLetterGroups))
	m.HandleFunc("GET "+p+"/api/v1/find", c.api(c.apiFind))
	m.HandleFunc(p+"/api/", c.api(func(*http.Request) (any, error) {
		return nil, notFound("no such API endpoint: see /api/v1/overview, /api/v1/charts, /api/v1/dead-letters, " +
			"/api/v1/dead-letter-groups and /api/v1/find")
	}))
}

// isAPI reports whether r asks for the JSON API.
func (c *Console) isAPI(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, c.cfg.Prefix+"/api/")
}

// api adapts a JSON handler: its value is written as JSON, its error as {"error": ...} with its status.
func (c *Console) api(h func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			c.apiError(w, r, &statusError{code: http.StatusMethodNotAllowed, msg: "the API is read-only: GET only"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
		defer cancel()
		c.samples.viewed()
		v, err := h(r.WithContext(ctx))
		if err != nil {
			c.apiError(w, r, err)
			return
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			c.apiError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	}
}

func (c *Console) apiError(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	var se *statusError
	if errors.As(err, &se) {
		code = se.code
	} else {
		c.cfg.Logger.ErrorContext(r.Context(), "console: an API request failed", "path", clipForError(r.URL.Path),
			"error", err)
	}
	if code == http.StatusUnauthorized && c.cfg.Challenge != "" {
		w.Header().Set("WWW-Authenticate", c.cfg.Challenge)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]string{"error": err.Error()})
	_, _ = w.Write(append(b, '\n'))
}

// apiOverviewBody is GET /api/v1/overview.
type apiOverviewBody struct {
	Scope string `json:"scope"`
	// Health is the latest verdict, with every component's figures (null before the first sample).
	Health *health.Report `json:"health"`
	Outbox apiOutbox      `json:"outbox"`
	Inbox  apiInbox       `json:"inbox"`
	// Rates are the latest sample's, per second (-1: not known yet).
	Rates       *apiRates    `json:"rates"`
	Latency     apiLatency   `json:"latency"`
	Processes   []apiProcess `json:"processes,omitempty"`
	SampleError string       `json:"sample_error,omitempty"`
}

type apiOutbox struct {
	Pending              int64   `json:"pending"`
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	Scheduled            int64   `json:"scheduled"`
	BackingOff           int64   `json:"backing_off"`
	InFlight             int64   `json:"in_flight"`
	WaitingBehindPending int64   `json:"waiting_behind_pending"`
	HeldByDeadLetter     int64   `json:"held_by_dead_letter"`
	DeadLetters          int64   `json:"dead_letters"`
}

type apiInbox struct {
	Failing         int64 `json:"failing"`
	DeadLetters     int64 `json:"dead_letters"`
	HandledLastHour int64 `json:"handled_last_hour"`
}

type apiRates struct {
	At        time.Time `json:"at"`
	Appended  float64   `json:"appended"`
	Staged    float64   `json:"staged"`
	Published float64   `json:"published"`
	Handled   float64   `json:"handled"`
	Failed    float64   `json:"failed"`
}

type apiLatency struct {
	// Covers says which messages the figures cover.
	Covers string           `json:"covers"`
	Steps  []apiLatencyStep `json:"steps"`
}

type apiLatencyStep struct {
	Step       string  `json:"step"`
	Messages   int     `json:"messages"`
	P50Seconds float64 `json:"p50_seconds"`
	P99Seconds float64 `json:"p99_seconds"`
	MaxSeconds float64 `json:"max_seconds"`
}

type apiProcess struct {
	Kind            string   `json:"kind"`
	Name            string   `json:"name"`
	Instance        string   `json:"instance"`
	State           string   `json:"state"`
	HeartbeatAgo    float64  `json:"heartbeat_age_seconds"`
	LastActivityAgo *float64 `json:"last_activity_age_seconds"`
	Activity        int64    `json:"activity"`
}

func (c *Console) apiOverview(r *http.Request) (any, error) {
	ctx := r.Context()
	c.samples.fresh(ctx)
	snap := c.samples.snapshot()
	st, ok := outboxFigures(snap.report)
	if !ok {
		var err error
		if st, err = c.admin.Backlog(ctx); err != nil {
			return nil, err
		}
	}
	in, err := c.inboxFigures(ctx, snap.report)
	if err != nil {
		return nil, err
	}
	procs, err := c.processes(ctx, c.cfg.Clock())
	if err != nil {
		return nil, err
	}
	body := apiOverviewBody{Scope: c.scopeName(), Health: snap.report, SampleError: snap.err,
		Outbox: apiOutbox{Pending: st.Pending, OldestPendingSeconds: st.OldestPendingAge.Seconds(),
			Scheduled: st.Scheduled, BackingOff: st.BackingOff, InFlight: st.InFlight,
			WaitingBehindPending: st.WaitingBehindPending, HeldByDeadLetter: st.HeldByDeadLetter,
			DeadLetters: st.DeadLettered},
		Inbox:   apiInbox{Failing: in.Failing, DeadLetters: in.DeadLettered, HandledLastHour: in.Handled},
		Latency: apiLatency{Covers: snap.cover.String(), Steps: []apiLatencyStep{}}}
	if n := len(snap.samples); n > 0 {
		s := snap.samples[n-1]
		body.Rates = &apiRates{At: s.At.UTC(), Appended: s.Appended, Staged: s.Staged, Published: s.Published,
			Handled: s.Handled, Failed: s.Failed}
	}
	for _, l := range snap.latencies {
		body.Latency.Steps = append(body.Latency.Steps, apiLatencyStep{Step: l.Step, Messages: l.N,
			P50Seconds: l.P50.Seconds(), P99Seconds: l.P99.Seconds(), MaxSeconds: l.Max.Seconds()})
	}
	for _, p := range procs {
		ap := apiProcess{Kind: p.Kind.Text, Name: p.Name.Text, Instance: p.Instance.Text, State: p.State,
			HeartbeatAgo: p.BeatAgo.Seconds(), Activity: p.Activity}
		if p.Active {
			s := p.ActivityAgo.Seconds()
			ap.LastActivityAgo = &s
		}
		body.Processes = append(body.Processes, ap)
	}
	return body, nil
}

// apiChartsBody is GET /api/v1/charts?range=1h: the chart history the charts page draws.
type apiChartsBody struct {
	Scope       string                 `json:"scope"`
	Range       string                 `json:"range"`
	From        time.Time              `json:"from"`
	To          time.Time              `json:"to"`
	StepSeconds int                    `json:"step_seconds"`
	All         []apiBucket            `json:"all"`
	Topics      map[string][]apiBucket `json:"topics"`
	Handlers    map[string][]apiBucket `json:"handlers"`
}

// apiBucket is one point: counts over [at, at + seconds) (null where the series has no such figure), backlogs as
// last sampled in it (null when none was).
type apiBucket struct {
	At                time.Time `json:"at"`
	Seconds           int64     `json:"seconds"`
	Appended          *int64    `json:"appended,omitempty"`
	Staged            *int64    `json:"staged,omitempty"`
	Published         *int64    `json:"published,omitempty"`
	DeadLettered      *int64    `json:"dead_lettered,omitempty"`
	Handled           *int64    `json:"handled,omitempty"`
	InboxDeadLettered *int64    `json:"inbox_dead_lettered,omitempty"`
	InboxFailed       *int64    `json:"inbox_failed,omitempty"`
	Pending           *int64    `json:"pending,omitempty"`
	OldestPendingMS   *int64    `json:"oldest_pending_ms,omitempty"`
	DeadLetters       *int64    `json:"dead_letters,omitempty"`
	InboxDeadLetters  *int64    `json:"inbox_dead_letters,omitempty"`
	ProjectionLag     *int64    `json:"projection_lag,omitempty"`
	WorkerLag         *int64    `json:"worker_lag,omitempty"`
}

func buckets(pts []histPoint) []apiBucket {
	out := make([]apiBucket, 0, len(pts))
	for _, p := range pts {
		out = append(out, apiBucket(p))
	}
	return out
}

func (c *Console) apiCharts(r *http.Request) (any, error) {
	ctx := r.Context()
	c.samples.fresh(ctx)
	h, err := c.readChartRange(ctx, r.URL.Query().Get("range"))
	if err != nil {
		return nil, err
	}
	body := apiChartsBody{Scope: c.scopeName(), Range: h.r.Name, From: h.from, To: h.to,
		StepSeconds: int(h.r.Step / time.Second), All: buckets(h.all), Topics: map[string][]apiBucket{},
		Handlers: map[string][]apiBucket{}}
	for name, pts := range h.topics {
		body.Topics[name] = buckets(pts)
	}
	for name, pts := range h.handlers {
		body.Handlers[name] = buckets(pts)
	}
	return body, nil
}

// apiTextLimit cuts the errors and payloads the list endpoints return, as the pages' lists do: a list never reads
// a whole large value.
const apiTextLimit = 1024

// apiSource reads ?source= (outbox, the default, or inbox).
func apiSource(r *http.Request) (inbox bool, err error) {
	switch src := r.URL.Query().Get("source"); src {
	case "", "outbox":
		return false, nil
	case "inbox":
		return true, nil
	default:
		return false, badRequest("source must be outbox or inbox, not %q", clipForError(src))
	}
}

// apiDeadLetters is GET /api/v1/dead-letters?source=outbox|inbox&signature=...&limit=N: the newest dead letters
// of the scope (at most 1000, default 100), errors and payloads cut to their first 1024 bytes, no metadata.
func (c *Console) apiDeadLetters(r *http.Request) (any, error) {
	inbox, err := apiSource(r)
	if err != nil {
		return nil, err
	}
	limit, err := intParam("limit", r.URL.Query().Get("limit"), 100)
	if err != nil || limit < 1 || limit > 1000 {
		return nil, badRequest("limit must be between 1 and 1000")
	}
	signature := r.URL.Query().Get("signature")
	if inbox {
		dead, err := c.admin.InboxDeadLetters(r.Context(), outbox.InboxListOptions{Limit: int(limit),
			NewestFirst: true, Signature: signature, TextLimit: apiTextLimit, PayloadLimit: apiTextLimit})
		if dead == nil {
			dead = []outbox.InboxDeadLetter{}
		}
		return map[string]any{"scope": c.scopeName(), "source": "inbox", "dead_letters": dead}, err
	}
	dead, err := c.admin.DeadLetters(r.Context(), outbox.ListOptions{Limit: int(limit), NewestFirst: true,
		Signature: signature, TextLimit: apiTextLimit, PayloadLimit: apiTextLimit})
	if dead == nil {
		dead = []outbox.DeadLetter{}
	}
	return map[string]any{"scope": c.scopeName(), "source": "outbox", "dead_letters": dead}, err
}

// apiDeadLetterGroups is GET /api/v1/dead-letter-groups?source=outbox|inbox: the dead letters grouped by cause.
func (c *Console) apiDeadLetterGroups(r *http.Request) (any, error) {
	inbox, err := apiSource(r)
	if err != nil {
		return nil, err
	}
	var groups []outbox.DeadLetterGroup
	source := "outbox"
	if inbox {
		source = "inbox"
		groups, err = c.admin.InboxDeadLetterGroups(r.Context(), outbox.InboxListOptions{})
	} else {
		groups, err = c.admin.DeadLetterGroups(r.Context(), outbox.ListOptions{})
	}
	if groups == nil {
		groups = []outbox.DeadLetterGroup{}
	}
	return map[string]any{"scope": c.scopeName(), "source": source, "groups": groups}, err
}

// apiFind is GET /api/v1/find?q=...: where the messages with that ID, correlation ID, stream or key are, as the
// find page shows them (without the stream's events).
func (c *Console) apiFind(r *http.Request) (any, error) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" || len(q) > 1024 {
		return nil, badRequest("q must be a message ID, correlation ID, stream or key of at most 1024 bytes")
	}
	res, err := c.admin.Find(r.Context(), outbox.FindQuery{Text: q})
	if err != nil {
		return nil, err
	}
	return map[string]any{"scope": c.scopeName(), "query": q, "result": res}, nil
}
