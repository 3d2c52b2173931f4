package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand/internal/lease"
)

// Relay delivers staged messages. It is a Watermill message.Subscriber: Subscribe(ctx, topic) delivers the rows
// staged for topic, one Watermill message per row (UUID = message ID, metadata = the staged metadata plus the
// standard headers). Ack marks the row sent; Nack, an AckDeadline without an answer, or the relay's death leave it
// for a retry (see RelayConfig). AddToRouter wires it to any Watermill publisher through a message.Router, and Drain
// publishes what is due once, without a background loop.
//
// Several relays, in one process or many, may work on one outbox: rows are claimed under leases with
// FOR UPDATE SKIP LOCKED, and a relay only marks rows it still holds. With RelayConfig.LeaderElection only the
// leader claims, fenced by the leader lease's token on every claim and mark (a demoted leader's writes are
// rejected with ErrFenced); with RelayConfig.Partitions the claim runs as independent loops per partition, led
// separately and shared among the relays. Under leader election, use one subscription per relay (SubscribeTopics
// for several topics): subscriptions of one relay contend for the same leases as the same owner, so only one of
// them leads at a time.
//
// Per-key order: messages sharing a partition key are delivered one at a time in staging-commit order, and a
// message is delivered only after every earlier message of its key was acknowledged, so the first publication of
// each reaches the broker in that order, whatever the number of relays and MaxDegreeOfParallelism. A message
// that fails holds back only the later messages of its own key; a dead-lettered one keeps holding them until it is
// redriven or discarded (unless RelayConfig.ReleaseKeyOnDeadLetter).
type Relay struct {
	o      *Outbox
	s      settings
	st     relayStatements
	owner  string         // names this relay in the leader leases (and, with a suffix per term, in row leases)
	leases *lease.Manager // nil without LeaderElection
	tel    *relayTelemetry

	fenceChecked atomic.Bool
	maint        *relayMaintenance // nil when RelayConfig.Maintenance.Disabled

	mu     sync.Mutex
	closed bool
	groups map[*group]struct{}
	wg     sync.WaitGroup
}

// NewRelay returns a relay with the given processing settings (nil: Balanced()). Invalid settings return a
// *ConfigError naming the field. With RelayConfig.SingleWriter it logs a warning that the relay runs unfenced.
func (o *Outbox) NewRelay(cfg *RelayConfig) (*Relay, error) {
	s, err := cfg.settings(o.logger)
	if err != nil {
		return nil, err
	}
	r := &Relay{o: o, s: s, owner: newLeaseOwner(s.processorID), groups: map[*group]struct{}{}}
	r.st = o.q.relay(s.leader != "", s.partitions > 1, s.partitionBy)
	if s.leader != "" {
		r.leases, err = lease.New(o.pool, &lease.Config{Schema: o.schema, Owner: r.owner, TTL: s.leaderTTL,
			AcquireInterval: min(time.Second, s.leaderTTL/3), Logger: s.logger})
		if err != nil {
			return nil, &ConfigError{Package: "outbox", Field: "LeaderTTL", Reason: err.Error()}
		}
	}
	if s.singleWriter {
		s.logger.Warn("stagehand: outbox relay runs unfenced (SingleWriter): the operator guarantees that it is "+
			"the only relay draining this outbox", "processor_id", s.processorID, "schema", o.schema)
	}
	if r.tel, err = newRelayTelemetry(r); err != nil {
		return nil, err
	}
	if s.maintenance != nil {
		m, err := o.NewMaintainer(s.maintenance)
		if err != nil {
			return nil, err
		}
		r.maint = &relayMaintenance{m: m}
	}
	return r, nil
}

var _ message.Subscriber = (*Relay)(nil)

// Subscribe delivers the messages staged for topic until ctx ends or the relay is closed; then the channel is
// closed. Each subscription claims, delivers and marks on its own.
func (r *Relay) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return r.SubscribeTopics(ctx, topic)
}

// SubscribeTopics is Subscribe for a set of topics; with no topics it delivers every topic.
func (r *Relay) SubscribeTopics(ctx context.Context, topics ...string) (<-chan *message.Message, error) {
	out, _, err := r.subscribe(ctx, topics)
	return out, err
}

