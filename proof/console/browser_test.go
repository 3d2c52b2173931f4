package console_test

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/stagehandtest"
)

var updateScreenshots = flag.Bool("update-screenshots", false,
	"write the pages' screenshots to console/screenshots (the console README shows them)")

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// chromium finds the browser: $CHROMIUM, else Debian's chromium (or Chrome) on the PATH. The tests fail, never skip,
// without one: .ci/run installs Debian's chromium when it is absent.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found: install Debian's chromium (apt-get install -y chromium), or set CHROMIUM to a " +
		"Chromium or Chrome binary; .ci/run installs it when absent")
	return ""
}

// browser starts a headless Chromium for the test and returns a tab's context; the browser is closed when the
// test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption{},
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	ctx, cancelTime := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() {
		cancelTime()
		cancelTab()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start Chromium")
	return ctx
}

// signIn makes the tab send basic credentials with every request, as a browser does once its prompt was
// answered.
func signIn(user, pass string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders,
			network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return err
	})
}

// serve mounts a console over the shop under /ops/console, with its sampler running, and returns its URL.
func serve(t *testing.T, s *shop, mod func(*console.Config)) string {
	t.Helper()
	cfg := &console.Config{Pool: s.pool, Schema: s.schema, Outbox: s.ob, Store: s.store,
		Title: "shop · staging", Prefix: "/ops/console", SampleInterval: time.Second, History: 2 * time.Minute}
	if mod != nil {
		mod(cfg)
	}
	con, err := console.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		_ = con.Run(ctx)
	}()
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", con)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-sampled
		_ = con.Close()
	})
	return srv.URL + "/ops/console"
}

// do runs the steps within 30 seconds; when they fail, the test fails with where the tab is and what it shows.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	var err error
	for _, step := range steps {
		// The live parts of a page are replaced every refresh period (a second in these tests): a step that
		// found its node just before the replacement fails with the node gone, and is run again on the new one.
		for try := 0; ; try++ {
			err = chromedp.Do(sctx, step)
			if err == nil || try == 4 || !strings.Contains(err.Error(), "Could not find node with given id") {
				break
			}
		}
		if err != nil {
			break
		}
	}
	cancel()
	if err != nil {
		where, _ := chromedp.Run(ctx, chromedp.Evaluate[string](
			`location.href + "\n" + (document.querySelector("main") || document.body).innerText.slice(0, 2000)`))
		t.Fatalf("%v; the tab shows %s", err, where)
	}
}

// text reads an element's text.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(css)))
	require.NoError(t, err, css)
	return strings.TrimSpace(s)
}

