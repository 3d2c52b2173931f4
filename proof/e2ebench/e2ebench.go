package e2ebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/proof/natsjs"
	"github.com/stagehand-es/stagehand/staging"
)

// Config is what one run measures and where. A zero field means the default stated on it.
type Config struct {
	// URL is the PostgreSQL server (for figures worth quoting, a durable one: fsync and synchronous_commit on).
	// Required.
	URL string
	// Schema is the schema the run creates its tables in (stagehand's migrations, watermill-sql's tables, the
	// consumers' effects). Required; it should be new and empty.
	Schema string
	// Saturation is how long producers append as fast as they can in one closed-loop round; the path's maximum
	// sustainable rate is what it delivered end to end. Default 8s.
	Saturation time.Duration
	// SaturationRounds is the number of closed-loop rounds per path, alternating the paths; the maximum rate is
	// their mean. Default 2.
	SaturationRounds int
	// SaturationWorkers is the number of closed-loop producers. Default 16.
	SaturationWorkers int
	// Paced is how long paced (open-loop) producers run at each rate, per path. Default 15s.
	Paced time.Duration
	// PacedSlices is how many slices each path's Paced time at a rate is cut into, run alternating the paths in
	// the order stagehand, forwarder, forwarder, stagehand, stagehand, ... so that whatever changes over the rate's
	// run (the tables' growth, an autovacuum, a busy host) weighs on both paths alike; the percentiles pool the
	// messages of every slice of a path. Default 4. One slice per path compares two different stretches of the
	// run, and a tail percentile of one stretch moves with what happened in it.
	PacedSlices int
	// Fractions of stagehand's maximum sustainable rate at which both paths are then run, paced. Default 0.25,
	// 0.5 and 0.9. Each must be in (0, 1].
	Fractions []float64
	// PacedWorkers is the number of paced producers; an append starts at its due time if one of them is free, and
	// its latency counts from its due time either way. Default 64.
	PacedWorkers int
	// PoolSize is the number of database connections both paths share (producers, relay, forwarder, consumers).
	// Default 32: a pool sized for the server (a few connections per core) rather than one per producer. With a
	// connection for every producer (128 here), a stall of a few tens of milliseconds let waiting producers open
	// new connections, and a new connection's first statements pay for planning and for filling its catalog
	// caches (up to 100 ms of CPU each on a busy 2-core machine), which stalls the next saves in turn: stagehand's
	// p99 at half its maximum rate rose to 500-700 ms in episodes of about a second, the forwarder's (whose
	// statements are cheaper to plan) to 25-60 ms.
	PoolSize int
	// Relay is the stagehand relay's configuration (ProcessorID and IsBrokerUnavailable are set by the run).
	// Default outbox.Balanced(): batches of 100, 4 deliveries in flight, NOTIFY wake-ups.
	Relay *outbox.RelayConfig
	// Warmup is a paced run of each path at 200 messages/s before anything is measured. Default 2s.
	Warmup time.Duration
	// WarmupSaturation is a closed-loop round of each path after Warmup, not measured either. Default 4s. Without
	// it the first measured round ran 15-20% below the later ones whichever path it was (the tables' first
	// growth, their first autovacuum and autoanalyze), which made the path measured first look slower: stagehand
	// in the rounds' order, the forwarder when the order was swapped (913 against 1,116 msgs/s).
	WarmupSaturation time.Duration
	// DrainTimeout bounds the wait, after a round's producers stop, for all its messages to be handled. Default 90s.
	DrainTimeout time.Duration
	// Logger receives the components' logs. Default: discarded.
	Logger *slog.Logger
	// Progress receives one line per round as the run goes. Default: discarded.
	Progress io.Writer
	// Observe, when set, is called as each round starts (warm-up rounds too), with the path and the offered rate
	// (0: closed loop), and the function it returns when every message of the round has been handled: for
	// sampling the database (pg_stat_statements, say) per round.
	Observe func(path string, rate float64) (done func())
}

