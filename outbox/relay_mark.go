package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// maxMark caps the rows of one mark statement, so a burst of acks cannot turn into one statement that holds up the
// promotions it carries for long.
const maxMark = 5000

// marker collects acknowledged rows until they are marked sent. Whatever arrives while a mark statement runs goes
// into the next one, so the database sees one statement per burst rather than one per message; and while other
// deliveries are still under way, a mark waits up to markGather for their acknowledgements (see gathering).
type marker struct {
	mu      sync.Mutex
	acks    []*row
	since   time.Time // when the oldest of acks arrived
	marking int       // rows in the mark statement running now
	arrived chan struct{}
}

func newMarker() *marker { return &marker{arrived: make(chan struct{}, 1)} }

func (m *marker) add(rw *row) {
	m.mu.Lock()
	if len(m.acks) == 0 {
		m.since = time.Now()
	}
	m.acks = append(m.acks, rw)
	m.mu.Unlock()
	signal(m.arrived)
}

// markGather bounds how long acknowledged rows wait for the acknowledgements of the deliveries still under way, so
// they share one mark. At moderate rates a mark otherwise carried one or two rows: measured end to end at 560-590
// messages/s, 1.5-1.6 rows a mark, each mark a round trip of four statements (the relay's settings, the key
// locks, the move to the ledger, the promotion) of about 250 µs of database time in all. Marking is off the
// delivery path (a message is published before it is marked); what waits is the promotion of a key's message
// staged after its run was claimed, and rows acknowledged but not yet marked are published again if the relay
// dies in between, as they always could be.
const markGather = 5 * time.Millisecond

// gathering reports how long the acknowledged rows should still wait for more before their mark: until markGather
// after the oldest of them arrived, while busy (deliveries are queued or under way in this loop, whose
// acknowledgements would follow soon) and fewer than full rows are waiting. Zero: mark now. Nothing waits when
// nothing else is under way, so a lone message, or the end of a key's run that its next run waits for, is
// marked at once.
func (m *marker) gathering(busy bool, full int, now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !busy || len(m.acks) == 0 || len(m.acks) >= full {
		return 0
	}
	return max(0, m.since.Add(markGather).Sub(now))
}

// take takes up to maxMark acknowledged rows to mark.
func (m *marker) take() []*row {
	m.mu.Lock()
	defer m.mu.Unlock()
	batch := m.acks
	if len(batch) > maxMark {
		batch, m.acks = batch[:maxMark:maxMark], batch[maxMark:]
	} else {
		m.acks = nil
	}
	m.marking = len(batch)
	return batch
}

// marked ends the mark statement of take's rows.
func (m *marker) marked() {
	m.mu.Lock()
	m.marking = 0
	m.mu.Unlock()
}

// idle reports whether no row waits for its mark.
func (m *marker) idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.acks) == 0 && m.marking == 0
}

// markAcknowledged marks acknowledged rows sent until the workers have stopped and nothing is left to mark, and
// retries the promotions that found a key's lock taken in between.
func (loop *claimLoop) markAcknowledged() {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	gather := time.NewTimer(time.Hour)
	defer gather.Stop()
	for {
		wait := time.Duration(0)
		select {
		case <-loop.stopped: // the workers are done: nothing more is coming
		default:
			wait = loop.marks.gathering(loop.flight.busy(), loop.cfg.BatchSize, time.Now())
		}
		if wait > 0 {
			gather.Reset(wait)
			select {
			case <-loop.marks.arrived:
			case <-gather.C:
			case <-loop.stopped:
			}
			if !gather.Stop() {
				select {
				case <-gather.C:
				default:
				}
			}
			continue
		}
		if batch := loop.marks.take(); len(batch) > 0 {
			promoted, err := loop.mark(rowIDs(batch), endedRuns(batch))
			if errors.Is(err, ErrFenced) {
				// logged by checkFence; the rows stay for the new leader
			} else if err != nil {
				loop.cfg.Logger.Warn("stagehand: outbox could not mark messages sent; their leases will lapse and "+
					"they will be published again", "count", len(batch), "error", err)
			} else {
				loop.moved.Add(int64(len(batch)))
			}
			loop.flight.forget(batch...)
			loop.marks.marked()
			if promoted > 0 || err != nil {
				// Messages fell due (or may have: the claimer looks). A mark that promoted nothing made nothing
				// claimable: the rows it removed were this loop's, and new rows come with their own wake-up or
				// poll. Waking the claimer after every mark doubled the claims at moderate rates (one that found
				// nothing per message), each costing a round trip and an implicit transaction.
				signal(loop.flight.wake)
			}
			signal(loop.flight.room)
			continue
		}
		if loop.retryPromotions() {
			retry.Reset(20 * time.Millisecond)
		}
		select {
		case <-loop.stopped:
			if loop.marks.idle() {
				return
			}
		case <-loop.marks.arrived:
		case <-retry.C:
		}
	}
}

