package histories

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/eventstore"
)

// StreamRunConfig configures RunStreams. Zero fields take the defaults named.
type StreamRunConfig struct {
	// Seed drives every random choice of the clients and of the nemesis. Default 0.
	Seed uint64
	// DatabaseURL is the server (postgres:// URL form); the clients reach it through a fault proxy. Required.
	DatabaseURL string
	// Schema holds the stagehand tables (migrated by the caller). Required.
	Schema string
	// Admin is a pool straight to the server (not through the proxy), used by the nemesis to terminate the
	// clients' server processes. Required.
	Admin *pgxpool.Pool
	// Clients is how many clients append and load concurrently, each on its own pool. Default 6.
	Clients int
	// Streams is how many streams they share. Default 3.
	Streams int
	// Duration is how long the clients run under faults. Default 8s. With RestartPostgres, the run goes on until
	// its restarts (begun in the first half of Duration) have ended and Duration/4 more has passed.
	Duration time.Duration
	// OpTimeout bounds each operation's context. Default 2s.
	OpTimeout time.Duration
	// FaultEvery is the mean time between two faults of the nemesis. Default 300ms.
	FaultEvery time.Duration
	// Logger receives the nemesis's and the proxy's lines. Default: silent.
	Logger *slog.Logger
	// RestartPostgres, when set, restarts the server of DatabaseURL at once, as after a crash (pgtest's
	// Server.RestartImmediate): the nemesis injects it as a fault of its own. Give it only a server private to the
	// run, with synchronous_commit on.
	RestartPostgres func(context.Context) error
}

func (c StreamRunConfig) withDefaults() (StreamRunConfig, error) {
	switch {
	case c.DatabaseURL == "":
		return c, errors.New("histories: StreamRunConfig.DatabaseURL is required")
	case c.Schema == "":
		return c, errors.New("histories: StreamRunConfig.Schema is required")
	case c.Admin == nil:
		return c, errors.New("histories: StreamRunConfig.Admin is required")
	}
	if c.Clients == 0 {
		c.Clients = 6
	}
	if c.Streams == 0 {
		c.Streams = 3
	}
	if c.Duration == 0 {
		c.Duration = 8 * time.Second
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 2 * time.Second
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 300 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// StreamRun is what RunStreams did.
type StreamRun struct {
	// History is every append and load, and the final loads after the faults stopped.
	History []Op
	// Faults counts the nemesis's faults by name.
	Faults map[string]int
	// Proxy is what the fault proxy did.
	Proxy ProxyStats
	// Classified counts the appends by the path they took and how they ended, and the appends during which the
	// proxy dropped their commit's reply or request by how the store classified them ("AppendWith ok",
	// "commit reply dropped -> ok"...).
	Classified map[string]int
	// Missing names the kinds of fault the nemesis was told to inject and did not (the run ended first).
	Missing []string
	// Crashes are the PostgreSQL restarts; LastCrash is when, on the history's clock, the last one ended (zero
	// when there was none).
	Crashes   []Crash
	LastCrash time.Duration
}

// AfterLastCrash counts the appends acknowledged that were invoked after the last crash ended.
func (r StreamRun) AfterLastCrash() int {
	n := 0
	for _, o := range r.History {
		if o.Kind == KindAppend && o.Outcome == OK && o.Invoke >= r.LastCrash {
			n++
		}
	}
	return n
}

// Summary renders the run's counts.
func (r StreamRun) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "operations: %s\n", FormatCounts(r.History))
	fmt.Fprintf(&b, "faults: %s\n", formatMap(r.Faults))
	fmt.Fprintf(&b, "appends classified: %s\n", formatMap(r.Classified))
	if len(r.Missing) > 0 {
		fmt.Fprintf(&b, "not injected: %s\n", strings.Join(r.Missing, ", "))
	}
	if r.LastCrash > 0 {
		fmt.Fprintf(&b, "crashes: %s\n", formatCrashes(r.Crashes))
		fmt.Fprintf(&b, "after the last crash (ended at %s): %d appends acknowledged\n",
			r.LastCrash.Round(time.Millisecond), r.AfterLastCrash())
	}
	fmt.Fprintf(&b, "proxy: %+v", r.Proxy)
	return b.String()
}