// waitText waits until the page (reloaded when reload is set, else refreshed by itself) holds want in css.
func waitText(t *testing.T, ctx context.Context, css, want string, reload bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(document.querySelector(%q) || {}).textContent || ""`, css)))
		require.NoError(t, err)
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed %q (last: %q)", css, want, got)
		}
		if reload {
			do(t, ctx, chromedp.Reload())
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// screenshot writes the tab's full page to console/screenshots/name.png when -update-screenshots is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*updateScreenshots {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := filepath.Join("..", "..", "console", "screenshots")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// The overview of the seeded shop shows its verdict and figures: one outbox dead letter holding its key, one
// inbox dead letter, the projection's checkpoint; the charts draw the traffic.
func TestOverviewShowsTheScenario(t *testing.T) {
	s := openShop(t)
	s.seed()
	base := serve(t, s, nil)
	ctx := browser(t)
	if *updateScreenshots { // some traffic, so the charts have lines to show
		traffic, stop := context.WithTimeout(context.Background(), 12*time.Second)
		s.trickle(traffic, 150*time.Millisecond)
		stop()
		time.Sleep(3 * time.Second)
	}
	do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(".headline")))
	require.Equal(t, "degraded", strings.ToLower(text(t, ctx, ".headline .big")))
	require.Equal(t, "1", text(t, ctx, "#tile-dead .n"))
	require.Equal(t, "1", text(t, ctx, "#tile-inbox-dead .n"))
	page := text(t, ctx, "main")
	require.Contains(t, page, "projection:order-board")
	require.Contains(t, page, "1 dead letters wait to be redriven or discarded, holding 1 later messages of their keys")
	require.Contains(t, page, "append → handled")
	screenshot(t, ctx, "overview")

	do(t, ctx, chromedp.Navigate(base+"/outbox"), chromedp.WaitVisible(chromedp.ID("held")))
	held := text(t, ctx, "#held")
	require.Contains(t, held, "order-7")
	require.Contains(t, held, declined)
	screenshot(t, ctx, "outbox")
}

// An operator finds the dead letter by its error text, redrives it (the count is confirmed first), and sees it
// handled: its event's messages, the redriven one and the one its key held, reach billing.
func TestFindRedriveAndSeeItHandled(t *testing.T) {
	s := openShop(t)
	s.seed()
	base := serve(t, s, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("dana", "on-call")
		c.Challenge = console.BasicChallenge
	})
	ctx := browser(t)
	do(t, ctx, signIn("dana", "on-call"),
		chromedp.Navigate(base+"/dead"), chromedp.WaitVisible(chromedp.ID("f-error")),
		chromedp.SendKeys(chromedp.ID("f-error"), "CARD DECLINED"), chromedp.Click(chromedp.ID("f-apply")),
		chromedp.WaitVisible(chromedp.CSS(`input[name="sel"]`)))
	require.Equal(t, "1", text(t, ctx, "#match-count"))
	require.Contains(t, text(t, ctx, "table.dead"), "payment gateway: card declined for order order-7")
	screenshot(t, ctx, "dead-letters")

	// The message itself: payload (its hostile note shown as text), headers, last error.
	do(t, ctx, chromedp.Click(chromedp.CSS("a.msg")),
		chromedp.WaitVisible(chromedp.ID("redrive-one")))
	detail := text(t, ctx, "main")
	require.Contains(t, detail, `alert(\"x\")`, "the payload's note is shown as text")
	require.Contains(t, detail, "aggregate-id")
	scripts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.scripts.length`))
	require.NoError(t, err)
	require.Equal(t, 1, scripts, "no script but the console's own")
	screenshot(t, ctx, "dead-letter")

	// The gateway is back; select the dead letter, redrive it, confirm the count.
	s.gateway.down.Store(false)
	do(t, ctx, chromedp.Navigate(base+"/dead?error=card+declined"), chromedp.WaitVisible(chromedp.CSS(`input[name="sel"]`)))
	disabled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.querySelector('button[value="redrive:selected"]').disabled`))
	require.NoError(t, err)
	require.True(t, disabled, "nothing selected: the button waits for a selection")
	do(t, ctx, chromedp.Click(chromedp.CSS(`input[name="sel"]`)),
		chromedp.Click(chromedp.CSS(`button[value="redrive:selected"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "1", text(t, ctx, "#confirm-count"))
	screenshot(t, ctx, "confirm")
	do(t, ctx, chromedp.Click(chromedp.ID("confirm")),
		chromedp.WaitVisible(chromedp.ID("done-affected")))
	require.Equal(t, "1", text(t, ctx, "#done-affected"))

	// The event's page shows both messages of order-7 handled by billing.
	do(t, ctx, chromedp.Navigate(base+"/events?stream=order-7&tenant="+acme),
		chromedp.WaitVisible(chromedp.CSS("article.event")))
	waitText(t, ctx, "#event-7", "handled by billing", true)
	waitText(t, ctx, "#event-8", "handled by billing", true)
	screenshot(t, ctx, "events")
	s.settle(0, 1)

	do(t, ctx, chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(chromedp.CSS("table.audit")))
	audit := text(t, ctx, "table.audit")
	require.Contains(t, audit, "dana")
	require.Contains(t, audit, "outbox.redrive")
	screenshot(t, ctx, "audit")
}

// An operator requests a rebuild of the order board and watches it finish on a page that refreshes by itself.
func TestRebuildWatchedToTheEnd(t *testing.T) {
	s := openShop(t)
	s.seed()
	base := serve(t, s, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("dana", "on-call")
	})
	ctx := browser(t)
	do(t, ctx, signIn("dana", "on-call"), chromedp.Navigate(base+"/projections"),
		chromedp.WaitVisible(chromedp.ID("parked")))
	list := text(t, ctx, "main")
	require.Contains(t, list, "order-board")
	require.Contains(t, list, "the board cannot show a hostile order")
	screenshot(t, ctx, "projections")

	s.board.slow.Store(true)
	do(t, ctx, chromedp.Navigate(base+"/projection?name=order-board"),
		chromedp.Click(chromedp.ID("rebuild")), chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Contains(t, text(t, ctx, "section.confirm"), "Rebuild 1 projection")
	do(t, ctx, chromedp.Click(chromedp.ID("confirm")),
		chromedp.WaitVisible(chromedp.ID("done-back")), chromedp.Click(chromedp.ID("done-back")),
		chromedp.WaitVisible(chromedp.ID("rebuild-status")))
	if *updateScreenshots { // mid-way, refreshed by the page itself
		deadline := time.Now().Add(30 * time.Second)
		for {
			pct, err := chromedp.Run(ctx, chromedp.Evaluate[int](
				`parseInt((document.querySelector("#rebuild-percent") || {}).textContent || "0", 10)`))
			require.NoError(t, err)
			if pct >= 30 && pct < 90 {
				break
			}
			require.True(t, time.Now().Before(deadline), "the rebuild was never seen mid-way")
			time.Sleep(50 * time.Millisecond)
		}
		screenshot(t, ctx, "projection-rebuild")
	}
	// No reload from here on: the page refreshes its live part by itself.
	waitText(t, ctx, "#rebuild-status", "Done", false)
	require.Equal(t, "100%", text(t, ctx, "#rebuild-percent"))
	s.board.slow.Store(false)
}

// A read-only console offers no action; an action sent anyway is refused, and so is one without credentials or
// without a valid CSRF token on a console whose actions are enabled.
func TestRefusals(t *testing.T) {
	s := openShop(t)
	s.seed()
	readOnly := serve(t, s, nil)
	ctx := browser(t)
	for _, p := range []string{"/", "/outbox", "/dead", "/dead?source=inbox", "/projections",
		"/projection?name=order-board", "/events?stream=order-7&tenant=" + acme, "/dead/groups",
		"/dead/groups?source=inbox", "/find?q=order-7"} {
		do(t, ctx, chromedp.Navigate(readOnly+p), chromedp.WaitVisible(chromedp.CSS("main")))
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](
			`document.querySelectorAll('form[method="post"], button[name="do"], input[name="csrf"], #rebuild').length`))
		require.NoError(t, err)
		require.Zero(t, n, "%s offers an action", p)
		require.Equal(t, "read-only", text(t, ctx, ".mode"))
	}
	post := func(url, body string) int {
		t.Helper()
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`fetch(%q, {method: "POST",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: %q}).then(r => r.status)`,
			url, body), chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		return status
	}
	require.Equal(t, http.StatusForbidden, post(readOnly+"/act", "action=outbox.discard&mode=matching&source=outbox"))

	acting := serve(t, s, func(c *console.Config) {
		c.Actions = true
		c.Authorize = console.BasicAuth("dana", "on-call")
	})
	do(t, ctx, chromedp.Navigate(acting+"/dead"), chromedp.WaitVisible(chromedp.CSS("main")))
	require.Equal(t, http.StatusUnauthorized, post(acting+"/confirm", "source=outbox&do=discard:matching"))
	do(t, ctx, signIn("dana", "on-call"), chromedp.Reload(),
		chromedp.WaitVisible(chromedp.ID("discard-matching")))
	require.Equal(t, http.StatusForbidden, post(acting+"/confirm", "source=outbox&do=discard:matching"),
		"no CSRF token")
	require.Equal(t, http.StatusForbidden, post(acting+"/confirm", "source=outbox&do=discard:matching&csrf=forged"),
		"a forged CSRF token")
	// The signed-in operator's own CSRF token, on an action that was never confirmed, with a bound in the future
	// and a made-up count: refused, and recorded as refused.
	csrf, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('input[name="csrf"]').value`))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, post(acting+"/act", "action=outbox.discard&mode=matching&source=outbox"+
		"&bound=2030-01-01T00:00:00Z&expected=99&csrf="+url.QueryEscape(csrf)), "an unconfirmed action")
	var refusedRecords int
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		pgx.Identifier{s.schema, "console_audit"}.Sanitize()+` WHERE action = 'outbox.discard' AND confirmed = 99
		AND affected = 0 AND error LIKE 'refused: %'`).Scan(&refusedRecords))
	require.Equal(t, 1, refusedRecords, "the refusal is recorded")
	st, err := s.ob.AllTenants().Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DeadLettered, "nothing was discarded")
}
