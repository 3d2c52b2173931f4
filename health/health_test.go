package health_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clock is the checker's injected clock: tests move it by minutes without waiting.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newChecker(t testing.TB, cfg health.Config) *health.Checker {
	t.Helper()
	c, err := health.New(&cfg)
	require.NoError(t, err)
	return c
}

func component(t testing.TB, r health.Report, name string) health.Component {
	t.Helper()
	for _, c := range r.Components {
		if c.Name == name {
			return c
		}
	}
	require.Failf(t, "no component", "%q in %+v", name, r.Components)
	return health.Component{}
}

// Every invalid setting fails construction with a *ConfigError naming its field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	c, err := health.New(nil)
	require.NoError(t, err, "a nil config is valid")
	require.Equal(t, health.Healthy, c.Check(context.Background()).Status, "watching nothing is healthy")

	cases := []struct {
		field, reason string
		cfg           health.Config
	}{
		{"DegradedInactivity", "must be positive", health.Config{DegradedInactivity: -time.Second}},
		{"UnhealthyInactivity", "must be positive", health.Config{UnhealthyInactivity: -time.Second}},
		{"UnhealthyInactivity", "must be at least DegradedInactivity",
			health.Config{DegradedInactivity: 3 * time.Minute, UnhealthyInactivity: time.Minute}},
		{"DegradedFailureRate", "must be a percentage above 0 and at most 100", health.Config{DegradedFailureRate: -1}},
		{"DegradedFailureRate", "must be a percentage above 0 and at most 100", health.Config{DegradedFailureRate: 101}},
		{"UnhealthyFailureRate", "must be a percentage above 0 and at most 100",
			health.Config{UnhealthyFailureRate: 250}},
		{"UnhealthyFailureRate", "must not be below DegradedFailureRate",
			health.Config{DegradedFailureRate: 10, UnhealthyFailureRate: 5}},
		{"FailureWindow", "must be at least 1s", health.Config{FailureWindow: time.Millisecond}},
		{"MinDeliveries", "must not be negative", health.Config{MinDeliveries: -1}},
		{"Timeout", "must not be negative", health.Config{Timeout: -time.Second}},
		{"Workers", "Workers[0] must not be nil", health.Config{Workers: []health.Worker{nil}}},
		{"UnhealthyInboxFailing", "must not be below InboxFailing",
			health.Config{InboxFailing: 10, UnhealthyInboxFailing: 5}},
	}
	for _, tc := range cases {
		_, err := health.New(&tc.cfg)
		require.ErrorIs(t, err, health.ErrInvalidConfig, "%+v", tc.cfg)
		var ce *health.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, tc.field, ce.Field, "%+v", tc.cfg)
		require.Equal(t, tc.reason, ce.Reason, "%+v", tc.cfg)
		require.Contains(t, err.Error(), tc.field)
	}

	// A Degraded threshold above the Unhealthy default moves the Unhealthy default up with it.
	_, err = health.New(&health.Config{DegradedInactivity: 10 * time.Minute, DegradedFailureRate: 30})
	require.NoError(t, err)
	require.ErrorIs(t, c.Run(context.Background(), 0), health.ErrInvalidConfig)
}

// delivered feeds n deliveries, failed of them rejected, through the hooks a relay would call.
func delivered(h outbox.Hooks, n, failed int) {
	for i := range n {
		var err error
		o := outbox.Published
		if i < failed {
			o, err = outbox.Rejected, errors.New("broker said no")
		}
		h.Delivered(context.Background(), outbox.Delivery{MessageID: fmt.Sprint(i)}, o, err, time.Millisecond)
	}
}