func formatMap(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// The append paths of the PostgreSQL store a client picks from: Append (one statement, committed by itself),
// AppendWith (a transaction ended by COMMIT) and AppendQueued (one pipelined round trip).
const (
	viaAppend       = "Append"
	viaAppendWith   = "AppendWith"
	viaAppendQueued = "AppendQueued"
)

// RunStreams runs clients appending to and loading a few streams through eventstore.NewPostgres on pools that
// reach the server through a fault proxy, while a seeded nemesis injects the proxy's faults (commit replies and
// requests dropped, black holes both ways and one way, delay with jitter, cuts, half-open connections) and
// terminates the clients' server processes. Once the faults stop, every stream is loaded once more. The history
// is for CheckStreams.
func RunStreams(ctx context.Context, cfg StreamRunConfig) (StreamRun, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return StreamRun{}, err
	}
	target, err := ServerAddr(cfg.DatabaseURL)
	if err != nil {
		return StreamRun{}, err
	}
	proxy, err := NewProxy(target, ProxyOptions{Seed: cfg.Seed, Logger: cfg.Logger})
	if err != nil {
		return StreamRun{}, err
	}
	defer func() { _ = proxy.Close() }()
	through, err := Through(cfg.DatabaseURL, proxy.Addr())
	if err != nil {
		return StreamRun{}, err
	}
	// Short (application_name is cut at 63 bytes) and unique to the run: the schema's random tail.
	appPrefix := "hist-" + cfg.Schema[max(0, len(cfg.Schema)-8):]
	rec := NewRecorder()
	clients := make([]*streamClient, cfg.Clients)
	for i := range clients {
		c, err := newStreamClient(ctx, cfg, i, through, appPrefix, rec, proxy)
		if err != nil {
			for _, c := range clients[:i] {
				c.close()
			}
			return StreamRun{}, err
		}
		clients[i] = c
	}
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()

	n := &nemesis{faultEvery: cfg.FaultEvery, logger: cfg.Logger, admin: cfg.Admin, proxy: proxy,
		rng: rand.New(rand.NewPCG(cfg.Seed, 1)), appPrefix: appPrefix, faults: map[string]int{},
		restart: cfg.RestartPostgres, clock: func() time.Duration { return time.Since(rec.start) },
		acked: func(since time.Duration) int {
			return StreamRun{History: rec.History(), LastCrash: since}.AfterLastCrash()
		}}
	runCtx, stop, nemesisDone := n.start(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); <-nemesisDone }()
	for _, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); c.run(runCtx) }()
	}
	wg.Wait()
	proxy.Heal()
	proxy.Disarm()

	// The faults have stopped: one more load of every stream, retried until it succeeds.
	for s := range cfg.Streams {
		if err := clients[0].finalLoad(ctx, streamName(s)); err != nil {
			return StreamRun{}, err
		}
	}
	run := StreamRun{History: rec.History(), Proxy: proxy.Stats(), Classified: map[string]int{}}
	run.Faults, run.Missing, run.Crashes, run.LastCrash = n.results()
	for _, c := range clients {
		for k, v := range c.classified {
			run.Classified[k] += v
		}
	}
	return run, nil
}

func streamName(i int) string { return fmt.Sprintf("stream-%d", i) }

// streamClient is one client: its own pool (its own application_name, so the proxy's drops can be attributed to
// it), its own store and its own random choices. It runs one operation at a time.
type streamClient struct {
	id         int
	cfg        StreamRunConfig
	app        string
	pool       *pgxpool.Pool
	store      *eventstore.PostgresStore
	rec        *Recorder
	proxy      *Proxy
	rng        *rand.Rand
	known      map[string]int64 // the version this client last saw of each stream
	classified map[string]int
}

