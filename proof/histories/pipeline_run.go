package histories

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Operation kinds recorded by the pipeline run besides saves and effects: what a handler did inside the inbox's
// transaction (its LoadTx of the counter its message came from, its UpsertTx of the key's tally; ok means done
// on the transaction, whose commit is the effect's outcome) and each delivery the broker made to a handler.
const (
	KindLoadTx   = "loadtx"
	KindUpdateTx = "updatetx"
)

// LoadTxOutput is the output of a handler's LoadTx: the version of the counter it loaded, and its state (the
// N of the last event applied: equal to Version in every state the log produces).
type LoadTxOutput struct {
	Version, Ticks int64
}

// Broker is what the pipeline run's relay publishes to and its handlers subscribe to.
type Broker struct {
	// Name describes it in the run's summary.
	Name string
	// Publisher is the relay's publisher; Subscriber the handlers'. The run closes neither.
	Publisher  message.Publisher
	Subscriber message.Subscriber
	// Unavailable classifies the publisher's errors for the relay (outbox.RelayConfig.IsBrokerUnavailable).
	Unavailable func(error) bool
	// Proxy, when not nil, stands between the publisher and subscriber and the broker: the nemesis injects its
	// black holes, delays, cuts and half-opens too.
	Proxy *Proxy
}

// PipelineRunConfig configures RunPipeline. Zero fields take the defaults named.
type PipelineRunConfig struct {
	// Seed drives the producers' and the nemesis's choices. Default 0.
	Seed uint64
	// DatabaseURL is the server (postgres:// URL form); every component reaches it through a fault proxy.
	// Required.
	DatabaseURL string
	// Schema holds the stagehand tables (migrated by the caller). Required.
	Schema string
	// Admin is a pool straight to the server: the nemesis terminates server processes with it, and the run reads
	// the committed state with it at the end. Required.
	Admin *pgxpool.Pool
	// Broker is the broker; default an in-process Watermill GoChannel whose Publish returns once the handler
	// acknowledged the message (so it takes messages in the relay's order, as a partitioned broker does).
	Broker *Broker
	// Producers save counters, each its own Keys/Producers of them. Defaults 3 and 6.
	Producers, Keys int
	// Partitions is how many topics the keys are spread over, each consumed one message at a time. Default 3.
	Partitions int
	// Duration is how long the producers save under faults. Default 6s. With crashes (RestartPostgres,
	// WorkerCommand), the run goes on until the crashes (begun in the first half of Duration) have ended and
	// Duration/4 more has passed.
	Duration time.Duration
	// OpTimeout bounds each save and read. Default 2s.
	OpTimeout time.Duration
	// SaveEvery is the pause a producer takes after each save: the pace of a run whose handlers would otherwise
	// fall ever further behind its producers (one worker process handling every message). Default 0: none.
	SaveEvery time.Duration
	// FaultEvery is the mean time between two faults. Default 300ms.
	FaultEvery time.Duration
	// DrainTimeout bounds the wait, after the faults, for every committed message to have an effect and the
	// projection to catch up. Default 2m.
	DrainTimeout time.Duration
	// PollOnly turns off the relay's and the projection's LISTEN wake-ups (RelayConfig.DisableNotify,
	// projection.Config.DisableListen): required behind a pooler in transaction pooling mode. Default false.
	PollOnly bool
	// Logger receives the components' and the nemesis's lines. Default: silent.
	Logger *slog.Logger
	// RestartPostgres, when set, restarts the server of DatabaseURL at once, as after a crash (pgtest's
	// Server.RestartImmediate): the nemesis injects it as a fault of its own. Give it only a server private to the
	// run, with synchronous_commit on: with it off, a crash loses commits already acknowledged, as PostgreSQL
	// documents, and the checkers flag them.
	RestartPostgres func(context.Context) error
	// WorkerCommand, when set, runs the relay and the handlers in a worker process started with it (the test
	// binary re-executed; its TestMain calls RunWorkerIfRequested first) instead of in this one; the nemesis kills
	// it with SIGKILL mid-work and starts another, as a fault of its own. With the default broker, the worker
	// has a GoChannel of its own between its relay and its handlers; with WorkerBroker, a broker it builds.
	WorkerCommand []string
	// WorkerBroker, with WorkerCommand, is the spec each worker process builds its broker from, with the
	// WorkerBroker function its test binary passed to RunWorkerIfRequested (a real broker outlives the worker:
	// what a killed worker's handler had not acknowledged is delivered again to the next one). Broker then only
	// names that broker and carries its fault proxy; its Publisher and Subscriber are not used.
	WorkerBroker string
}