// The relay's failure rate: Degraded from 5 %, Unhealthy from 20 % (the Excalibur outbox documentation), judged only
// over enough deliveries, forgotten once outside the window; user hooks still run.
func TestFailureRateThresholds(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, FailureWindow: time.Minute})
	ctx := context.Background()
	require.Empty(t, c.Check(ctx).Components, "no relay component until hooks are taken")

	var userCalls int
	h := c.RelayHooks(outbox.Hooks{Delivered: func(context.Context, outbox.Delivery, outbox.Outcome, error,
		time.Duration) {
		userCalls++
	}})
	check := func(want health.Status, deliveries, failures int64) health.Report {
		t.Helper()
		r := c.Check(ctx)
		rc := component(t, r, "relay")
		require.Equal(t, want, rc.Status, "%v", rc.Reasons)
		require.Equal(t, want, r.Status)
		require.Equal(t, deliveries, rc.Relay.Deliveries)
		require.Equal(t, failures, rc.Relay.Failures)
		return r
	}
	check(health.Healthy, 0, 0)

	delivered(h, 10, 10)
	check(health.Healthy, 10, 10) // below MinDeliveries (20): not judged yet
	require.Equal(t, 10, userCalls, "the user's hooks run too")

	clk.Add(2 * time.Minute) // out of the window
	delivered(h, 100, 4)
	check(health.Healthy, 100, 4) // 4 %

	clk.Add(2 * time.Minute)
	delivered(h, 100, 5)
	r := check(health.Degraded, 100, 5) // 5 %
	require.Contains(t, r.Reasons[0], "relay: 5.0% of 100 deliveries failed")
	require.Contains(t, r.Reasons[0], "broker said no")

	clk.Add(2 * time.Minute)
	delivered(h, 100, 19)
	check(health.Degraded, 100, 19) // 19 %

	clk.Add(2 * time.Minute)
	delivered(h, 100, 20)
	r = check(health.Unhealthy, 100, 20) // 20 %
	require.Contains(t, r.Reasons[0], "unhealthy at 20%")

	// The window slides: half a window later the failures still count, a window later they are gone.
	clk.Add(30 * time.Second)
	check(health.Unhealthy, 100, 20)
	clk.Add(31 * time.Second)
	check(health.Healthy, 0, 0)

	// A broker that cannot be reached fails deliveries too; a delivery released at shutdown is no verdict.
	for range 20 {
		h.Delivered(ctx, outbox.Delivery{}, outbox.Unreachable, errors.New("dial tcp: refused"), 0)
		h.Delivered(ctx, outbox.Delivery{}, outbox.Released, nil, 0)
	}
	r = check(health.Unhealthy, 20, 20)
	require.Contains(t, r.Reasons[0], "dial tcp: refused")

	// A failing claim degrades the relay until a claim succeeds.
	clk.Add(2 * time.Minute)
	h.Claimed(ctx, 0, time.Millisecond, errors.New("connection reset"))
	r = check(health.Degraded, 0, 0)
	require.Contains(t, r.Reasons[0], "the last claim failed: connection reset")
	h.Claimed(ctx, 3, time.Millisecond, nil)
	check(health.Healthy, 0, 0)
}