func newStreamClient(ctx context.Context, cfg StreamRunConfig, id int, through, appPrefix string, rec *Recorder,
	proxy *Proxy) (*streamClient, error) {
	app := fmt.Sprintf("%s-%d", appPrefix, id)
	u, err := url.Parse(through)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	q := u.Query()
	q.Set("application_name", app)
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("histories: pool config: %w", err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.ConnectTimeout = cfg.OpTimeout
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("histories: pool: %w", err)
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.Schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &streamClient{id: id, cfg: cfg, app: app, pool: pool, store: store, rec: rec, proxy: proxy,
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(id)+2)), known: map[string]int64{}, classified: map[string]int{}},
		nil
}

func (c *streamClient) close() {
	c.store.Close()
	c.pool.Close()
}

func (c *streamClient) run(ctx context.Context) {
	for ctx.Err() == nil {
		stream := streamName(c.rng.IntN(c.cfg.Streams))
		if c.rng.IntN(10) < 4 {
			c.load(ctx, stream)
		} else {
			c.append(ctx, stream)
		}
	}
}

func (c *streamClient) load(ctx context.Context, stream string) {
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpTimeout)
	defer cancel()
	inv := c.rec.Invoke(c.id, KindLoad, stream, nil)
	recs, err := c.store.ReadStream(opCtx, "", stream, 1)
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		inv.Fail(nil, err) // a failed read observed nothing
		return
	}
	out := LoadOutput{Events: make([]string, len(recs))}
	for i, r := range recs {
		out.Events[i] = r.EventID.String()
		out.Version = r.Version
	}
	c.known[stream] = out.Version
	inv.OK(out)
}

// finalLoad loads stream until a load succeeds (the faults have stopped).
func (c *streamClient) finalLoad(ctx context.Context, stream string) error {
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		c.load(ctx, stream)
		h := c.rec.History()
		if h[len(h)-1].Outcome == OK {
			return nil
		}
		last = h[len(h)-1].Err
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := c.pool.Stat()
	return fmt.Errorf("histories: the final load of %s kept failing for 30s (pool: %d connections, %d acquired, "+
		"%d idle); last error: %s", stream, st.TotalConns(), st.AcquiredConns(), st.IdleConns(), last)
}

func (c *streamClient) append(ctx context.Context, stream string) {
	expected := c.known[stream]
	if c.rng.IntN(10) == 0 {
		expected = AnyVersion
	}
	n := 1 + c.rng.IntN(2)
	req := eventstore.AppendRequest{StreamID: stream, StreamType: "histories", Expected: eventstore.ExpectedVersion(
		expected)}
	in := AppendInput{Expected: expected}
	for range n {
		id := uuid.New()
		req.Events = append(req.Events, eventstore.EventData{EventID: id, Type: "histories.appended",
			Payload: []byte(`{}`)})
		in.Events = append(in.Events, id.String())
	}
	via := []string{viaAppend, viaAppendWith, viaAppendQueued}[c.rng.IntN(3)]

	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpTimeout)
	defer cancel()
	before := c.proxy.FaultsOn(c.app)
	inv := c.rec.Invoke(c.id, KindAppend, stream, in)
	var (
		res eventstore.AppendResult
		err error
	)
	switch via {
	case viaAppend:
		res, err = c.store.Append(opCtx, req)
	case viaAppendWith:
		res, err = c.store.AppendWith(opCtx, req, nil)
	default:
		res, err = c.store.AppendQueued(opCtx, req, nil)
	}
	after := c.proxy.FaultsOn(c.app)

	var outcome string
	var conflict *eventstore.ConflictError
	switch {
	case err == nil:
		outcome = "ok"
		ids := make([]string, len(res.Records))
		for i, r := range res.Records {
			ids[i] = r.EventID.String()
		}
		inv.OK(AppendOutput{Version: res.Version, Events: ids})
		c.known[stream] = res.Version
	case errors.Is(err, eventstore.ErrCommitUnknown):
		outcome = "info"
		inv.Info(err)
	case errors.As(err, &conflict):
		outcome = "conflict"
		inv.Fail(AppendOutput{Conflict: true, Reason: conflict.Reason}, err)
		if conflict.Actual >= 0 {
			c.known[stream] = conflict.Actual
		}
	default:
		// Every other error is definite, by the store's contract: the checker holds it to that.
		outcome = "fail"
		inv.Fail(nil, err)
	}
	c.classified[via+" "+outcome]++
	if after.CommitReplies > before.CommitReplies {
		c.classified["commit reply dropped -> "+outcome]++
	}
	if after.CommitRequests > before.CommitRequests {
		c.classified["commit request dropped -> "+outcome]++
	}
}