func (r *Relay) subscribe(ctx context.Context, topics []string) (<-chan *message.Message, *group, error) {
	out := make(chan *message.Message)
	g, err := r.start(ctx, topics, func(ctx context.Context, d *delivery) outcome {
		return d.viaChannel(ctx, out, r.s.ackDeadline)
	}, func() { close(out) })
	if err != nil {
		return nil, nil, err
	}
	return out, g, nil
}

// DrainResult counts what a Drain did.
type DrainResult struct {
	// Published is the number of messages the publisher accepted (and that were marked sent).
	Published int
	// Failed is the number of rejected attempts (each backed off or dead-lettered).
	Failed int
	// DeadLettered is the number of messages moved to the dead letters.
	DeadLettered int
	// Unreachable is the number of publishes that found the broker unreachable (no attempt counted).
	Unreachable int
}

// Drain publishes every message that is due now through pub, topic taken from the row, and returns when none is left
// that this relay can take (others may be leased by other relays, backing off or scheduled later), when the broker
// turns out to be unreachable, or when ctx ends. It runs no background loop: call it from a timer trigger in serverless
// environments (the Excalibur outbox documentation, "Manual Processing"). Processing settings apply as for Subscribe.
func (r *Relay) Drain(ctx context.Context, pub message.Publisher) (DrainResult, error) {
	g, err := r.start(ctx, nil, func(ctx context.Context, d *delivery) outcome {
		return d.viaPublisher(ctx, pub)
	}, nil)
	if err != nil {
		return DrainResult{}, err
	}
	<-g.ended
	g.mu.Lock()
	res, drainErr := g.result, g.drainErr
	g.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	r.maint.afterDrain(ctx, r.s.logger)
	return res, drainErr
}

// Close stops every subscription: deliveries waiting for an ack are given up (their rows are released for a
// retry), acknowledged rows are marked, and the channels are closed. It is safe to call more than once.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	groups := make([]*group, 0, len(r.groups))
	for g := range r.groups {
		groups = append(groups, g)
	}
	r.mu.Unlock()
	for _, g := range groups {
		g.cancel()
	}
	r.wg.Wait()
	if r.tel != nil {
		r.tel.close()
	}
	return nil
}

// unit is what one worker delivers at a time: a single unordered row, or the claimed run of one partition key,
// delivered in sequence order.
type unit struct {
	key  string // "" for an unordered row
	rows []*row
}

type outcome struct {
	kind Outcome
	err  error
}

// subscription is one claim loop with its workers, acker and lease keeper: the loop of one partition (the only
// one when the relay is not partitioned), for one leadership term when the relay is fenced.
type subscription struct {
	r      *Relay
	s      *settings
	q      *queries
	st     *relayStatements
	topics []string
	owner  string // the row lease owner
	drain  bool
	listen <-chan struct{} // wake-up notifications (nil: poll only)

	part   int          // partition number
	lo, hi int32        // the partition's hash range (partitioned relays)
	fence  *lease.Lease // the leader lease of this term; nil when unfenced
	demote atomic.Pointer[fenceLoss]

	ctx     context.Context
	cancel  context.CancelFunc
	deliver func(context.Context, *delivery) outcome

	mu            sync.Mutex
	queue         []*unit
	keys          map[string]*unit    // keys (keyRef) with rows held here (queued or delivered)
	held          map[int64]*row      // every row leased here and not yet resolved in the database
	pending       int                 // rows queued or being delivered (not yet acknowledged)
	acks          []*row              // acknowledged rows waiting for their mark
	promotions    map[string]struct{} // keys whose promotion found their lock taken: retried
	moved         atomic.Int64        // rows marked since the last vacuum
	marking       int                 // rows in the mark statement running now
	pausedUntil   time.Time
	brokerBackoff time.Duration
	drainErr      error
	result        DrainResult

	work    chan struct{} // a unit was queued
	room    chan struct{} // rows were acknowledged or resolved: the claimer may have room
	wake    chan struct{} // rows were resolved: keys this relay blocked may be claimable again
	ackKick chan struct{}
	done    chan struct{} // closed when run has finished
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (s *subscription) run() {
	defer close(s.done)
	var workers, background sync.WaitGroup
	for range s.s.parallelism {
		workers.Add(1)
		go func() {
			defer workers.Done()
			s.worker()
		}()
	}
	background.Add(2)
	go func() {
		defer background.Done()
		s.keepLeases()
	}()
	go func() {
		defer background.Done()
		s.vacuumer()
	}()
	ackerDone, workersDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ackerDone)
		s.acker(workersDone)
	}()
	s.claimer(s.listen)
	s.cancel()
	workers.Wait()
	background.Wait()
	close(workersDone) // the acker marks what is left, then exits
	<-ackerDone
	s.releaseAll()
}