// The handler answers 200 for Healthy and Degraded, 503 for Unhealthy, with the report as JSON.
func TestHandlerCodesAndJSON(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, MinDeliveries: 1})
	h := c.RelayHooks(outbox.Hooks{})
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)

	get := func(wantCode int, want health.Status) health.Report {
		t.Helper()
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, wantCode, resp.StatusCode)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		var raw map[string]any
		var r health.Report
		dec := json.NewDecoder(resp.Body)
		require.NoError(t, dec.Decode(&raw))
		b, err := json.Marshal(raw)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &r))
		require.Equal(t, want.String(), raw["status"])
		require.Equal(t, want, r.Status)
		require.NotNil(t, raw["reasons"], "reasons is always a list")
		return r
	}
	r := get(http.StatusOK, health.Healthy)
	require.Equal(t, clk.Now(), r.CheckedAt)
	require.Len(t, r.Components, 1)
	require.Equal(t, "relay", r.Components[0].Name)

	delivered(h, 100, 10)
	r = get(http.StatusOK, health.Degraded)
	require.Len(t, r.Reasons, 1)
	require.InDelta(t, 10.0, r.Components[0].Relay.FailureRate, 1e-9)
	require.Equal(t, health.Duration(health.DefaultFailureWindow), r.Components[0].Relay.Window)

	delivered(h, 100, 100)
	r = get(http.StatusServiceUnavailable, health.Unhealthy)
	require.Equal(t, int64(110), r.Components[0].Relay.Failures)

	resp, err := http.Post(srv.URL, "text/plain", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	req, err := http.NewRequest(http.MethodHead, srv.URL, nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	// Durations are seconds in JSON.
	b, err := json.Marshal(health.OutboxDetails{OldestPendingAge: health.Duration(1500 * time.Millisecond)})
	require.NoError(t, err)
	require.Contains(t, string(b), `"oldest_pending_age_seconds":1.5`)
}

// fakeWorker is a staging worker whose lag the test sets.
type fakeWorker struct {
	mu  sync.Mutex
	lag staging.Lag
	err error
}

func (w *fakeWorker) Name() string { return "stager:test" }

func (w *fakeWorker) Lag(context.Context) (staging.Lag, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lag, w.err
}

func (w *fakeWorker) set(position, head int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lag, w.err = staging.Lag{Position: position, Head: head, Events: head - position}, err
}

// A staging worker that lags without moving is Degraded after 2 minutes and Unhealthy after 5; moving resets the
// clock; a worker that is caught up is never stalled, however long it stays still.
func TestWorkerStall(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := &fakeWorker{}
	c := newChecker(t, health.Config{Clock: clk.Now, Workers: []health.Worker{w}})
	ctx := context.Background()
	status := func() health.Status { return component(t, c.Check(ctx), "worker:stager:test").Status }

	w.set(10, 10, nil)
	require.Equal(t, health.Healthy, status())
	clk.Add(time.Hour)
	require.Equal(t, health.Healthy, status(), "caught up: idle, not stalled")

	w.set(10, 50, nil)
	require.Equal(t, health.Healthy, status())
	clk.Add(2 * time.Minute)
	require.Equal(t, health.Degraded, status())
	w.set(20, 60, nil) // it moved
	require.Equal(t, health.Healthy, status())
	clk.Add(119 * time.Second)
	require.Equal(t, health.Healthy, status())
	clk.Add(time.Second)
	require.Equal(t, health.Degraded, status())
	clk.Add(3 * time.Minute)
	r := c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status)
	require.Contains(t, r.Reasons[0], "worker:stager:test: 40 positions behind")
	require.Contains(t, r.Reasons[0], "has not moved for 5m0s")
	require.Equal(t, health.Duration(5*time.Minute), component(t, r, "worker:stager:test").Follower.Inactive)

	w.set(60, 60, nil)
	require.Equal(t, health.Healthy, status())
	w.set(60, 60, errors.New("connection refused"))
	r = c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status)
	require.Contains(t, r.Reasons[0], "connection refused")
}

// An outbox that cannot be read (here: a schema never migrated) is Unhealthy, with the error as the reason.
func TestUnreadableOutboxIsUnhealthy(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema, DisableNotify: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	c := newChecker(t, health.Config{Outbox: ob.AllTenants()})
	r := c.Check(context.Background())
	require.Equal(t, health.Unhealthy, r.Status)
	require.Contains(t, r.Reasons[0], "outbox: cannot read the outbox")
	require.Contains(t, r.Reasons[0], "does not exist")
}

// env is a migrated schema with an outbox.
type env struct {
	pool   *pgxpool.Pool
	schema string
	ob     *outbox.Outbox
}

func setup(t testing.TB) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	return &env{pool: pool, schema: schema, ob: ob}
}

func (e *env) stage(t testing.TB, prefix string, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Payload: []byte("{}")}
	}
	staged, err := e.ob.Stage(context.Background(), msgs...)
	require.NoError(t, err)
	require.Equal(t, n, staged)
}