// nemesis injects one fault at a time at random, seeded.
type nemesis struct {
	faultEvery time.Duration
	logger     *slog.Logger
	admin      *pgxpool.Pool // terminates the clients' server processes
	proxy      *Proxy
	rng        *rand.Rand
	appPrefix  string // the application_name prefix of the clients' connections
	faults     map[string]int
	// broker, when not nil, is a proxy in front of the broker: every fault that applies to a byte stream (black
	// holes, delay, cuts, half-open) is injected there too, at random, instead of on PostgreSQL's proxy.
	broker *Proxy
	// saveApps, when not empty, is the application_name prefix of the connections that save: every other commit
	// reply dropped (the first included) is one of theirs, so saves lose commits as often as the busier
	// components do.
	saveApps string
	drops    int

	// restart, when not nil, restarts PostgreSQL at once (pg_ctl restart -m immediate): a fault of its own.
	restart func(context.Context) error
	// crashWorker, when not nil, kills the worker process with SIGKILL and starts another: a fault of its own. It
	// returns the fault's name.
	crashWorker func(context.Context) (string, error)
	// crashesUntil is how long into the run crashes may begin (set by start).
	crashesUntil time.Duration
	// clock reads the history's clock; lastCrash is when the last crash ended on it.
	clock     func() time.Duration
	lastCrash time.Duration
	// crashEvery is the mean time between two crashes of a kind after its first. Default 2s.
	crashEvery time.Duration
	// acked counts the operations acknowledged (saves, appends) invoked at or after since on the history's clock.
	acked func(since time.Duration) int

	mu sync.Mutex // faults, injected, crashes, lastCrash: the crashes run beside the network faults
	// injected counts the faults by kind.
	injected map[int]int
	crashes  []Crash
}

// minAckedAfterCrash is how many operations a run with crashes goes on for, after its last crash, to see
// acknowledged.
const minAckedAfterCrash = 3

// Crash is one crash the nemesis injected: its kind, and when it began and ended on the history's clock.
type Crash struct {
	Kind       string
	Began, End time.Duration
}

// formatCrashes renders crashes on one line.
func formatCrashes(cs []Crash) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s at %s for %s", c.Kind, c.Began.Round(time.Millisecond),
			(c.End - c.Began).Round(time.Millisecond))
	}
	return strings.Join(parts, "; ")
}

// The nemesis's faults. The first round injects each once, in a seeded order (the crashes early in it), so every
// run exercises all of them (a commit reply dropped first of all); after it they are drawn at random, a dropped
// commit reply twice as often as the others.
const (
	faultDropReply = iota
	faultDropRequest
	faultBlackHole
	faultBlackHoleReplies
	faultDelay
	faultCutAll
	faultCutMid
	faultHalfOpen
	faultTerminate
	faultKinds // the network's kinds; the crashes follow
	faultRestartPostgres
	faultKillWorker
)

// kindNames name the kinds for the summary's "not injected" list.
var kindNames = map[int]string{faultDropReply: "drop commit reply", faultDropRequest: "drop commit request",
	faultBlackHole: "black hole both ways", faultBlackHoleReplies: "black hole server->client",
	faultDelay: "delay with jitter", faultCutAll: "cut every connection", faultCutMid: "cut mid-stream",
	faultHalfOpen: "half-open every connection", faultTerminate: "terminate server processes",
	faultRestartPostgres: "restart PostgreSQL (immediate)", faultKillWorker: "kill the worker process (SIGKILL)"}