// claimer claims batches while there is room and rows are due, and otherwise waits for a wake-up, a poll, or
// the next row falling due.
func (s *subscription) claimer(listen <-chan struct{}) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	sweepEvery := min(max(5*s.s.pollingInterval, time.Second), 30*time.Second)
	var lastSweep time.Time
	for {
		if s.ctx.Err() != nil {
			return
		}
		if time.Since(lastSweep) >= sweepEvery {
			s.sweep()
			lastSweep = time.Now()
		}
		if !s.waitUnpaused() {
			return
		}
		limit := s.roomFor()
		if limit == 0 {
			select {
			case <-s.room:
				continue
			case <-s.ctx.Done():
				return
			}
		}
		// The claim's instant bounds the next-due query below: a row falling due while the claim runs is not
		// claimed, and must not be skipped as already past either.
		claimedAt := s.r.o.now()
		n, err := s.claim(claimedAt, limit)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.s.logger.Warn("stagehand: outbox claim failed; retrying at the next poll", "error", err)
			if s.drain {
				s.mu.Lock()
				s.drainErr = err
				s.mu.Unlock()
				s.waitDrained()
				return
			}
		}
		if err == nil && n == limit {
			continue // more may be due
		}
		if s.drain {
			if s.drainFinished() {
				return
			}
			select {
			case <-s.wake:
			case <-s.room:
			case <-s.ctx.Done():
				return
			}
			continue
		}
		wait := s.s.pollingInterval
		if err == nil {
			if next, ok := s.nextDue(claimedAt); ok {
				wait = min(wait, max(time.Until(next), time.Millisecond))
			}
		}
		poll.Reset(wait)
		select {
		case <-listen:
		case <-s.wake:
		case <-poll.C:
		case <-s.ctx.Done():
			return
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
	}
}

// roomFor is how many rows the claimer may claim now: up to a batch, while fewer than two batches (and at least
// two rows per worker) are waiting or in flight, so claims overlap deliveries and no worker waits for one.
func (s *subscription) roomFor() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	hold := max(2*s.s.batchSize, 2*s.s.parallelism)
	if s.pending >= hold {
		return 0
	}
	return min(s.s.batchSize, hold-s.pending)
}

// drainFinished reports whether a drain has nothing left to do: no row held and the last claim came back short.
func (s *subscription) drainFinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held) == 0 && s.pending == 0 && len(s.acks) == 0 && s.marking == 0
}

