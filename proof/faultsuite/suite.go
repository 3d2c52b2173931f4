package faultsuite

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/staging"
)

const (
	schema = "faults"
	tenant = "faults"
)

// Run runs the suite once: it starts its own PostgreSQL cluster and broker, produces cfg.Messages messages
// while injecting the faults, waits until everything is handled, and returns what it measured. It stops and
// removes everything it started before returning, whatever happened. The error is about the run itself (a
// component that could not start, a relay process that exited by itself, a drain that did not finish); the
// report's Check says whether the guarantees held.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rep := &Report{Config: cfg}
	began := time.Now()
	log := cfg.Logger
	step := func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}

	// 1. A PostgreSQL cluster of our own (so it can be restarted) and the broker, also ours (so it can be killed).
	step("starting a throwaway PostgreSQL cluster and the broker, %s (seed %d)", cfg.Broker, cfg.Seed)
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.Stop() }()
	pool, err := connect(ctx, srv.URL())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema}); err != nil {
		return nil, fmt.Errorf("faultsuite: migrate: %w", err)
	}
	effects := pgx.Identifier{schema, "fault_effects"}.Sanitize()
	// seq numbers the effects in the order the handler applied them: a key's order at the handler.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (seq bigserial, message_id text NOT NULL,
		partition_key text NOT NULL, version bigint NOT NULL,
		handled_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return nil, fmt.Errorf("faultsuite: effects table: %w", err)
	}
	brk, err := startBroker(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = brk.stop() }()
	rep.Broker = brk.describe()
	if err := brk.provision(ctx); err != nil {
		return nil, err
	}

	// 2. The producing side: a repository staging with the Transactional strategy.
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: event store: %w", err)
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: outbox: %w", err)
	}
	defer ob.Close()
	reg, err := newRegistry()
	if err != nil {
		return nil, err
	}
	mapping, err := newMapping(reg, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob, Mapping: mapping,
		Logger: log})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: stager: %w", err)
	}
	repo, err := aggregate.NewRepository[*Counter](store, reg, &aggregate.RepositoryConfig{Stager: stager,
		Logger: log})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: repository: %w", err)
	}

	// 3. The consumers (in this process) and the relay processes.
	cons, err := startConsumers(ctx, pool, ob, effects, brk, cfg, log)
	if err != nil {
		return nil, err
	}
	defer cons.stop()
	relays := newRelays(cfg, srv.URL(), schema, brk.url(), log)
	defer relays.stop()
	step("starting %d relay processes", cfg.Relays)
	if err := relays.start(ctx); err != nil {
		return nil, err
	}

	// 4. The fault window: production, kills, PostgreSQL restarts and the broker outage, all at once.
	step("producing %d messages over %d keys for at least %s; killing relays every %s-%s", cfg.Messages, cfg.Keys,
		cfg.ProduceFor, cfg.KillMin, cfg.KillMax)
	windowStart := time.Now()
	prod := newProducers(cfg, repo, log)
	prodDone := make(chan error, 1)
	pctx, pcancel := context.WithTimeoutCause(ctx, cfg.ProduceTimeout,
		fmt.Errorf("faultsuite: production took longer than ProduceTimeout (%s)", cfg.ProduceTimeout))
	defer pcancel()
	go func() { prodDone <- prod.run(stagehand.WithTenant(pctx, tenant), time.Minute) }()
	faults := &faultLog{}
	faultsDone := make(chan error, 1)
	go func() { faultsDone <- injectFaults(ctx, cfg, windowStart, srv, brk, faults, relays.spare, step) }()
	// live fills the report with what is known so far, so a run that fails still reports how far it got.
	live := func() {
		rc := relays.snapshot()
		rep.RelayStarts, rep.Kills, rep.KillsMidWork = rc.starts, rc.kills, rc.killsMidWork
		rep.InjectedRejections, rep.UnexpectedRejections = rc.injectedRejections, rc.unexpected
		rep.UnreachableDeliveries, rep.RelayDeadLetters, rep.RelaySamples = rc.unreachable, rc.deadLettered, rc.samples
		f := faults.snapshot()
		rep.PostgresRestarts, rep.PostgresDown = len(f.pgRestarts), f.pgRestarts
		rep.BrokerStops, rep.BrokerOutage, rep.BrokerFault = f.brokerStops, f.brokerDown, f.brokerWhat
		rep.BrokerLeaderless = f.brokerLeaderless
		rep.CommittedEvents, rep.SaveRetries = prod.events.Load(), prod.retries.Load()
		rep.Deliveries = cons.counts.deliveries.Load()
		rep.FirstHandlings = cons.counts.handled.Load()
		rep.InboxSkipped = cons.counts.suppressed.Load()
		rep.HandlerFailures = cons.counts.failed.Load()
		rep.DroppedAcks = cons.counts.redelivered.Load()
		rep.Total = time.Since(began)
	}
	progress := func(what string) {
		rc := relays.snapshot()
		step("%s: %d of %d events committed (%d saves, %d retried), %d messages handled (%d deliveries, %d skipped "+
			"by the inbox), %d relay kills", what, prod.events.Load(), cfg.Messages, prod.saves.Load(),
			prod.retries.Load(), cons.counts.handled.Load(), cons.counts.deliveries.Load(),
			cons.counts.suppressed.Load(), rc.kills)
	}
	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	for prodDone != nil || faultsDone != nil {
		select {
		case err := <-prodDone:
			if err != nil {
				live()
				return rep, fmt.Errorf("faultsuite: producing (%d of %d events committed in %s): %w",
					prod.events.Load(), cfg.Messages, time.Since(windowStart).Round(time.Second), err)
			}
			prodDone = nil
			rep.ProduceTime = time.Since(windowStart)
			step("produced: %d events in %d saves (%d saves retried)", prod.events.Load(), prod.saves.Load(),
				prod.retries.Load())
		case err := <-faultsDone:
			if err != nil {
				live()
				return rep, err
			}
			faultsDone = nil
		case err := <-relays.failed:
			live()
			return rep, err
		case <-cons.done:
			live()
			return rep, fmt.Errorf("faultsuite: the consumer router stopped: %w", cons.runErr)
		case <-tick.C:
			progress("producing")
		}
	}
	relays.stopKilling()
	rc := relays.snapshot()
	lastFault := slices.MaxFunc([]time.Time{rc.lastKill, faults.lastEnd()}, time.Time.Compare)
	rep.SaveRetries = prod.retries.Load()
	fv := faults.snapshot()
	step("faults over: %d kills, %d PostgreSQL restarts, broker down %.1fs; waiting for the drain", rc.kills,
		len(fv.pgRestarts), fv.brokerDown.Seconds())

	// 5. The drain: every message handled, nothing left in the outbox, nothing left for the broker to deliver.
	drained, err := waitDrained(ctx, cfg, pool, ob, effects, brk, cons, relays, func(state string) {
		step("draining: %s", state)
	})
	if err != nil {
		live()
		return rep, err
	}
	rep.DrainAfterLastFault = drained.Sub(lastFault)
	step("drained %.1fs after the last fault; stopping the relays", rep.DrainAfterLastFault.Seconds())
	// Nothing more is published once the relays are gone; then the consumer must settle once more, so a late copy
	// would still reach the inbox (and the count of effects) before the check.
	relays.stop()
	if err := waitSettled(ctx, brk, cons, 30*time.Second); err != nil {
		return rep, err
	}
	cons.stop()

	// 6. What happened.
	step("checking: reading the event log, the broker's stream, the effects and the outbox")
	rc = relays.snapshot()
	rep.RelayStarts, rep.Kills, rep.KillsMidWork = rc.starts, rc.kills, rc.killsMidWork
	rep.PostgresRestarts, rep.PostgresDown = len(fv.pgRestarts), fv.pgRestarts
	rep.BrokerStops, rep.BrokerOutage, rep.BrokerFault = fv.brokerStops, fv.brokerDown, fv.brokerWhat
	rep.BrokerLeaderless = fv.brokerLeaderless
	rep.InjectedRejections, rep.UnexpectedRejections = rc.injectedRejections, rc.unexpected
	rep.UnreachableDeliveries, rep.RelayDeadLetters, rep.RelaySamples = rc.unreachable, rc.deadLettered, rc.samples
	rep.Deliveries = cons.counts.deliveries.Load()
	rep.FirstHandlings = cons.counts.handled.Load()
	rep.InboxSkipped = cons.counts.suppressed.Load()
	rep.HandlerFailures = cons.counts.failed.Load()
	rep.DroppedAcks = cons.counts.redelivered.Load()

	p, err := readPlan(ctx, store)
	if err != nil {
		return rep, err
	}
	rep.CommittedEvents, rep.KeysWithEvents = p.events, len(p.keys)
	for _, ids := range p.keys {
		rep.MaxPerKey = max(rep.MaxPerKey, len(ids))
	}
	of, err := readOutbox(ctx, ob)
	if err != nil {
		return rep, err
	}
	rep.Staged, rep.OutboxPending, rep.OutboxDeadLetters = of.staged, of.pending, of.deadLetters
	rep.InboxHandled, rep.InboxDeadLetters, rep.InboxFailing = of.inboxHandled, of.inboxDeadLetters, of.inboxFailing
	bf, err := readBroker(ctx, brk, p)
	if err != nil {
		return rep, err
	}
	rep.BrokerStored, rep.BrokerUnique, rep.BrokerUnexpected, rep.BrokerMissing = bf.stored, bf.unique,
		bf.unexpected, bf.missing
	rep.OrderViolations, rep.OrderExamples, rep.KeysChecked = bf.orderViolations, bf.violations, bf.keysChecked
	rep.VersionMismatches = bf.versionMismatch
	if len(bf.violatingKeys) > 0 {
		if rep.OrderTimelines, err = keyTimelines(ctx, pool, pgx.Identifier{schema, "outbox_sent"}.Sanitize(), p,
			bf); err != nil {
			return rep, err
		}
	}
	ef, err := readEffects(ctx, pool, effects, p)
	if err != nil {
		return rep, err
	}
	rep.EffectRows, rep.UniqueHandled, rep.DuplicateEffects = ef.rows, ef.unique, ef.duplicates
	rep.EffectsMissing, rep.EffectsUnexpected, rep.DuplicateExamples = ef.missing, ef.unexpected, ef.examples
	rep.HandlerOrderViolations, rep.HandlerOrderExamples = ef.orderViolations, ef.orderExamples
	rep.Total = time.Since(began)
	step("done")
	return rep, nil
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: database URL: %w", err)
	}
	pc.MaxConns = 48
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: connect: %w", err)
	}
	return pool, nil
}

