package console

import (
	"context"
	"net/http"
	"slices"
	"time"
)

// chartsPage is the charts page: the chart history of the scope over a range, by topic and by inbox handler.
type chartsPage struct {
	Ranges []rangeLink
	Range  string
	// Totals, Failures, Backlogs, Topics and Handlers are the chart groups.
	Totals, Failures, Backlogs, Topics, Handlers []chart
	// Resolution is the width of a point.
	Resolution string
	// Empty is set when the range holds no bucket at all.
	Empty bool
}

type rangeLink struct {
	Name, Link string
	On         bool
}

// maxLines is how many topics or handlers a chart draws; the others are summed into "others".
const maxLines = 6

// history of one range, read for the charts page and its JSON.
type rangeHistory struct {
	r        chartRange
	from, to time.Time
	all      []histPoint
	topics   map[string][]histPoint
	handlers map[string][]histPoint
}

func (c *Console) readChartRange(ctx context.Context, name string) (rangeHistory, error) {
	r, err := rangeNamed(name)
	if err != nil {
		return rangeHistory{}, err
	}
	from, to := rangeWindow(r, c.cfg.Clock())
	h := rangeHistory{r: r, from: from, to: to}
	all, err := c.history(ctx, "all", from, to, r.Step)
	if err != nil {
		return rangeHistory{}, err
	}
	h.all = all[""]
	if h.topics, err = c.history(ctx, "topic", from, to, r.Step); err != nil {
		return rangeHistory{}, err
	}
	if h.handlers, err = c.history(ctx, "handler", from, to, r.Step); err != nil {
		return rangeHistory{}, err
	}
	return h, nil
}

// chartsPage shows the chart history: the rates, the failures and dead letters, the backlogs, and the rates by
// topic and by inbox handler, over a range of 15 minutes to 7 days. It reads the console_samples table, so it shows
// what was sampled before the console (re)started.
func (c *Console) chartsPage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c.samples.fresh(ctx)
	h, err := c.readChartRange(ctx, r.URL.Query().Get("range"))
	if err != nil {
		return err
	}
	p := chartsPage{Range: h.r.Name, Resolution: duration(h.r.Step), Empty: len(h.all) == 0}
	for _, cr := range chartRanges {
		p.Ranges = append(p.Ranges, rangeLink{Name: cr.Name, Link: c.link("/charts", "range", cr.Name),
			On: cr.Name == h.r.Name})
	}
	gap := 3 * h.r.Step
	perSec := func(v float64) string { return rateText(v) + "/s" }
	count := func(v float64) string { return number(int64(v)) }
	rate := func(get func(histPoint) *int64) func(histPoint) float64 {
		return func(p histPoint) float64 {
			v := get(p)
			if v == nil || p.Seconds <= 0 {
				return unknown
			}
			return float64(*v) / float64(p.Seconds)
		}
	}
	sum := func(get func(histPoint) *int64) func(histPoint) float64 {
		return func(p histPoint) float64 {
			if v := get(p); v != nil {
				return float64(*v)
			}
			return unknown
		}
	}
	mk := func(name, class string, pts []histPoint, f func(histPoint) float64) line {
		l := line{name: name, class: class}
		for _, p := range pts {
			l.points = append(l.points, point{At: p.At, V: f(p)})
		}
		return l
	}
	draw := func(title string, format func(float64) string, ls ...line) chart {
		return drawChart(title, h.from, h.to, gap, format, ls...)
	}
	a := h.all
	p.Totals = []chart{
		draw("staged, published and handled", perSec,
			mk("staged", "s2", a, rate(func(p histPoint) *int64 { return p.Staged })),
			mk("published", "s3", a, rate(func(p histPoint) *int64 { return p.Published })),
			mk("handled", "s4", a, rate(func(p histPoint) *int64 { return p.Handled }))),
		draw("appended to the log", perSec, mk("appended", "s1", a, rate(func(p histPoint) *int64 { return p.Appended }))),
	}
	per := "per " + duration(h.r.Step)
	p.Failures = []chart{
		draw("dead-lettered, "+per, count,
			mk("outbox", "s5", a, sum(func(p histPoint) *int64 { return p.DeadLettered })),
			mk("inbox", "s6", a, sum(func(p histPoint) *int64 { return p.InboxDeadLettered }))),
		draw("dead letters waiting", count,
			mk("outbox", "s5", a, sum(func(p histPoint) *int64 { return p.DeadLetters })),
			mk("inbox", "s6", a, sum(func(p histPoint) *int64 { return p.InboxDeadLetters }))),
		draw("inbox handler failures, "+per, count,
			mk("failed", "s5", a, sum(func(p histPoint) *int64 { return p.InboxFailed }))),
	}
	p.Backlogs = []chart{
		draw("outbox pending", count, mk("pending", "s2", a, sum(func(p histPoint) *int64 { return p.Pending }))),
		draw("oldest pending", func(v float64) string { return duration(time.Duration(v) * time.Millisecond) },
			mk("age", "s5", a, sum(func(p histPoint) *int64 { return p.OldestPendingMS }))),
	}
	if c.estate() {
		p.Backlogs = append(p.Backlogs,
			draw("projection lag", count, mk("positions", "s1", a, sum(func(p histPoint) *int64 { return p.ProjectionLag }))),
			draw("worker lag", count, mk("positions", "s4", a, sum(func(p histPoint) *int64 { return p.WorkerLag }))))
	}
	byName := func(title string, series map[string][]histPoint, get func(histPoint) *int64) chart {
		return draw(title, perSec, topLines(a, series, get)...)
	}
	p.Topics = []chart{
		byName("published by topic", h.topics, func(p histPoint) *int64 { return p.Published }),
		byName("staged by topic", h.topics, func(p histPoint) *int64 { return p.Staged }),
		byName("dead-lettered by topic", h.topics, func(p histPoint) *int64 { return p.DeadLettered }),
	}
	p.Handlers = []chart{
		byName("handled by handler", h.handlers, func(p histPoint) *int64 { return p.Handled }),
		byName("failed by handler", h.handlers, func(p histPoint) *int64 { return p.InboxFailed }),
		byName("dead-lettered by handler", h.handlers, func(p histPoint) *int64 { return p.InboxDeadLettered }),
	}
	c.render(w, r, http.StatusOK, "charts", "Charts", p)
	return nil
}