func (c PipelineRunConfig) withDefaults() (PipelineRunConfig, error) {
	switch {
	case len(c.WorkerCommand) > 0 && c.Broker != nil && c.WorkerBroker == "":
		return c, errors.New("histories: PipelineRunConfig.WorkerCommand needs the default broker (Broker nil) " +
			"or a WorkerBroker the worker processes build theirs from")
	case c.WorkerBroker != "" && len(c.WorkerCommand) == 0:
		return c, errors.New("histories: PipelineRunConfig.WorkerBroker needs a WorkerCommand")
	case c.DatabaseURL == "":
		return c, errors.New("histories: PipelineRunConfig.DatabaseURL is required")
	case c.Schema == "":
		return c, errors.New("histories: PipelineRunConfig.Schema is required")
	case c.Admin == nil:
		return c, errors.New("histories: PipelineRunConfig.Admin is required")
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Producers, 3)
	def(&c.Keys, 6)
	def(&c.Partitions, 3)
	if c.Keys < c.Producers {
		return c, errors.New("histories: PipelineRunConfig.Keys must be at least Producers")
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defd(&c.Duration, 6*time.Second)
	defd(&c.OpTimeout, 2*time.Second)
	defd(&c.FaultEvery, 300*time.Millisecond)
	defd(&c.DrainTimeout, 2*time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// PipelineRun is what RunPipeline did and the committed state it read back.
type PipelineRun struct {
	// History is every save, handler delivery and effect, LoadTx and UpsertTx in a handler, and projection read.
	History []Op
	// Committed holds the IDs of the saves whose events are in the committed log.
	Committed map[string]bool
	// Final counts the committed effects (Counted events of the tallies) of each message.
	Final map[string]int
	// Log is the counters' events of the committed log, in log order (what the projection folds).
	Log []LogEvent
	// Faults counts the nemesis's faults; Proxy and BrokerProxy are what the proxies did.
	Faults map[string]int
	Proxy  ProxyStats
	// Drops counts the commit replies and requests the proxy dropped on each component's connections ("relay",
	// "inbox", "projection", "reader", "producer0"...).
	Drops       map[string]AppFaults
	BrokerProxy *ProxyStats
	// Drained reports that every committed message had an effect and the projection caught up before
	// DrainTimeout; Drain is how long that took, DrainEffects and DrainProjection how long each of the two took
	// (zero when it did not happen).
	Drained                       bool
	Drain                         time.Duration
	DrainEffects, DrainProjection time.Duration
	// DrainFrom is when, on the history's clock, the drain began (the producers and the faults had stopped);
	// EffectPace(History, DrainFrom) is how fast the handlers worked through the backlog.
	DrainFrom time.Duration
	// Broker names the broker.
	Broker string
	// Stall describes the outbox when the run did not drain: its rows by state and their last errors.
	Stall string
	// Missing names the kinds of fault the nemesis was told to inject and did not (the run ended first).
	Missing []string
	// Crashes are the PostgreSQL restarts and worker kills; LastCrash is when, on the history's clock, the last one
	// ended (zero when there was none).
	Crashes   []Crash
	LastCrash time.Duration
	// Worker is what the worker processes did (nil without PipelineRunConfig.WorkerCommand).
	Worker *WorkerStats

	expected map[string]bool // the pipeline IDs of the committed log's messages
}

// Summary renders the run's counts.
func (r PipelineRun) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "broker: %s\n", r.Broker)
	fmt.Fprintf(&b, "operations: %s\n", FormatCounts(r.History))
	fmt.Fprintf(&b, "faults: %s\n", formatMap(r.Faults))
	fmt.Fprintf(&b, "committed: %d saves, %d events, %d effects; drained=%v in %s (effects in %s, projection in %s)\n",
		len(r.Committed), len(r.Log), sum(r.Final), r.Drained, r.Drain.Round(time.Millisecond),
		r.DrainEffects.Round(time.Millisecond), r.DrainProjection.Round(time.Millisecond))
	var drops []string
	for _, c := range slices.Sorted(maps.Keys(r.Drops)) {
		drops = append(drops, fmt.Sprintf("%s %d/%d", c, r.Drops[c].CommitReplies, r.Drops[c].CommitRequests))
	}
	fmt.Fprintf(&b, "commit replies/requests dropped: %s\n", strings.Join(drops, ", "))
	if r.DrainFrom > 0 {
		fmt.Fprintf(&b, "drain pace: %s\n", EffectPace(r.History, r.DrainFrom))
	}
	if r.Stall != "" {
		fmt.Fprintf(&b, "not drained: %s\n", r.Stall)
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(&b, "not injected: %s\n", strings.Join(r.Missing, ", "))
	}
	if r.LastCrash > 0 {
		saves, effects := r.AfterLastCrash()
		fmt.Fprintf(&b, "crashes: %s\n", formatCrashes(r.Crashes))
		fmt.Fprintf(&b, "after the last crash (ended at %s): %d saves acknowledged, %d effects committed\n",
			r.LastCrash.Round(time.Millisecond), saves, effects)
	}
	if r.Worker != nil {
		fmt.Fprintf(&b, "worker processes: %d started, %d killed (%d with an operation in flight), %d deliveries "+
			"handled\n", r.Worker.Starts, r.Worker.Kills, r.Worker.KillsMidWork, r.Worker.Effects)
	}
	fmt.Fprintf(&b, "proxy: %+v", r.Proxy)
	if r.BrokerProxy != nil {
		fmt.Fprintf(&b, "\nbroker proxy: %+v", *r.BrokerProxy)
	}
	return b.String()
}

// AfterLastCrash counts the saves acknowledged and the effects committed (not duplicates) invoked after the last
// crash ended: a run whose crashes left nothing working would check little.
func (r PipelineRun) AfterLastCrash() (saves, effects int) {
	for _, o := range r.History {
		if o.Outcome != OK || o.Invoke < r.LastCrash {
			continue
		}
		switch o.Kind {
		case KindSave:
			saves++
		case KindEffect:
			if out, _ := o.Output.(EffectOutput); !out.Duplicate {
				effects++
			}
		}
	}
	return saves, effects
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Check runs every pipeline checker over the run: ResolveSaves against the committed log, CheckPipeline (per-key
// order included, the committed effects as the truth), CheckHandlerLoads and CheckProjectionReads. It returns nil
// when nothing is flagged.
func (r PipelineRun) Check(seed uint64) error {
	resolved, vs := ResolveSaves(r.History, r.Committed)
	rep := CheckPipeline(resolved, seed, PipelineOptions{Ordered: true, Final: r.Final})
	rep.Violations = append(vs, rep.Violations...)
	rep.Violations = append(rep.Violations, CheckHandlerLoads(r.History)...)
	var errs []error
	if err := rep.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := CheckProjectionReads(r.History, r.Log, seed).Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckHandlerLoads flags a handler's LoadTx that did not see the event its message was derived from ("cause not
// visible"): the message was staged in the transaction that appended the event, so the event has committed before
// the message can be delivered. It flags too a load whose state is not the one its version's events fold to
// ("state not of its version": a snapshot of another version, an event applied twice or skipped).
func CheckHandlerLoads(h []Op) []PipelineViolation {
	var vs []PipelineViolation
	for _, o := range h {
		if o.Kind != KindLoadTx || o.Outcome != OK {
			continue
		}
		in, _ := o.Input.(EffectInput)
		out, _ := o.Output.(LoadTxOutput)
		if out.Version < in.Message.Seq {
			vs = append(vs, PipelineViolation{Kind: "cause not visible", Message: in.Message.ID,
				Detail: fmt.Sprintf("the handler loaded version %d of %s; its message came from version %d",
					out.Version, in.Message.Key, in.Message.Seq), Ops: []Op{o}})
		}
		if out.Ticks != out.Version {
			vs = append(vs, PipelineViolation{Kind: "state not of its version", Message: in.Message.ID,
				Detail: fmt.Sprintf("the handler loaded version %d of %s in the state of version %d", out.Version,
					in.Message.Key, out.Ticks), Ops: []Op{o}})
		}
	}
	return vs
}

// RunPipeline runs the whole pipeline through a fault proxy to PostgreSQL while a seeded nemesis injects the
// proxy's faults (and the broker proxy's, when the broker has one) and terminates server processes:
//
//   - producers save counters through aggregate.Repository with the Transactional staging strategy (each event
//     and its message commit together), one producer per key, reloading after a save that did not succeed;
//   - one outbox relay, on a pool of its own, publishes to the broker;
//   - handlers behind the inbox, one per partition topic, load the counter the message came from (LoadTx) and
//     add a Counted event to the key's tally (UpsertTx), both on the inbox's transaction;
//   - a projection folds the counters' events into a read model (events applied per key), and a reader reads it.
//
// Every operation is recorded. After the faults, the run waits for every committed message to have an effect and
// the projection to catch up, stops, and reads back the committed log and effects. Run PipelineRun.Check on it.
func RunPipeline(ctx context.Context, cfg PipelineRunConfig) (PipelineRun, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return PipelineRun{}, err
	}
	target, err := ServerAddr(cfg.DatabaseURL)
	if err != nil {
		return PipelineRun{}, err
	}
	proxy, err := NewProxy(target, ProxyOptions{Seed: cfg.Seed, Logger: cfg.Logger})
	if err != nil {
		return PipelineRun{}, err
	}
	defer func() { _ = proxy.Close() }()
	through, err := Through(cfg.DatabaseURL, proxy.Addr())
	if err != nil {
		return PipelineRun{}, err
	}
	brk := cfg.Broker
	if brk == nil && cfg.WorkerBroker != "" {
		brk = &Broker{Name: "a broker of the worker processes' own"}
	}
	if brk == nil {
		gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true},
			watermill.NewSlogLogger(cfg.Logger))
		defer func() { _ = gc.Close() }()
		brk = &Broker{Name: "Watermill GoChannel (in process)", Publisher: gc, Subscriber: gc}
		if len(cfg.WorkerCommand) > 0 {
			brk.Name = "Watermill GoChannel (in the worker process, with the relay and the handlers)"
		}
	}
	readModel := pgx.Identifier{cfg.Schema, "histories_read_model"}.Sanitize()
	if _, err := cfg.Admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+readModel+
		` (key text PRIMARY KEY, applied bigint NOT NULL)`); err != nil {
		return PipelineRun{}, fmt.Errorf("histories: read model: %w", err)
	}
	reg, err := newPipelineRegistry()
	if err != nil {
		return PipelineRun{}, err
	}
	mapping, err := newPipelineMapping(reg, cfg.Partitions)
	if err != nil {
		return PipelineRun{}, err
	}
	appPrefix := "hist-" + cfg.Schema[max(0, len(cfg.Schema)-8):]
	p := &pipeline{cfg: cfg, rec: NewRecorder(), through: through, appPrefix: appPrefix, reg: reg,
		mapping: mapping, readModel: readModel, brk: brk}
	p.record = func(process int, kind, key string, input any) opInvocation {
		return p.rec.Invoke(process, kind, key, input)
	}
	defer p.closeAll()

	// Components run until stopCtx ends (after the drain), the producers and the nemesis until runCtx does.
	stopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var comps sync.WaitGroup
	// With a worker process, the relay and the handlers run there only: every message goes through it.
	if len(cfg.WorkerCommand) == 0 {
		if err := p.startConsumers(stopCtx, &comps, "inbox", 100); err != nil {
			stop()
			comps.Wait()
			return PipelineRun{}, err
		}
		if err := p.startRelay(stopCtx, &comps, "relay", "histories-relay"); err != nil {
			stop()
			comps.Wait()
			return PipelineRun{}, err
		}
	}
	if err := p.startProjection(stopCtx, &comps); err != nil {
		stop()
		comps.Wait()
		return PipelineRun{}, err
	}
	prods := make([]*producer, cfg.Producers)
	for i := range prods {
		if prods[i], err = p.newProducer(ctx, i); err != nil {
			stop()
			comps.Wait()
			return PipelineRun{}, err
		}
	}

	var wk *workers
	if len(cfg.WorkerCommand) > 0 {
		wk = &workers{command: cfg.WorkerCommand, rec: p.rec, logger: cfg.Logger, settings: workerSettings{
			Through: through, AppPrefix: appPrefix, Schema: cfg.Schema, Partitions: cfg.Partitions,
			PollOnly: cfg.PollOnly, OpTimeout: cfg.OpTimeout, Broker: cfg.WorkerBroker}}
		defer wk.stop()
		err := wk.start()
		if err == nil {
			err = wk.waitReady(ctx, time.Minute) // before the run: a worker killed at once tests nothing
		}
		if err != nil {
			stop()
			comps.Wait()
			return PipelineRun{}, err
		}
	}

	n := &nemesis{faultEvery: cfg.FaultEvery, logger: cfg.Logger, admin: cfg.Admin, proxy: proxy,
		rng: rand.New(rand.NewPCG(cfg.Seed, 1)), appPrefix: appPrefix, faults: map[string]int{},
		broker: brk.Proxy, saveApps: appPrefix + "-producer", restart: cfg.RestartPostgres,
		clock: func() time.Duration { return time.Since(p.rec.start) },
		acked: func(since time.Duration) int {
			saves, _ := PipelineRun{History: p.rec.History(), LastCrash: since}.AfterLastCrash()
			return saves
		}}
	if wk != nil {
		n.crashWorker = wk.kill
	}
	runCtx, endRun, nemesisDone := n.start(ctx, cfg.Duration)
	defer endRun()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.read(stopCtx) }()
	var prodWG sync.WaitGroup
	for _, pr := range prods {
		prodWG.Add(1)
		go func() { defer prodWG.Done(); pr.run(runCtx) }()
	}
	prodWG.Wait()
	endRun()
	<-nemesisDone // the reader goes on through the drain
	proxy.Heal()
	proxy.Disarm()
	if brk.Proxy != nil {
		brk.Proxy.Heal()
		brk.Proxy.Disarm()
	}

	run := PipelineRun{Broker: brk.Name}
	run.Faults, run.Missing, run.Crashes, run.LastCrash = n.results()
	began := time.Now()
	run.DrainFrom = time.Since(p.rec.start)
	run.Drained, err = p.drain(ctx, cfg.DrainTimeout, &run)
	run.Drain = time.Since(began)
	if wk != nil {
		s := wk.stop()
		run.Worker = &s
	}
	if !run.Drained && err == nil {
		run.Stall = p.outboxState(ctx)
		if f, ferr := os.CreateTemp("", "histories-goroutines-*.txt"); ferr == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 1)
			_ = f.Close()
			run.Stall += "; goroutines then: " + f.Name()
		}
	}
	stop()
	comps.Wait()
	wg.Wait()
	if err != nil {
		return PipelineRun{}, err
	}
	if err := p.readBack(ctx, &run); err != nil {
		return PipelineRun{}, err
	}
	run.History = p.rec.History()
	run.Proxy = proxy.Stats()
	run.Drops = map[string]AppFaults{}
	for _, c := range append([]string{"relay", "inbox", "projection", "reader", "worker-relay", "worker-inbox"},
		p.producerNames()...) {
		if f := proxy.FaultsOn(appPrefix + "-" + c); f != (AppFaults{}) {
			run.Drops[c] = f
		}
	}
	if brk.Proxy != nil {
		s := brk.Proxy.Stats()
		run.BrokerProxy = &s
	}
	return run, nil
}

