package logfollow

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/heartbeat"
	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
)

// Follower follows the global log under a lease and hands batches to a Handler, advancing its checkpoint in the
// handler's transaction. See the package documentation for the contract.
type Follower struct {
	pool    *pgxpool.Pool
	store   eventstore.Store
	handler Handler
	cfg     Config
	leases  *lease.Manager
	q       checkpointSQL
	filter  string

	running       atomic.Bool
	poolWarned    atomic.Bool // the pool's shortfall is logged once
	listenChecked atomic.Bool // checkListen found that the pool delivers notifications
	wake          chan struct{}
	// beat records, while Run runs, that this process runs the follower (active or standby) and when it last
	// applied events; nil when it cannot be made (heartbeats are best effort).
	beat *heartbeat.Beat
}

// New returns a Follower that reads store and keeps its checkpoint (and takes its lease) on pool. store may be
// any eventstore.Store, including the in-memory one; pool must reach a database migrated with stagehand.Migrate.
// Neither is closed by the Follower.
func New(pool *pgxpool.Pool, store eventstore.Store, h Handler, cfg *Config) (*Follower, error) {
	switch {
	case pool == nil:
		return nil, &ConfigError{Field: "pool", Reason: "must not be nil"}
	case store == nil:
		return nil, &ConfigError{Field: "store", Reason: "must not be nil"}
	case h == nil:
		return nil, &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if c.Owner == "" { // the lease's and the heartbeat's name of this process
		c.Owner = lease.DefaultOwner()
	}
	leases, err := lease.New(pool, &lease.Config{Schema: c.Schema, Owner: c.Owner, TTL: c.LeaseTTL,
		RenewInterval: c.LeaseRenewInterval, AcquireInterval: c.LeaseAcquireInterval, Logger: c.Logger})
	if err != nil {
		var le *lease.ConfigError
		if errors.As(err, &le) {
			return nil, &ConfigError{Field: "Lease" + le.Field, Reason: le.Reason}
		}
		return nil, err
	}
	beat, err := heartbeat.New(pool, heartbeat.Config{Schema: c.Schema, Kind: c.Kind, Name: c.Name,
		Instance: c.Owner, Logger: c.Logger})
	if err != nil {
		beat = nil
	}
	q, err := checkpointStatements(c.Schema)
	if err != nil {
		return nil, err
	}
	return &Follower{pool: pool, store: store, handler: h, cfg: c, leases: leases, q: q, filter: c.filterText(),
		wake: make(chan struct{}, 1), beat: beat}, nil
}

// Name returns the follower's name.
func (f *Follower) Name() string { return f.cfg.Name }

// Wake makes a waiting follower read the log now, for stores without notifications (the in-memory store) or
// after an in-process change. It never blocks.
func (f *Follower) Wake() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run follows the log until ctx ends (returning nil) or a record exhausts its attempts with no OnExhausted set
// (returning a *HandlerError). While another process holds the follower's lease, Run waits as a standby and
// takes over when that lease is released or expires. Run may be called again after it returns.
func (f *Follower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return f.errorf("%w", ErrAlreadyRunning)
	}
	defer f.running.Store(false)
	if short := f.poolShortfall(); short != "" && f.poolWarned.CompareAndSwap(false, true) {
		f.cfg.Logger.WarnContext(ctx, "stagehand: log follower's pool is smaller than what it holds at once; its "+
			"statements will wait for connections, and a lease renewal that waits too long loses the lease",
			"name", f.cfg.Name, "detail", short)
	}
	if f.beat != nil {
		beatCtx, stopBeat := context.WithCancel(ctx)
		beating := make(chan struct{})
		go func() {
			defer close(beating)
			f.beat.Run(beatCtx)
		}()
		defer func() {
			stopBeat()
			<-beating
		}()
	}
	var notified <-chan struct{}
	if n, ok := f.store.(notifier); ok && !f.cfg.DisableListen && n.Pool() != nil {
		if err := f.checkListen(ctx, n.Pool()); err != nil {
			return err
		}
		w, stop := pgnotify.Listen(ctx, n.Pool(), n.NotifyChannel(), f.cfg.ReconnectDelay, f.cfg.Logger)
		defer stop()
		notified = w
	}
	follow := func(ctx context.Context, l lease.Lease) error { return f.follow(ctx, l, notified) }
	if f.cfg.Share != nil {
		return f.leases.RunShared(ctx, f.cfg.Share, f.cfg.Partition, LeasePrefix+f.cfg.Name, follow)
	}
	return f.leases.Run(ctx, LeasePrefix+f.cfg.Name, follow)
}

