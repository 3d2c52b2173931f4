package health

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Status is a health verdict. Its order matters: a report is as bad as its worst component.
type Status int

const (
	// Healthy: nothing needs attention.
	Healthy Status = iota
	// Degraded: working, but something needs attention (a slow or stalled component, failures above the degraded
	// rate, dead letters). The HTTP handler still answers 200.
	Degraded
	// Unhealthy: a component is stalled past the unhealthy threshold, fails too often, or cannot be read. The HTTP
	// handler answers 503.
	Unhealthy
)

func (s Status) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Unhealthy:
		return "unhealthy"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText renders the status as "healthy", "degraded" or "unhealthy".
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses what MarshalText renders.
func (s *Status) UnmarshalText(b []byte) error {
	for _, v := range []Status{Healthy, Degraded, Unhealthy} {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("health: unknown status %q", b)
}

// Duration is a time.Duration that JSON renders as seconds (a number), for monitoring tools.
type Duration time.Duration

// MarshalJSON renders the duration in seconds.
func (d Duration) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, time.Duration(d).Seconds(), 'f', -1, 64), nil
}

// UnmarshalJSON reads a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// Report is the result of one Check.
type Report struct {
	// Status is the worst status of the components.
	Status Status `json:"status"`
	// Reasons explain every status other than Healthy, one line each, prefixed with the component's name.
	Reasons []string `json:"reasons"`
	// CheckedAt is the checker's clock at the check.
	CheckedAt time.Time `json:"checked_at"`
	// Components are the parts checked, in a stable order: outbox, relay, inbox, projections, workers.
	Components []Component `json:"components"`
}

// Component is the verdict on one part of the pipeline, with the figures it was based on. Exactly one of the
// details is set.
type Component struct {
	// Name is "outbox", "relay", "inbox", "projection:" + checkpoint name, or "worker:" + worker name.
	Name    string   `json:"name"`
	Status  Status   `json:"status"`
	Reasons []string `json:"reasons,omitempty"`

	Outbox   *OutboxDetails   `json:"outbox,omitempty"`
	Relay    *RelayDetails    `json:"relay,omitempty"`
	Inbox    *InboxDetails    `json:"inbox,omitempty"`
	Follower *FollowerDetails `json:"follower,omitempty"`
}

// OutboxDetails are the outbox figures a check saw.
type OutboxDetails struct {
	// Pending, Scheduled, BackingOff, Parked, WaitingBehindPending, HeldByDeadLetter, InFlight and DeadLettered
	// are outbox.Stats': Parked is WaitingBehindPending (messages waiting behind an earlier pending message of
	// their key, which go out in turn) plus HeldByDeadLetter (messages held by a dead letter of their key, which
	// wait for an operator).
	Pending              int64 `json:"pending"`
	Scheduled            int64 `json:"scheduled"`
	BackingOff           int64 `json:"backing_off"`
	Parked               int64 `json:"parked"`
	WaitingBehindPending int64 `json:"waiting_behind_pending"`
	HeldByDeadLetter     int64 `json:"held_by_dead_letter"`
	InFlight             int64 `json:"in_flight"`
	DeadLettered         int64 `json:"dead_lettered"`
	// Ready counts pending messages a relay should be delivering now (neither backing off nor parked).
	Ready int64 `json:"ready"`
	// OldestPendingAge is how long the oldest pending message has been due.
	OldestPendingAge Duration `json:"oldest_pending_age_seconds"`
	// LastPublishedAt is the latest publication seen in the sent ledger (by the publishing relay's clock); nil
	// when none was seen.
	LastPublishedAt *time.Time `json:"last_published_at,omitempty"`
	// Inactive is how long ready messages have waited without any publication (0 while progressing or idle).
	Inactive Duration `json:"inactive_seconds"`
	// Maintenance is the latest routine maintenance pass (outbox.Admin.Maintenance); nil when none ever ran.
	Maintenance *MaintenanceDetails `json:"maintenance,omitempty"`
}

// MaintenanceDetails describe the latest routine maintenance pass of the outbox.
type MaintenanceDetails struct {
	StartedAt time.Time `json:"started_at"`
	// FinishedAt is nil while the pass runs, or when its process died during it.
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Owner      string     `json:"owner"`
	LastError  string     `json:"last_error,omitempty"`
	// Overdue is true when no pass started within three of its intervals.
	Overdue bool `json:"overdue"`
}