// pipeline holds the run's components.
type pipeline struct {
	cfg       PipelineRunConfig
	rec       *Recorder
	through   string
	appPrefix string
	reg       *aggregate.Registry
	mapping   *staging.Mapping
	readModel string
	brk       *Broker
	// record records a handler's operations: in the recorder, or on a worker process's report.
	record func(process int, kind, key string, input any) opInvocation

	mu      sync.Mutex
	closers []func()
}

func (p *pipeline) onClose(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closers = append(p.closers, f)
}

func (p *pipeline) closeAll() {
	p.mu.Lock()
	cs := p.closers
	p.closers = nil
	p.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// pool opens a pool through the proxy whose connections carry application_name "<prefix>-<name>".
func (p *pipeline) pool(ctx context.Context, name string, conns int32) (*pgxpool.Pool, error) {
	u, err := url.Parse(p.through)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	q := u.Query()
	q.Set("application_name", p.appPrefix+"-"+name)
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("histories: pool config: %w", err)
	}
	pc.MaxConns = conns
	pc.ConnConfig.ConnectTimeout = p.cfg.OpTimeout
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("histories: pool: %w", err)
	}
	p.onClose(pool.Close)
	return pool, nil
}

// stores opens a pool with its event store and outbox.
func (p *pipeline) stores(ctx context.Context, name string, conns int32) (*pgxpool.Pool, *eventstore.PostgresStore,
	*outbox.Outbox, error) {
	pool, err := p.pool(ctx, name, conns)
	if err != nil {
		return nil, nil, nil, err
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: p.cfg.Schema,
		Logger: p.cfg.Logger})
	if err != nil {
		return nil, nil, nil, err
	}
	p.onClose(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: p.cfg.Schema, Logger: p.cfg.Logger})
	if err != nil {
		return nil, nil, nil, err
	}
	p.onClose(func() { _ = ob.Close() })
	return pool, store, ob, nil
}