func (s *subscription) waitDrained() {
	for !s.drainFinished() {
		select {
		case <-s.wake:
		case <-s.room:
		case <-time.After(10 * time.Millisecond):
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *subscription) waitUnpaused() bool {
	for {
		s.mu.Lock()
		until := s.pausedUntil
		s.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return false
		}
	}
}

// exec sends b in one round trip and one implicit transaction, with the relay's settings (see
// queries.relaySettings), lets read read the results of b's statements in order (nil: none), and returns the
// first error.
func (s *subscription) exec(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	all := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: s.q.relaySettings}}, b.QueuedQueries...)}
	res := s.r.o.pool.SendBatch(ctx, all)
	_, err := res.Exec()
	if err == nil && read != nil {
		err = read(res)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *subscription) claim(now time.Time, limit int) (n int, err error) {
	start := time.Now()
	var claimed []*row
	defer func() {
		took := time.Since(start)
		s.r.tel.claimed(s, start, took, claimed, err)
		if h := s.s.hooks.Claimed; h != nil {
			h(s.ctx, n, took, err)
		}
	}()
	args := []any{now, limit, s.owner, now.Add(s.s.leaseDuration), s.topics, s.runLength() - 1, s.runHeads()}
	if s.st.partitioned {
		args = append(args, s.lo, s.hi)
	}
	b := &pgx.Batch{}
	b.Queue(s.st.claim, s.fenced(args...)...)
	err = s.exec(s.ctx, b, func(res pgx.BatchResults) error {
		rows, err := res.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rw := &row{}
			if err := rows.Scan(&rw.rid, &rw.id, &rw.topic, &rw.msgType, &rw.payload, &rw.metadata, &rw.tenant,
				&rw.correlationID, &rw.causationID, &rw.partitionKey, &rw.seq, &rw.attempts, &rw.createdAt,
				&rw.scheduledAt); err != nil {
				return err
			}
			claimed = append(claimed, rw)
		}
		return rows.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	s.enqueue(claimed)
	return len(claimed), nil
}

// runLength is how many messages of one key a claim takes at most: enough for the batch to fill with runs of
// twice as many keys as there are workers, so workers stay busy while promotions (one per run, when it ends) stay
// rare.
func (s *subscription) runLength() int {
	per := 2 * s.s.parallelism
	return max(1, (s.s.batchSize+per-1)/per)
}

// runHeads is how many of a claim's heads may bring their runs: at least two per worker, and enough for deep keys
// to fill the batch with runs (one promotion per run rather than per message), while bounding what the claim reads.
func (s *subscription) runHeads() int {
	return max(2*s.s.parallelism, (s.s.batchSize+7)/8)
}

// enqueue groups claimed rows into units: every unordered row alone, the rows of a key in sequence order.
func (s *subscription) enqueue(rows []*row) {
	if len(rows) == 0 {
		return
	}
	sortRows(rows)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rw := range rows {
		if _, dup := s.held[rw.rid]; dup {
			continue // a lease of ours that lapsed and was claimed again: it is already here
		}
		s.held[rw.rid] = rw
		s.pending++
		if !rw.ordered() {
			s.queue = append(s.queue, &unit{rows: []*row{rw}})
			continue
		}
		if u, ok := s.keys[rw.keyRef()]; ok {
			u.rows = append(u.rows, rw)
			continue
		}
		u := &unit{key: rw.keyRef(), rows: []*row{rw}}
		s.keys[u.key] = u
		s.queue = append(s.queue, u)
	}
	kick(s.work)
}

// sweep promotes the first message of keys whose promotion was missed (see queries.sweep).
func (s *subscription) sweep() {
	b := &pgx.Batch{}
	b.Queue(s.q.sweep, s.r.o.now())
	var tag pgconn.CommandTag
	err := s.exec(s.ctx, b, func(res pgx.BatchResults) (err error) {
		tag, err = res.Exec()
		return err
	})
	if err != nil {
		if s.ctx.Err() == nil {
			s.s.logger.Warn("stagehand: outbox sweep failed", "error", err)
		}
		return
	}
	if tag.RowsAffected() > 0 {
		s.s.logger.Debug("stagehand: outbox sweep promoted messages", "count", tag.RowsAffected())
	}
}

// nextDue is when the earliest row that was not yet due at the claim at claimedAt falls due. Asking from the
// claim's instant rather than from now keeps a row that fell due in between: it comes back already due, and the
// claimer claims it at once instead of a poll later.
func (s *subscription) nextDue(claimedAt time.Time) (time.Time, bool) {
	var next *time.Time
	b := &pgx.Batch{}
	b.Queue(s.q.nextDue, claimedAt, s.topics)
	if err := s.exec(s.ctx, b, func(res pgx.BatchResults) error {
		return res.QueryRow().Scan(&next)
	}); err != nil || next == nil {
		return time.Time{}, false
	}
	// Compare on the outbox clock, wait on the real one.
	return time.Now().Add(next.Sub(s.r.o.now())), true
}

// worker delivers units, one row at a time, until the subscription ends.
func (s *subscription) worker() {
	for {
		u := s.nextUnit()
		if u == nil {
			return
		}
		s.deliverUnit(u)
	}
}

func (s *subscription) nextUnit() *unit {
	for {
		if !s.waitUnpaused() {
			return nil
		}
		s.mu.Lock()
		if len(s.queue) > 0 {
			u := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			more := len(s.queue) > 0
			s.mu.Unlock()
			if more {
				kick(s.work)
			}
			return u
		}
		s.mu.Unlock()
		select {
		case <-s.work:
		case <-s.ctx.Done():
			return nil
		}
	}
}

// next pops the unit's next row, or reports that the unit is finished (and forgets its key).
func (s *subscription) next(u *unit) *row {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(u.rows) == 0 {
		if u.key != "" && s.keys[u.key] == u {
			delete(s.keys, u.key)
		}
		return nil
	}
	rw := u.rows[0]
	u.rows[0] = nil
	u.rows = u.rows[1:]
	return rw
}

// rest takes the unit's undelivered rows away from it and forgets its key.
func (s *subscription) rest(u *unit) []*row {
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := u.rows
	u.rows = nil
	if u.key != "" && s.keys[u.key] == u {
		delete(s.keys, u.key)
	}
	return rows
}

func (s *subscription) deliverUnit(u *unit) {
	for {
		if s.ctx.Err() != nil {
			return // closing: releaseAll gives the rest back
		}
		if !s.waitUnpaused() {
			return
		}
		rw := s.next(u)
		if rw == nil {
			return
		}
		d := &delivery{row: rw}
		start := time.Now()
		dctx, span := s.r.tel.startPublish(s.ctx, rw)
		out := s.classify(s.deliver(dctx, d))
		s.r.tel.published(dctx, span, rw, out)
		if h := s.s.hooks.Delivered; h != nil {
			h(s.ctx, rw.info(), out.kind, out.err, time.Since(start))
		}
		switch out.kind {
		case Published:
			s.acked(rw, s.finished(u))
		case Released:
			return
		case Unreachable:
			s.unreachable(rw, u, out.err)
			return
		case Rejected:
			if !s.rejected(rw, u, out.err) {
				return
			}
		}
	}
}

// finished reports whether the unit has no row left to deliver.
func (s *subscription) finished(u *unit) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(u.rows) == 0
}