// RelayDetails are the relay figures a check saw, from the hooks of Checker.RelayHooks.
type RelayDetails struct {
	// Window is how far back Deliveries and Failures count.
	Window Duration `json:"window_seconds"`
	// Deliveries counts deliveries answered within the window; Failures those rejected or refused by an
	// unreachable broker.
	Deliveries int64 `json:"deliveries"`
	Failures   int64 `json:"failures"`
	// FailureRate is Failures / Deliveries in percent (0 without deliveries).
	FailureRate float64 `json:"failure_rate_percent"`
	// LastDeliveryAt is when the latest delivery was answered (checker clock); nil when none was.
	LastDeliveryAt *time.Time `json:"last_delivery_at,omitempty"`
	// LastError is the error of the latest failed delivery; ClaimError that of the latest claim when it failed.
	LastError  string `json:"last_error,omitempty"`
	ClaimError string `json:"claim_error,omitempty"`
}

// InboxDetails are the inbox figures a check saw: the totals, and every handler with failures.
type InboxDetails struct {
	// Failing counts the messages handlers are failing on (retrying); DeadLettered the inbox dead letters.
	Failing      int64 `json:"failing"`
	DeadLettered int64 `json:"dead_lettered"`
	// Handlers are the handlers with failing messages or dead letters, by name.
	Handlers []InboxHandlerDetails `json:"handlers"`
}