// runRouter runs router until ctx ends, and returns once it runs.
func runRouter(ctx context.Context, router *message.Router, wg *sync.WaitGroup, what string) error {
	done := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- router.Run(ctx)
	}()
	select {
	case <-router.Running():
		return nil
	case err := <-done:
		return fmt.Errorf("histories: %s router: %w", what, err)
	case <-time.After(30 * time.Second):
		_ = router.Close()
		return fmt.Errorf("histories: the %s router did not start within 30s", what)
	}
}

type ranKey struct{}

// startConsumers starts one handler per partition topic behind the inbox, on a pool named name, recording every
// delivery as an effect of process procBase+partition.
func (p *pipeline) startConsumers(ctx context.Context, wg *sync.WaitGroup, name string, procBase int) error {
	_, store, ob, err := p.stores(ctx, name, 4)
	if err != nil {
		return err
	}
	snapshots := &aggregate.RepositoryConfig{SnapshotEvery: pipelineSnapshotEvery, Logger: p.cfg.Logger}
	counters, err := aggregate.NewRepository[*counter](store, p.reg, snapshots)
	if err != nil {
		return err
	}
	tallies, err := aggregate.NewRepository[*tally](store, p.reg, snapshots)
	if err != nil {
		return err
	}
	inbox, err := ob.NewInbox(&outbox.InboxConfig{MaxAttempts: 1000, RetryDelay: 20 * time.Millisecond,
		MaxRetryDelay: 200 * time.Millisecond, HandlerTimeout: 3 * time.Second, Logger: p.cfg.Logger})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second},
		watermill.NewSlogLogger(p.cfg.Logger))
	if err != nil {
		return fmt.Errorf("histories: consumer router: %w", err)
	}
	for part, topic := range partitionTopics(p.cfg.Partitions) {
		proc := procBase + part
		handle := inbox.Handler("histories-tally", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
			msg *message.Message) error {
			if ran, ok := ctx.Value(ranKey{}).(*atomic.Bool); ok {
				ran.Store(true)
			}
			pm, err := decodeMessage(msg)
			if err != nil {
				return outbox.Permanent(err)
			}
			inv := p.record(proc, KindLoadTx, pm.Key, EffectInput{Message: pm})
			c, err := counters.LoadTx(ctx, tx, pm.Key)
			if err != nil {
				inv.Fail(nil, err)
				return err
			}
			inv.OK(LoadTxOutput{Version: c.Version(), Ticks: c.Ticks})
			inv = p.record(proc, KindUpdateTx, tallyID(pm.Key), EffectInput{Message: pm})
			if _, err := tallies.UpsertTx(ctx, tx, tallyID(pm.Key), func(t *tally) error {
				aggregate.Raise(t, counted{Message: pm.ID, Seq: pm.Seq})
				return nil
			}); err != nil {
				inv.Fail(nil, err)
				return err
			}
			inv.OK(nil)
			return nil
		})
		router.AddConsumerHandler(fmt.Sprintf("histories-consumer-p%02d", part), topic, p.brk.Subscriber,
			func(msg *message.Message) error {
				pm, err := decodeMessage(msg)
				if err != nil {
					return err
				}
				ran := &atomic.Bool{}
				msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
				inv := p.record(proc, KindEffect, pm.Key, EffectInput{Message: pm})
				err = handle(msg)
				switch {
				case err == nil && !isNacked(msg) && !ran.Load():
					inv.OK(EffectOutput{Duplicate: true}) // the inbox had recorded it: nothing applied
				case err == nil && !isNacked(msg):
					inv.OK(EffectOutput{}) // committed (or found committed after its reply was lost)
				case ran.Load():
					inv.Info(errOr(err, "nacked for redelivery")) // its commit may have applied
				default:
					inv.Fail(nil, errOr(err, "nacked for redelivery")) // the handler never ran: nothing applied
				}
				return err
			})
	}
	return runRouter(ctx, router, wg, "consumer")
}