// acked queues rw's mark. last says rw ends its key's run here: its mark then promotes the key's next message
// (a run in progress needs none: this relay delivers the next one itself).
func (s *subscription) acked(rw *row, last bool) {
	rw.lastOfRun = last
	s.mu.Lock()
	s.pending--
	s.acks = append(s.acks, rw)
	s.brokerBackoff = s.s.brokerBackoff
	s.mu.Unlock()
	kick(s.ackKick)
	kick(s.room)
}

// resolved forgets rows whose fate the database now records.
func (s *subscription) resolved(rows ...*row) {
	s.mu.Lock()
	for _, rw := range rows {
		delete(s.held, rw.rid)
	}
	s.mu.Unlock()
}

func (s *subscription) unpend(n int) {
	s.mu.Lock()
	s.pending -= n
	s.mu.Unlock()
	kick(s.room)
	kick(s.wake)
}

// rejected records a rejected attempt: the row backs off (and the rest of its key with it) or, with its retries
// used up, moves to the dead letters. It reports whether the unit may go on with its next row (only after a dead
// letter that does not hold its key).
func (s *subscription) rejected(rw *row, u *unit, cause error) bool {
	if cause == nil {
		cause = ErrNacked
	}
	attempt := rw.attempts + 1
	now := s.r.o.now()
	msg := truncateError(cause)
	dead := attempt > s.s.maxRetryCount
	holds := dead && rw.ordered() && !s.s.releaseKey
	goOn := dead && !holds
	var rest []*row
	if !goOn {
		rest = s.rest(u)
	}
	// Forget the rows before the database lets them go: a claim may return them the moment the statement below
	// commits, and must not find them still held here (they would be skipped as our own).
	s.resolved(append(rest, rw)...)
	retryAt := now.Add(s.s.backoff(attempt))
	// The rest of the key's run stays parked behind the row (backing off, or dead-lettered and holding the key);
	// only a dead letter that releases its key promotes the next message.
	b := &pgx.Batch{}
	if dead {
		b.Queue(s.st.deadLetter, s.fenced(rw.rid, s.owner, msg, !s.s.releaseKey, now)...)
	} else {
		b.Queue(s.st.fail, s.fenced(rw.rid, s.owner, msg, retryAt)...)
	}
	if len(rest) > 0 {
		b.Queue(s.st.release, s.fenced(rids(rest), s.owner, []int64{}, now)...) // they stay parked behind rw
	}
	promote := goOn && rw.ordered() && s.finished(u)
	if promote {
		s.r.o.queuePromote(b, []string{rw.keyRef()}, now)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 30*time.Second)
	var moved int64
	err := s.exec(ctx, b, func(res pgx.BatchResults) error {
		tag, err := res.Exec() // the move or the backoff
		if err != nil {
			return err
		}
		moved = tag.RowsAffected()
		if !promote {
			return nil
		}
		locked, err := lockedKeys(res, []string{rw.keyRef()}) // goOn: nothing was released
		if err == nil {
			s.promoteLaterExcept([]string{rw.keyRef()}, locked)
		}
		return err
	})
	if err == nil && moved == 0 {
		op := "backoff"
		if dead {
			op = "dead-letter move"
		}
		err = s.checkFence(ctx, op)
	}
	cancel()
	switch {
	case errors.Is(err, ErrFenced):
		goOn = false // logged by checkFence; the new leader retries the message
	case err != nil:
		s.s.logger.Warn("stagehand: outbox could not record a failed delivery; the lease will lapse and the "+
			"message will be retried", "message_id", rw.id, "error", err)
	default:
		s.s.logger.Debug("stagehand: outbox delivery rejected", "message_id", rw.id, "attempt", attempt,
			"dead_lettered", dead, "error", cause)
	}
	s.mu.Lock()
	s.result.Failed++
	if dead {
		s.result.DeadLettered++
	}
	s.mu.Unlock()
	s.r.tel.failed(s.ctx, rw, dead && err == nil)
	if h := s.s.hooks.DeadLettered; dead && err == nil && h != nil {
		h(s.ctx, rw.info(), cause)
	}
	s.unpend(1 + len(rest))
	return goOn
}