// startRelay runs a relay whose consumer acks what gate lets through (everything when gate is nil) until stop.
func (e *env) startRelay(t testing.TB, hooks outbox.Hooks, gate <-chan struct{}) (stop func()) {
	t.Helper()
	r, err := e.ob.NewRelay(&outbox.RelayConfig{PollingInterval: 20 * time.Millisecond, ClaimDuration: 5 * time.Second,
		AckDeadline: 10 * time.Second, MaxDegreeOfParallelism: 1, Hooks: hooks})
	require.NoError(t, err)
	ch, err := r.SubscribeTopics(context.Background())
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			if gate != nil {
				select {
				case <-gate:
				case <-m.Context().Done():
					m.Nack()
					continue
				}
			}
			m.Ack()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = r.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func (e *env) pending(t testing.TB) int64 {
	st, err := e.ob.AllTenants().Stats(context.Background())
	require.NoError(t, err)
	return st.Pending
}

// A relay stopped with messages pending: Degraded after 2 minutes, Unhealthy after 5 (503 from the handler),
// although nothing reports an error; Healthy again once a relay runs and publishes.
func TestStoppedRelayWithPendingMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Outbox: e.ob.AllTenants()})
	h := c.RelayHooks(outbox.Hooks{})

	stop := e.startRelay(t, h, nil)
	e.stage(t, "a", 5)
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.pending(t) == 0 }, "the relay did not drain")
	r := c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
	ob := component(t, r, "outbox").Outbox
	require.NotNil(t, ob.LastPublishedAt, "the ledger shows the publications")
	require.Equal(t, int64(5), component(t, r, "relay").Relay.Deliveries)

	stop()
	e.stage(t, "b", 3)
	r = c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "work just appeared: not stalled yet: %v", r.Reasons)
	require.Equal(t, int64(3), component(t, r, "outbox").Outbox.Ready)

	clk.Add(2 * time.Minute)
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status, "%v", r.Reasons)
	require.Contains(t, r.Reasons[0], "outbox: 3 messages ready but none published for 2m0s")

	clk.Add(3 * time.Minute)
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	var got health.Report
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, health.Unhealthy, got.Status)
	require.Equal(t, health.Duration(5*time.Minute), component(t, got, "outbox").Outbox.Inactive)

	// A relay in another process (no hooks here): the sent ledger shows its progress.
	e.startRelay(t, outbox.Hooks{}, nil)
	pgtest.Eventually(t, 10*time.Second, func() bool { return e.pending(t) == 0 }, "the relay did not resume")
	r = c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
}

// Progress keeps a busy outbox healthy: messages stay pending for longer than the thresholds, but every check
// sees a new publication (read from the sent ledger), so the outbox is not stalled.
func TestSlowButMovingOutboxStaysHealthy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Outbox: e.ob.AllTenants()})
	e.stage(t, "m", 4)
	gate := make(chan struct{})
	e.startRelay(t, outbox.Hooks{}, gate) // no hooks: progress comes from the database alone
	require.Equal(t, health.Healthy, c.Check(ctx).Status)
	for i := range 3 {
		gate <- struct{}{}
		want := int64(3 - i)
		pgtest.Eventually(t, 10*time.Second, func() bool {
			return pgtest.Count(t, e.pool, `SELECT count(*) FROM `+pgtest.Q(e.schema, "outbox")) == want
		}, "message %d was not published", i)
		clk.Add(3 * time.Minute)
		r := c.Check(ctx)
		require.Equal(t, health.Healthy, r.Status, "step %d: %v", i, r.Reasons)
		require.Positive(t, component(t, r, "outbox").Outbox.Ready)
	}
	clk.Add(3 * time.Minute) // no publication since the last check
	r := c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status, "%v", r.Reasons)
	close(gate)
}

// Dead letters degrade the outbox until an operator redrives or discards them.
func TestDeadLettersDegrade(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	c := newChecker(t, health.Config{Outbox: e.ob.AllTenants()})
	e.stage(t, "p", 1)
	r, err := e.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	res, err := r.Drain(ctx, rejecting{})
	require.NoError(t, err)
	require.Equal(t, 1, res.DeadLettered)
	rep := c.Check(ctx)
	require.Equal(t, health.Degraded, rep.Status)
	require.Equal(t, []string{"outbox: 1 dead letters wait to be redriven or discarded"}, rep.Reasons)
	_, err = e.ob.AllTenants().Discard(ctx, "p-0")
	require.NoError(t, err)
	require.Equal(t, health.Healthy, c.Check(ctx).Status)
}

// The failure rate of a real relay, fed by RelayHooks: 4 rejections in 40 deliveries (10 %) degrade it, 14 in 50
// (28 %) make it Unhealthy. Rejected messages back off for an hour, so each counts once.
func TestRelayFailureRate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	c := newChecker(t, health.Config{Outbox: e.ob.AllTenants()})
	r, err := e.ob.NewRelay(&outbox.RelayConfig{RetryDelay: time.Hour, Hooks: c.RelayHooks(outbox.Hooks{})})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	e.stage(t, "ok", 36)
	e.stage(t, "bad", 4)
	res, err := r.Drain(ctx, rejectPrefix("bad"))
	require.NoError(t, err)
	require.Equal(t, outbox.DrainResult{Published: 36, Failed: 4}, res)
	rep := c.Check(ctx)
	require.Equal(t, health.Degraded, rep.Status, "%v", rep.Reasons)
	rc := component(t, rep, "relay")
	require.Equal(t, int64(40), rc.Relay.Deliveries)
	require.InDelta(t, 10.0, rc.Relay.FailureRate, 1e-9)
	require.Equal(t, health.Healthy, component(t, rep, "outbox").Status, "backing off is not a stall")

	e.stage(t, "bad2", 10)
	_, err = r.Drain(ctx, rejectPrefix("bad"))
	require.NoError(t, err)
	rep = c.Check(ctx)
	require.Equal(t, health.Unhealthy, rep.Status, "%v", rep.Reasons)
	require.Contains(t, rep.Reasons[0], "relay: 28.0% of 50 deliveries failed")
}

