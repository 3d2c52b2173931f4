package console

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// pageNames are the page templates; each is parsed with the layout and the shared partials.
var pageNames = []string{"overview", "outbox", "key", "dead", "message", "projections", "projection", "events",
	"audit", "done", "confirm", "error", "find", "groups"}

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

// chart is a small line chart, drawn as inline SVG by the template from the coordinates computed here.
type chart struct {
	Title string
	// Now is the latest value, written out; Max the top of the scale.
	Now, Max string
	// Lines are the series; each is drawn as polylines (a gap in the samples breaks a line).
	Lines []chartLine
	// Span says how far back the chart goes.
	Span string
	// Empty says why there is nothing to draw ("" when there is).
	Empty string
}

type chartLine struct {
	Name, Class string
	Now         string
	Paths       []string
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

// makeChart draws the series over the samples, the x axis spanning history up to now.
func makeChart(title string, samples []sample, now time.Time, history time.Duration, ss ...series) chart {
	ch := chart{Title: title, Span: duration(history)}
	top := 0.0
	for _, s := range ss {
		for _, smp := range samples {
			top = math.Max(top, s.value(smp))
		}
	}
	top = niceCeil(top)
	ch.Max = ss[0].format(top)
	gap := func(a, b sample) bool { return b.At.Sub(a.At) > history/10 }
	for _, s := range ss {
		line := chartLine{Name: s.name, Class: s.class, Now: "–"}
		var cur []string
		var prev *sample
		flush := func() {
			if len(cur) == 1 { // a lone point: a short dash so it shows
				cur = append(cur, cur[0])
			}
			if len(cur) > 0 {
				line.Paths = append(line.Paths, strings.Join(cur, " "))
			}
			cur = nil
		}
		for i := range samples {
			smp := samples[i]
			v := s.value(smp)
			if v < 0 || (prev != nil && gap(*prev, smp)) {
				flush()
			}
			prev = &samples[i]
			if v < 0 {
				continue
			}
			x := chartW * (1 - now.Sub(smp.At).Seconds()/history.Seconds())
			y := chartH
			if top > 0 {
				y = chartH * (1 - v/top)
			}
			cur = append(cur, strconv.FormatFloat(math.Max(x, 0), 'f', 1, 64)+","+strconv.FormatFloat(y, 'f', 1, 64))
			line.Now = s.format(v)
		}
		flush()
		ch.Lines = append(ch.Lines, line)
	}
	drawn := false
	for _, l := range ch.Lines {
		drawn = drawn || len(l.Paths) > 0
	}
	switch {
	case len(samples) == 0:
		ch.Empty = "collecting samples…"
	case !drawn:
		ch.Empty = "nothing to show yet"
	}
	if len(ss) == 1 {
		ch.Now = ch.Lines[0].Now
	}
	return ch
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