// faultLog records the faults injected by injectFaults. Read it through snapshot while injectFaults may run.
type faultLog struct {
	mu               sync.Mutex
	pgRestarts       []time.Duration // how long each restart kept PostgreSQL away
	pgLastEnd        time.Time
	brokerStops      int
	brokerWhat       string
	brokerDown       time.Duration // from the kill to the node's readiness again
	brokerLeaderless time.Duration // from the kill until the stream had a leader again
	brokerEnd        time.Time
}

type faultView struct {
	pgRestarts       []time.Duration
	brokerStops      int
	brokerWhat       string
	brokerDown       time.Duration
	brokerLeaderless time.Duration
}

func (f *faultLog) snapshot() faultView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return faultView{pgRestarts: slices.Clone(f.pgRestarts), brokerStops: f.brokerStops, brokerWhat: f.brokerWhat,
		brokerDown: f.brokerDown, brokerLeaderless: f.brokerLeaderless}
}

func (f *faultLog) lastEnd() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.brokerEnd.After(f.pgLastEnd) {
		return f.brokerEnd
	}
	return f.pgLastEnd
}

// injectFaults restarts PostgreSQL and injects the broker's fault at their times in the window (fractions of
// ProduceFor after start), one after the other. On NATS, spare holds one relay slot's kills back from KillMax
// before the broker's fault until the broker is back (see relays.spare).
func injectFaults(ctx context.Context, cfg Config, start time.Time, srv *pgtest.Server, brk broker, log *faultLog,
	spare func(bool), step func(string, ...any)) error {
	type fault struct {
		at     time.Duration
		broker bool
	}
	var plan []fault
	for _, f := range cfg.PostgresRestarts {
		plan = append(plan, fault{at: time.Duration(f * float64(cfg.ProduceFor))})
	}
	if cfg.BrokerOutage > 0 {
		plan = append(plan, fault{at: time.Duration(cfg.BrokerStopAt * float64(cfg.ProduceFor)), broker: true})
	}
	slices.SortFunc(plan, func(a, b fault) int { return int(a.at - b.at) })
	for _, f := range plan {
		if f.broker && cfg.Broker != BrokerRabbitMQ { // see relays.spare
			if err := sleep(ctx, time.Until(start.Add(f.at-cfg.KillMax))); err != nil {
				return err
			}
			spare(true) // a process of the spared slot running now is still up when the broker fails
			step("holding relay %s's kills back until the broker is back", sparedSlot)
		}
		if err := sleep(ctx, time.Until(start.Add(f.at))); err != nil {
			return err
		}
		if f.broker {
			bf, err := brk.fault(ctx, cfg.BrokerOutage, step)
			spare(false)
			if err != nil {
				return err
			}
			log.mu.Lock()
			log.brokerStops++
			log.brokerEnd = time.Now()
			log.brokerWhat, log.brokerDown, log.brokerLeaderless = bf.what, bf.down, bf.leaderless
			log.mu.Unlock()
			step("broker back after %.1fs", bf.down.Seconds())
			continue
		}
		step("restarting PostgreSQL (pg_ctl restart -m fast)")
		began := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := srv.Restart(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("faultsuite: restart PostgreSQL: %w", err)
		}
		log.mu.Lock()
		log.pgLastEnd = time.Now()
		log.pgRestarts = append(log.pgRestarts, log.pgLastEnd.Sub(began))
		log.mu.Unlock()
		step("PostgreSQL back after %.1fs", time.Since(began).Seconds())
	}
	return nil
}