// unreachable gives the row (and the rest of its unit) back without counting an attempt and pauses the whole
// subscription, with a backoff that doubles while the broker stays unreachable.
func (s *subscription) unreachable(rw *row, u *unit, cause error) {
	rest := s.rest(u)
	s.resolved(append(rest, rw)...) // before the release commits; see rejected
	b := &pgx.Batch{}
	now := s.r.o.now()
	b.Queue(s.st.unreachable, s.fenced(rw.rid, s.owner, truncateError(cause), now)...)
	if len(rest) > 0 {
		b.Queue(s.st.release, s.fenced(rids(rest), s.owner, []int64{}, now)...) // they stay parked behind rw
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 30*time.Second)
	var released int64
	err := s.exec(ctx, b, func(res pgx.BatchResults) error {
		tag, err := res.Exec()
		released = tag.RowsAffected()
		return err
	})
	if err == nil && released == 0 {
		err = s.checkFence(ctx, "release")
	}
	if err != nil && !errors.Is(err, ErrFenced) {
		s.s.logger.Warn("stagehand: outbox could not release a message", "message_id", rw.id, "error", err)
	}
	cancel()
	s.mu.Lock()
	pause := s.brokerBackoff
	s.brokerBackoff = s.s.nextBrokerBackoff(s.brokerBackoff)
	if until := time.Now().Add(pause); until.After(s.pausedUntil) {
		s.pausedUntil = until
	}
	s.result.Unreachable++
	s.mu.Unlock()
	s.s.logger.Warn("stagehand: outbox broker unreachable; relay backing off", "pause", pause, "error", cause)
	s.unpend(1 + len(rest))
	if s.drain {
		s.mu.Lock()
		if s.drainErr == nil {
			s.drainErr = fmt.Errorf("%w: %w", ErrBrokerUnavailable, cause)
		}
		s.mu.Unlock()
		s.cancel()
	}
}

// maxMark caps the rows of one mark statement, so a burst of acks cannot turn into one statement that holds up the
// promotions it carries for long.
const maxMark = 5000