// checkListen refuses, once per follower, to listen for wake-ups on a pool that cannot deliver them (a pooler in
// transaction pooling mode). When the check cannot run (the database unreachable), the follower listens as usual.
func (f *Follower) checkListen(ctx context.Context, pool *pgxpool.Pool) error {
	if f.listenChecked.Load() {
		return nil
	}
	reason, err := pgnotify.CheckDelivery(ctx, pool)
	if err != nil {
		f.cfg.Logger.DebugContext(ctx, "stagehand: could not check that the event store's pool delivers "+
			"notifications", "name", f.cfg.Name, "error", err)
		return nil
	}
	if reason != "" {
		return f.errorf("%w: it listens for wake-up notifications on the event store's pool, and %s; set "+
			"DisableListen in its configuration to poll only, or give it an event store whose pool connects to "+
			"PostgreSQL directly", stagehand.ErrPooledConnection, reason)
	}
	f.listenChecked.Store(true)
	return nil
}

// progress is the follower's view while it holds the lease.
type progress struct {
	pos          int64
	reset        bool  // a reset was requested
	reload       bool  // re-read the checkpoint row before the next page
	isolateUntil int64 // after a failed batch: one record per transaction up to this position
	failPos      int64 // the record being retried
	attempts     int
	infraDelay   time.Duration
}

func (f *Follower) follow(ctx context.Context, l lease.Lease, notified <-chan struct{}) error {
	var p progress
	for {
		err := f.start(ctx, &p)
		if err == nil {
			break
		}
		if !f.pause(ctx, &p, err, "start") {
			return nil
		}
	}
	f.cfg.Logger.InfoContext(ctx, "stagehand: log follower running", "name", f.cfg.Name, "position", p.pos,
		"token", l.Token)
	err := f.loop(ctx, l, &p, notified)
	f.setState(ctx, l, err)
	return err
}

// prefetched is the next page, read while the current batch commits.
type prefetched struct {
	after int64
	done  chan struct{}
	page  eventstore.LogPage
	err   error
}

func (f *Follower) readLog(ctx context.Context, after int64) (eventstore.LogPage, error) {
	return f.store.ReadLog(ctx, eventstore.LogQuery{After: after, Limit: f.cfg.BatchSize,
		EventTypes: f.cfg.EventTypes, StreamTypes: f.cfg.StreamTypes, Tenants: f.cfg.Tenants,
		Deletions: f.cfg.Deletions})
}

func (f *Follower) prefetch(ctx context.Context, after int64) *prefetched {
	pf := &prefetched{after: after, done: make(chan struct{})}
	go func() {
		defer close(pf.done)
		pf.page, pf.err = f.readLog(ctx, after)
	}()
	return pf
}

// ready reports whether pf's read has finished.
func ready(pf *prefetched) bool {
	select {
	case <-pf.done:
		return true
	default:
		return false
	}
}

