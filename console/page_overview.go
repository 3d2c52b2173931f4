package console

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/outbox"
)

type overviewPage struct {
	// Health is the latest verdict (nil before the first sample); CheckedAgo how old it is.
	Health     *health.Report
	CheckedAgo time.Duration
	Components []componentView
	// SampleError is the last sampling failure ("" when the last sample succeeded).
	SampleError clipped
	Stats       outbox.Stats
	Inbox       outbox.InboxStats
	Rates       []chart
	Backlogs    []chart
	Latency     []latencyRow
	// LatencyCovers says what the latency figures cover.
	LatencyCovers string
	// Followers counts the projections' checkpoints and staging workers, and how many are not running.
	Projections, ProjectionsDown, Workers, WorkersDown int
	// Processes are every component's processes, from their heartbeats (estate-wide consoles).
	Processes []processView
	Links     overviewLinks
}

type overviewLinks struct {
	Dead, InboxDead, Held, Pending, Projections, Charts string
}

type componentView struct {
	Name    clipped
	Status  string
	Reasons []clipped
	// Figures are the component's details worth showing next to its verdict.
	Figures string
}

// overview is the landing page: the health verdict per component with its reasons, the rates and backlogs over the
// last History, the latency from append to handled, and the outbox and inbox figures.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c.samples.fresh(ctx)
	snap := c.samples.snapshot()
	samples, rep, lat, sampleErr := snap.samples, snap.report, snap.latencies, snap.err
	c.samples.viewed()
	st, ok := outboxFigures(rep)
	if !ok { // a checker without the outbox: read it
		var err error
		if st, err = c.admin.Backlog(ctx); err != nil {
			return err
		}
	}
	in, err := c.inboxFigures(ctx, rep)
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	procs, err := c.processes(ctx, now)
	if err != nil {
		return err
	}
	p := overviewPage{Processes: procs, Health: rep, Stats: st, Inbox: in, Latency: lat, SampleError: clip(sampleErr, 2048),
		LatencyCovers: snap.cover.String(),
		Links: overviewLinks{Dead: c.link("/dead", "source", "outbox"), InboxDead: c.link("/dead", "source", "inbox"),
			Held: c.link("/outbox") + "#held", Pending: c.link("/outbox"), Projections: c.link("/projections"),
			Charts: c.link("/charts")}}
	if rep != nil {
		p.CheckedAgo = max(now.Sub(rep.CheckedAt), 0)
		for _, comp := range rep.Components {
			cv := componentView{Name: clip(comp.Name, 200), Status: comp.Status.String(), Figures: figures(comp)}
			for _, reason := range comp.Reasons {
				cv.Reasons = append(cv.Reasons, clip(reason, 1000))
			}
			p.Components = append(p.Components, cv)
			if comp.Follower != nil {
				down := comp.Follower.State != "" && comp.Follower.State != "running"
				if len(comp.Name) > 11 && comp.Name[:11] == "projection:" {
					p.Projections++
					if down {
						p.ProjectionsDown++
					}
				} else {
					p.Workers++
					if down {
						p.WorkersDown++
					}
				}
			}
		}
	}
	h := c.cfg.History
	perSec := func(v float64) string { return rateText(v) + "/s" }
	count := func(v float64) string { return number(int64(v)) }
	p.Rates = []chart{
		makeChart("appended", samples, now, h, series{"appended", "s1", func(s sample) float64 { return s.Appended }, perSec}),
		makeChart("staged", samples, now, h, series{"staged", "s2", func(s sample) float64 { return s.Staged }, perSec}),
		makeChart("published", samples, now, h, series{"published", "s3", func(s sample) float64 { return s.Published }, perSec}),
		makeChart("handled", samples, now, h, series{"handled", "s4", func(s sample) float64 { return s.Handled }, perSec}),
		makeChart("failed", samples, now, h, series{"failed", "s5", func(s sample) float64 { return s.Failed }, perSec}),
	}
	p.Backlogs = []chart{
		makeChart("outbox pending", samples, now, h, series{"pending", "s2", func(s sample) float64 { return float64(s.Pending) }, count}),
		makeChart("oldest pending", samples, now, h, series{"age", "s5", func(s sample) float64 { return s.OldestAge.Seconds() },
			func(v float64) string { return duration(time.Duration(v * float64(time.Second))) }}),
	}
	if c.estate() {
		p.Backlogs = append(p.Backlogs,
			makeChart("projection lag", samples, now, h, series{"positions", "s1", func(s sample) float64 { return float64(s.ProjectionLag) }, count}),
			makeChart("worker lag", samples, now, h, series{"positions", "s4", func(s sample) float64 { return float64(s.WorkerLag) }, count}))
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", p)
	return nil
}

