package scalebench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
)

// A worker process is the test binary re-executed with envRole set. It runs one of four kinds of worker until its
// standard input ends (the parent closed it, or died) or it gets SIGTERM, and reports on standard output, one
// unbuffered line per event, so a line written before a SIGKILL is never lost:
//
//	ready                the worker is connected and running (a projection: waiting for "go")
//	count <n>            messages published (relays) or events applied (projections) so far, every 50 ms when
//	                     it changed
//	part <p> <n>         a relay's publishes of messages whose key falls in partition p, so far (keys named by
//	                     Keys carry their partition)
//
// Projection workers wait for a line "go <name>" on standard input and then run the projection (or the raw
// follower) of that name; a later "go <name>" stops it and starts the next. Relays start at once.
//
// Roles:
//
//	relay      an outbox relay, leader-elected and partitioned as documented for scale-out, through a Watermill
//	           router to a publisher that accepts every message at once (the broker is not measured)
//	rawrelay   the hand-written ceiling: goroutines claiming FOR UPDATE SKIP LOCKED and moving the rows to a
//	           ledger, on a table of the same shape, with the same no-op publish
//	projection a partitioned projection whose handler upserts one read-model row per event
//	rawproj    the hand-written ceiling: goroutines, each owning a hash partition of the streams, reading the log
//	           in pages, upserting the same rows and advancing a checkpoint in the same transaction

const (
	envRole       = "STAGEHAND_SCALEBENCH_ROLE"
	envDB         = "STAGEHAND_SCALEBENCH_DB"
	envSchema     = "STAGEHAND_SCALEBENCH_SCHEMA"
	envSlot       = "STAGEHAND_SCALEBENCH_SLOT"
	envPartitions = "STAGEHAND_SCALEBENCH_PARTITIONS" // relay and projection partitions (all processes)
	envOwn        = "STAGEHAND_SCALEBENCH_OWN"        // the raw roles: which partitions (or claim loops) are this process's, "0,1,5"
	envTTL        = "STAGEHAND_SCALEBENCH_TTL"        // LeaderTTL of relays, LeaseTTL of projections
	envBatch      = "STAGEHAND_SCALEBENCH_BATCH"
	// The relays' PollingInterval (default 1s, the library's): wake-ups come by NOTIFY, so it matters for the
	// sweep for missed promotions, which runs every 5 polls (at least every second).
	envPoll = "STAGEHAND_SCALE_POLL"
)

// leaderElection is the relays' election name; their partition leases are leaderElection + "/" + partition.
const leaderElection = "scale"