func (f *Follower) loop(ctx context.Context, l lease.Lease, p *progress, notified <-chan struct{}) error {
	// While catching up, the next page is read while the current batch commits, so a page costs about
	// max(read, commit) instead of their sum.
	var pf *prefetched
	defer func() {
		if pf != nil {
			<-pf.done
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil
		}
		var next *prefetched
		next, pf = pf, nil
		if next != nil {
			<-next.done
		}
		if p.reload {
			if err := f.load(ctx, p); err != nil {
				if !f.pause(ctx, p, err, "read checkpoint") {
					return nil
				}
				continue
			}
			p.reload = false
		}
		if p.reset {
			if err := f.reset(ctx, l, p); err != nil {
				if errors.Is(err, lease.ErrFenced) {
					return err
				}
				if !f.pause(ctx, p, err, "reset") {
					return nil
				}
			}
			continue
		}
		var page eventstore.LogPage
		var err error
		if next != nil && next.after == p.pos {
			page, err = next.page, next.err
		} else {
			page, err = f.readLog(ctx, p.pos)
		}
		if err != nil {
			if done, stop := f.readFailed(ctx, l, p, err, &pf); done {
				return stop
			}
			continue
		}
		recs, last := f.batch(p, page)
		if last <= p.pos {
			// After a poll or a Wake, re-read the checkpoint row to notice resets and operator changes made while
			// idle; a notification only means new events, so it goes straight to the log.
			p.reload = !f.wait(ctx, notified)
			continue
		}
		b := &txBatch{recs: recs, last: last, full: last-p.pos >= int64(f.cfg.BatchSize) && p.pos >= p.isolateUntil}
		if b.full {
			pf = f.prefetch(ctx, last) // a full page: more is probably waiting
		}
		if done, stop := f.committed(ctx, l, p, b, f.commit(ctx, l, p, b, &pf)); done {
			return stop
		}
	}
}

// readFailed deals with err, the failure to read the page after p.pos, and reports whether the loop ends (with
// stop to return). An event that cannot be read is passed when it is another partition's (Select), and fails like
// a handler that can never succeed on it when it is the follower's own (its failure mode applies: stop naming it,
// or give up on it and go on). Anything else pauses and retries.
func (f *Follower) readFailed(ctx context.Context, l lease.Lease, p *progress, err error, pf **prefetched) (
	done bool, stop error) {
	var rerr *eventstore.RecordError
	if !errors.As(err, &rerr) || rerr.Record.Position <= p.pos {
		return !f.pause(ctx, p, err, "read log"), nil
	}
	if f.cfg.Select != nil && !f.cfg.Select(rerr.Record) {
		b := &txBatch{last: rerr.Record.Position}
		return f.committed(ctx, l, p, b, f.commit(ctx, l, p, b, pf))
	}
	stop = f.failed(ctx, l, p, []eventstore.Record{rerr.Record}, &handlerFailure{err: stagehand.Permanent(err)})
	return stop != nil, stop
}

// committed applies the outcome err of committing b and reports whether the loop ends (with stop to return): the
// checkpoint moves on, the term is over (fenced), the checkpoint moved under the follower (reload it), the
// handler failed on a record (retry, park or stop), or anything else pauses and retries.
func (f *Follower) committed(ctx context.Context, l lease.Lease, p *progress, b *txBatch, err error) (
	done bool, stop error) {
	switch {
	case err == nil:
		p.pos, p.infraDelay = b.last, 0
		if p.failPos != 0 && p.failPos <= b.last {
			p.failPos, p.attempts = 0, 0
		}
	case errors.Is(err, lease.ErrFenced):
		return true, err
	case errors.Is(err, errMoved):
		p.reload = true
	case isHandlerFailure(err):
		if stop := f.failed(ctx, l, p, b.recs, err); stop != nil {
			return true, stop
		}
	default:
		return !f.pause(ctx, p, err, "commit"), nil
	}
	return false, nil
}

// batch selects the records of a page to handle and the position the checkpoint moves to.
func (f *Follower) batch(p *progress, page eventstore.LogPage) ([]eventstore.Record, int64) {
	recs := page.Records
	if f.cfg.Select != nil {
		kept := recs[:0:0]
		for _, r := range recs {
			if f.cfg.Select(r) {
				kept = append(kept, r)
			}
		}
		recs = kept
	}
	last := page.Last
	if p.pos < p.isolateUntil && len(recs) > 1 {
		recs, last = recs[:1], recs[0].Position
	}
	return recs, last
}