// endedRuns returns the distinct keys of the ordered rows that end their run, sorted.
func endedRuns(rows []*row) []tenantKey {
	var keys []tenantKey
	for _, rw := range rows {
		if rw.ordered() && rw.lastOfRun {
			keys = append(keys, rw.key())
		}
	}
	return sortedKeys(keys)
}

// mark moves acknowledged rows to the ledger and promotes the next message of keys, in one implicit transaction
// (one round trip), and returns how many messages the promotion made due.
func (loop *claimLoop) mark(batch []int64, keys []tenantKey) (promoted int64, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loop.ctx), 30*time.Second)
	defer cancel()
	if h := loop.cfg.Hooks.Marked; h != nil {
		start := time.Now()
		defer func() { h(ctx, len(batch), time.Since(start), err) }()
	}
	now := loop.relay.o.now()
	run := func(mark sqlfile.Named[relayRow]) (int64, error) {
		b := &pgx.Batch{}
		b.Queue(mark.SQL, loop.db.args(mark, &relayRow{IDs: batch, Now: now})...)
		if len(keys) > 0 {
			loop.relay.o.queuePromote(b, keys, now)
		}
		return loop.db.written(ctx, "mark sent", b, func(res pgx.BatchResults) error {
			if len(keys) == 0 {
				return nil
			}
			locked, err := lockedKeys(res, keys)
			if err != nil {
				return err
			}
			loop.promos.later(keys, locked)
			tag, err := res.Exec()
			promoted = tag.RowsAffected()
			return err
		})
	}
	marked, err := run(loop.db.st.mark)
	if inLedger(err) {
		// Some of the rows were in the ledger already; the failed mark changed nothing (one transaction).
		marked, err = run(loop.db.st.markDedup)
	}
	if err != nil {
		if errors.Is(err, ErrFenced) {
			return 0, err
		}
		return 0, fmt.Errorf("outbox: mark sent: %w", err)
	}
	loop.tally.add(func(r *DrainResult) { r.Published += len(batch) })
	if lost := len(batch) - int(marked); lost > 0 {
		loop.cfg.Logger.Debug("stagehand: outbox lost leases before marking; another relay will publish again",
			"count", lost)
	}
	return promoted, nil
}

// inLedger reports whether err is a mark's insert into the ledger meeting a message already there.
func inLedger(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == "outbox_sent"
}

// retryPromotions promotes the keys whose promotion was skipped, and reports whether some are still waiting.
func (loop *claimLoop) retryPromotions() bool {
	keys := loop.promos.takeAll()
	if len(keys) == 0 {
		return false
	}
	defer signal(loop.flight.wake)
	defer loop.promos.retried()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loop.ctx), 30*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	loop.relay.o.queuePromote(b, keys, loop.relay.o.now())
	var locked []tenantKey
	err := loop.db.exec(ctx, b, func(res pgx.BatchResults) (err error) {
		locked, err = lockedKeys(res, keys)
		return err
	})
	if err != nil {
		loop.cfg.Logger.Debug("stagehand: outbox promotion failed; the sweep will retry", "error", err)
		return false
	}
	loop.promos.later(keys, locked)
	return loop.promos.waiting() && loop.ctx.Err() == nil
}

// promoter keeps the keys whose promotion found their lock taken by a staging transaction (which may be parking a
// message the promotion cannot see yet), to promote them again.
type promoter struct {
	mu       sync.Mutex
	keys     map[tenantKey]struct{}
	retrying bool // takeAll's keys are being promoted
}

// later remembers the keys that are not among locked.
func (p *promoter) later(keys, locked []tenantKey) {
	if len(locked) == len(keys) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[tenantKey]struct{}{}
	}
	for _, k := range keys {
		if !slices.Contains(locked, k) {
			p.keys[k] = struct{}{}
		}
	}
}

// takeAll returns the remembered keys, sorted, and forgets them.
func (p *promoter) takeAll() []tenantKey {
	p.mu.Lock()
	keys := make([]tenantKey, 0, len(p.keys))
	for k := range p.keys {
		keys = append(keys, k)
	}
	p.keys = nil
	p.retrying = len(keys) > 0
	p.mu.Unlock()
	return sortedKeys(keys)
}

// retried ends the retry of takeAll's keys (those still locked out are back through later).
func (p *promoter) retried() {
	p.mu.Lock()
	p.retrying = false
	p.mu.Unlock()
}

// waiting reports whether keys wait for a retry.
func (p *promoter) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys) > 0
}

// pending reports whether keys wait for a retry or are being promoted now.
func (p *promoter) pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys) > 0 || p.retrying
}