// InboxHandlerDetails are one inbox handler's failures.
type InboxHandlerDetails struct {
	Handler      string `json:"handler"`
	Failing      int64  `json:"failing"`
	MaxAttempts  int    `json:"max_attempts,omitempty"`
	DeadLettered int64  `json:"dead_lettered"`
	// FailingFor is how long ago the oldest failing message first failed (0 when none fails).
	FailingFor    Duration   `json:"failing_for_seconds"`
	LastFailureAt *time.Time `json:"last_failure_at,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
}

// FollowerDetails are the figures of a log follower (a projection checkpoint or a staging worker).
type FollowerDetails struct {
	// State is the projection's state ("running", "stopped", "failed"); empty for workers.
	State string `json:"state,omitempty"`
	// Position is the checkpoint, Head the head of the log, Lag the positions still ahead.
	Position int64 `json:"position"`
	Head     int64 `json:"head"`
	Lag      int64 `json:"lag"`
	// TimeLag is how long the oldest event ahead has been waiting.
	TimeLag Duration `json:"time_lag_seconds"`
	// LastError is the last handler error (projections only; kept after recovery) and FailingPosition the event
	// being retried (0 when none).
	LastError       string `json:"last_error,omitempty"`
	FailingPosition int64  `json:"failing_position,omitempty"`
	Parked          int    `json:"parked,omitempty"`
	// Inactive is how long the follower has lagged without its position moving (0 while progressing or caught
	// up).
	Inactive Duration `json:"inactive_seconds"`
}

// Checker checks the health of an outbox, its relays, the inbox's handlers, projections and staging workers. It
// detects stalls from the database's own times and by sampling progress: a component that has work but has not
// moved for DegradedInactivity (UnhealthyInactivity) is Degraded (Unhealthy), even when nothing reports an error.
// How long it has not moved is the longer of what the database shows (the outbox: since the latest publication in
// the sent ledger, at most since the oldest ready message became due; a projection or a worker read through
// Projections or WorkerStatus: since its checkpoint last changed, at most since the oldest event ahead was
// recorded; an inbox handler: since its oldest failing message first failed) and what the checker saw between its
// checks. So a checker that has just started reports a stall that began before it. Workers given as Worker (lag
// only) are judged by sampling alone: a stall is seen at the earliest the threshold after the first check that saw
// the work. Call Check regularly (an HTTP probe every few seconds does, or Run).
//
// A Checker is safe for concurrent use; checks run one at a time. It starts no goroutine of its own.
type Checker struct {
	cfg   Config
	rates *rateWindow

	mu         sync.Mutex // serializes checks and guards what follows
	outbox     progress
	lastPub    time.Time // newest sent_at seen in the ledger
	hookPubs   int64     // relay publications seen through the hooks at the previous check
	followers  map[string]*progress
	lastStatus Status
	checked    bool
}

// progress tracks one component's work and movement between checks.
type progress struct {
	seen     bool
	position int64
	since    time.Time // the checker's clock when it last moved, or when its work appeared
}

// advance records a sample and returns how long the component has had work without moving: the longer of what
// the checker saw itself (since its first sample with the work, or the last move) and stalled, the time the
// database's own records show it stalled for (0 when they cannot tell), so a checker that has just started, or
// a console just restarted, sees a stall that began before it looked.
func (p *progress) advance(now time.Time, work, moved bool, stalled time.Duration) time.Duration {
	if !work {
		p.seen, p.since = true, now
		return 0
	}
	if !p.seen || moved {
		p.seen, p.since = true, now
	}
	return max(now.Sub(p.since), stalled, 0)
}

// stalledSince is how long ago at was by now, never negative; 0 for a zero time.
func stalledSince(now, at time.Time) time.Duration {
	if at.IsZero() {
		return 0
	}
	return max(now.Sub(at), 0)
}

// New returns a Checker, or a *ConfigError naming the invalid field.
func New(cfg *Config) (*Checker, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Checker{cfg: c, rates: newRateWindow(c.FailureWindow), followers: map[string]*progress{}}, nil
}

// RelayHooks returns hooks for an outbox relay (outbox.RelayConfig.Hooks) that feed the checker's failure rate
// and relay activity, then call next's hooks (nil ones are skipped). Several relays may share the checker: their
// deliveries count together.
func (c *Checker) RelayHooks(next outbox.Hooks) outbox.Hooks {
	c.rates.hooked.Store(true)
	h := next
	h.Delivered = func(ctx context.Context, d outbox.Delivery, o outbox.Outcome, err error, took time.Duration) {
		c.rates.delivered(c.cfg.Clock(), o, err)
		if next.Delivered != nil {
			next.Delivered(ctx, d, o, err, took)
		}
	}
	h.Claimed = func(ctx context.Context, rows int, took time.Duration, err error) {
		c.rates.claimed(err)
		if next.Claimed != nil {
			next.Claimed(ctx, rows, took, err)
		}
	}
	return h
}

// Check checks every configured component and returns the report. It fails no call: a component that cannot be
// read (the database is down, ctx ends) is Unhealthy, with the error as its reason.
func (c *Checker) Check(ctx context.Context) Report {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Clock()
	r := Report{Status: Healthy, Reasons: []string{}, CheckedAt: now.UTC(), Components: []Component{}}
	if c.cfg.Outbox != nil {
		r.Components = append(r.Components, c.checkOutbox(ctx, now))
	}
	if c.rates.hooked.Load() {
		r.Components = append(r.Components, c.checkRelay(now))
	}
	if c.cfg.Inbox != nil {
		r.Components = append(r.Components, c.checkInbox(ctx, now))
	}
	if c.cfg.Projections != nil {
		r.Components = append(r.Components, c.checkProjections(ctx, now)...)
	}
	for _, w := range c.cfg.Workers {
		r.Components = append(r.Components, c.checkWorker(ctx, now, w))
	}
	if c.cfg.WorkerStatus != nil {
		r.Components = append(r.Components, c.checkWorkerStatus(ctx, now)...)
	}
	for _, comp := range r.Components {
		r.Status = max(r.Status, comp.Status)
		r.Reasons = append(r.Reasons, comp.Reasons...)
	}
	c.logChange(r)
	return r
}

func (c *Checker) logChange(r Report) {
	if c.checked && r.Status == c.lastStatus {
		return
	}
	first := !c.checked
	c.checked, c.lastStatus = true, r.Status
	switch {
	case r.Status != Healthy:
		c.cfg.Logger.Warn("health: "+r.Status.String(), "reasons", r.Reasons)
	case !first:
		c.cfg.Logger.Info("health: healthy again")
	}
}

// verdict collects a component's reasons and its worst status.
type verdict struct {
	status  Status
	reasons []string
	name    string
}

func (v *verdict) add(s Status, format string, args ...any) {
	v.status = max(v.status, s)
	v.reasons = append(v.reasons, v.name+": "+fmt.Sprintf(format, args...))
}

// inactive judges how long a component has had work without progress.
func (c *Checker) inactive(v *verdict, d time.Duration, format string, args ...any) {
	switch {
	case d >= c.cfg.UnhealthyInactivity:
		v.add(Unhealthy, format, args...)
	case d >= c.cfg.DegradedInactivity:
		v.add(Degraded, format, args...)
	}
}

func (c *Checker) checkOutbox(ctx context.Context, now time.Time) Component {
	v := verdict{name: "outbox"}
	st, err := c.cfg.Outbox.Backlog(ctx)
	if err != nil {
		v.add(Unhealthy, "cannot read the outbox: %v", err)
		return Component{Name: v.name, Status: v.status, Reasons: v.reasons}
	}
	last, err := c.cfg.Outbox.LastPublished(ctx, c.lastPub)
	if err != nil {
		v.add(Unhealthy, "cannot read the sent ledger: %v", err)
		return Component{Name: v.name, Status: v.status, Reasons: v.reasons}
	}
	moved := false
	if last.After(c.lastPub) {
		moved = !c.lastPub.IsZero() || c.outbox.seen
		c.lastPub = last
	}
	if pubs := c.rates.published.Load(); pubs != c.hookPubs {
		c.hookPubs, moved = pubs, true
	}
	ready := max(st.Pending-st.BackingOff-st.Parked, 0)
	d := OutboxDetails{Pending: st.Pending, Scheduled: st.Scheduled, BackingOff: st.BackingOff, Parked: st.Parked,
		WaitingBehindPending: st.WaitingBehindPending, HeldByDeadLetter: st.HeldByDeadLetter,
		InFlight: st.InFlight, DeadLettered: st.DeadLettered, Ready: ready,
		OldestPendingAge: Duration(st.OldestPendingAge)}
	if !c.lastPub.IsZero() {
		t := c.lastPub
		d.LastPublishedAt = &t
	}
	// From the database: ready messages have waited at least since the oldest became due, with nothing
	// published since the latest publication in the ledger.
	stalled := time.Duration(0)
	if ready > 0 {
		stalled = st.OldestPendingAge
		if !c.lastPub.IsZero() {
			stalled = min(stalled, stalledSince(now, c.lastPub))
		}
	}
	if moved {
		stalled = 0
	}
	idle := c.outbox.advance(now, ready > 0, moved, stalled)
	d.Inactive = Duration(idle)
	c.inactive(&v, idle, "%d messages ready but none published for %s (oldest pending for %s)", ready,
		idle.Round(time.Second), st.OldestPendingAge.Round(time.Second))
	if m, ran, err := c.cfg.Outbox.Maintenance(ctx); err != nil {
		v.add(Degraded, "cannot read the maintenance record: %v", err)
	} else if ran {
		md := MaintenanceDetails{StartedAt: m.StartedAt, Owner: m.Owner, LastError: m.LastError,
			Overdue: m.Overdue(now)}
		if !m.FinishedAt.IsZero() {
			t := m.FinishedAt
			md.FinishedAt = &t
		}
		d.Maintenance = &md
		switch {
		case md.Overdue:
			v.add(Degraded, "routine maintenance has not run for %s (every %s expected, last by %s): the sent "+
				"ledger and the inbox grow without it", now.Sub(m.StartedAt).Round(time.Second), m.Interval, m.Owner)
		case m.LastError != "":
			v.add(Degraded, "the latest maintenance pass failed: %s", m.LastError)
		}
	}
	if c.cfg.DeadLetters > 0 && st.DeadLettered >= c.cfg.DeadLetters {
		if st.HeldByDeadLetter > 0 {
			v.add(Degraded, "%d dead letters wait to be redriven or discarded, holding %d later messages of their keys",
				st.DeadLettered, st.HeldByDeadLetter)
		} else {
			v.add(Degraded, "%d dead letters wait to be redriven or discarded", st.DeadLettered)
		}
	}
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons, Outbox: &d}
}

func (c *Checker) checkRelay(now time.Time) Component {
	v := verdict{name: "relay"}
	s := c.rates.snapshot(now)
	d := RelayDetails{Window: Duration(c.cfg.FailureWindow), Deliveries: s.total, Failures: s.failures,
		LastError: s.lastError, ClaimError: s.claimError}
	if !s.lastDelivery.IsZero() {
		t := s.lastDelivery.UTC()
		d.LastDeliveryAt = &t
	}
	if s.total > 0 {
		d.FailureRate = 100 * float64(s.failures) / float64(s.total)
	}
	if s.total >= int64(max(c.cfg.MinDeliveries, 1)) {
		switch {
		case d.FailureRate >= c.cfg.UnhealthyFailureRate:
			v.add(Unhealthy, "%.1f%% of %d deliveries failed in the last %s (unhealthy at %v%%): %s",
				d.FailureRate, s.total, c.cfg.FailureWindow, c.cfg.UnhealthyFailureRate, s.lastError)
		case d.FailureRate >= c.cfg.DegradedFailureRate:
			v.add(Degraded, "%.1f%% of %d deliveries failed in the last %s (degraded at %v%%): %s",
				d.FailureRate, s.total, c.cfg.FailureWindow, c.cfg.DegradedFailureRate, s.lastError)
		}
	}
	if s.claimError != "" {
		v.add(Degraded, "the last claim failed: %s", s.claimError)
	}
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons, Relay: &d}
}

func (c *Checker) follower(key string) *progress {
	p := c.followers[key]
	if p == nil {
		p = &progress{}
		c.followers[key] = p
	}
	return p
}

// followed samples a follower's position and returns how long it has lagged without moving. updatedAt is when
// its checkpoint last changed in the database (zero when not known) and timeLag how long the oldest event ahead
// has waited: the follower has been stalled at least the shorter of the two.
func (c *Checker) followed(key string, now time.Time, position, lag int64, updatedAt time.Time,
	timeLag time.Duration) time.Duration {
	p := c.follower(key)
	moved := p.seen && p.position != position
	p.position = position
	stalled := time.Duration(0)
	if !updatedAt.IsZero() && !moved {
		stalled = min(stalledSince(now, updatedAt), timeLag)
	}
	return p.advance(now, lag > 0, moved, stalled)
}

func (c *Checker) checkProjections(ctx context.Context, now time.Time) []Component {
	sts, err := c.cfg.Projections(ctx)
	if err != nil {
		return []Component{unreadable("projections", "cannot read the projections' status: %v", err)}
	}
	out := make([]Component, 0, len(sts))
	for _, s := range sts {
		out = append(out, c.judgeFollower(now, "projection:"+s.Checkpoint, s.State == projection.Failed, s.Attempts,
			s.UpdatedAt, FollowerDetails{State: string(s.State), Position: s.Position, Head: s.Head, Lag: s.Lag,
				TimeLag: Duration(s.TimeLag), LastError: s.LastError, FailingPosition: s.FailingPosition,
				Parked: s.Parked}))
	}
	return out
}

// judgeFollower gives the verdict on one log follower (a projection's checkpoint or a staging worker) from its
// status as read from the database: failed is Unhealthy, a follower that does not move while behind is judged by
// the inactivity thresholds, and an event being retried or parked events past the DeadLetters threshold are
// Degraded.
func (c *Checker) judgeFollower(now time.Time, name string, failed bool, attempts int, updatedAt time.Time,
	d FollowerDetails) Component {
	v := verdict{name: name}
	idle := c.followed(name, now, d.Position, d.Lag, updatedAt, time.Duration(d.TimeLag))
	d.Inactive = Duration(idle)
	if failed {
		v.add(Unhealthy, "failed: %s", d.LastError)
	}
	c.inactive(&v, idle, "%s, %d positions behind (oldest waiting %s), position %d has not moved for %s",
		d.State, d.Lag, time.Duration(d.TimeLag).Round(time.Second), d.Position, idle.Round(time.Second))
	if d.FailingPosition > 0 && !failed {
		v.add(Degraded, "retrying position %d (%d attempts): %s", d.FailingPosition, attempts, d.LastError)
	}
	if c.cfg.DeadLetters > 0 && int64(d.Parked) >= c.cfg.DeadLetters {
		v.add(Degraded, "%d parked events wait to be replayed", d.Parked)
	}
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons, Follower: &d}
}

// unreadable is the Unhealthy component name whose status could not be read.
func unreadable(name, format string, err error) Component {
	v := verdict{name: name}
	v.add(Unhealthy, format, err)
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons}
}

func (c *Checker) checkWorker(ctx context.Context, now time.Time, w Worker) Component {
	v := verdict{name: "worker:" + w.Name()}
	lag, err := w.Lag(ctx)
	if err != nil {
		v.add(Unhealthy, "cannot read its lag: %v", err)
		return Component{Name: v.name, Status: v.status, Reasons: v.reasons}
	}
	idle := c.followed(v.name, now, lag.Position, lag.Events, time.Time{}, 0)
	d := FollowerDetails{Position: lag.Position, Head: lag.Head, Lag: lag.Events, TimeLag: Duration(lag.Time),
		Inactive: Duration(idle)}
	c.inactive(&v, idle, "%d positions behind (oldest waiting %s), position %d has not moved for %s", lag.Events,
		lag.Time.Round(time.Second), lag.Position, idle.Round(time.Second))
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons, Follower: &d}
}

// ServeHTTP answers a health probe: the report as JSON, with status 200 when Healthy or Degraded and 503 when
// Unhealthy. Methods other than GET and HEAD get 405.
func (c *Checker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rep := c.Check(r.Context())
	body, err := json.Marshal(rep)
	if err != nil { // not expected: every field marshals
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	code := http.StatusOK
	if rep.Status == Unhealthy {
		code = http.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	if r.Method == http.MethodGet {
		_, _ = w.Write(append(body, '\n'))
	}
}

// Run checks every interval (a wall-clock ticker) until ctx ends, then returns nil, so progress is sampled and
// status changes are logged even when no probe calls Check. It starts no goroutine.
func (c *Checker) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return &ConfigError{Package: "health", Field: "interval", Reason: "the Run interval must be positive."}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.Check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *Checker) checkWorkerStatus(ctx context.Context, now time.Time) []Component {
	sts, err := c.cfg.WorkerStatus(ctx)
	if err != nil {
		return []Component{unreadable("workers", "cannot read the staging workers' status: %v", err)}
	}
	out := make([]Component, 0, len(sts))
	for _, s := range sts {
		out = append(out, c.judgeFollower(now, "worker:"+s.Name, s.State == staging.WorkerFailed, s.Attempts,
			s.UpdatedAt, FollowerDetails{State: string(s.State), Position: s.Position, Head: s.Head, Lag: s.Lag,
				TimeLag: Duration(s.TimeLag), LastError: s.LastError, FailingPosition: s.FailingPosition,
				Parked: s.Parked}))
	}
	return out
}

// checkInbox judges the inbox by its handlers' failures, read from the database: dead letters and failing
// messages past their thresholds, and a handler stuck on a message for the inactivity thresholds.
func (c *Checker) checkInbox(ctx context.Context, now time.Time) Component {
	v := verdict{name: "inbox"}
	fs, err := c.cfg.Inbox.InboxFailures(ctx)
	if err != nil {
		v.add(Unhealthy, "cannot read the inbox's failures: %v", err)
		return Component{Name: v.name, Status: v.status, Reasons: v.reasons}
	}
	d := InboxDetails{Handlers: make([]InboxHandlerDetails, 0, len(fs))}
	for _, f := range fs {
		h := InboxHandlerDetails{Handler: f.Handler, Failing: f.Failing, MaxAttempts: f.MaxAttempts,
			DeadLettered: f.DeadLettered, LastError: f.LastError}
		if !f.LastFailureAt.IsZero() {
			t := f.LastFailureAt
			h.LastFailureAt = &t
		}
		d.Failing += f.Failing
		d.DeadLettered += f.DeadLettered
		if f.Failing > 0 {
			stuck := stalledSince(now, f.FailingSince)
			h.FailingFor = Duration(stuck)
			switch {
			case c.cfg.UnhealthyInboxFailing > 0 && f.Failing >= c.cfg.UnhealthyInboxFailing:
				v.add(Unhealthy, "handler %q is failing on %d messages (unhealthy at %d): %s", f.Handler, f.Failing,
					c.cfg.UnhealthyInboxFailing, f.LastError)
			case c.cfg.InboxFailing > 0 && f.Failing >= c.cfg.InboxFailing:
				v.add(Degraded, "handler %q is failing on %d messages (up to %d attempts): %s", f.Handler,
					f.Failing, f.MaxAttempts, f.LastError)
			}
			c.inactive(&v, stuck, "handler %q has been failing on a message for %s", f.Handler,
				stuck.Round(time.Second))
		}
		if c.cfg.InboxDeadLetters > 0 && f.DeadLettered >= c.cfg.InboxDeadLetters {
			v.add(Degraded, "handler %q has %d dead letters waiting to be redriven or discarded", f.Handler,
				f.DeadLettered)
		}
		d.Handlers = append(d.Handlers, h)
	}
	return Component{Name: v.name, Status: v.status, Reasons: v.reasons, Inbox: &d}
}
