package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
)

// startConsole serves a console over the shop with its sampler running; stop ends both.
func startConsole(t *testing.T, s *shop) (base string, stop func()) {
	t.Helper()
	con, err := console.New(&console.Config{Pool: s.pool, Schema: s.schema, Outbox: s.ob, Store: s.store,
		Prefix: "/ops/console", SampleInterval: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = con.Run(ctx)
	}()
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", con)
	srv := httptest.NewServer(mux)
	once := false
	stop = func() {
		if once {
			return
		}
		once = true
		srv.Close()
		cancel()
		<-ran
		_ = con.Close()
	}
	t.Cleanup(stop)
	return srv.URL + "/ops/console", stop
}

// The charts page of a restarted console shows what the console before it sampled (the history is in the
// database), by topic and by handler, with a time axis; hovering a chart shows a point's time and value.
func TestChartsSurviveARestartAndShowValuesOnHover(t *testing.T) {
	s := openShop(t)
	s.seed()
	first, stop := startConsole(t, s)
	if *updateScreenshots { // traffic over several buckets, so the charts have lines to show
		traffic, end := context.WithTimeout(context.Background(), 35*time.Second)
		s.trickle(traffic, 150*time.Millisecond)
		end()
		time.Sleep(3 * time.Second)
	}
	// Wait until the first console has written a bucket with the seeded publications.
	deadline := time.Now().Add(40 * time.Second)
	for {
		resp, err := http.Get(first + "/api/v1/charts?range=15m")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		var c struct {
			Topics map[string][]struct {
				Published *int64 `json:"published"`
			} `json:"topics"`
		}
		require.NoError(t, json.Unmarshal(b, &c))
		n := int64(0)
		for _, p := range c.Topics[topic] {
			if p.Published != nil {
				n += *p.Published
			}
		}
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the first console wrote no history: %s", b)
		time.Sleep(500 * time.Millisecond)
	}
	stop()
	restarted := time.Now().UTC()

	second, _ := startConsole(t, s)
	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(second+"/charts?range=15m"),
		chromedp.WaitVisible(chromedp.ID("chart-published-by-topic")))
	names, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector("#chart-published-by-topic svg.plot").getAttribute("data-names")`))
	require.NoError(t, err)
	require.Equal(t, topic, names)
	handlers, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector("#chart-handled-by-handler svg.plot").getAttribute("data-names")`))
	require.NoError(t, err)
	require.Equal(t, "billing", handlers)
	ticks, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`document.querySelectorAll("#chart-published-by-topic svg.timeaxis text").length`))
	require.NoError(t, err)
	require.Positive(t, ticks, "the chart has a time axis")

	// The first point with publications (sampled by the first console), and where it is on the screen.
	type target struct {
		X, Y   float64
		T, V   string
		Points int
	}
	tg, err := chromedp.Run(ctx, chromedp.Evaluate[target](`(function () {
		var fig = document.getElementById("chart-published-by-topic");
		fig.scrollIntoView({block: "center"});
		var pts = JSON.parse(fig.getAttribute("data-points"));
		var p = pts.find(function (p) { return p.v[0] !== "0/s" && p.v[0] !== "–"; });
		var box = fig.querySelector("svg.plot").getBoundingClientRect();
		return {X: box.left + p.x / 300 * box.width, Y: box.top + box.height / 2, T: p.t, V: p.v[0], Points: pts.length};
	})()`))
	require.NoError(t, err)
	at, err := time.Parse("15:04:05 UTC", tg.T)
	require.NoError(t, err)
	day := restarted.Truncate(24 * time.Hour)
	at = day.Add(time.Duration(at.Hour())*time.Hour + time.Duration(at.Minute())*time.Minute +
		time.Duration(at.Second())*time.Second)
	require.True(t, at.Before(restarted), "the point at %s was sampled before the restart (%s)", tg.T,
		restarted.Format(time.TimeOnly))
	do(t, ctx, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, tg.X, tg.Y))
	tip := waitVisibleText(t, ctx, "#chart-published-by-topic .tip")
	require.Contains(t, tip, tg.T)
	require.Contains(t, tip, tg.V)
	require.True(t, strings.HasSuffix(tg.V, "/s"), tg.V)
	screenshot(t, ctx, "charts")
}

// waitVisibleText waits until the element is shown and returns its text.
func waitVisibleText(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(function () { var e = document.querySelector(%q); return e && !e.hidden ? e.textContent : ""; })()`, css)))
		require.NoError(t, err)
		if got != "" {
			return got
		}
		require.True(t, time.Now().Before(deadline), "%s was never shown", css)
		time.Sleep(100 * time.Millisecond)
	}
}