var errMoved = errors.New("checkpoint moved by someone else")

type handlerFailure struct {
	err   error
	infra bool // the connection or the context failed, not the handler's logic
}

func (h *handlerFailure) Error() string { return h.err.Error() }
func (h *handlerFailure) Unwrap() error { return h.err }

func isHandlerFailure(err error) bool {
	var hf *handlerFailure
	return errors.As(err, &hf)
}

// txBatch is what one transaction applies: a page, or several pages while catching up.
type txBatch struct {
	recs []eventstore.Record
	last int64
	full bool // the last page was full: more is probably waiting
}

// commit handles b and moves the checkpoint from p.pos to b.last in one fenced transaction. While pages come
// back full it goes on with the prefetched next page in the same transaction, up to PagesPerTx pages, so one
// commit serves them all; b then holds every record handled and the final position. It never waits for a page
// still being read: the transaction holds a connection, and the read takes another.
func (f *Follower) commit(ctx context.Context, l lease.Lease, p *progress, b *txBatch, pf **prefetched) error {
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return f.errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fail := func(err error) error {
		return &handlerFailure{err: err, infra: ctx.Err() != nil || tx.Conn().IsClosed() || isConnErr(err)}
	}
	if len(b.recs) > 0 {
		if err := f.handle(ctx, tx, b.recs); err != nil {
			return fail(err)
		}
	}
	for pages := 1; pages < f.cfg.PagesPerTx && b.full && *pf != nil; pages++ {
		next := *pf
		if !ready(next) {
			// Not read yet: commit what is handled instead of waiting, with this transaction's connection held,
			// for a read that needs another connection of the pool (the pool may be full of transactions
			// waiting for locks this one holds). The loop takes the page when it is read.
			break
		}
		if next.err != nil || next.after != b.last {
			break // the loop deals with it
		}
		recs, last := f.batch(p, next.page)
		if last <= b.last {
			break
		}
		*pf = nil
		full := last-b.last >= int64(f.cfg.BatchSize)
		if full {
			*pf = f.prefetch(ctx, last)
		}
		b.recs, b.last, b.full = append(b.recs, recs...), last, full
		if len(recs) > 0 {
			if err := f.handle(ctx, tx, recs); err != nil {
				return fail(err)
			}
		}
	}
	var lastEventAt *time.Time
	if len(b.recs) > 0 {
		t := b.recs[len(b.recs)-1].RecordedAt
		lastEventAt = &t
	}
	if err := f.advance(ctx, tx, l, p, b.last, lastEventAt); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return f.errorf("commit checkpoint %d: %w", b.last, err)
	}
	if len(b.recs) > 0 {
		f.beat.Add(int64(len(b.recs)), time.Now())
	}
	if f.cfg.AfterCommit != nil && len(b.recs) > 0 {
		f.cfg.AfterCommit()
	}
	return nil
}

func (f *Follower) handle(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return f.handler(ctx, tx, recs)
}

// advance moves the checkpoint from p.pos to last in tx, fenced: in one statement it locks the lease row FOR
// SHARE and updates the checkpoint only while l holds the lease and the checkpoint is still at p.pos. It notes a
// reset request.
func (f *Follower) advance(ctx context.Context, tx pgx.Tx, l lease.Lease, p *progress, last int64,
	lastEventAt *time.Time) error {
	err := tx.QueryRow(ctx, f.q.advance.SQL, f.q.advance.Args(&checkpoint{Name: f.cfg.Name, Position: last,
		LastEventAt: lastEventAt, From: p.pos, FenceName: l.Name, FenceOwner: l.Owner, FenceToken: l.Token})...).
		Scan(&p.reset)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := f.leases.CheckTx(ctx, tx, l); err != nil {
			return err // fenced out: another holder took over
		}
		return errMoved
	}
	if err != nil {
		return f.errorf("advance checkpoint to %d: %w", last, err)
	}
	return nil
}