// rejectPrefix is a publisher that rejects the messages whose ID starts with its value.
type rejectPrefix string

func (p rejectPrefix) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if strings.HasPrefix(m.UUID, string(p)) {
			return errors.New("rejected " + m.UUID)
		}
	}
	return nil
}

func (rejectPrefix) Close() error { return nil }

// A staging worker is a health.Worker.
var _ health.Worker = (*staging.Worker)(nil)

type rejecting struct{}

func (rejecting) Publish(string, ...*message.Message) error { return errors.New("rejected") }
func (rejecting) Close() error                              { return nil }

// A projection whose handler hangs: it has lag and its position stands still, so it turns Degraded, then
// Unhealthy, though it reports no error; released, it catches up and is Healthy again.
func TestHungProjection(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)

	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	hang := false
	var mu sync.Mutex
	h := projection.HandlerFunc(func(ctx context.Context, _ pgx.Tx, e projection.Event) error {
		mu.Lock()
		block := hang
		mu.Unlock()
		if block {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	p, err := projection.New(pool, store, h, &projection.Config{Name: "orders", Schema: schema,
		PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second, LeaseAcquireInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		unblock()
		<-done
	})

	appendEvents := func(stream string, n int) {
		t.Helper()
		req := eventstore.AppendRequest{StreamID: stream, StreamType: "order", Expected: eventstore.AnyVersion}
		for range n {
			req.Events = append(req.Events, eventstore.EventData{Type: "order.placed", Payload: []byte(`{}`)})
		}
		_, err := store.Append(ctx, req)
		require.NoError(t, err)
	}
	caughtUp := func() bool {
		st, err := p.Status(ctx)
		require.NoError(t, err)
		return len(st) == 1 && st[0].Lag == 0 && st[0].State == projection.Running
	}

	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Projections: p.Status})
	appendEvents("o-1", 3)
	pgtest.Eventually(t, 10*time.Second, caughtUp, "the projection did not catch up")
	r := c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
	require.Len(t, r.Components, 1)
	require.Equal(t, "projection:orders", r.Components[0].Name)

	mu.Lock()
	hang = true
	mu.Unlock()
	appendEvents("o-2", 2)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		st, err := p.Status(ctx)
		require.NoError(t, err)
		return st[0].Lag > 0
	}, "no lag")
	require.Equal(t, health.Healthy, c.Check(ctx).Status, "lag just appeared")
	clk.Add(2 * time.Minute)
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status, "%v", r.Reasons)
	clk.Add(3 * time.Minute)
	r = c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status, "%v", r.Reasons)
	require.Contains(t, r.Reasons[0], "projection:orders: running, 2 positions behind")
	require.Contains(t, r.Reasons[0], "has not moved for 5m0s")
	f := r.Components[0].Follower
	require.Equal(t, int64(2), f.Lag)
	require.Equal(t, "running", f.State)

	mu.Lock()
	hang = false
	mu.Unlock()
	unblock()
	pgtest.Eventually(t, 10*time.Second, caughtUp, "the projection did not catch up after release")
	r = c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
}

