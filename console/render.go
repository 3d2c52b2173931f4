package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pageNames are the page templates; each is parsed with the layout and the shared partials.
var pageNames = []string{"overview", "outbox", "key", "dead", "message", "projections", "projection", "events",
	"audit", "done", "confirm", "error", "find", "groups", "charts"}

// funcs are the templates' helpers. None returns template.HTML: stored data is only ever text.
var funcs = template.FuncMap{
	"num":  func(n int64) string { return number(n) },
	"int":  func(n int) string { return number(int64(n)) },
	"dur":  duration,
	"clip": clip,
	"pct": func(part, whole int64) string {
		if whole <= 0 {
			return "0"
		}
		return strconv.FormatFloat(math.Min(100, 100*float64(part)/float64(whole)), 'f', 0, 64)
	},
	"rate":       rateText,
	"add":        func(a, b int) int { return a + b },
	"parkedArgs": func(v view, f parkedForm) parkedList { return parkedList{View: v, parkedForm: f} },
}

// rateText writes a rate (unknown when negative).
func rateText(v float64) string {
	switch {
	case v < 0:
		return "–"
	case v == 0:
		return "0"
	case v < 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return number(int64(math.Round(v)))
}

// parsePages parses every page with the layout.
func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html",
		"templates/partials.html")
	if err != nil {
		return nil, fmt.Errorf("parse the layout: %w", err)
	}
	out := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if _, err := t.ParseFS(templateFiles, "templates/"+name+".html"); err != nil {
			return nil, fmt.Errorf("parse page %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// view is what every page's template gets: the frame, and the page's own Data.
type view struct {
	Title, Page, Nav, Prefix string
	// Scope says whose data the page shows; Estate is true for every tenant.
	Scope  string
	Estate bool
	// Actions is true when the console offers actions; User is the authenticated user ("" when none); CanAct is
	// Actions with a user; CSRF the token of the user's forms.
	Actions bool
	User    string
	CanAct  bool
	CSRF    string
	// Refresh is the period (seconds) of the live parts' refresh (0: none).
	Refresh int
	// Login is the sign-in link, back to this page.
	Login string
	Now   time.Time
	Data  any
}

// render writes page name with data and status code.
func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	t, ok := c.pages[name]
	if !ok {
		http.Error(w, "console: no page "+name, http.StatusInternalServerError)
		return
	}
	now := c.cfg.Clock()
	v := view{Title: c.cfg.Title, Page: title, Nav: name, Prefix: c.cfg.Prefix, Scope: c.scopeName(),
		Estate: c.estate(), Actions: c.cfg.Actions, Now: now, Data: data}
	v.Login = c.link("/login", "back", c.back(r.URL.RequestURI(), ""))
	if u, ok := c.user(r); ok {
		v.User = u
		if c.cfg.Actions {
			v.CanAct, v.CSRF = true, c.csrfToken(u, now)
		}
	}
	if code == http.StatusOK {
		v.Refresh = int(max(c.cfg.SampleInterval/time.Second, 1))
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		c.cfg.Logger.ErrorContext(r.Context(), "console: a template failed", "page", name, "error", err)
		http.Error(w, "console: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// link builds a console URL: the path under the prefix and the query values (empty ones left out).
func (c *Console) link(path string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	u := c.cfg.Prefix + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// chart is a small line chart, drawn as inline SVG by the template from the coordinates computed here, with a
// time axis under it and, for the script's hover, every point's time and values.
type chart struct {
	ID    string
	Title string
	// Now is the latest value, written out; Max the top of the scale.
	Now, Max string
	// Lines are the series; each is drawn as polylines (a gap in the points breaks a line).
	Lines []chartLine
	// Span says how far back the chart goes.
	Span string
	// Ticks are the time axis's labels.
	Ticks []chartTick
	// Points is the JSON the hover reads: [{"x": svg x, "t": time, "v": [value per line]}].
	Points string
	// Empty says why there is nothing to draw ("" when there is).
	Empty string
}

type chartLine struct {
	Name, Class string
	Now         string
	Paths       []string
}

type chartTick struct {
	X     string
	Label string
}

// chart geometry, in the SVG's own units.
const (
	chartW = 300.0
	chartH = 80.0
)

// series is one line of a chart: a value per sample (negative: unknown, not drawn).
type series struct {
	name, class string
	value       func(sample) float64
	format      func(float64) string
}

// point is one value of a line at a time (negative: unknown, not drawn).
type point struct {
	At time.Time
	V  float64
}

// line is one series of a chart drawn from points.
type line struct {
	name, class string
	points      []point
}

// makeChart draws the series over the samples, the x axis spanning history up to now.
func makeChart(title string, samples []sample, now time.Time, history time.Duration, ss ...series) chart {
	lines := make([]line, 0, len(ss))
	for _, s := range ss {
		l := line{name: s.name, class: s.class}
		for _, smp := range samples {
			l.points = append(l.points, point{At: smp.At, V: s.value(smp)})
		}
		lines = append(lines, l)
	}
	ch := drawChart(title, now.Add(-history), now, history/10, ss[0].format, lines...)
	if len(samples) == 0 {
		ch.Empty = "collecting samples…"
	}
	return ch
}

// drawChart draws the lines over [from, to]; points further apart than gap break a line.
func drawChart(title string, from, to time.Time, gap time.Duration, format func(float64) string, lines ...line) chart {
	span := to.Sub(from)
	ch := chart{Title: title, Span: duration(span), ID: chartID(title)}
	top := 0.0
	for _, l := range lines {
		for _, p := range l.points {
			top = math.Max(top, p.V)
		}
	}
	top = niceCeil(top)
	ch.Max = format(top)
	xOf := func(t time.Time) float64 { return math.Max(0, chartW*(t.Sub(from).Seconds()/span.Seconds())) }
	type column struct {
		X float64  `json:"x"`
		T string   `json:"t"`
		V []string `json:"v"`
	}
	cols := map[int64]*column{}
	var order []int64
	for li, l := range lines {
		cl := chartLine{Name: l.name, Class: l.class, Now: "–"}
		var cur []string
		var prev *point
		flush := func() {
			if len(cur) == 1 { // a lone point: a short dash so it shows
				cur = append(cur, cur[0])
			}
			if len(cur) > 0 {
				cl.Paths = append(cl.Paths, strings.Join(cur, " "))
			}
			cur = nil
		}
		for i := range l.points {
			p := l.points[i]
			if p.V < 0 || (prev != nil && p.At.Sub(prev.At) > gap) {
				flush()
			}
			prev = &l.points[i]
			if p.V < 0 {
				continue
			}
			x := xOf(p.At)
			y := chartH
			if top > 0 {
				y = chartH * (1 - p.V/top)
			}
			cur = append(cur, strconv.FormatFloat(x, 'f', 1, 64)+","+strconv.FormatFloat(y, 'f', 1, 64))
			cl.Now = format(p.V)
			key := p.At.UnixMilli()
			col := cols[key]
			if col == nil {
				col = &column{X: math.Round(x*10) / 10, T: p.At.UTC().Format(tickLayout(span, true)) + " UTC",
					V: make([]string, len(lines))}
				for j := range col.V {
					col.V[j] = "–"
				}
				cols[key] = col
				order = append(order, key)
			}
			col.V[li] = format(p.V)
		}
		flush()
		ch.Lines = append(ch.Lines, cl)
	}
	slices.Sort(order)
	list := make([]*column, 0, len(order))
	for _, k := range order {
		list = append(list, cols[k])
	}
	if b, err := json.Marshal(list); err == nil {
		ch.Points = string(b)
	}
	ch.Ticks = ticks(from, to)
	drawn := false
	for _, l := range ch.Lines {
		drawn = drawn || len(l.Paths) > 0
	}
	if !drawn {
		ch.Empty = "nothing to show yet"
	}
	if len(lines) == 1 {
		ch.Now = ch.Lines[0].Now
	}
	return ch
}

// chartID makes an element ID of a chart's title.
func chartID(title string) string {
	var b strings.Builder
	b.WriteString("chart-")
	for _, r := range strings.ToLower(title) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return b.String()
}

// tickLayout is how the time axis writes a time: with the day when the span is long, with seconds in the hover
// of short spans.
func tickLayout(span time.Duration, hover bool) string {
	switch {
	case span > 36*time.Hour:
		return "Jan 2 15:04"
	case hover && span <= 6*time.Hour:
		return "15:04:05"
	}
	return "15:04"
}

// ticks labels the time axis of [from, to] at three to six round times (UTC).
func ticks(from, to time.Time) []chartTick {
	span := to.Sub(from)
	step := 24 * time.Hour
	for _, s := range []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute,
		15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
		24 * time.Hour} {
		if span/s <= 5 {
			step = s
			break
		}
	}
	var out []chartTick
	for t := from.Truncate(step).Add(step); t.Before(to); t = t.Add(step) {
		x := chartW * t.Sub(from).Seconds() / span.Seconds()
		if x < 12 || x > chartW-12 {
			continue // the label would not fit
		}
		out = append(out, chartTick{X: strconv.FormatFloat(x, 'f', 1, 64), Label: t.UTC().Format(tickLayout(span, false))})
	}
	return out
}

// niceCeil rounds a chart's top up to 1, 2 or 5 times a power of ten (1 at least).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