// failed deals with a handler failure; it returns non-nil when the follower must stop.
func (f *Follower) failed(ctx context.Context, l lease.Lease, p *progress, recs []eventstore.Record,
	err error) error {
	var hf *handlerFailure
	errors.As(err, &hf)
	if hf.infra {
		f.pause(ctx, p, hf.err, "handle")
		return nil
	}
	if len(recs) > 1 {
		// Find the failing record: one record per transaction up to the end of this batch.
		p.isolateUntil = recs[len(recs)-1].Position
		f.cfg.Logger.DebugContext(ctx, "stagehand: batch failed; isolating the failing event", "name", f.cfg.Name,
			"from", recs[0].Position, "to", p.isolateUntil, "error", hf.err)
		return nil
	}
	rec := recs[0]
	if p.failPos != rec.Position {
		p.failPos, p.attempts = rec.Position, 0
	}
	p.attempts++
	f.noteError(ctx, rec.Position, p.attempts, hf.err)
	exhausted := p.attempts >= f.cfg.MaxAttempts || errors.Is(hf.err, stagehand.ErrPermanent)
	f.cfg.Logger.WarnContext(ctx, "stagehand: log follower handler failed", "name", f.cfg.Name,
		"position", rec.Position, "event_type", rec.Type, "attempt", p.attempts, "exhausted", exhausted,
		"error", hf.err)
	if !exhausted {
		backoff.Sleep(ctx, f.cfg.retryDelay(p.attempts))
		return nil
	}
	herr := &HandlerError{Kind: f.cfg.Kind, Name: f.cfg.Name, Record: rec, Attempts: p.attempts, Err: hf.err}
	if f.cfg.OnExhausted == nil {
		return herr
	}
	for ctx.Err() == nil {
		err := f.giveUp(ctx, l, p, herr)
		switch {
		case err == nil:
			p.pos, p.failPos, p.attempts = rec.Position, 0, 0
			return nil
		case errors.Is(err, lease.ErrFenced):
			return err
		case errors.Is(err, errMoved):
			p.reload = true
			return nil
		}
		if !f.pause(ctx, p, err, "give up on event") {
			return nil
		}
	}
	return nil
}

// giveUp runs OnExhausted for the failed record and moves the checkpoint past it, in one fenced transaction.
func (f *Follower) giveUp(ctx context.Context, l lease.Lease, p *progress, herr *HandlerError) error {
	rec := herr.Record
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return f.errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := f.cfg.OnExhausted(ctx, tx, herr); err != nil {
		return f.errorf("give up on the event at position %d: %w", rec.Position, err)
	}
	if err := f.advance(ctx, tx, l, p, rec.Position, nil); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return f.errorf("commit: %w", err)
	}
	return nil
}

// noteError records the failing position and its error for status readers (best effort, not fenced: it
// changes no position).
func (f *Follower) noteError(ctx context.Context, pos int64, attempts int, err error) {
	_, qerr := f.pool.Exec(ctx, f.q.noteError.SQL, f.q.noteError.Args(&checkpoint{Name: f.cfg.Name,
		Error: err.Error(), FailingPosition: pos, Attempts: attempts})...)
	if qerr != nil && ctx.Err() == nil {
		f.cfg.Logger.DebugContext(ctx, "stagehand: could not record a handler error", "name", f.cfg.Name,
			"error", qerr)
	}
}

// setState records why the follower stopped holding the lease: failed (with the error) or stopped. It is fenced,
// so a follower that lost its lease does not overwrite its successor's state.
func (f *Follower) setState(ctx context.Context, l lease.Lease, runErr error) {
	if errors.Is(runErr, lease.ErrLost) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	state, msg := "stopped", (*string)(nil)
	if runErr != nil {
		state = "failed"
		s := runErr.Error()
		msg = &s
	}
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if err := f.leases.CheckTx(ctx, tx, l); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, f.q.setState.SQL, f.q.setState.Args(&checkpoint{Name: f.cfg.Name, State: state,
			LastError: msg})...)
		return err
	})
	if err != nil {
		f.cfg.Logger.DebugContext(ctx, "stagehand: could not record the follower's state", "name", f.cfg.Name,
			"error", err)
	}
}