// topLines draws one line per name (the maxLines-1 largest by total, the others summed into "others"), a rate per
// point of the scope's own buckets (a name without a bucket there counted zero).
func topLines(all []histPoint, series map[string][]histPoint, get func(histPoint) *int64) []line {
	totals := map[string]int64{}
	for name, pts := range series {
		for _, p := range pts {
			if v := get(p); v != nil {
				totals[name] += *v
			}
		}
	}
	var names []string
	for name, n := range totals {
		if n > 0 {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if totals[a] != totals[b] {
			if totals[a] > totals[b] {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	})
	others := false
	if len(names) > maxLines {
		names, others = names[:maxLines-1], true
	}
	kept := map[string]int{}
	for i, n := range names {
		kept[n] = i
	}
	n := len(names)
	if others {
		n++
	}
	if n == 0 {
		return []line{{name: "none", class: "s7"}}
	}
	vals := make([]map[time.Time]int64, n)
	for i := range vals {
		vals[i] = map[time.Time]int64{}
	}
	for name, pts := range series {
		i, ok := kept[name]
		if !ok {
			if !others {
				continue
			}
			i = n - 1
		}
		for _, p := range pts {
			if v := get(p); v != nil {
				vals[i][p.At] += *v
			}
		}
	}
	out := make([]line, n)
	for i := range out {
		name := "others"
		if i < len(names) {
			name = names[i]
		}
		out[i] = line{name: name, class: "s" + string(rune('1'+i%8))}
		for _, p := range all {
			if p.Seconds <= 0 {
				continue
			}
			out[i].points = append(out[i].points, point{At: p.At, V: float64(vals[i][p.At]) / float64(p.Seconds)})
		}
	}
	return out
}