func errOr(err error, what string) error {
	if err != nil {
		return err
	}
	return errors.New(what)
}

func isNacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

func decodeMessage(msg *message.Message) (PipelineMessage, error) {
	var m tickedMessage
	if err := json.Unmarshal(msg.Payload, &m); err != nil {
		return PipelineMessage{}, fmt.Errorf("histories: decode %s: %w", msg.UUID, err)
	}
	return PipelineMessage{ID: pipelineID(m.Key, m.Version, m.Save), Key: m.Key, Seq: m.Version}, nil
}

// startRelay starts one outbox relay on a pool of its own named name, publishing to the broker.
func (p *pipeline) startRelay(ctx context.Context, wg *sync.WaitGroup, name, processorID string) error {
	_, _, ob, err := p.stores(ctx, name, 6)
	if err != nil {
		return err
	}
	relay, err := ob.NewRelay(&outbox.RelayConfig{
		BatchSize:              50,
		PollingInterval:        50 * time.Millisecond,
		MaxRetryCount:          outbox.Retries(1000),
		RetryDelay:             20 * time.Millisecond,
		MaxRetryDelay:          200 * time.Millisecond,
		MaxDegreeOfParallelism: 4,
		ProcessorID:            processorID,
		DisableNotify:          p.cfg.PollOnly,
		ClaimDuration:          2 * time.Second,
		AckDeadline:            10 * time.Second,
		IsBrokerUnavailable:    p.brk.Unavailable,
		BrokerBackoff:          50 * time.Millisecond,
		MaxBrokerBackoff:       500 * time.Millisecond,
		Logger:                 p.cfg.Logger,
	})
	if err != nil {
		return err
	}
	p.onClose(func() { _ = relay.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second},
		watermill.NewSlogLogger(p.cfg.Logger))
	if err != nil {
		return fmt.Errorf("histories: relay router: %w", err)
	}
	relay.AddToRouter(router, p.brk.Publisher, nil)
	return runRouter(ctx, router, wg, "relay")
}