// inboxFigures are the inbox's failing pairs and dead letters of the latest health report (read by the handlers'
// failures when it has no inbox component), and Handled the messages handled in the last hour by the chart
// history: no figure reads the inbox's handled entries, which may number millions.
func (c *Console) inboxFigures(ctx context.Context, rep *health.Report) (outbox.InboxStats, error) {
	var in outbox.InboxStats
	found := false
	if rep != nil {
		for _, comp := range rep.Components {
			if d := comp.Inbox; d != nil {
				in.Failing, in.DeadLettered, found = d.Failing, d.DeadLettered, true
			}
		}
	}
	if !found {
		fs, err := c.admin.InboxFailures(ctx)
		if err != nil {
			return in, err
		}
		for _, f := range fs {
			in.Failing += f.Failing
			in.DeadLettered += f.DeadLettered
		}
	}
	now := c.cfg.Clock()
	h, err := c.history(ctx, "all", now.Add(-time.Hour), now, time.Hour)
	if err != nil {
		return in, err
	}
	for _, p := range h[""] {
		if p.Handled != nil {
			in.Handled += *p.Handled
		}
	}
	return in, nil
}

// String says what the latency figures cover.
func (lc latencyCover) String() string {
	if lc.Window == 0 {
		return ""
	}
	n := lc.Published + lc.Handled
	if n == 0 {
		return "no message was published or handled in the last " + duration(lc.Window)
	}
	span := "published or handled between " + lc.From.UTC().Format("15:04:05") + " and " +
		lc.To.UTC().Format("15:04:05") + " UTC"
	if lc.Capped {
		return "the latest " + number(int64(lc.Published)) + " publications and " + number(int64(lc.Handled)) +
			" handlings (at most " + number(int64(lc.Cap)) + " of each, of the last " + duration(lc.Window) +
			"), " + span
	}
	return "every message (" + number(int64(lc.Published)) + " publications, " + number(int64(lc.Handled)) +
		" handlings) of the last " + duration(lc.Window) + ", " + span
}

// outboxFigures are the outbox statistics of the latest health report, read in the same sample, when it has them.
func outboxFigures(rep *health.Report) (outbox.Stats, bool) {
	if rep == nil {
		return outbox.Stats{}, false
	}
	for _, comp := range rep.Components {
		if d := comp.Outbox; d != nil {
			return outbox.Stats{Pending: d.Pending, OldestPendingAge: time.Duration(d.OldestPendingAge),
				Scheduled: d.Scheduled, BackingOff: d.BackingOff, Parked: d.Parked,
				WaitingBehindPending: d.WaitingBehindPending, HeldByDeadLetter: d.HeldByDeadLetter,
				InFlight: d.InFlight, DeadLettered: d.DeadLettered}, true
		}
	}
	return outbox.Stats{}, false
}

// figures summarizes a component's details in a line.
func figures(comp health.Component) string {
	switch {
	case comp.Outbox != nil:
		d := comp.Outbox
		return number(d.Pending) + " pending, " + number(d.Ready) + " ready, oldest " +
			duration(time.Duration(d.OldestPendingAge)) + ", " + number(d.DeadLettered) + " dead letters"
	case comp.Relay != nil:
		d := comp.Relay
		return number(d.Deliveries) + " deliveries, " + strconv.FormatFloat(d.FailureRate, 'f', 1, 64) +
			"% failed in the last " + duration(time.Duration(d.Window))
	case comp.Inbox != nil:
		d := comp.Inbox
		return number(d.Failing) + " failing, " + number(d.DeadLettered) + " dead letters, " +
			number(int64(len(d.Handlers))) + " handlers with failures"
	case comp.Follower != nil:
		d := comp.Follower
		s := "position " + number(d.Position) + " of " + number(d.Head) + ", lag " + number(d.Lag)
		if d.State != "" {
			s = d.State + ", " + s
		}
		if d.Parked > 0 {
			s += ", " + number(int64(d.Parked)) + " parked"
		}
		return s
	}
	return ""
}