// waitDrained waits until every planned message has an effect, the outbox holds nothing pending, and the broker
// has nothing left to deliver; it returns when that was first seen. It fails when the drain stalls: DrainTimeout
// without a message handled (a slow drain on a busy machine is not a failure; one that stopped is).
func waitDrained(ctx context.Context, cfg Config, pool *pgxpool.Pool, ob *outbox.Outbox, effects string,
	brk broker, cons *consumers, relays *relays, progress func(state string)) (time.Time, error) {
	deadline := time.NewTimer(cfg.DrainTimeout)
	defer deadline.Stop()
	lastHandled := cons.counts.handled.Load()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	state := "not checked yet"
	lastProgress := time.Now()
	for {
		if time.Since(lastProgress) >= cfg.ProgressEvery {
			progress(state)
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return time.Time{}, context.Cause(ctx)
		case err := <-relays.failed:
			return time.Time{}, err
		case <-cons.done:
			return time.Time{}, fmt.Errorf("faultsuite: the consumer router stopped: %w", cons.runErr)
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("faultsuite: the drain stalled: no message handled for %s: %s\n%s",
				cfg.DrainTimeout, state, stallDetail(ctx, pool, schema, effects, brk, cons))
		case <-tick.C:
		}
		if n := cons.counts.handled.Load(); n != lastHandled {
			lastHandled = n
			deadline.Reset(cfg.DrainTimeout) // Go 1.23 timers: no stale expiry is received after Reset
		}
		if cons.counts.handled.Load() < int64(cfg.Messages) {
			state = fmt.Sprintf("%d of %d messages handled by the consumers", cons.counts.handled.Load(),
				cfg.Messages)
			continue
		}
		now := time.Now()
		var handled int64
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM `+effects).Scan(&handled); err != nil {
			return time.Time{}, fmt.Errorf("faultsuite: count effects: %w", err)
		}
		st, err := ob.AllTenants().Stats(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("faultsuite: outbox stats: %w", err)
		}
		settled, cstate, err := atRest(ctx, brk, cons)
		if err != nil {
			return time.Time{}, err
		}
		state = fmt.Sprintf("%d of %d messages with an effect, %d pending in the outbox, consumer: %s", handled,
			cfg.Messages, st.Pending, cstate)
		if handled >= int64(cfg.Messages) && st.Pending == 0 && settled {
			return now, nil
		}
	}
}

// stallDetail says where the messages without an effect are when the drain stalls: the broker's and the handlers'
// state, the rows still in the outbox (with their leases, attempts and last errors), the dead letters, and the
// messages the relays recorded as sent that no handler applied (with their inbox entries).
func stallDetail(ctx context.Context, pool *pgxpool.Pool, schema, effects string, brk broker, cons *consumers) string {
	var b strings.Builder
	if _, cstate, err := atRest(ctx, brk, cons); err != nil {
		fmt.Fprintf(&b, "  broker: %v\n", err)
	} else {
		fmt.Fprintf(&b, "  broker and handlers: %s\n", cstate)
	}
	q := func(title, sql string) {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", title, err)
			return
		}
		defer rows.Close()
		fmt.Fprintf(&b, "  %s:\n", title)
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "    %v\n", err)
				return
			}
			fmt.Fprintf(&b, "    %v\n", vals)
		}
		if err := rows.Err(); err != nil {
			fmt.Fprintf(&b, "    %v\n", err)
		}
	}
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	q("outbox rows (message, key, seq, next attempt, lease owner, lease expiry, attempts, last error)",
		`SELECT message_id, partition_key, seq, next_attempt_at, lease_owner, lease_expires_at, attempts,
		    left(coalesce(last_error, ''), 200) FROM `+t("outbox")+` ORDER BY id LIMIT 10`)
	q("outbox dead letters (message, key, seq, attempts, last error)",
		`SELECT message_id, partition_key, seq, attempts, left(coalesce(last_error, ''), 200)
		FROM `+t("outbox_dead_letters")+` LIMIT 10`)
	q("sent without an effect (message, topic, attempts, sent at, inbox entries)",
		`SELECT s.message_id, s.topic, s.attempts, s.sent_at,
		    (SELECT count(*) FROM `+t("inbox")+` i WHERE i.message_id = s.message_id)
		FROM `+t("outbox_sent")+` s
		WHERE NOT EXISTS (SELECT 1 FROM `+effects+` e WHERE e.message_id = s.message_id) LIMIT 10`)
	return b.String()
}

// atRest reports whether the broker has nothing left to deliver and no handler is running.
func atRest(ctx context.Context, brk broker, cons *consumers) (bool, string, error) {
	ok, state, err := brk.settled(ctx)
	if err != nil {
		return false, "", err
	}
	running := cons.counts.inFlight.Load()
	return ok && running == 0, fmt.Sprintf("%s, %d handlers running", state, running), nil
}

// waitSettled waits until the broker has nothing left to deliver or to have acknowledged.
func waitSettled(ctx context.Context, brk broker, cons *consumers, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		settled, state, err := atRest(ctx, brk, cons)
		if err != nil {
			return err
		}
		if settled {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("faultsuite: the consumer did not settle within %s: %s", within, state)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}