// startProjection runs a projection folding the counters' events into the read model (events applied per key),
// restarted after it stops on an error, as a supervisor would.
func (p *pipeline) startProjection(ctx context.Context, wg *sync.WaitGroup) error {
	pool, store, _, err := p.stores(ctx, "projection", 3)
	if err != nil {
		return err
	}
	upsert := `INSERT INTO ` + p.readModel + ` AS m (key, applied) VALUES ($1, 1)
		ON CONFLICT (key) DO UPDATE SET applied = m.applied + 1`
	proj, err := projection.New(pool, store, projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx,
		e projection.Event) error {
		_, err := tx.Exec(ctx, upsert, e.StreamID)
		return err
	}), &projection.Config{Name: "histories-read-model", Schema: p.cfg.Schema, StreamTypes: []string{counterType},
		PollInterval: 50 * time.Millisecond, DisableListen: p.cfg.PollOnly, MaxAttempts: 1000, RetryDelay: 20 * time.Millisecond,
		MaxRetryDelay: 200 * time.Millisecond, LeaseTTL: 2 * time.Second, LeaseAcquireInterval: 200 * time.Millisecond,
		Logger: p.cfg.Logger})
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := proj.Run(ctx); err != nil && ctx.Err() == nil {
				p.cfg.Logger.Warn("histories: the projection stopped; restarting it", "error", err)
				sleep(ctx, 100*time.Millisecond)
			}
		}
	}()
	return nil
}