// acker marks acknowledged rows sent, coalescing every ack that arrives while a mark statement runs into the next
// one, so the database sees one statement per burst rather than one per message. It also retries promotions that
// found a key's lock taken by a staging transaction.
func (s *subscription) acker(workersDone <-chan struct{}) {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		s.mu.Lock()
		batch := s.acks
		if len(batch) > maxMark {
			batch, s.acks = batch[:maxMark:maxMark], batch[maxMark:]
		} else {
			s.acks = nil
		}
		s.marking = len(batch)
		s.mu.Unlock()
		if len(batch) > 0 {
			keys := orderedKeys(batch)
			if err := s.mark(rids(batch), keys); errors.Is(err, ErrFenced) {
				// logged by checkFence; the rows stay for the new leader
			} else if err != nil {
				s.s.logger.Warn("stagehand: outbox could not mark messages sent; their leases will lapse and "+
					"they will be published again", "count", len(batch), "error", err)
			} else {
				s.moved.Add(int64(len(batch)))
			}
			s.mu.Lock()
			for _, rw := range batch {
				delete(s.held, rw.rid)
			}
			s.marking = 0
			s.mu.Unlock()
			kick(s.wake)
			kick(s.room)
			continue
		}
		if s.retryPromotions() {
			retry.Reset(20 * time.Millisecond)
		}
		select {
		case <-workersDone:
			s.mu.Lock()
			idle := len(s.acks) == 0
			s.mu.Unlock()
			if idle {
				return
			}
		case <-s.ackKick:
		case <-retry.C:
		}
	}
}

// retryPromotions promotes the keys whose promotion was skipped, and reports whether some are still waiting.
func (s *subscription) retryPromotions() bool {
	s.mu.Lock()
	keys := make([]string, 0, len(s.promotions))
	for k := range s.promotions {
		keys = append(keys, k)
	}
	s.promotions = nil
	s.mu.Unlock()
	if len(keys) == 0 {
		return false
	}
	slices.Sort(keys)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 30*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	s.r.o.queuePromote(b, keys, s.r.o.now())
	var locked []string
	err := s.exec(ctx, b, func(res pgx.BatchResults) (err error) {
		locked, err = lockedKeys(res, keys)
		return err
	})
	if err != nil {
		s.s.logger.Debug("stagehand: outbox promotion failed; the sweep will retry", "error", err)
		return false
	}
	s.promoteLaterExcept(keys, locked)
	kick(s.wake)
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.promotions) > 0 && s.ctx.Err() == nil
}

// promoteLaterExcept remembers the keys whose lock it could not take, to promote them again.
func (s *subscription) promoteLaterExcept(keys, locked []string) {
	if len(locked) == len(keys) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.promotions == nil {
		s.promotions = map[string]struct{}{}
	}
	for _, k := range keys {
		if !slices.Contains(locked, k) {
			s.promotions[k] = struct{}{}
		}
	}
}