// kinds lists the kinds this nemesis injects: the network's, and the crashes it was given.
func (n *nemesis) kinds() (network, crashes []int) {
	for k := range faultKinds {
		network = append(network, k)
	}
	if n.restart != nil {
		crashes = append(crashes, faultRestartPostgres)
	}
	if n.crashWorker != nil {
		crashes = append(crashes, faultKillWorker)
	}
	return network, crashes
}

// start starts the nemesis for a run of duration d. It returns the run's context, which ends once d has passed
// and, when the nemesis crashes things, its crashes have ended and max(d/4, 2s) more has passed (so the run saves
// under the network faults alone after the last crash) and the run has acknowledged minAckedAfterCrash operations
// invoked after the last crash ended (for at most a minute more), its cancel function, and a channel closed when the
// nemesis has stopped. The crashes begin only in the first half of d.
func (n *nemesis) start(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc, <-chan struct{}) {
	n.injected = map[int]int{}
	network, crashes := n.kinds()
	runCtx, end := context.WithCancel(ctx)
	done := make(chan struct{})
	var crashing sync.WaitGroup
	n.crashesUntil = d / 2
	for _, kind := range crashes {
		crng := rand.New(rand.NewPCG(n.rng.Uint64(), uint64(kind)))
		crashing.Add(1)
		// On ctx, not runCtx: the crashes end by themselves, and the run's end waits for them.
		go func() { defer crashing.Done(); n.runCrashes(ctx, crng, kind) }()
	}
	go func() {
		defer end()
		if !sleep(ctx, d) || len(crashes) == 0 {
			return
		}
		crashing.Wait()
		if !sleep(ctx, max(d/4, 2*time.Second)) || n.acked == nil {
			return
		}
		// On a loaded machine a run may not have acknowledged anything yet since the last crash: it goes on until
		// it has (or a minute has passed), which the test then asserts.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			n.mu.Lock()
			last := n.lastCrash
			n.mu.Unlock()
			if n.acked(last) >= minAckedAfterCrash || !sleep(ctx, 50*time.Millisecond) {
				return
			}
		}
	}()
	go func() {
		defer close(done)
		n.run(runCtx, network)
		crashing.Wait()
	}()
	return runCtx, end, done
}

// run injects the network's faults until ctx ends.
func (n *nemesis) run(ctx context.Context, network []int) {
	round := append([]int{faultDropReply}, n.rng.Perm(len(network))...)
	for i := 0; ; i++ {
		every := n.faultEvery
		if i < len(round) {
			every /= 2 // the first round quickly, so a short run completes it
		}
		wait := time.Duration(n.rng.Int64N(int64(2 * every)))
		if !sleep(ctx, wait) {
			return
		}
		kind := n.rng.IntN(len(network) + 1) // len(network) itself: another dropped commit reply
		if i < len(round) {
			kind = round[i]
		}
		if kind == len(network) {
			kind = faultDropReply
		}
		n.record(kind, n.inject(ctx, kind))
	}
}

// runCrashes injects crashes of one kind beside the network faults and the other kind's crashes: the first at a
// random time in the first crashesUntil of the run, then one about every crashEvery until crashesUntil has
// passed.
func (n *nemesis) runCrashes(ctx context.Context, rng *rand.Rand, kind int) {
	began := time.Now()
	every := cmp.Or(n.crashEvery, 2*time.Second)
	if !sleep(ctx, time.Duration(rng.Int64N(int64(n.crashesUntil)))) {
		return
	}
	for {
		n.crash(ctx, kind)
		if !sleep(ctx, time.Duration(rng.Int64N(int64(2*every)))) || time.Since(began) > n.crashesUntil {
			return
		}
	}
}

// crash injects one crash and records when it began and ended.
func (n *nemesis) crash(ctx context.Context, kind int) {
	var began time.Duration
	if n.clock != nil {
		began = n.clock()
	}
	name := n.inject(ctx, kind)
	if n.clock != nil && !strings.HasSuffix(name, " failed") {
		end := n.clock()
		n.mu.Lock()
		n.crashes = append(n.crashes, Crash{Kind: name, Began: began, End: end})
		n.lastCrash = max(n.lastCrash, end)
		n.mu.Unlock()
	}
	n.record(kind, name)
}