// A partition of a partitioned projection that no process has run has no checkpoint: while its siblings are at the
// head, the checker reports it (Status lists it as not started), Degraded and then Unhealthy by the inactivity
// thresholds, until a process runs it.
func TestUnstartedProjectionPartition(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	for i := range 6 {
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: fmt.Sprint("o-", i), StreamType: "order",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "order.placed", Payload: []byte(`{}`)}}})
		require.NoError(t, err)
	}
	p, err := projection.New(pool, store, projection.HandlerFunc(func(context.Context, pgx.Tx, projection.Event) error {
		return nil
	}), &projection.Config{Name: "orders", Schema: schema, Partitions: 3, PollInterval: 20 * time.Millisecond,
		LeaseAcquireInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	run := func() (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return func() { cancel(); <-done }
	}
	caughtUp := func() bool {
		st, err := p.Status(ctx)
		require.NoError(t, err)
		if len(st) != 3 {
			return false
		}
		for _, s := range st {
			if s.Lag != 0 {
				return false
			}
		}
		return true
	}
	stop := run()
	pgtest.Eventually(t, 10*time.Second, caughtUp, "the projection did not catch up")
	stop()
	// Partition 2 as though no process had ever run it.
	pgtest.Exec(t, pool, `DELETE FROM `+pgtest.Q(schema, "checkpoints")+` WHERE name = 'orders#2/3'`)

	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Projections: p.Status})
	r := c.Check(ctx)
	require.Len(t, r.Components, 3)
	missing := component(t, r, "projection:orders#2/3")
	require.Equal(t, health.Healthy, missing.Status, "given the inactivity threshold to start")
	require.EqualValues(t, 6, missing.Follower.Lag)
	require.Equal(t, health.Healthy, component(t, r, "projection:orders#0/3").Status)
	clk.Add(2 * time.Minute)
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status, "%v", r.Reasons)
	clk.Add(3 * time.Minute)
	r = c.Check(ctx)
	require.Equal(t, health.Unhealthy, r.Status, "%v", r.Reasons)
	require.Len(t, r.Reasons, 1)
	require.Contains(t, r.Reasons[0], "projection:orders#2/3: not-started, 6 positions behind")

	stop = run()
	defer stop()
	pgtest.Eventually(t, 10*time.Second, caughtUp, "the partition did not catch up once run")
	r = c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
	require.Equal(t, int64(0), component(t, r, "projection:orders#2/3").Follower.Lag)
}

// Run samples until its context ends and leaves no goroutine behind; status changes are logged.
func TestRunStopsWithItsContext(t *testing.T) {
	pgtest.CheckLeaks(t) // not parallel: the leak check sees every goroutine
	var logs safeBuffer
	w := &fakeWorker{}
	w.set(0, 5, nil)
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Workers: []health.Worker{w}, Logger: newLogger(&logs)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, 5*time.Millisecond) }()
	time.Sleep(20 * time.Millisecond)
	clk.Add(10 * time.Minute)
	pgtest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "unhealthy") },
		"the change to unhealthy was not logged")
	w.set(5, 5, nil)
	pgtest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "healthy again") },
		"the recovery was not logged")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// safeBuffer is a bytes.Buffer that a logger and the test may use at once.
type safeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// The latest routine maintenance pass, as recorded by the outbox: overdue or failed is Degraded, with the reason.
func TestMaintenanceOverdueOrFailing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	clk := newClock()
	c := newChecker(t, health.Config{Clock: clk.Now, Outbox: e.ob.AllTenants()})
	r := c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "no pass ever ran: nothing to judge")
	require.Nil(t, component(t, r, "outbox").Outbox.Maintenance)

	maint := pgtest.Q(e.schema, "outbox_maintenance")
	_, err := e.pool.Exec(ctx, `INSERT INTO `+maint+` (owner, interval_seconds, started_at, finished_at, passes)
		VALUES ('host/maintenance/1', 60, $1, $1, 1)`, clk.Now().Add(-time.Hour))
	require.NoError(t, err)
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status)
	require.Contains(t, strings.Join(r.Reasons, "\n"), "routine maintenance has not run for 1h0m0s")
	require.True(t, component(t, r, "outbox").Outbox.Maintenance.Overdue)

	_, err = e.pool.Exec(ctx, `UPDATE `+maint+` SET started_at = $1, finished_at = $1, last_error = 'outbox_sent: boom'`,
		clk.Now().Add(-time.Minute))
	require.NoError(t, err)
	r = c.Check(ctx)
	require.Equal(t, health.Degraded, r.Status)
	require.Contains(t, strings.Join(r.Reasons, "\n"), "the latest maintenance pass failed: outbox_sent: boom")

	_, err = e.pool.Exec(ctx, `UPDATE `+maint+` SET last_error = ''`)
	require.NoError(t, err)
	r = c.Check(ctx)
	require.Equal(t, health.Healthy, r.Status, "%v", r.Reasons)
	md := component(t, r, "outbox").Outbox.Maintenance
	require.NotNil(t, md)
	require.False(t, md.Overdue)
	require.Equal(t, "host/maintenance/1", md.Owner)
}