// start creates or updates the checkpoint row and loads it.
func (f *Follower) start(ctx context.Context, p *progress) error {
	err := f.pool.QueryRow(ctx, f.q.start.SQL, f.q.start.Args(&checkpoint{Name: f.cfg.Name, Kind: f.cfg.Kind,
		ResetGroup: f.cfg.ResetGroup, Filter: f.filter})...).Scan(&p.pos, &p.reset)
	if err != nil {
		return f.errorf("start checkpoint (did you run stagehand.Migrate?): %w", err)
	}
	return nil
}

func (f *Follower) load(ctx context.Context, p *progress) error {
	err := f.pool.QueryRow(ctx, f.q.load.SQL, f.q.load.Args(&checkpoint{Name: f.cfg.Name})...).Scan(&p.pos, &p.reset)
	if err != nil {
		return f.errorf("read checkpoint: %w", err)
	}
	return nil
}

// reset clears the follower's state (OnReset) and sets every checkpoint of its reset group back to the start,
// in one transaction that holds the lease and locks the group's checkpoint rows.
func (f *Follower) reset(ctx context.Context, l lease.Lease, p *progress) error {
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return f.errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var requested bool
	group := &checkpoint{ResetGroup: f.cfg.ResetGroup}
	if err := tx.QueryRow(ctx, f.q.lockResetGroup.SQL, f.q.lockResetGroup.Args(group)...).
		Scan(&requested); err != nil {
		return f.errorf("lock reset group %q: %w", f.cfg.ResetGroup, err)
	}
	if requested {
		if err := f.leases.CheckTx(ctx, tx, l); err != nil {
			return err
		}
		if f.cfg.OnReset != nil {
			if err := f.cfg.OnReset(ctx, tx); err != nil {
				return f.errorf("reset: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, f.q.resetGroup.SQL, f.q.resetGroup.Args(group)...); err != nil {
			return f.errorf("reset checkpoints of %q: %w", f.cfg.ResetGroup, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return f.errorf("commit reset: %w", err)
	}
	if requested {
		f.cfg.Logger.InfoContext(ctx, "stagehand: log follower reset", "name", f.cfg.Name,
			"group", f.cfg.ResetGroup)
	}
	p.reset, p.reload = false, true
	p.failPos, p.attempts, p.isolateUntil = 0, 0, 0
	return nil
}

// pause logs an infrastructure error and waits with a growing delay (up to PollInterval). It returns false when
// ctx ended.
func (f *Follower) pause(ctx context.Context, p *progress, err error, what string) bool {
	if ctx.Err() != nil {
		return false
	}
	p.infraDelay = min(max(2*p.infraDelay, 50*time.Millisecond), f.cfg.PollInterval)
	f.cfg.Logger.WarnContext(ctx, "stagehand: log follower error; retrying", "name", f.cfg.Name, "step", what,
		"retry_in", p.infraDelay, "error", err)
	p.reload = true
	return backoff.Sleep(ctx, p.infraDelay)
}

// wait waits for a wake-up and reports whether it was a notification of new events.
func (f *Follower) wait(ctx context.Context, notified <-chan struct{}) bool {
	t := time.NewTimer(f.cfg.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-notified:
		return true
	case <-f.wake:
	case <-t.C:
	}
	return false
}

// isConnErr reports errors of the connection rather than of a statement.
func isConnErr(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.Timeout(err) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08 (connection exception), 57P01-57P03 (admin shutdown, crash shutdown, cannot connect now).
		return pe.Code[:2] == "08" || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	return false
}