// read reads the read model until ctx ends, recording each read.
func (p *pipeline) read(ctx context.Context) {
	pool, err := p.pool(ctx, "reader", 1)
	if err != nil {
		p.cfg.Logger.Warn("histories: reader", "error", err)
		return
	}
	for ctx.Err() == nil {
		p.readOnce(ctx, pool)
		sleep(ctx, 20*time.Millisecond)
	}
}

func (p *pipeline) readOnce(ctx context.Context, pool *pgxpool.Pool) {
	opCtx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	inv := p.rec.Invoke(200, KindProjectionRead, "", nil)
	rows, err := pool.Query(opCtx, `SELECT key, applied FROM `+p.readModel)
	if err != nil {
		inv.Fail(nil, err)
		return
	}
	rm := ReadModel{Counts: map[string]int64{}}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			inv.Fail(nil, err)
			return
		}
		rm.Counts[k] = n
	}
	if err := rows.Err(); err != nil {
		inv.Fail(nil, err)
		return
	}
	inv.OK(rm)
}

// producerNames are the producers' component names.
func (p *pipeline) producerNames() []string {
	out := make([]string, p.cfg.Producers)
	for i := range out {
		out[i] = fmt.Sprintf("producer%d", i)
	}
	return out
}

// SaveDrops is how many commit replies the proxy dropped on the producers' connections.
func (r PipelineRun) SaveDrops() int {
	n := 0
	for c, f := range r.Drops {
		if strings.HasPrefix(c, "producer") {
			n += f.CommitReplies
		}
	}
	return n
}

// producer saves its own counters.
type producer struct {
	id   int
	p    *pipeline
	repo *aggregate.Repository[*counter]
	rng  *rand.Rand
	keys []string
	have map[string]*counter // the counter as last saved or loaded; nil: reload it
}

func (p *pipeline) newProducer(ctx context.Context, id int) (*producer, error) {
	_, store, ob, err := p.stores(ctx, fmt.Sprintf("producer%d", id), 2)
	if err != nil {
		return nil, err
	}
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob,
		Mapping: p.mapping, Logger: p.cfg.Logger})
	if err != nil {
		return nil, err
	}
	repo, err := aggregate.NewRepository[*counter](store, p.reg, &aggregate.RepositoryConfig{Stager: stager,
		SnapshotEvery: pipelineSnapshotEvery, Logger: p.cfg.Logger})
	if err != nil {
		return nil, err
	}
	pr := &producer{id: id, p: p, repo: repo, rng: rand.New(rand.NewPCG(p.cfg.Seed, uint64(id)+10)),
		have: map[string]*counter{}}
	for k := id; k < p.cfg.Keys; k += p.cfg.Producers {
		key := fmt.Sprintf("counter-%02d", k)
		pr.keys = append(pr.keys, key)
		pr.have[key] = repo.New(key)
	}
	return pr, nil
}

func (pr *producer) run(ctx context.Context) {
	for ctx.Err() == nil {
		key := pr.keys[pr.rng.IntN(len(pr.keys))]
		c := pr.have[key]
		if c == nil {
			if c = pr.reload(ctx, key); c == nil {
				return
			}
			pr.have[key] = c
		}
		pr.save(ctx, c)
		if pr.p.cfg.SaveEvery > 0 {
			sleep(ctx, pr.p.cfg.SaveEvery)
		}
	}
}

