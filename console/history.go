package console

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// histPoint is one merged bucket of the chart history for one series.
type histPoint struct {
	At      time.Time
	Seconds int64
	// Counts are summed over the merged buckets; nil where the series has no such figure.
	Appended, Staged, Published, DeadLettered, Handled, InboxDeadLettered, InboxFailed *int64
	// Backlogs are the latest seen in the merged buckets; nil when none was.
	Pending, OldestPendingMS, DeadLetters, InboxDeadLetters, ProjectionLag, WorkerLag *int64
}

// history reads the chart history of kind ("all", "topic" or "handler") in [from, to), merged into buckets of step,
// by name ("" for kind "all"), each series oldest first.
func (c *Console) history(ctx context.Context, kind string, from, to time.Time, step time.Duration) (
	map[string][]histPoint, error) {
	rows, err := c.cfg.Pool.Query(ctx, c.q.sampleRange, c.scopeKey(), kind, from, to,
		fmt.Sprintf("%d seconds", int(step/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("console: read the chart history: %w", err)
	}
	out := map[string][]histPoint{}
	var p histPoint
	var name string
	_, err = pgx.ForEachRow(rows, []any{&p.At, &name, &p.Seconds, &p.Appended, &p.Staged, &p.Published,
		&p.DeadLettered, &p.Handled, &p.InboxDeadLettered, &p.InboxFailed, &p.Pending, &p.OldestPendingMS,
		&p.DeadLetters, &p.InboxDeadLetters, &p.ProjectionLag, &p.WorkerLag}, func() error {
		q := p
		q.At = q.At.UTC()
		out[name] = append(out[name], q)
		p = histPoint{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: read the chart history: %w", err)
	}
	return out, nil
}

// chartRange is a span of time the charts page offers, and the width of its points.
type chartRange struct {
	Name string
	Span time.Duration
	Step time.Duration
}

// chartRanges are the spans the charts page offers; each has at most 360 points.
var chartRanges = []chartRange{
	{"15m", 15 * time.Minute, 10 * time.Second},
	{"1h", time.Hour, 10 * time.Second},
	{"6h", 6 * time.Hour, time.Minute},
	{"24h", 24 * time.Hour, 5 * time.Minute},
	{"7d", 7 * 24 * time.Hour, 30 * time.Minute},
}

// rangeNamed returns the chart range of the name ("" is 1h), or a bad request.
func rangeNamed(name string) (chartRange, error) {
	if name == "" {
		name = "1h"
	}
	i := slices.IndexFunc(chartRanges, func(r chartRange) bool { return r.Name == name })
	if i < 0 {
		return chartRange{}, badRequest("range %q is not one of 15m, 1h, 6h, 24h, 7d", clipForError(name))
	}
	return chartRanges[i], nil
}

// rangeWindow is the [from, to) of a chart range ending now, aligned on its step.
func rangeWindow(r chartRange, now time.Time) (time.Time, time.Time) {
	to := now.Truncate(r.Step).Add(r.Step)
	return to.Add(-r.Span), to
}