// record counts a fault injected (a failed one under its own name only).
func (n *nemesis) record(kind int, name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults[name]++
	if !strings.HasSuffix(name, " failed") {
		n.injected[kind]++
	}
	n.logger.Info("histories: nemesis", "fault", name)
}

// results returns the faults injected by name, the kinds missing, the crashes and when the last one ended.
func (n *nemesis) results() (map[string]int, []string, []Crash, time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.faults), n.missing(), slices.Clone(n.crashes), n.lastCrash
}

// missing names the kinds the nemesis was told to inject and did not (the run ended before its first round did).
// Call it with n.mu held.
func (n *nemesis) missing() []string {
	network, crashes := n.kinds()
	var out []string
	for _, k := range append(network, crashes...) {
		if n.injected[k] == 0 {
			out = append(out, kindNames[k])
		}
	}
	return out
}

// inject injects one fault, waits for it to pass when it lasts, and names it. A fault on a byte stream goes to
// the broker's proxy instead of PostgreSQL's half of the time when there is one.
func (n *nemesis) inject(ctx context.Context, kind int) string {
	switch kind { // the crashes run on a goroutine of their own: they draw nothing from n.rng
	case faultRestartPostgres:
		// Not bounded by the run's end: a restart begun completes, and the run waits for it.
		if err := n.restart(context.WithoutCancel(ctx)); err != nil {
			n.logger.Warn("histories: nemesis could not restart PostgreSQL", "error", err)
			return "restart PostgreSQL failed"
		}
		return kindNames[faultRestartPostgres]
	case faultKillWorker:
		name, err := n.crashWorker(context.WithoutCancel(ctx))
		if err != nil {
			n.logger.Warn("histories: nemesis could not kill the worker process", "error", err)
			return "kill the worker process failed"
		}
		return name
	}
	hold := time.Duration(100+n.rng.IntN(400)) * time.Millisecond
	px, on := n.proxy, ""
	switch kind {
	case faultBlackHole, faultBlackHoleReplies, faultDelay, faultCutAll, faultCutMid, faultHalfOpen:
		if n.broker != nil && n.rng.IntN(2) == 0 {
			px, on = n.broker, " (broker)"
		}
	}
	switch kind {
	case faultDropRequest:
		px.DropCommitRequest()
		return "drop commit request"
	case faultBlackHole:
		px.BlackHole(Both)
		sleep(ctx, hold)
		px.Heal()
		return "black hole both ways" + on
	case faultBlackHoleReplies:
		px.BlackHole(ServerToClient)
		sleep(ctx, hold)
		px.Heal()
		return "black hole server->client" + on
	case faultDelay:
		px.SetDelay(10*time.Millisecond, 40*time.Millisecond)
		sleep(ctx, 2*hold)
		px.SetDelay(0, 0)
		return "delay with jitter" + on
	case faultCutAll:
		px.CutAll()
		return "cut every connection" + on
	case faultCutMid:
		px.CutMidStream()
		return "cut mid-stream" + on
	case faultHalfOpen:
		px.HalfOpen()
		return "half-open every connection" + on
	case faultTerminate:
		n.terminate(ctx)
		return "terminate server processes"
	}
	n.drops++
	if n.saveApps != "" && n.drops%2 == 1 {
		px.DropCommitReplyTo(n.saveApps)
		return "drop commit reply (a save's)"
	}
	px.DropCommitReply()
	return "drop commit reply"
}

// terminate ends the server processes of the run's clients (pg_terminate_backend, on the admin pool).
func (n *nemesis) terminate(ctx context.Context) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, err := n.admin.Exec(tctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, n.appPrefix+"-%")
	if err != nil {
		n.logger.Warn("histories: nemesis could not terminate server processes", "error", err)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