// RunChildIfRequested runs a worker process and exits when this process was started as one; otherwise it returns
// at once. Call it first in the test binary's TestMain.
func RunChildIfRequested() {
	role := os.Getenv(envRole)
	run := map[string]func(context.Context, *childEnv) error{
		"relay": runRelay, "rawrelay": runRawRelay, "projection": runProjection, "rawproj": runRawProjection,
	}[role]
	if run == nil {
		return
	}
	if err := runChild(run); err != nil {
		fmt.Fprintf(os.Stderr, "scalebench: %s process failed: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childEnv is what every worker process has: its settings, its pool, its report lines and its parent's commands.
type childEnv struct {
	schema     string
	slot       string
	partitions int
	own        []int
	ttl        time.Duration
	batch      int
	poll       time.Duration
	pool       *pgxpool.Pool
	out        *lines
	logger     *slog.Logger
	commands   <-chan string // lines from standard input
}

func runChild(run func(context.Context, *childEnv) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	e := &childEnv{schema: os.Getenv(envSchema), slot: os.Getenv(envSlot), out: &lines{w: os.Stdout},
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var err error
	if e.partitions, err = strconv.Atoi(os.Getenv(envPartitions)); err != nil {
		return fmt.Errorf("%s: %w", envPartitions, err)
	}
	if e.own, err = parseInts(os.Getenv(envOwn)); err != nil {
		return fmt.Errorf("%s: %w", envOwn, err)
	}
	if e.ttl, err = time.ParseDuration(os.Getenv(envTTL)); err != nil {
		return fmt.Errorf("%s: %w", envTTL, err)
	}
	if e.batch, err = strconv.Atoi(os.Getenv(envBatch)); err != nil {
		return fmt.Errorf("%s: %w", envBatch, err)
	}
	e.poll = time.Second
	if d, err := time.ParseDuration(os.Getenv(envPoll)); err == nil && d > 0 {
		e.poll = d
	}
	// Standard input carries the parent's commands; its end means the parent is done with this process (or died,
	// which closes the pipe too), so no worker outlives its run.
	commands := make(chan string)
	e.commands = commands
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			select {
			case commands <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		stop()
	}()
	pc, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	// A partitioned projection holds a listening connection per partition, led or not, besides its transactions
	// and the page it reads ahead.
	pc.MaxConns = int32(3*e.partitions + 4)
	if e.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	defer e.pool.Close()
	err = run(ctx, e)
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || err == nil) {
		return nil
	}
	return err
}

// reportCounts writes "count <n>" every 50 ms while count changes, until ctx ends; parts, when set, adds a "part"
// line per partition whose count changed.
func (e *childEnv) reportCounts(ctx context.Context, count *atomic.Int64, parts []atomic.Int64) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last int64
	lastParts := make([]int64, len(parts))
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for p := range parts {
			if n := parts[p].Load(); n != lastParts[p] {
				e.out.printf("part %d %d", p, n)
				lastParts[p] = n
			}
		}
		if n := count.Load(); n != last {
			e.out.printf("count %d", n)
			last = n
		}
	}
}

// runRelay runs one stagehand relay: leader election with e.partitions partitions, shared among the relay
// processes (each leads its fair share), publishing to a publisher that accepts everything.
func runRelay(ctx context.Context, e *childEnv) error {
	ob, err := outbox.New(e.pool, &outbox.Config{Schema: e.schema, Logger: e.logger})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer ob.Close()
	var count atomic.Int64
	parts := make([]atomic.Int64, e.partitions)
	relay, err := ob.NewRelay(&outbox.RelayConfig{
		BatchSize:              e.batch,
		PollingInterval:        e.poll,
		MaxDegreeOfParallelism: 4,
		ProcessorID:            "scale-" + e.slot,
		LeaderElection:         leaderElection,
		LeaderTTL:              e.ttl,
		Partitions:             e.partitions,
		Logger:                 e.logger,
		Hooks: outbox.Hooks{Delivered: func(_ context.Context, d outbox.Delivery, o outbox.Outcome, _ error,
			_ time.Duration) {
			if o != outbox.Published {
				return
			}
			count.Add(1)
			if p, ok := KeyPartition(d.PartitionKey); ok && p < len(parts) {
				parts[p].Add(1)
			}
		}},
	})
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer relay.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second},
		watermill.NewSlogLogger(e.logger))
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	relay.AddToRouter(router, acceptAll{}, nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-router.Running():
		case <-rctx.Done():
			return
		}
		e.out.printf("ready")
		e.reportCounts(rctx, &count, parts)
	}()
	if err := router.Run(rctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// acceptAll is the broker as the relays see it: every publish succeeds at once.
type acceptAll struct{}

func (acceptAll) Publish(string, ...*message.Message) error { return nil }
func (acceptAll) Close() error                              { return nil }

// runRawRelay runs len(e.own) claim loops on the raw outbox: claim a batch FOR UPDATE SKIP LOCKED under a lease,
// publish, move the batch to the raw ledger. No per-key order, no fencing, no retries.
func runRawRelay(ctx context.Context, e *childEnv) error {
	claim, mark := rawRelayStatements(e.schema)
	var count atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(e.own))
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range e.own {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lctx.Err() == nil {
				n, err := rawClaimAndMark(lctx, e.pool, claim, mark, e.batch)
				if err != nil {
					if lctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				count.Add(int64(n))
				if n == 0 {
					sleep(lctx, 10*time.Millisecond)
				}
			}
		}()
	}
	e.out.printf("ready")
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.reportCounts(lctx, &count, nil)
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// rawRelayStatements are the ceiling's claim and mark (the tables are created by createRawTables).
func rawRelayStatements(schema string) (claim, mark string) {
	tbl, sent := qualify(schema, "raw_outbox"), qualify(schema, "raw_sent")
	// The ids are computed once (an InitPlan), as the relay's statements do: with "id IN (SELECT ... FOR UPDATE
	// SKIP LOCKED)", concurrent claims re-evaluate the subquery for rows another claim changed, and eight claim
	// loops drove each other into statements running for minutes.
	claim = `UPDATE ` + tbl + ` SET lease_until = now() + interval '30 seconds'
		WHERE id = ANY (ARRAY(SELECT id FROM ` + tbl + ` WHERE lease_until IS NULL OR lease_until < now()
		             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
		RETURNING id, topic, partition_key, payload`
	mark = `WITH done AS (DELETE FROM ` + tbl + ` WHERE id = ANY($1) RETURNING message_id, topic, created_at)
		INSERT INTO ` + sent + ` (message_id, topic, created_at, sent_at) SELECT message_id, topic, created_at, now() FROM done`
	return claim, mark
}

func rawClaimAndMark(ctx context.Context, pool *pgxpool.Pool, claim, mark string, batch int) (int, error) {
	rows, err := pool.Query(ctx, claim, batch)
	if err != nil {
		return 0, fmt.Errorf("raw claim: %w", err)
	}
	var ids []int64
	pub := acceptAll{}
	for rows.Next() {
		var (
			id         int64
			topic, key string
			payload    []byte
		)
		if err := rows.Scan(&id, &topic, &key, &payload); err != nil {
			rows.Close()
			return 0, fmt.Errorf("raw claim: %w", err)
		}
		msg := message.NewMessage(strconv.FormatInt(id, 10), payload)
		msg.Metadata.Set("partition-key", key)
		if err := pub.Publish(topic, msg); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("raw claim: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := pool.Exec(ctx, mark, ids); err != nil {
		return 0, fmt.Errorf("raw mark: %w", err)
	}
	return len(ids), nil
}

// readModelUpsert is the projections' one write per event, the same statement on both sides (each side has its
// own table, table).
func readModelUpsert(schema, table string) string {
	return `INSERT INTO ` + qualify(schema, table) + ` AS r (tenant_id, stream_id, events, last_position)
		VALUES ($1, $2, 1, $3)
		ON CONFLICT (tenant_id, stream_id) DO UPDATE SET events = r.events + 1, last_position = EXCLUDED.last_position`
}

// runProjection runs the projection named by each "go <name>" command, e.partitions partitions, leases of e.ttl.
func runProjection(ctx context.Context, e *childEnv) error {
	store, err := eventstore.NewPostgres(e.pool, &eventstore.PostgresConfig{Schema: e.schema, Logger: e.logger})
	if err != nil {
		return fmt.Errorf("event store: %w", err)
	}
	defer store.Close()
	upsert := readModelUpsert(e.schema, "read_model")
	var count atomic.Int64
	h := projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev projection.Event) error {
		if _, err := tx.Exec(ctx, upsert, ev.Tenant, ev.StreamID, ev.Position); err != nil {
			return fmt.Errorf("read model: %w", err)
		}
		count.Add(1) // handled, not yet committed: the parent times completion from the checkpoints
		return nil
	})
	return e.serve(ctx, &count, func(ctx context.Context, name string) error {
		p, err := projection.New(e.pool, store, h, &projection.Config{Name: name, Schema: e.schema,
			Partitions: e.partitions, BatchSize: e.batch, Owner: "proj-" + e.slot, LeaseTTL: e.ttl,
			PollInterval: 100 * time.Millisecond, Logger: e.logger})
		if err != nil {
			return fmt.Errorf("projection: %w", err)
		}
		defer p.Close()
		if err := p.Run(ctx); err != nil {
			return fmt.Errorf("projection %s: %w", name, err)
		}
		return nil
	})
}