// reload loads counter key until a load succeeds, or ctx ends (nil).
func (pr *producer) reload(ctx context.Context, key string) *counter {
	for ctx.Err() == nil {
		opCtx, cancel := context.WithTimeout(ctx, pr.p.cfg.OpTimeout)
		c, err := pr.repo.Load(opCtx, key)
		cancel()
		if errors.Is(err, aggregate.ErrNotFound) {
			return pr.repo.New(key)
		}
		if err == nil {
			return c
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return nil
}

func (pr *producer) save(ctx context.Context, c *counter) {
	key := c.ID()
	save := uuid.NewString()
	n := 1 + pr.rng.IntN(3)
	in := SaveInput{Save: save}
	base := c.Version()
	for i := range n {
		v := base + int64(i) + 1
		aggregate.Raise(c, ticked{N: v, Save: save})
		in.Messages = append(in.Messages, PipelineMessage{ID: pipelineID(key, v, save), Key: key, Seq: v})
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pr.p.cfg.OpTimeout)
	defer cancel()
	inv := pr.p.rec.Invoke(pr.id, KindSave, key, in)
	err := pr.repo.Save(opCtx, c)
	switch {
	case err == nil:
		inv.OK(nil)
		return
	case errors.Is(err, eventstore.ErrCommitUnknown):
		inv.Info(err)
	default:
		// Every other error is definite by the store's contract: the checkers hold the library to it.
		inv.Fail(nil, err)
	}
	pr.have[key] = nil // reload before the next save: the failed attempt's events are still pending on c
}

// drain waits until every message of the committed log has an effect and the projection has applied every
// counter event, reading the committed state straight from the server, or until timeout.
func (p *pipeline) drain(ctx context.Context, timeout time.Duration, out *PipelineRun) (bool, error) {
	began := time.Now()
	deadline := began.Add(timeout)
	for {
		var run PipelineRun
		if err := p.readBack(ctx, &run); err != nil {
			return false, err
		}
		rm, err := p.readModelNow(ctx)
		if err != nil {
			return false, err
		}
		projected, handled := p.drained(run, rm)
		if projected && out.DrainProjection == 0 {
			out.DrainProjection = time.Since(began)
		}
		if handled && out.DrainEffects == 0 {
			out.DrainEffects = time.Since(began)
		}
		if projected && handled {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return false, ctx.Err()
		}
	}
}

// drained reports whether the projection has applied every counter event of the committed log, and whether every
// message of it has an effect.
func (p *pipeline) drained(run PipelineRun, rm map[string]int64) (projected, handled bool) {
	perKey := map[string]int64{}
	for _, e := range run.Log {
		perKey[e.Key]++
	}
	projected = true
	for k, n := range perKey {
		if rm[k] != n {
			projected = false
		}
	}
	handled = true
	for id := range run.expected {
		if run.Final[id] == 0 {
			handled = false
		}
	}
	return projected, handled
}

func (p *pipeline) readModelNow(ctx context.Context) (map[string]int64, error) {
	rows, err := p.cfg.Admin.Query(ctx, `SELECT key, applied FROM `+p.readModel)
	if err != nil {
		return nil, fmt.Errorf("histories: read model: %w", err)
	}
	m := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("histories: read model: %w", err)
		}
		m[k] = n
	}
	return m, rows.Err()
}

// outboxState describes the outbox's rows (read straight from the server): how many are due, parked behind their
// key, leased, backing off, and their most frequent last errors.
func (p *pipeline) outboxState(ctx context.Context) string {
	outboxT := pgx.Identifier{p.cfg.Schema, "outbox"}.Sanitize()
	var rows, due, parked, leased, backoff, attempts int64
	err := p.cfg.Admin.QueryRow(ctx, `SELECT count(*),
		count(*) FILTER (WHERE next_attempt_at <= now() AND (lease_expires_at IS NULL OR lease_expires_at < now())),
		count(*) FILTER (WHERE next_attempt_at = 'infinity'),
		count(*) FILTER (WHERE lease_expires_at >= now()),
		count(*) FILTER (WHERE next_attempt_at > now() AND next_attempt_at < 'infinity'),
		coalesce(max(attempts), 0) FROM `+outboxT).Scan(&rows, &due, &parked, &leased, &backoff, &attempts)
	if err != nil {
		return fmt.Sprintf("the outbox could not be read: %v", err)
	}
	out := fmt.Sprintf("outbox rows=%d due=%d parked=%d leased=%d backing-off=%d max-attempts=%d", rows, due,
		parked, leased, backoff, attempts)
	errs, err := p.cfg.Admin.Query(ctx, `SELECT left(last_error, 200), count(*) FROM `+outboxT+`
		WHERE last_error IS NOT NULL GROUP BY 1 ORDER BY 2 DESC LIMIT 3`)
	if err == nil {
		for errs.Next() {
			var e string
			var n int64
			if errs.Scan(&e, &n) == nil {
				out += fmt.Sprintf("; %d× %q", n, e)
			}
		}
		errs.Close()
	}
	return out
}

// readBack reads the committed log straight from the server: the counters' events (which saves committed, the
// messages they staged) and the tallies' (the effects).
func (p *pipeline) readBack(ctx context.Context, run *PipelineRun) error {
	store, err := eventstore.NewPostgres(p.cfg.Admin, &eventstore.PostgresConfig{Schema: p.cfg.Schema})
	if err != nil {
		return err
	}
	defer store.Close()
	run.Committed, run.Final, run.Log, run.expected = map[string]bool{}, map[string]int{}, nil, map[string]bool{}
	var after int64
	for {
		page, err := store.ReadLog(ctx, eventstore.LogQuery{After: after, Limit: 1000})
		if err != nil {
			return fmt.Errorf("histories: read the log: %w", err)
		}
		for _, r := range page.Records {
			switch r.Type {
			case tickedType:
				var e ticked
				if err := json.Unmarshal(r.Payload, &e); err != nil {
					return fmt.Errorf("histories: decode %s: %w", r.EventID, err)
				}
				run.Committed[e.Save] = true
				run.Log = append(run.Log, LogEvent{Key: r.StreamID})
				run.expected[pipelineID(r.StreamID, r.Version, e.Save)] = true
			case countedType:
				var e counted
				if err := json.Unmarshal(r.Payload, &e); err != nil {
					return fmt.Errorf("histories: decode %s: %w", r.EventID, err)
				}
				run.Final[e.Message]++
			}
		}
		if page.Last <= after {
			return nil
		}
		after = page.Last
	}
}