// orderedKeys returns the distinct keys (keyRef) of the ordered rows that end their run, sorted.
func orderedKeys(rows []*row) []string {
	var keys []string
	for _, rw := range rows {
		if rw.ordered() && rw.lastOfRun {
			keys = append(keys, rw.keyRef())
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// mark moves acknowledged rows to the ledger and promotes the next message of their keys, in one implicit
// transaction (one round trip).
func (s *subscription) mark(batch []int64, keys []string) (err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 30*time.Second)
	defer cancel()
	if h := s.s.hooks.Marked; h != nil {
		start := time.Now()
		defer func() { h(ctx, len(batch), time.Since(start), err) }()
	}
	now := s.r.o.now()
	b := &pgx.Batch{}
	b.Queue(s.st.mark, s.fenced(batch, s.owner, now)...)
	if len(keys) > 0 {
		s.r.o.queuePromote(b, keys, now)
	}
	var tag pgconn.CommandTag
	err = s.exec(ctx, b, func(res pgx.BatchResults) (err error) {
		if tag, err = res.Exec(); err != nil || len(keys) == 0 {
			return err
		}
		locked, err := lockedKeys(res, keys)
		if err == nil {
			s.promoteLaterExcept(keys, locked)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: mark sent: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if err := s.checkFence(ctx, "mark sent"); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.result.Published += len(batch)
	s.mu.Unlock()
	if lost := len(batch) - int(tag.RowsAffected()); lost > 0 {
		s.s.logger.Debug("stagehand: outbox lost leases before marking; another relay will publish again",
			"count", lost)
	}
	return nil
}

// vacuumer vacuums the outbox table while this subscription moves rows out of it, off the acker's path: at an
// interval, once VacuumAfterRows rows have moved since its last vacuum (a trickle is autovacuum's). SKIP_LOCKED: when
// another relay is vacuuming it, there is nothing to add. PARALLEL 0: the table is small by design, and parallel
// index vacuuming would take cores from staging and the relay for nothing.
func (s *subscription) vacuumer() {
	if s.s.vacuumInterval <= 0 {
		return
	}
	t := time.NewTicker(s.s.vacuumInterval)
	defer t.Stop()
	var moved int64
	for {
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		if moved += s.moved.Swap(0); moved < s.s.vacuumAfterRows {
			continue
		}
		moved = 0
		// No truncation: it would lock staging out of the table (migration 027 says the same to autovacuum).
		if _, err := s.r.o.pool.Exec(s.ctx, "VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) "+
			pgx.Identifier{s.r.o.schema, "outbox"}.Sanitize()); err != nil && s.ctx.Err() == nil {
			s.s.logger.Debug("stagehand: outbox vacuum failed; autovacuum remains", "error", err)
		}
	}
}

// keepLeases renews the leases of the rows this subscription holds, every third of the lease duration.
func (s *subscription) keepLeases() {
	t := time.NewTicker(s.s.leaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		s.mu.Lock()
		held := make([]int64, 0, len(s.held))
		for rid := range s.held {
			held = append(held, rid)
		}
		s.mu.Unlock()
		if len(held) == 0 {
			continue
		}
		b := &pgx.Batch{}
		b.Queue(s.st.extend, s.fenced(held, s.owner, s.r.o.now().Add(s.s.leaseDuration))...)
		var extended int64
		err := s.exec(s.ctx, b, func(res pgx.BatchResults) error {
			tag, err := res.Exec()
			extended = tag.RowsAffected()
			return err
		})
		if err == nil && extended == 0 {
			err = s.checkFence(s.ctx, "lease renewal")
		}
		if err != nil && s.ctx.Err() == nil && !errors.Is(err, ErrFenced) {
			s.s.logger.Warn("stagehand: outbox could not renew leases", "count", len(held), "error", err)
		}
	}
}

// releaseAll gives back every row still held when the subscription ends, without counting an attempt.
func (s *subscription) releaseAll() {
	s.mu.Lock()
	held := make([]int64, 0, len(s.held))
	first := map[string]*row{} // per key, the earliest row released: it becomes due
	for rid, rw := range s.held {
		held = append(held, rid)
		if rw.ordered() {
			if f, ok := first[rw.keyRef()]; !ok || *rw.seq < *f.seq {
				first[rw.keyRef()] = rw
			}
		}
	}
	s.held = map[int64]*row{}
	s.queue = nil
	s.mu.Unlock()
	if len(held) == 0 {
		return
	}
	unpark := make([]int64, 0, len(first))
	for _, rw := range first {
		unpark = append(unpark, rw.rid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(s.st.release, s.fenced(held, s.owner, unpark, s.r.o.now())...)
	if err := s.exec(ctx, b, nil); err != nil {
		s.s.logger.Warn("stagehand: outbox could not release leases on close; they will lapse",
			"count", len(held), "error", err)
	}
}

func rids(rows []*row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.rid
	}
	return out
}

func truncateError(err error) string {
	msg := err.Error()
	if len(msg) > 4000 {
		msg = msg[:4000] + "…"
	}
	return msg
}

// ErrNacked is the error recorded for a message that was nacked without an error recorded through RecordError.
var ErrNacked = errors.New("outbox: message nacked")

// ErrAckDeadline is the error recorded for a message not acknowledged within RelayConfig.AckDeadline.
var ErrAckDeadline = errors.New("outbox: ack deadline exceeded")