// serve says ready, then runs work for each "go <name>" command (stopping the previous one first) until ctx ends.
func (e *childEnv) serve(ctx context.Context, count *atomic.Int64, work func(context.Context, string) error) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.reportCounts(sctx, count, nil)
	}()
	e.out.printf("ready")
	errs := make(chan error, 1)
	stopWork := func() {}
	defer func() { stopWork() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return err
		case cmd := <-e.commands:
			word, name, _ := strings.Cut(cmd, " ")
			if word != "go" || name == "" {
				return fmt.Errorf("unknown command %q", cmd)
			}
			stopWork()
			wctx, wcancel := context.WithCancel(sctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if err := work(wctx, name); err != nil && wctx.Err() == nil {
					select {
					case errs <- err:
					default:
					}
				}
			}()
			stopWork = func() { wcancel(); <-done }
		}
	}
}

// runRawProjection runs, for each "go <name>", one follower per partition in e.own: read a page of the log after
// the partition's checkpoint (its streams only, filtered by the database), upsert the read model per event and
// advance the checkpoint in the same transaction. No gap detection, no lease, no fencing.
func runRawProjection(ctx context.Context, e *childEnv) error {
	upsert := readModelUpsert(e.schema, "raw_read_model")
	read := `SELECT position, tenant_id, stream_id FROM ` + qualify(e.schema, "events") + `
		WHERE position > $1 AND abs(hashtext(stream_id) % $2) = $3 ORDER BY position LIMIT $4`
	advance := `UPDATE ` + qualify(e.schema, "raw_checkpoints") + ` SET position = $3 WHERE name = $1 AND part = $2`
	var count atomic.Int64
	return e.serve(ctx, &count, func(ctx context.Context, name string) error {
		g, gctx := errgroup.WithContext(ctx)
		for _, part := range e.own {
			g.Go(func() error {
				var pos int64
				if err := e.pool.QueryRow(gctx, `SELECT position FROM `+qualify(e.schema, "raw_checkpoints")+
					` WHERE name = $1 AND part = $2`, name, part).Scan(&pos); err != nil {
					return fmt.Errorf("raw checkpoint %s/%d: %w", name, part, err)
				}
				for gctx.Err() == nil {
					n := 0
					err := pgx.BeginFunc(gctx, e.pool, func(tx pgx.Tx) error {
						rows, err := tx.Query(gctx, read, pos, e.partitions, part, e.batch)
						if err != nil {
							return err
						}
						type rec struct {
							pos            int64
							tenant, stream string
						}
						var recs []rec
						for rows.Next() {
							var r rec
							if err := rows.Scan(&r.pos, &r.tenant, &r.stream); err != nil {
								rows.Close()
								return err
							}
							recs = append(recs, r)
						}
						if err := rows.Err(); err != nil {
							return err
						}
						for _, r := range recs {
							if _, err := tx.Exec(gctx, upsert, r.tenant, r.stream, r.pos); err != nil {
								return err
							}
						}
						if len(recs) == 0 {
							return nil
						}
						n = len(recs)
						_, err = tx.Exec(gctx, advance, name, part, recs[len(recs)-1].pos)
						if err == nil {
							pos = recs[len(recs)-1].pos
						}
						return err
					})
					if err != nil {
						if gctx.Err() != nil {
							return nil
						}
						return fmt.Errorf("raw follower %s/%d: %w", name, part, err)
					}
					count.Add(int64(n))
					if n == 0 {
						sleep(gctx, 10*time.Millisecond)
					}
				}
				return nil
			})
		}
		return g.Wait()
	})
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// lines writes whole lines to w, one write each.
type lines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lines) printf(format string, args ...any) {
	s := fmt.Sprintf(format, args...) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s)
}