func (c *Config) validate() error {
	switch {
	case c.URL == "":
		return errors.New("e2ebench: URL is required")
	case c.Schema == "":
		return errors.New("e2ebench: Schema is required")
	case c.Saturation < 0 || c.Paced < 0 || c.Warmup < 0 || c.WarmupSaturation < 0 || c.DrainTimeout < 0:
		return errors.New("e2ebench: Saturation, Paced, Warmup, WarmupSaturation and DrainTimeout must not be negative")
	}
	for _, f := range []struct {
		name string
		n    int
	}{{"SaturationRounds", c.SaturationRounds}, {"SaturationWorkers", c.SaturationWorkers},
		{"PacedSlices", c.PacedSlices}, {"PacedWorkers", c.PacedWorkers}, {"PoolSize", c.PoolSize}} {
		if f.n < 0 {
			return fmt.Errorf("e2ebench: %s must not be negative, got %d", f.name, f.n)
		}
	}
	for _, f := range c.Fractions {
		if f <= 0 || f > 1 {
			return fmt.Errorf("e2ebench: Fractions must be in (0, 1], got %g", f)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Saturation, 8*time.Second)
	def(&c.Paced, 15*time.Second)
	def(&c.Warmup, 2*time.Second)
	def(&c.WarmupSaturation, 4*time.Second)
	def(&c.DrainTimeout, 90*time.Second)
	if c.SaturationRounds == 0 {
		c.SaturationRounds = 2
	}
	if c.SaturationWorkers == 0 {
		c.SaturationWorkers = 16
	}
	if c.PacedSlices == 0 {
		c.PacedSlices = 4
	}
	if c.PacedWorkers == 0 {
		c.PacedWorkers = 64
	}
	if c.PoolSize == 0 {
		c.PoolSize = 32
	}
	if len(c.Fractions) == 0 {
		c.Fractions = []float64{0.25, 0.5, 0.9}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}

// Round is what one round of one path measured.
type Round struct {
	Path string
	// Offered is the paced rate in messages/s (0 for a closed-loop round).
	Offered float64
	// Produced messages were appended (and staged); Handled of them were handled by the path's consumer.
	Produced, Handled int
	// ProduceRate is Produced over the producers' run; Throughput is Produced from the round's start to the last
	// message handled: the rate the whole path delivered. For a paced round in slices, each is over the slices'
	// times added together.
	ProduceRate, Throughput float64
	// Append → handled latency percentiles, from each append's due time to the commit of the consumer's inbox
	// transaction.
	P50, P99, Max time.Duration
	// AppendP50 and AppendP99 are the part of it spent appending: from the due time to the return of the save
	// (the commit of the event and its message). The rest is the way through the relay or the forwarder, the
	// broker and the consumer.
	AppendP50, AppendP99 time.Duration
	// Lag is from the producers' stop to the last message handled (the longest of a paced round's slices).
	Lag time.Duration
	// Steal is the share of the machine's CPU time the hypervisor ran something else while the round ran (from
	// its start to its last message handled; -1 where /proc/stat cannot be read): a round on a busy host is slower
	// for reasons neither path controls.
	Steal float64
	// CPU is the machine's CPU time per message produced in the round, from its start until every message was
	// handled (neither idle nor steal: this process, PostgreSQL and anything else running); GoCPU is this
	// process's share (producers, relay or forwarder, the embedded broker, consumers; the idle path's polling
	// too). Zero where they cannot be read.
	CPU, GoCPU time.Duration
	// Relay is what stagehand's relay did in the round (zero for the forwarder's rounds): how its statements
	// amortise over the messages.
	Relay RelayWork
	// SliceP99 is the append → handled p99 of each slice of a paced round, in the order run (one for a
	// closed-loop round): how far the pooled P99 rests on one stretch of the run.
	SliceP99 []time.Duration
}

// RelayWork counts the relay's claims (EmptyClaims of them found nothing) and marks (from outbox.Hooks) and the
// rows they carried.
type RelayWork struct {
	Claims, EmptyClaims, ClaimedRows, Marks, MarkedRows int64
}

// String is ", relay R rows/claim (E% empty), M rows/mark" ("" when the relay did nothing).
func (w RelayWork) String() string {
	if w.Claims == 0 || w.Marks == 0 {
		return ""
	}
	return fmt.Sprintf(", relay %.1f rows/claim (%.0f%% empty), %.1f rows/mark",
		float64(w.ClaimedRows)/float64(w.Claims), 100*float64(w.EmptyClaims)/float64(w.Claims),
		float64(w.MarkedRows)/float64(w.Marks))
}

// sub is the work from before to w.
func (w RelayWork) sub(before RelayWork) RelayWork {
	return RelayWork{Claims: w.Claims - before.Claims, EmptyClaims: w.EmptyClaims - before.EmptyClaims,
		ClaimedRows: w.ClaimedRows - before.ClaimedRows, Marks: w.Marks - before.Marks,
		MarkedRows: w.MarkedRows - before.MarkedRows}
}

// add is w and more together.
func (w RelayWork) add(more RelayWork) RelayWork {
	return RelayWork{Claims: w.Claims + more.Claims, EmptyClaims: w.EmptyClaims + more.EmptyClaims,
		ClaimedRows: w.ClaimedRows + more.ClaimedRows, Marks: w.Marks + more.Marks,
		MarkedRows: w.MarkedRows + more.MarkedRows}
}

// relayTally is the running count behind RelayWork.
type relayTally struct {
	claims, emptyClaims, claimedRows, marks, markedRows atomic.Int64
}

func (t *relayTally) snapshot() RelayWork {
	return RelayWork{Claims: t.claims.Load(), EmptyClaims: t.emptyClaims.Load(), ClaimedRows: t.claimedRows.Load(),
		Marks: t.marks.Load(), MarkedRows: t.markedRows.Load()}
}

// hook counts the relay's claims and marks, and calls the hooks h already had.
func (t *relayTally) hook(h *outbox.Hooks) {
	claimed, marked := h.Claimed, h.Marked
	h.Claimed = func(ctx context.Context, rows int, took time.Duration, err error) {
		if err == nil {
			t.claims.Add(1)
			t.claimedRows.Add(int64(rows))
			if rows == 0 {
				t.emptyClaims.Add(1)
			}
		}
		if claimed != nil {
			claimed(ctx, rows, took, err)
		}
	}
	h.Marked = func(ctx context.Context, rows int, took time.Duration, err error) {
		if err == nil && rows > 0 {
			t.marks.Add(1)
			t.markedRows.Add(int64(rows))
		}
		if marked != nil {
			marked(ctx, rows, took, err)
		}
	}
}

// KeptUp reports whether the path delivered a paced round at the offered rate: everything handled, at least 95%
// of the offered rate end to end, and the last message handled within a second of the producers' stop.
func (r Round) KeptUp() bool {
	return r.Handled == r.Produced && r.Throughput >= 0.95*r.Offered && r.Lag <= time.Second
}

// Paced is one absolute rate and what both paths did at it.
type Paced struct {
	Fraction             float64 // of stagehand's maximum sustainable rate
	Rate                 float64 // messages/s
	Stagehand, Forwarder Round
}

// Results is what a run measured.
type Results struct {
	Config  Config
	Machine Machine
	// Saturation holds the closed-loop rounds, in the order run.
	Saturation []Round
	// MaxStagehand and MaxForwarder are the maximum sustainable rates (messages/s): the mean throughput of each
	// path's closed-loop rounds.
	MaxStagehand, MaxForwarder float64
	Paced                      []Paced
	// Integrity, checked against the effects table at the end: messages produced with no effect, and effects
	// applied more than once, per path (both must be 0).
	Missing, Duplicates map[string]int64
	Total               time.Duration
}

// Ratio is the throughput ratio, stagehand over forwarder.
func (r *Results) Ratio() float64 {
	if r.MaxForwarder == 0 {
		return 0
	}
	return r.MaxStagehand / r.MaxForwarder
}

// Check returns an error when a message was lost or applied twice on either path.
func (r *Results) Check() error {
	var errs []error
	for _, p := range []string{PathStagehand, PathForwarder} {
		if r.Missing[p] != 0 || r.Duplicates[p] != 0 {
			errs = append(errs, fmt.Errorf("e2ebench: %s path: %d messages without an effect, %d duplicate effects",
				p, r.Missing[p], r.Duplicates[p]))
		}
	}
	return errors.Join(errs...)
}

// Run sets both paths up on cfg's database and an embedded NATS JetStream server, measures each path's maximum
// sustainable rate with closed-loop rounds (alternating the paths), then runs both paths paced at cfg.Fractions of
// stagehand's maximum, and checks that every message was handled exactly once. It stops everything it started
// before returning.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	runSteal := hoststat.Steal()
	step := func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	log := cfg.Logger
	wlog := watermill.NewSlogLogger(log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: database URL: %w", err)
	}
	pc.MaxConns = int32(cfg.PoolSize)
	// watermill-sql names its tables without a schema: they go to the run's schema.
	pc.ConnConfig.RuntimeParams["search_path"] = cfg.Schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: connect: %w", err)
	}
	defer pool.Close()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: cfg.Schema}); err != nil {
		return nil, fmt.Errorf("e2ebench: migrate: %w", err)
	}
	effects := pgx.Identifier{cfg.Schema, "e2e_effects"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (message_id text NOT NULL, path text NOT NULL,
		order_id text NOT NULL, amount bigint NOT NULL, handled_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return nil, fmt.Errorf("e2ebench: effects table: %w", err)
	}
	res := &Results{Config: cfg}
	res.Machine = describeMachine(ctx, pool)

	brk, err := startBroker(log)
	if err != nil {
		return nil, err
	}
	defer brk.stop()
	if err := brk.provision(ctx, TopicStagehand, TopicForwarder); err != nil {
		return nil, err
	}

	// The writing side.
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.Schema, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("e2ebench: event store: %w", err)
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: cfg.Schema, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("e2ebench: outbox: %w", err)
	}
	defer ob.Close()
	reg, err := newRegistry()
	if err != nil {
		return nil, err
	}
	mapping, err := newMapping(reg)
	if err != nil {
		return nil, err
	}
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob, Mapping: mapping,
		Logger: log})
	if err != nil {
		return nil, fmt.Errorf("e2ebench: stager: %w", err)
	}
	stagedRepo, err := aggregate.NewRepository[*Order](store, reg, &aggregate.RepositoryConfig{Stager: stager,
		Logger: log})
	if err != nil {
		return nil, fmt.Errorf("e2ebench: repository: %w", err)
	}
	plainRepo, err := aggregate.NewRepository[*Order](store, reg, &aggregate.RepositoryConfig{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("e2ebench: repository: %w", err)
	}
	sh := stagehandPath(stagedRepo, newRecorder())
	fw := forwarderPath(pool, plainRepo, newRecorder())

	// Background work: the consumers of both paths, stagehand's relay, Watermill's forwarder. Closed in reverse.
	var stops []func()
	defer func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}()
	inbox, err := ob.NewInbox(nil)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: inbox: %w", err)
	}
	consumers, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: consumer router: %w", err)
	}
	for _, p := range []*path{sh, fw} {
		topic := map[string]string{PathStagehand: TopicStagehand, PathForwarder: TopicForwarder}[p.name]
		sub, err := newSubscriber(brk.URL(), topic, wlog)
		if err != nil {
			return nil, err
		}
		stops = append(stops, func() { _ = sub.Close() }) // after the router (closing twice is harmless)
		consumers.AddConsumerHandler("consume-"+p.name, topic, sub, consumerHandler(inbox, p.name, effects, p.rec))
	}
	stop, err := runRouter(ctx, consumers)
	if err != nil {
		return nil, err
	}
	stops = append(stops, stop)

	shPub, err := newPublisher(brk.URL(), "e2ebench relay", wlog)
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { _ = shPub.Close() })
	relayCfg := outbox.Balanced() // the default profile: batches of 100, 4 deliveries in flight, NOTIFY wake-ups
	if cfg.Relay != nil {
		c := *cfg.Relay
		relayCfg = &c
	}
	relayCfg.ProcessorID = "e2ebench"
	relayCfg.IsBrokerUnavailable = natsjs.Unavailable
	tally := &relayTally{}
	tally.hook(&relayCfg.Hooks)
	relay, err := ob.NewRelay(relayCfg)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: relay: %w", err)
	}
	stops = append(stops, func() { _ = relay.Close() })
	relayRouter, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return nil, fmt.Errorf("e2ebench: relay router: %w", err)
	}
	relay.AddToRouter(relayRouter, shPub, nil)
	if stop, err = runRouter(ctx, relayRouter); err != nil {
		return nil, err
	}
	stops = append(stops, stop)

	fwPub, err := newPublisher(brk.URL(), "e2ebench forwarder", wlog)
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { _ = fwPub.Close() })
	stopForwarder, err := runForwarder(ctx, pool, fwPub, log)
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { _ = stopForwarder() })

	r := &runner{cfg: cfg, relay: tally}
	step("machine: %s", res.Machine)
	for _, p := range []*path{sh, fw} {
		if _, err := r.round(ctx, p, 200, cfg.PacedWorkers, cfg.Warmup); err != nil {
			return nil, fmt.Errorf("e2ebench: warm-up: %w", err)
		}
	}
	for _, p := range []*path{sh, fw} {
		if _, err := r.round(ctx, p, 0, cfg.SaturationWorkers, cfg.WarmupSaturation); err != nil {
			return nil, fmt.Errorf("e2ebench: warm-up: %w", err)
		}
	}
	step("warmed up; measuring the maximum sustainable rates (%d closed-loop rounds of %s per path, %d producers)",
		cfg.SaturationRounds, cfg.Saturation, cfg.SaturationWorkers)
	sums := map[string]float64{}
	for i := range cfg.SaturationRounds {
		order := []*path{sh, fw}
		if i%2 == 1 {
			order = []*path{fw, sh}
		}
		for _, p := range order {
			rd, err := r.round(ctx, p, 0, cfg.SaturationWorkers, cfg.Saturation)
			if err != nil {
				return res, err
			}
			res.Saturation = append(res.Saturation, rd)
			sums[p.name] += rd.Throughput
			step("closed loop %-9s produced %6d (%5.0f/s), delivered end to end %5.0f msgs/s, lag %.1fs, %s%s", p.name,
				rd.Produced, rd.ProduceRate, rd.Throughput, rd.Lag.Seconds(), hoststat.Percent(rd.Steal), rd.cpuText()+rd.Relay.String())
		}
	}
	res.MaxStagehand = sums[PathStagehand] / float64(cfg.SaturationRounds)
	res.MaxForwarder = sums[PathForwarder] / float64(cfg.SaturationRounds)
	step("maximum sustainable rate: stagehand %.0f msgs/s, forwarder %.0f msgs/s (%.2fx)", res.MaxStagehand,
		res.MaxForwarder, res.Ratio())

	for _, f := range cfg.Fractions {
		rate := f * res.MaxStagehand
		pr := Paced{Fraction: f, Rate: rate}
		parts := map[*path][]slice{}
		each := cfg.Paced / time.Duration(cfg.PacedSlices)
		for _, p := range pacedOrder(sh, fw, cfg.PacedSlices) {
			s, err := r.slice(ctx, p, rate, cfg.PacedWorkers, each)
			if err != nil {
				return res, err
			}
			parts[p] = append(parts[p], s)
		}
		pr.Stagehand = summarize(sh.name, rate, parts[sh])
		pr.Forwarder = summarize(fw.name, rate, parts[fw])
		for _, rd := range []Round{pr.Stagehand, pr.Forwarder} {
			step("paced %3.0f%% %-9s %5.0f msgs/s offered: p50 %s p99 %s (append p50 %s p99 %s; p99 of each slice %s), "+
				"delivered %5.0f msgs/s, lag %.1fs, %s%s", f*100, rd.Path, rate, ms(rd.P50), ms(rd.P99),
				ms(rd.AppendP50), ms(rd.AppendP99), msList(rd.SliceP99), rd.Throughput, rd.Lag.Seconds(),
				hoststat.Percent(rd.Steal), rd.cpuText()+rd.Relay.String())
		}
		res.Paced = append(res.Paced, pr)
	}

	res.Missing, res.Duplicates = map[string]int64{}, map[string]int64{}
	for _, p := range []*path{sh, fw} {
		var unique, rows int64
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id), count(*) FROM `+effects+` WHERE path = $1`,
			p.name).Scan(&unique, &rows); err != nil {
			return res, fmt.Errorf("e2ebench: count effects: %w", err)
		}
		res.Missing[p.name] = r.produced[p.name] - unique
		res.Duplicates[p.name] = rows - unique
	}
	res.Machine.LoadAfter = loadAverage()
	res.Machine.Steal = runSteal()
	res.Total = time.Since(began)
	step("done")
	return res, nil
}

// runRouter runs router in the background; stop closes it and waits for Run to return.
func runRouter(ctx context.Context, router *message.Router) (stop func(), err error) {
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
		return func() { _ = router.Close(); <-done }, nil
	case err := <-done:
		return nil, fmt.Errorf("e2ebench: router: %w", err)
	}
}

// runner runs rounds: every round is a phase of its own, so its messages are told apart from the previous
// round's stragglers.
type runner struct {
	cfg      Config
	relay    *relayTally // stagehand's relay
	phase    int
	produced map[string]int64
}

// round runs p's producers for d: paced at rate messages/s, or closed-loop (as fast as they can) when rate is 0;
// then waits until everything they appended has been handled, and measures.
func (r *runner) round(ctx context.Context, p *path, rate float64, workers int, d time.Duration) (Round, error) {
	s, err := r.slice(ctx, p, rate, workers, d)
	if err != nil {
		return Round{}, err
	}
	return summarize(p.name, rate, []slice{s}), nil
}

// pacedOrder is the order of a rate's slices: n of each path, in pairs alternating which path goes first (a, b,
// b, a, a, b, ...): with an even n each path goes first in half the pairs, and their slices' mean position in
// the run is the same.
func pacedOrder(a, b *path, n int) []*path {
	order := make([]*path, 0, 2*n)
	for i := range n {
		if i%2 == 0 {
			order = append(order, a, b)
		} else {
			order = append(order, b, a)
		}
	}
	return order
}

// slice is what one run of a path's producers left to measure.
type slice struct {
	produced, handled    int
	start, stopped, last time.Time       // the producers' start and stop, the last message handled
	latency, appended    []time.Duration // append → handled and the append alone, per message
	busy                 float64         // the machine's CPU seconds, neither idle nor steal (-1: unknown)
	goCPU                time.Duration   // this process's CPU time
	steal                float64         // share of the slice (-1: unknown)
	relay                RelayWork
}

// slice runs p's producers for d (see round) and keeps what they did.
func (r *runner) slice(ctx context.Context, p *path, rate float64, workers int, d time.Duration) (slice, error) {
	r.phase++
	phase := r.phase
	if r.produced == nil {
		r.produced = map[string]int64{}
	}
	var next, produced atomic.Int64
	var appendMu sync.Mutex
	var appendLatency []time.Duration
	if r.cfg.Observe != nil {
		if done := r.cfg.Observe(p.name, rate); done != nil {
			defer done()
		}
	}
	steal := hoststat.Steal()
	relayBefore := r.relay.snapshot()
	cpuBefore, cpuErr := hoststat.Read()
	goBefore := hoststat.ProcessCPU()
	start := time.Now()
	end := start.Add(d)
	g, gctx := errgroup.WithContext(ctx)
	for range workers {
		g.Go(func() error {
			for {
				i := next.Add(1) - 1
				due := time.Now()
				if rate > 0 {
					due = start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
				}
				if !due.Before(end) {
					return nil
				}
				if err := sleepUntil(gctx, due); err != nil {
					return err
				}
				id := fmt.Sprintf("%s-%d-%d", p.name, phase, i)
				if err := p.save(gctx, id, Placed{Phase: phase, SentAt: due.UnixNano(), Amount: 1999}); err != nil {
					return fmt.Errorf("e2ebench: %s: append %s: %w", p.name, id, err)
				}
				took := time.Since(due)
				produced.Add(1)
				appendMu.Lock()
				appendLatency = append(appendLatency, took)
				appendMu.Unlock()
			}
		})
	}
	err := g.Wait()
	stopped := time.Now()
	n := int(produced.Load())
	r.produced[p.name] += int64(n)
	if err != nil {
		return slice{}, err
	}
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for p.rec.count(phase) < n {
		if time.Now().After(deadline) {
			return slice{}, fmt.Errorf("e2ebench: %s: %d of %d messages handled %s after the producers stopped",
				p.name, p.rec.count(phase), n, r.cfg.DrainTimeout)
		}
		if err := sleepUntil(ctx, time.Now().Add(2*time.Millisecond)); err != nil {
			return slice{}, err
		}
	}
	s := slice{produced: n, start: start, stopped: stopped, appended: appendLatency, busy: -1, steal: steal()}
	if cpuAfter, err := hoststat.Read(); err == nil && cpuErr == nil {
		s.busy = cpuAfter.Busy(cpuBefore)
		s.goCPU = hoststat.ProcessCPU() - goBefore
	}
	log := p.rec.take(phase)
	s.handled, s.last, s.latency = log.handled, log.last, log.latency
	if p.name == PathStagehand {
		s.relay = r.relay.snapshot().sub(relayBefore)
	}
	return s, nil
}

// summarize measures the slices of one path at one rate as one round: the percentiles over every message of
// every slice, the rates over the slices' time together, CPU per message over all of them, the longest lag, and
// the steal share weighted by each slice's length.
func summarize(name string, rate float64, parts []slice) Round {
	rd := Round{Path: name, Offered: rate}
	var latency, appendLatency []time.Duration
	var producing, delivering, stealTime time.Duration
	var busy float64
	var goCPU time.Duration
	cpuKnown := true
	for _, s := range parts {
		rd.Produced += s.produced
		rd.Handled += s.handled
		latency = append(latency, s.latency...)
		appendLatency = append(appendLatency, s.appended...)
		producing += s.stopped.Sub(s.start)
		if s.produced > 0 {
			delivering += s.last.Sub(s.start)
			rd.Lag = max(rd.Lag, s.last.Sub(s.stopped))
			if s.steal < 0 || rd.Steal < 0 {
				rd.Steal = -1
			} else {
				stealTime += time.Duration(s.steal * float64(s.last.Sub(s.start)))
			}
		}
		cpuKnown = cpuKnown && s.busy >= 0
		busy += s.busy
		goCPU += s.goCPU
		rd.Relay = rd.Relay.add(s.relay)
		if len(s.latency) > 0 {
			sorted := slices.Sorted(slices.Values(s.latency))
			rd.SliceP99 = append(rd.SliceP99, quantile(sorted, 0.99))
		}
	}
	if rd.Produced == 0 {
		return rd
	}
	rd.ProduceRate = float64(rd.Produced) / producing.Seconds()
	rd.Throughput = float64(rd.Produced) / delivering.Seconds()
	if rd.Steal >= 0 && delivering > 0 {
		rd.Steal = float64(stealTime) / float64(delivering)
	}
	if cpuKnown {
		rd.CPU = time.Duration(busy / float64(rd.Produced) * float64(time.Second))
		rd.GoCPU = goCPU / time.Duration(rd.Produced)
	}
	slices.Sort(latency)
	rd.P50, rd.P99, rd.Max = quantile(latency, 0.50), quantile(latency, 0.99), latency[len(latency)-1]
	slices.Sort(appendLatency)
	rd.AppendP50, rd.AppendP99 = quantile(appendLatency, 0.50), quantile(appendLatency, 0.99)
	return rd
}

// cpuText is ", CPU c/msg (Go g)" for a report line ("" when unmeasured).
func (r Round) cpuText() string {
	if r.CPU == 0 {
		return ""
	}
	return fmt.Sprintf(", CPU %.0f µs/msg (Go %.0f µs)", float64(r.CPU.Microseconds()), float64(r.GoCPU.Microseconds()))
}

// quantile returns the q-quantile of sorted (nearest rank); 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank-1, 0), len(sorted)-1)]
}

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
